"""The study: the MoL-RL paper's ablations on the demo's worlds over seeds, each claim with a verdict that code
applies (``molrl demo --study``).

``run_study`` (``molrl.study.run``) runs the arms (``molrl.study.arms``) as pipelines of the demo, reusing finished
runs; ``molrl.study.report`` writes ``study.md`` and its plots from what the runs left on disk; ``molrl.study.verdict``
is the rule a claim's verdict follows (``molrl.study.metrics`` and ``molrl.study.kl`` read the figures). The demo
runs without importing this package; the study imports the demo.
"""
