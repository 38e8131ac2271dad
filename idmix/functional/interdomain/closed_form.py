"""Oracle: the attention-like O(T²) closed form (docs/design.md §1), for small T only.

With Λ(s, t] = Π_{s<r≤t} λ_r (λ^{t-s} for shared decays) and g[t, s] = C (β_s ⊙ Λ(s, t])
(zero for s > t):
  a_t   = Σ_s g[t, s] (q_t · k_s) + C(Λ(-1, t] ⊙ X0ᵏ q_t)
  K[t,s'] = Re(g[t, s']ᴴ a_t)   (conj)   or   Re(g[t, s']ᵀ a_t)   (product)
  o_t   = Σ_{s'} K[t, s'] v_{s'} + Re((C(Λ(-1, t] ⊙ X0ᵛ))ᴴ a_t)   (ᵀ for product)
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..powers import complex_powers
from .validation import State


class Decays(NamedTuple):
    """Decay factors with a leading batch dim Bd (1 for shared decays, B for per-token ones)."""

    pair: torch.Tensor  # (Bd, H, T, T, M): β_s Λ(s, t] for s ≤ t, else 0
    from_start: torch.Tensor  # (Bd, H, T, M): Λ(-1, t]
    to_end: torch.Tensor  # (Bd, H, T, M): β_s Λ(s, T-1]
    total: torch.Tensor  # (Bd, H, M): Λ(-1, T-1]


def decay_factors(lam: torch.Tensor, beta: torch.Tensor, T: int) -> Decays:
    """lam, beta: (H, M) (shared: powers λⁿ) or (B, T, H, M) (per token: exp of differences of
    cumulative log λ, in the given complex dtype)."""
    idx = torch.arange(T, device=lam.device)
    lag = idx[:, None] - idx[None, :]  # (T, T)
    causal = (lag >= 0)[None, None, :, :, None]
    if lam.dim() == 2:
        pair = complex_powers(lam, lag.clamp_min(0))[None] * beta[None, :, None, None, :]
        from_start = complex_powers(lam, idx + 1)[None]
        to_end = beta[None, :, None, :] * complex_powers(lam, T - 1 - idx)[None]
        total = complex_powers(lam, idx.new_tensor(T))[None]
    else:
        cum = torch.log(lam).cumsum(1).movedim(1, 2)  # (B, H, T, M)
        b = beta.movedim(1, 2)
        pair = torch.exp(torch.where(causal, cum[:, :, :, None] - cum[:, :, None], 0))
        pair = pair * b[:, :, None, :, :]
        from_start, total = torch.exp(cum), torch.exp(cum[:, :, -1])
        to_end = b * torch.exp(cum[:, :, -1:] - cum)
    return Decays(torch.where(causal, pair, torch.zeros_like(pair)), from_start, to_end, total)


def interdomain_attention_closed_form(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    beta: torch.Tensor,
    C: torch.Tensor,
    readout: str = "conj",
    initial_state: State | None = None,
    reset: torch.Tensor | None = None,
) -> tuple[torch.Tensor, State]:
    """Same contract as ``interdomain_attention_naive``; memory O(H·T²·M). With reset, pairs
    (t, s) in different sequences are masked and the initial state reaches only the first."""
    B, T, H, R = q.shape
    cdtype = C.dtype
    rdtype = C.real.dtype
    dec = decay_factors(lam.to(cdtype), beta.to(cdtype), T)
    g = torch.einsum("hmn,bhtsn->bhtsm", C, dec.pair)  # (Bd, H, T, T, M)
    qc, kc, vc = q.to(rdtype), k.to(rdtype), v.to(rdtype)
    scores = torch.einsum("bthr,bshr->bhts", qc, kc)  # (B, H, T, T)
    B = q.shape[0]
    doc = (
        torch.zeros(B, T, dtype=torch.long, device=q.device)
        if reset is None
        else reset.long().cumsum(1)
    )  # sequence index of every position
    same = (doc[:, :, None] == doc[:, None, :])[:, None]  # (B, 1, T, T)
    first = (doc == 0)[:, None, :, None]  # (B, 1, T, 1): still in the initial state's sequence
    scores = scores * same
    a = torch.einsum("bhts,bhtsm->bhtm", scores.to(cdtype), g)  # (B, H, T, M)
    lam_pow = dec.from_start  # (Bd, H, T, M)
    if initial_state is not None:
        X0k, X0v = (s.to(cdtype) for s in initial_state)
        X0k_q = torch.einsum("bhmr,bthr->bhtm", X0k, qc.to(cdtype))
        a = a + first * torch.einsum("hmn,bhtn->bhtm", C, lam_pow * X0k_q)
    g_read = g.conj() if readout == "conj" else g
    K = torch.einsum("bhtsm,bhtm->bhts", g_read, a).real * same
    o = torch.einsum("bhts,bshd->bthd", K, vc)
    if initial_state is not None:
        Gam0 = torch.einsum("hmn,bhtn,bhnd->bhtmd", C, lam_pow, X0v)  # (B, H, T, M, D)
        Gam0 = Gam0.conj() if readout == "conj" else Gam0
        o = o + (first * torch.einsum("bhtmd,bhtm->bhtd", Gam0, a).real).transpose(1, 2)
    # Final state: X_T = λ^T X0 + Σ_s β λ^{T-1-s} z_s.
    w_end = dec.to_end  # (Bd, H, T, M)
    last = (doc == doc[:, -1:]).to(rdtype)[..., None, None]  # (B, T, 1, 1): in the last sequence
    Xk = torch.einsum("bhsm,bshr->bhmr", w_end, (kc * last).to(cdtype))
    Xv = torch.einsum("bhsm,bshd->bhmd", w_end, (vc * last).to(cdtype))
    if initial_state is not None:
        lam_T = dec.total[..., None] * (doc[:, -1] == 0)[:, None, None, None]
        Xk, Xv = Xk + lam_T * X0k, Xv + lam_T * X0v
    return o.to(q.dtype), (Xk, Xv)
