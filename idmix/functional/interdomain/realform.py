"""Real-form helpers: a complex vector over M modes is stored as 2M reals [Re; Im].

Kernels never see complex dtypes (Triton has none; Inductor warns on complex codegen), so the
chunked and decode paths work on these real tensors only.
"""

from __future__ import annotations

import torch


def complex_to_rows(X: torch.Tensor) -> torch.Tensor:
    """(..., M, C) complex -> (..., 2M, C) real, rows [Re X; Im X]."""
    return torch.cat([X.real, X.imag], dim=-2)


def rows_to_complex(X: torch.Tensor) -> torch.Tensor:
    """(..., 2M, C) real -> (..., M, C) complex."""
    M = X.shape[-2] // 2
    return torch.complex(X[..., :M, :], X[..., M:, :])


def cmul_rows(a_re: torch.Tensor, a_im: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """Mode-wise complex product a ⊙ X. a_re, a_im: (..., M) broadcastable; X: (..., 2M, C)."""
    M = X.shape[-2] // 2
    Xr, Xi = X[..., :M, :], X[..., M:, :]
    ar, ai = a_re[..., None], a_im[..., None]
    return torch.cat([ar * Xr - ai * Xi, ar * Xi + ai * Xr], dim=-2)


def cmul_last(a_re: torch.Tensor, a_im: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mode-wise complex product a ⊙ y with y: (..., 2M) real form in its last dim."""
    M = y.shape[-1] // 2
    yr, yi = y[..., :M], y[..., M:]
    return torch.cat([a_re * yr - a_im * yi, a_re * yi + a_im * yr], dim=-1)


def polar(lam_ri: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., 2) [re, im] -> (log|λ|, arg λ). |λ| is clamped away from 0 so log stays finite."""
    re, im = lam_ri.unbind(-1)
    sq = (re * re + im * im).clamp_min(torch.finfo(re.dtype).tiny)
    return 0.5 * torch.log(sq), torch.atan2(im, re)


def powers(log_mag: torch.Tensor, theta: torch.Tensor, n: torch.Tensor):
    """λ^n = |λ|^n (cos nθ + i sin nθ) for exponents n >= 0 (never positive powers of 1/|λ|).

    log_mag, theta: (H, M); n: any shape S of non-negative reals. Returns (re, im): (H, *S, M).
    """
    view = (log_mag.shape[0],) + (1,) * n.dim() + (log_mag.shape[1],)
    nn = n.to(log_mag.dtype)[None, ..., None]
    mag = torch.exp(nn * log_mag.view(view))
    ang = nn * theta.view(view)
    return mag * torch.cos(ang), mag * torch.sin(ang)
