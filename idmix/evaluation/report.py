"""Results as people read them: markdown tables (files: ``idmix.io.files``; plots:
``idmix.training.plots``)."""

from __future__ import annotations

from collections.abc import Sequence


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """rows of cells (floats printed with 4 significant digits) under header."""

    def cell(x) -> str:
        return f"{x:.4g}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
