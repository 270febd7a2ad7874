"""The config blocks every stage shares, under one name and one type wherever a stage has them.

- ``model`` (``ModelSource``): the checkpoint a stage loads, an adapter on it, the weights' dtype. ``model: PATH``
  is short for ``model: {path: PATH}``, so a one-line model still reads as it always did.

``tests/test_config_blocks.py`` checks, by enumeration over the stages, that each exposes these blocks under the
same names and types.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from molrl.config_ranges import Dtype


@dataclass
class ModelSource:
    """The model a stage loads: a checkpoint, an optional PEFT adapter on top of it, and the weights' dtype."""

    SHORTHAND: ClassVar[str] = "path"
    """``model: PATH`` (a YAML string or ``model=PATH`` on the command line) sets ``model.path``."""

    path: str = ""
    """Model directory or hub name (tiny:chatml / tiny:llama3: a random tiny model built in-process)."""
    adapter: Path | None = None
    """A PEFT adapter directory put on top of the model (none: the model as it is)."""
    dtype: Dtype = "float32"
    """Weights dtype of the transformers path: float32, bfloat16 or float16 (vLLM uses the checkpoint's)."""


def as_model_source(value: ModelSource | str | Path) -> ModelSource:
    """A stage's ``model`` as its block: a config built in Python may give a plain path (``EvalConfig(model=P)``)."""
    return value if isinstance(value, ModelSource) else ModelSource(str(value))
