"""Powers of the discrete decays λ: the one place λⁿ is computed (the chunked path, the S4D-only
readout and the closed-form reference all take it from here)."""

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


def complex_powers(lam: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """λ^n as a complex tensor: lam (H, M) complex, n any shape S of integers >= 0 ->
    (H, *S, M), through :func:`powers`."""
    re, im = powers(*polar(torch.view_as_real(lam.resolve_conj())), n)
    return torch.complex(re, im)
