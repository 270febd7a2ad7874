"""MoL continual training: CE on environment feedback, KL to the frozen base on the model's own decisions.

``run_mol(MolConfig) -> Path`` is the stage entry point; the loss lives in ``molrl.mol.losses``.
"""

from molrl.mol.config import MolConfig
from molrl.mol.run import run_mol

__all__ = ["MolConfig", "run_mol"]
