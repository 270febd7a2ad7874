"""The demo: worlds molrl builds itself, a tiny base trained on them, and the pipeline run on it (``molrl demo``)."""
