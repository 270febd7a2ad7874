"""Stage subcommands of the ``molrl`` console script, one module per stage."""
