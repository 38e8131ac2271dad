"""Document boundaries of packed sequences: torchtune's convention, positions restart at 0."""

from __future__ import annotations

import torch


def positions_and_resets(input_pos, B: int, T: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions (B, T), reset (B, T) bool: a document starts here). Defaults: 0..T-1 per row."""
    if input_pos is None:
        pos = torch.arange(T, device=device).expand(B, T)
    else:
        pos = input_pos.expand(B, T) if input_pos.dim() == 1 else input_pos
        if pos.shape != (B, T):
            raise ValueError(
                f"input_pos: expected ({B}, {T}) or ({T},), got {tuple(input_pos.shape)}"
            )
    return pos, pos == 0


def documents(reset: torch.Tensor) -> list[list[tuple[int, int]]] | None:
    """Per row, the [start, end) spans between resets; None when no row resets after t = 0
    (then the whole batch is one document per row and runs in one call)."""
    inner = reset[:, 1:]
    if not bool(inner.any()):
        return None
    T = reset.shape[1]
    spans = []
    for row in reset.cpu():
        cuts = [0] + [int(t) for t in torch.nonzero(row[1:]).flatten() + 1] + [T]
        spans.append(list(zip(cuts[:-1], cuts[1:], strict=True)))
    return spans
