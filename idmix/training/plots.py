"""The loss curve of a run as a PNG (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

from .files import atomic_write


def plot_history(history: list[dict], path: Path, title: str) -> Path:
    """Training loss per step and validation loss where measured; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([h["step"] for h in history], [h["loss"] for h in history], label="train loss")
    val = [h for h in history if "val_loss" in h]
    if val:
        ax.plot(
            [h["step"] for h in val], [h["val_loss"] for h in val], "o-", label="validation loss"
        )
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120))
    plt.close(fig)
    return Path(path)
