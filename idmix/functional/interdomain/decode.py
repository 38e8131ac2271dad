"""Single-token decode step (DESIGN.md §4): O(M(R+D) + M²) per head, real arithmetic inside."""

from __future__ import annotations

import torch

from .validation import State


def interdomain_decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    beta: torch.Tensor,
    G_hat: torch.Tensor,
    state: State,
) -> tuple[torch.Tensor, State]:
    """Advance the state by one position and read it out.

    q, k: (B, H, R); v: (B, H, D); lam, beta: (H, M) complex; G_hat: (H, 2M, 2M) real
    (``readout_gram(C, readout)``, computed once per set of weights, not per step);
    state: (Xk: (B, H, M, R), Xv: (B, H, M, D)) complex. Returns (o: (B, H, D), new state).
    Steps: X ← λ⊙X + β⊗z; p = Xᵏ q; w̃ = Ĝ p̂; o = Re(Xᵛ)ᵀ w̃_re + Im(Xᵛ)ᵀ w̃_im.
    """
    with torch.autocast(q.device.type, enabled=False):
        return _step(q, k, v, lam, beta, G_hat, state)


def _step(q, k, v, lam, beta, G_hat, state):
    Xk, Xv = state
    rdtype = G_hat.dtype
    lr, li = lam.real.to(rdtype)[..., None], lam.imag.to(rdtype)[..., None]  # (H, M, 1)
    br, bi = beta.real.to(rdtype)[..., None], beta.imag.to(rdtype)[..., None]
    q, k, v = q.to(rdtype), k.to(rdtype), v.to(rdtype)

    def update(X: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        Xr, Xi = X.real.to(rdtype), X.imag.to(rdtype)
        z = z[:, :, None, :]
        return lr * Xr - li * Xi + br * z, lr * Xi + li * Xr + bi * z

    Kr, Ki = update(Xk, k)
    Vr, Vi = update(Xv, v)
    p = torch.cat([Kr @ q[..., None], Ki @ q[..., None]], dim=-2)  # (B, H, 2M, 1)
    w = G_hat @ p  # (B, H, 2M, 1)
    M = Kr.shape[-2]
    o = (Vr.mT @ w[..., :M, :] + Vi.mT @ w[..., M:, :]).squeeze(-1)
    return o, (torch.complex(Kr, Ki), torch.complex(Vr, Vi))
