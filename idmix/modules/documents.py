"""Document boundaries of packed sequences: torchtune's convention, positions restart at 0."""

from __future__ import annotations

import torch

from ..debug import check_values


def check_layer_input(x, embed_dim: int, input_pos=None) -> tuple[int, int]:
    """x: (B, T, embed_dim) floating with T >= 1; input_pos None or integer (B, T) / (T,)
    positions (non-negative: checked where ``idmix.debug.check_values`` allows a host sync).
    Returns (B, T)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(
            f"x: expected a floating tensor, got {getattr(x, 'dtype', type(x).__name__)}"
        )
    if x.dim() != 3 or x.shape[-1] != embed_dim:
        raise ValueError(f"x: expected (B, T, {embed_dim}), got {tuple(x.shape)}")
    B, T = x.shape[:2]
    if T < 1 or B < 1:
        raise ValueError(f"x: expected B >= 1 and T >= 1, got {tuple(x.shape)}")
    if input_pos is not None:
        if (
            not isinstance(input_pos, torch.Tensor)
            or input_pos.is_floating_point()
            or input_pos.dtype == torch.bool
        ):
            kind = getattr(input_pos, "dtype", type(input_pos).__name__)
            raise TypeError(f"input_pos: expected an integer tensor, got {kind}")
        if check_values(input_pos) and input_pos.numel() and int(input_pos.min()) < 0:
            raise ValueError(f"input_pos: expected positions >= 0, got {int(input_pos.min())}")
    return B, T


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
