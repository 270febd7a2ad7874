"""Where a training stage's figures go besides ``metrics.jsonl``: the ``report_to`` switch of MoL and RL.

Both stages pass the same list to transformers' Trainer, which writes each logged step to every named
backend: tensorboard event files (``runs/`` beside the run's checkpoints), wandb, mlflow and the others
transformers knows. The figures are those of ``metrics.jsonl``, under ``train/`` (``train/reward``,
``train/loss``). ``report_backends`` checks the names before anything loads, so a backend that is not
installed stops the stage at once, naming the key and the fix, instead of after the model loaded.
"""

from __future__ import annotations

import importlib.util
from typing import Sequence

from molrl.config import ConfigError

BACKENDS = {
    "tensorboard": ("tensorboard", "tensorboard", "tensorboardX"), "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"), "trackio": ("trackio", "trackio"), "comet_ml": ("comet-ml", "comet_ml"),
    "clearml": ("clearml", "clearml"), "neptune": ("neptune", "neptune"), "dvclive": ("dvclive", "dvclive"),
    "swanlab": ("swanlab", "swanlab"), "codecarbon": ("codecarbon", "codecarbon"),
    "azure_ml": ("azureml-core", "azureml"), "dagshub": ("dagshub", "dagshub"), "flyte": ("flytekit", "flytekit"),
}
"""Backend name (as transformers' ``report_to`` spells it) -> (the package to install, then the modules that
provide it: any one will do)."""


def report_backends(names: Sequence[str], key: str) -> list[str] | str:
    """``names`` checked and turned into transformers' ``report_to``: the backends, or ``"none"`` for
    metrics.jsonl only (an empty list or ``none``). ``key`` names the config key in errors.

    >>> report_backends(["tensorboard"], "report_to"), report_backends(["none"], "report_to"), report_backends([], "x")
    (['tensorboard'], 'none', 'none')
    """
    chosen = [name for name in names if name != "none"]
    for name in chosen:
        if name not in BACKENDS:
            raise ConfigError(f"{key}: unknown backend {name!r}; expected some of {', '.join(BACKENDS)}, or none")
        package, *modules = BACKENDS[name]
        if not any(importlib.util.find_spec(module) for module in modules):
            raise ConfigError(f"{key}: {name} is not installed; pip install {package}, or drop it "
                              f"from {key} (tensorboard is installed with molrl; none: metrics.jsonl only)")
    return chosen or "none"
