"""Plotting helpers every report uses (the pipeline's, the demo's, the study's): matplotlib without a display,
figures written atomically, and a metric's logged series."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from molrl.records.writes import write_bytes


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Write ``fig`` as a PNG at ``path`` (under a temporary name, renamed into place) and close it."""
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, dpi=dpi, format="png")
    write_bytes(path, image.getvalue())
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def metric_series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` over metrics.jsonl ``rows`` that log it as a number, in the rows' order."""
    pairs = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and "step" in r]
    return [p[0] for p in pairs], [p[1] for p in pairs]
