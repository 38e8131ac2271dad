"""Rotary position embedding over the last dim, pairs (x[2i], x[2i+1]) rotated by pos·θ_i."""

from __future__ import annotations

import torch


def _inv_freq(dim: int, base: float, device: torch.device) -> torch.Tensor:
    return base ** (-torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)


def rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """x: (B, T, H, F) with F even; positions: (B, T) or (T,) integer. Returns x's shape/dtype.

    θ_i = base^(-2i/F). Angles are computed from the positions directly (no length cap), so any
    context length works, packed documents included (positions restart at 0). Each pair is
    rotated as one complex multiply in eager mode (fewest ops); under torch.compile in real
    arithmetic, which Inductor fuses into one kernel (it has no complex codegen).
    """
    F_ = x.shape[-1]
    if F_ % 2:
        raise ValueError(f"x: rope needs an even last dim, got {F_}")
    pos = positions.to(torch.float32)
    if pos.dim() == 1:
        pos = pos[None]
    ang = pos[..., None, None] * _inv_freq(F_, float(base), x.device)  # (B, T, 1, F/2)
    if torch.compiler.is_compiling():
        cos, sin = torch.cos(ang), torch.sin(ang)
        x0, x1 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
        return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2).to(x.dtype)
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)).contiguous())
    return (
        torch.view_as_real(pairs * torch.polar(torch.ones_like(ang), ang)).flatten(-2).to(x.dtype)
    )


def rope_naive(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Reference for :func:`rope`, pair by pair in real arithmetic."""
    F_ = x.shape[-1]
    pos = positions.double() if positions.dim() == 2 else positions.double()[None]
    out = x.double().clone()
    for i in range(F_ // 2):
        ang = (pos * base ** (-2 * i / F_))[..., None]  # (B, T, 1)
        x0, x1 = x[..., 2 * i].double(), x[..., 2 * i + 1].double()
        out[..., 2 * i] = x0 * torch.cos(ang) - x1 * torch.sin(ang)
        out[..., 2 * i + 1] = x0 * torch.sin(ang) + x1 * torch.cos(ang)
    return out.to(x.dtype)
