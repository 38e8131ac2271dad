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
