"""Real-form helpers. Complex dtypes never reach the GEMM paths: a complex vector over M modes
becomes 2M interleaved reals (re₀, im₀, re₁, …), the one layout of the runtime contract: the
state (B, H, R+D, 2M) and Ĝ (H, 2M, 2M) (``view_as_complex`` of it is then free).
"""

from __future__ import annotations

import torch


def polar(lam_ri: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., 2) [re, im] -> (log|λ|, arg λ). |λ| is clamped away from 0 so log stays finite."""
    re, im = lam_ri.unbind(-1)
    sq = (re * re + im * im).clamp_min(torch.finfo(re.dtype).tiny)
    return 0.5 * torch.log(sq), torch.atan2(im, re)


def powers(log_mag: torch.Tensor, theta: torch.Tensor, n: torch.Tensor):
    """λ^n = |λ|^n (cos nθ + i sin nθ) for exponents n >= 0 (never positive powers of 1/|λ|).

    log_mag, theta: (H, M); n: any shape S of non-negative integers. Returns (re, im): (H, *S, M).
    """
    view = (log_mag.shape[0],) + (1,) * n.dim() + (log_mag.shape[1],)
    nn = n.to(log_mag.dtype)[None, ..., None]
    mag = torch.exp(nn * log_mag.view(view))
    ang = nn * theta.view(view)
    return mag * torch.cos(ang), mag * torch.sin(ang)


def state_to_interleaved(Xk: torch.Tensor, Xv: torch.Tensor) -> torch.Tensor:
    """(Xk: (B, H, M, R), Xv: (B, H, M, D)) complex -> (B, H, R+D, 2M) interleaved real."""
    Z = torch.cat([Xk, Xv], dim=-1).transpose(-1, -2)  # (B, H, R+D, M)
    return torch.view_as_real(Z).flatten(-2).contiguous()


def interleaved_to_state(Z: torch.Tensor, R: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`state_to_interleaved` (R is the key width), as views of Z's storage:
    mode-last, the layout the decode step reads without copying."""
    Zc = torch.view_as_complex(Z.unflatten(-1, (-1, 2))).mT  # (B, H, M, R+D)
    return Zc[..., :R], Zc[..., R:]
