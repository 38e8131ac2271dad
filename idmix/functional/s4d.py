"""S4D initialisers and discretisation of a complex diagonal state matrix.

A is stored as (log_A_real, A_imag) with A = -exp(log_A_real) + i·A_imag, one A per head:
shapes (H, M). The step size Δ is one scalar per head, (H,).
"""

from __future__ import annotations

import math

import torch


def s4d_inv_init(
    num_heads: int, num_modes: int, state_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """S4D-Inv: Re A = -1/2, Im A_n = (N/π)(N/(2n+1) - 1), n = 0..M-1, with N = state_size.

    N = M (default) is the paper's formula read literally: for n >= M/2 the frequencies are
    negative. N = 2M is S4D's own convention (N real states = M conjugate pairs): every
    frequency positive. Returns (log_A_real, A_imag), each (H, M) float32.
    """
    N = state_size or num_modes
    n = torch.arange(num_modes, dtype=torch.float64)
    imag = (N / math.pi) * (N / (2 * n + 1) - 1)
    log_real = torch.full((num_modes,), math.log(0.5), dtype=torch.float64)
    return (
        log_real.expand(num_heads, -1).float().clone(),
        imag.expand(num_heads, -1).float().clone(),
    )


def s4d_lin_init(num_heads: int, num_modes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """S4D-Lin: Re A = -1/2, Im A_n = π n. Returns (log_A_real, A_imag), each (H, M)."""
    n = torch.arange(num_modes, dtype=torch.float32)
    log_real = torch.full((num_modes,), math.log(0.5))
    return log_real.expand(num_heads, -1).clone(), (math.pi * n).expand(num_heads, -1).clone()


def log_uniform_dt(
    num_heads: int, dt_min: float = 1e-3, dt_max: float = 1e-1, generator=None
) -> torch.Tensor:
    """log Δ drawn uniformly in [log dt_min, log dt_max]; returns log Δ of shape (H,)."""
    if not 0 < dt_min <= dt_max:
        raise ValueError(f"dt_min, dt_max: expected 0 < dt_min <= dt_max, got {dt_min}, {dt_max}")
    u = torch.rand(num_heads, generator=generator)
    return math.log(dt_min) + u * (math.log(dt_max) - math.log(dt_min))


def complex_A(log_A_real: torch.Tensor, A_imag: torch.Tensor) -> torch.Tensor:
    """A = -exp(log_A_real) + i·A_imag, (H, M) complex."""
    return torch.complex(-torch.exp(log_A_real), A_imag)


def discretize(
    dt: torch.Tensor, A: torch.Tensor, method: str = "zoh"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Discretise ẋ = A x + z (B = 1) with step Δ.

    dt: (H,) real, positive; A: (H, M) complex. Returns (lam, beta), each (H, M) complex:
    - "zoh": λ = exp(ΔA), β = (λ - 1)/A
    - "bilinear": λ = (1 + ΔA/2)/(1 - ΔA/2), β = Δ/(1 - ΔA/2)
    """
    if not A.is_complex():
        raise TypeError(f"A: expected a complex tensor, got {A.dtype}")
    if dt.dim() != 1 or dt.shape[0] != A.shape[0]:
        raise ValueError(f"dt: expected ({A.shape[0]},), got {tuple(dt.shape)}")
    dA = dt.to(A.real.dtype).unsqueeze(-1) * A
    if method == "zoh":
        lam = torch.exp(dA)
        return lam, (lam - 1) / A
    if method == "bilinear":
        denom = 1 - dA / 2
        return (1 + dA / 2) / denom, dt.to(A.real.dtype).unsqueeze(-1) / denom
    raise ValueError(f"method: expected 'zoh' or 'bilinear', got {method!r}")


def discretize_real(
    dt: torch.Tensor, log_A_real: torch.Tensor, A_imag: torch.Tensor, method: str = "zoh"
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`discretize` in real arithmetic, straight from the parameters (what the layers use:
    Inductor has no complex codegen, and this fuses into one kernel under torch.compile).

    dt: (H,), or (..., H) per token (selective layers); log_A_real, A_imag: (H, M). Returns
    (lam_ri, beta_ri): (..., H, M, 2) [re, im] pairs, equal to ``torch.view_as_real`` of
    :func:`discretize`'s (lam, beta).
    """
    if dt.dim() < 1 or dt.shape[-1] != log_A_real.shape[0]:
        raise ValueError(
            f"dt: expected ({log_A_real.shape[0]},) or (..., {log_A_real.shape[0]}), "
            f"got {tuple(dt.shape)}"
        )
    ar, ai = -torch.exp(log_A_real), A_imag
    dt_ = dt.to(ar.dtype).unsqueeze(-1)
    if method == "zoh":
        x, y = dt_ * ar, dt_ * ai
        cos, sin = torch.cos(y), torch.sin(y)
        lr, li = torch.exp(x) * cos, torch.exp(x) * sin
        # Re(λ) - 1 = expm1(x)·cos y - 2 sin²(y/2): no cancellation when ΔA is small (for
        # Δ = 1e-3, computing λ - 1 directly loses ~3 of fp32's 7 digits of β)
        lr_m1 = torch.expm1(x) * cos - 2 * torch.sin(y / 2) ** 2
        # β = (λ - 1)/A = (λ - 1)·conj(A)/|A|²
        inv = 1.0 / (ar * ar + ai * ai)
        br, bi = (lr_m1 * ar + li * ai) * inv, (li * ar - lr_m1 * ai) * inv
    elif method == "bilinear":
        # 1/(1 - ΔA/2) = conj(d)/|d|² with d = 1 - ΔA/2
        dr, di = 1 - dt_ * ar / 2, -dt_ * ai / 2
        inv = 1.0 / (dr * dr + di * di)
        nr, ni = 1 + dt_ * ar / 2, dt_ * ai / 2
        lr, li = (nr * dr + ni * di) * inv, (ni * dr - nr * di) * inv
        br, bi = dt_ * dr * inv, -dt_ * di * inv
    else:
        raise ValueError(f"method: expected 'zoh' or 'bilinear', got {method!r}")
    return torch.stack([lr, li], -1), torch.stack([br, bi], -1)
