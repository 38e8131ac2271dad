"""Oracle: the attention-like O(T²) closed form (docs/design.md §1), for small T only.

With g[t, s] = C (β ⊙ λ^{t-s}) (zero for s > t):
  a_t   = Σ_s g[t, s] (q_t · k_s) + C(λ^{t+1} ⊙ X0ᵏ q_t)
  K[t,s'] = Re(g[t, s']ᴴ a_t)   (conj)   or   Re(g[t, s']ᵀ a_t)   (product)
  o_t   = Σ_{s'} K[t, s'] v_{s'} + Re((C(λ^{t+1} ⊙ X0ᵛ))ᴴ a_t)   (ᵀ for product)
"""

from __future__ import annotations

import torch

from ..powers import complex_powers
from .validation import State


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
    lam_, beta_ = lam.to(cdtype), beta.to(cdtype)
    idx = torch.arange(T, device=q.device)
    lag = idx[:, None] - idx[None, :]  # (T, T)
    causal = lag >= 0
    powers = complex_powers(lam_, lag.clamp_min(0))  # (H, T, T, M)
    powers = torch.where(causal[None, :, :, None], powers, torch.zeros_like(powers))
    g = torch.einsum("hmn,htsn->htsm", C, beta_[:, None, None, :] * powers)  # (H, T, T, M)
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
    a = torch.einsum("bhts,htsm->bhtm", scores.to(cdtype), g)  # (B, H, T, M)
    lam_pow = complex_powers(lam_, idx + 1)  # (H, T, M)
    if initial_state is not None:
        X0k, X0v = (s.to(cdtype) for s in initial_state)
        X0k_q = torch.einsum("bhmr,bthr->bhtm", X0k, qc.to(cdtype))
        a = a + first * torch.einsum("hmn,bhtn->bhtm", C, lam_pow[None] * X0k_q)
    g_read = g.conj() if readout == "conj" else g
    K = torch.einsum("htsm,bhtm->bhts", g_read, a).real * same
    o = torch.einsum("bhts,bshd->bthd", K, vc)
    if initial_state is not None:
        Gam0 = torch.einsum("hmn,htn,bhnd->bhtmd", C, lam_pow, X0v)  # (B, H, T, M, D)
        Gam0 = Gam0.conj() if readout == "conj" else Gam0
        o = o + (first * torch.einsum("bhtmd,bhtm->bhtd", Gam0, a).real).transpose(1, 2)
    # Final state: X_T = λ^T X0 + Σ_s β λ^{T-1-s} z_s.
    w_end = beta_[:, None, :] * complex_powers(lam_, T - 1 - idx)
    last = (doc == doc[:, -1:]).to(rdtype)[..., None, None]  # (B, T, 1, 1): in the last sequence
    Xk = torch.einsum("hsm,bshr->bhmr", w_end, (kc * last).to(cdtype))
    Xv = torch.einsum("hsm,bshd->bhmd", w_end, (vc * last).to(cdtype))
    if initial_state is not None:
        lam_T = complex_powers(lam_, idx.new_tensor(T))[None, :, :, None]
        lam_T = lam_T * (doc[:, -1] == 0)[:, None, None, None]
        Xk, Xv = Xk + lam_T * X0k, Xv + lam_T * X0v
    return o.to(q.dtype), (Xk, Xv)
