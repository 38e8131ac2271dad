"""Document boundaries of packed sequences: torchtune's convention, positions restart at 0."""

from __future__ import annotations

import torch


def positions_and_resets(input_pos, B: int, T: int, device):
    """(positions (B, T), reset (B, T) bool where a document starts, or None).

    Without input_pos: positions 0..T-1 and reset None, i.e. one document per row continuing
    whatever state there is (no data-dependent branching, so the layer compiles whole).
    """
    if input_pos is None:
        return torch.arange(T, device=device).expand(B, T), None
    else:
        pos = input_pos.expand(B, T) if input_pos.dim() == 1 else input_pos
        if pos.shape != (B, T):
            raise ValueError(
                f"input_pos: expected ({B}, {T}) or ({T},), got {tuple(input_pos.shape)}"
            )
    return pos, pos == 0


def documents(reset: torch.Tensor | None) -> list[list[tuple[int, int]]] | None:
    """Per row, the [start, end) spans between resets; None when no row resets after t = 0
    (then the whole batch is one document per row and runs in one call)."""
    if reset is None:
        return None
    inner = reset[:, 1:]
    if not bool(inner.any()):
        return None
    T = reset.shape[1]
    spans = []
    for row in reset.cpu():
        cuts = [0] + [int(t) for t in torch.nonzero(row[1:]).flatten() + 1] + [T]
        spans.append(list(zip(cuts[:-1], cuts[1:], strict=True)))
    return spans
