"""Rotary position embedding over the last dim, pairs (x[2i], x[2i+1]) rotated by pos·θ_i."""

from __future__ import annotations

from functools import lru_cache

import torch


@lru_cache(maxsize=32)
def _inv_freq(dim: int, base: float, device: torch.device) -> torch.Tensor:
    return base ** (-torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)


def rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """x: (B, T, H, F) with F even; positions: (B, T) or (T,) integer. Returns x's shape/dtype.

    θ_i = base^(-2i/F). Angles are computed from the positions directly (no length cap), so any
    context length works, packed documents included (positions restart at 0).
    """
    F_ = x.shape[-1]
    if F_ % 2:
        raise ValueError(f"x: rope needs an even last dim, got {F_}")
    inv_freq = _inv_freq(F_, float(base), x.device)
    pos = positions.to(torch.float32)
    if pos.dim() == 1:
        pos = pos[None]
    ang = pos[..., None, None] * inv_freq  # (B, T, 1, F/2)
    cos, sin = torch.cos(ang), torch.sin(ang)
    xf = x.float().unflatten(-1, (-1, 2))
    x0, x1 = xf[..., 0], xf[..., 1]
    out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    return out.flatten(-2).to(x.dtype)
