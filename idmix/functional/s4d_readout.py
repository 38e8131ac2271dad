"""The S4D-only baseline's core: the same complex diagonal recurrence, read out linearly.

Per head h and input channel c: X_t = λ ⊙ X_{t-1} + β z_t ∈ Cᴹ and y_t = Re(cᵀ X_t), with one
mode contraction c ∈ Cᴹ per head (``c = Cᵀ w`` for a full complex C and real weights w).
The output is a causal convolution of z with the kernel K[τ] = Re(Σ_m c_m β_m λ_m^τ), computed
by FFT in O(T log T); the initial-state term and the final state are O(T·M·C) contractions.
"""

from __future__ import annotations

import torch


def _powers(lam: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """λ^n for n >= 0 (H, M) x (N,) -> (H, N, M) complex, via exp(n log λ)."""
    return torch.exp(n.to(lam.real.dtype)[None, :, None] * torch.log(lam)[:, None, :])


def s4d_linear_readout(
    z: torch.Tensor,
    lam: torch.Tensor,
    beta: torch.Tensor,
    c: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
):
    """z: (B, T, H, Cz) real; lam, beta, c: (H, M) complex; initial_state: (B, H, M, Cz) complex.

    Returns y: (B, T, H, Cz) real (z's dtype), or (y, final_state (B, H, M, Cz) complex).
    Computes in fp32 (fp64 for fp64 z), whatever the ambient autocast.
    """
    B, T, H, Cz = z.shape
    with torch.autocast(z.device.type, enabled=False):
        rdtype = torch.float64 if z.dtype == torch.float64 else torch.float32
        cdtype = torch.complex128 if rdtype == torch.float64 else torch.complex64
        lam, beta, c, zr = lam.to(cdtype), beta.to(cdtype), c.to(cdtype), z.to(rdtype)
        n = torch.arange(T, device=z.device)
        pw = _powers(lam, n)  # (H, T, M)
        kernel = ((c * beta)[:, None, :] * pw).sum(-1).real  # (H, T)
        size = 2 * T
        zf = torch.fft.rfft(zr, n=size, dim=1)  # (B, size//2+1, H, Cz)
        kf = torch.fft.rfft(kernel, n=size, dim=1)  # (H, size//2+1)
        y = torch.fft.irfft(zf * kf.T[None, :, :, None], n=size, dim=1)[:, :T]
        if initial_state is not None:
            X0 = initial_state.to(cdtype)
            decay0 = c[:, None, :] * lam[:, None, :] * pw  # c ⊙ λ^{t+1}: (H, T, M)
            y = y + torch.einsum("htm,bhmc->bthc", decay0, X0).real
        if not return_final_state:
            return y.to(z.dtype)
        w_end = beta[:, None, :] * pw.flip(1)  # β λ^{T-1-s}
        X = torch.einsum("hsm,bshc->bhmc", w_end, zr.to(cdtype))
        if initial_state is not None:
            X = X + (lam * pw[:, -1])[None, :, :, None] * X0
    return y.to(z.dtype), X


def s4d_linear_readout_naive(z, lam, beta, c, initial_state=None):
    """Reference: the per-step recurrence. Returns (y, final_state)."""
    B, T, H, Cz = z.shape
    cdtype = torch.complex128
    lam_, beta_ = lam.to(cdtype)[None, :, :, None], beta.to(cdtype)[None, :, :, None]
    X = (
        torch.zeros(B, H, lam.shape[1], Cz, dtype=cdtype)
        if initial_state is None
        else initial_state.to(cdtype)
    )
    ys = []
    for t in range(T):
        X = lam_ * X + beta_ * z[:, t, :, None, :].to(cdtype)
        ys.append(torch.einsum("hm,bhmc->bhc", c.to(cdtype), X).real)
    return torch.stack(ys, 1).to(z.dtype), X


def s4d_linear_step(
    z: torch.Tensor,
    lam: torch.Tensor,
    beta: torch.Tensor,
    c: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step. z: (B, H, Cz); state: (B, H, M, Cz) complex. Returns (y, new state)."""
    with torch.autocast(z.device.type, enabled=False):
        X = lam[None, :, :, None] * state + beta[None, :, :, None] * z[:, :, None, :].to(
            state.real.dtype
        )
        y = torch.einsum("hm,bhmc->bhc", c.to(X.dtype), X).real
    return y.to(z.dtype), X


__all__ = ["s4d_linear_readout", "s4d_linear_readout_naive", "s4d_linear_step"]
