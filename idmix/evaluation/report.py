"""Results as people read them: a markdown table, a JSON file and a line plot, all written
atomically."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ..training.files import atomic_write


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """rows of cells (floats printed with 4 significant digits) under header."""

    def cell(x) -> str:
        return f"{x:.4g}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def write_json(path: Path, obj) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=1)))


def line_plot(
    panels: dict[str, dict[str, tuple[Sequence[float], Sequence[float]]]],
    path: Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    logy: bool = False,
) -> Path:
    """One subplot per panel title -> {line name -> (xs, ys)}, side by side; written atomically
    as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (panel, series) in zip(axes[0], panels.items(), strict=True):
        for name, (xs, ys) in series.items():
            ax.plot(xs, ys, "o-", label=name)
        if logx:
            ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(panel)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120))
    plt.close(fig)
    return Path(path)
