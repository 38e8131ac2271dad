"""Line plots as PNG (matplotlib, headless), written atomically: the loss curve of a run and
the evaluation recipes' figures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..io.files import atomic_write


def line_plot(
    panels: dict[str, dict[str, tuple[Sequence[float], Sequence[float]]]],
    path: Path,
    *,
    title: str,
    xlabel: str | dict[str, str],
    ylabel: str,
    logx: bool = False,
    logy: bool = False,
) -> Path:
    """One subplot per panel title -> {line name -> (xs, ys)}, side by side; written atomically
    as a PNG. xlabel: one for all panels or {panel title: label}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (panel, series) in zip(axes[0], panels.items(), strict=True):
        for name, (xs, ys) in series.items():
            ax.plot(xs, ys, "o-" if len(xs) <= 50 else "-", label=name)
        if logx:
            ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel[panel] if isinstance(xlabel, dict) else xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(panel)
        ax.grid(alpha=0.3)
        ax.legend()
    if len(panels) > 1:
        fig.suptitle(title)
    else:
        axes[0][0].set_title(title)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120))
    plt.close(fig)
    return Path(path)


def plot_history(history: list[dict], path: Path, title: str) -> Path:
    """Training loss per step and validation loss where measured."""
    val = [h for h in history if "val_loss" in h]
    series = {"train loss": ([h["step"] for h in history], [h["loss"] for h in history])}
    if val:
        series["validation loss"] = ([h["step"] for h in val], [h["val_loss"] for h in val])
    return line_plot(
        {title: series}, path, title=title, xlabel="step", ylabel="cross-entropy (nats/token)"
    )
