"""The reference rungs (docs/design.md §8): the per-step complex recurrence (§1), written out
literally, in the paper's complex form (C, readout) and on the real-form contract (Ĝ,
interleaved state); the O(T²) closed form; T applications of the decode step."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from ..powers import complex_powers
from .decode import torch_step
from .layout import as_complex, as_interleaved
from .validation import State

if TYPE_CHECKING:
    from .api import Decays


def interdomain_attention_naive(
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
    """q, k: (B, T, H, R); v: (B, T, H, D); lam, beta: (H, M), or (B, T, H, M) per token;
    C: (H, M, M) complex.

    Per step: Xᵏ ← λ⊙Xᵏ + β⊗k̃_t, Xᵛ ← λ⊙Xᵛ + β⊗ṽ_t, U = C Xᵏ, Γ = C Xᵛ, a = U q_t,
    o_t = Re(Γᴴ a) ("conj") or Re(Γᵀ a) ("product"). Returns (o: (B, T, H, D), (Xk, Xv)).
    Computes in the complex dtype matching C; o has q's dtype. reset (B, T) bool: the state is
    zeroed before the positions where it is True.
    """
    B, T, H, R = q.shape
    D, M = v.shape[-1], lam.shape[-1]
    cdtype = C.dtype
    per_token = lam.dim() == 4
    lam_, beta_ = lam.to(cdtype)[..., None], beta.to(cdtype)[..., None]  # (H, M, 1)
    if initial_state is None:
        Xk = torch.zeros(B, H, M, R, dtype=cdtype, device=q.device)
        Xv = torch.zeros(B, H, M, D, dtype=cdtype, device=q.device)
    else:
        Xk, Xv = (s.to(cdtype) for s in initial_state)
    outs = []
    for t in range(T):
        if reset is not None:  # a select: a NaN in an earlier document never crosses
            new_doc = reset[:, t, None, None, None]
            Xk, Xv = torch.where(new_doc, 0, Xk), torch.where(new_doc, 0, Xv)
        lam_t, beta_t = (lam_[:, t], beta_[:, t]) if per_token else (lam_, beta_)
        Xk = lam_t * Xk + beta_t * k[:, t, :, None, :].to(cdtype)
        Xv = lam_t * Xv + beta_t * v[:, t, :, None, :].to(cdtype)
        U, Gam = C @ Xk, C @ Xv  # (B, H, M, R), (B, H, M, D)
        a = U @ q[:, t, :, :, None].to(cdtype)  # (B, H, M, 1)
        Gt = Gam.conj().mT if readout == "conj" else Gam.mT
        outs.append((Gt @ a).squeeze(-1).real)
    return torch.stack(outs, dim=1).to(q.dtype), (Xk, Xv)


def interdomain_attention_naive_real(q, k, v, decays: Decays, G_hat, Z0, reset=None):
    """The same recurrence on the real-form contract, step by step (the op's impl "naive").

    q, k: (B, T, H, R); v: (B, T, H, D); decays: SharedDecays or TokenDecays; G_hat
    (H, 2M, 2M); Z0 (B, H, R+D, 2M) interleaved, in the compute dtype. With the state seen as
    complex X (B, H, R+D, M) and z_t = [k_t; v_t]: X ← λ_t ⊙ X + z_t ⊗ β_t, p̂ = X̂ᵏᵀ q_t,
    o_t = X̂ᵛ Ĝ p̂. Returns (o (B, T, H, D) in q's dtype, final state like Z0).
    """
    rdtype, R = Z0.dtype, q.shape[-1]
    G = G_hat.to(rdtype)
    X = as_complex(Z0)  # (B, H, R+D, M)
    outs = []
    for t in range(q.shape[1]):
        if reset is not None:  # a select: a NaN in an earlier document never crosses
            X = torch.where(reset[:, t, None, None, None], 0, X)
        lam, beta = (torch.view_as_complex(x.to(rdtype).contiguous()) for x in decays.at(t))
        lam, beta = lam[..., None, :], beta[..., None, :]  # (.., H, 1, M)
        z = torch.cat([k[:, t], v[:, t]], dim=-1).to(rdtype)[..., None]  # (B, H, R+D, 1)
        X = lam * X + beta * z
        Z = as_interleaved(X)
        p = torch.einsum("bhrj,bhr->bhj", Z[:, :, :R], q[:, t].to(rdtype))
        w = torch.einsum("hij,bhj->bhi", G, p)
        outs.append(torch.einsum("bhdi,bhi->bhd", Z[:, :, R:], w))
    return torch.stack(outs, dim=1).to(q.dtype), as_interleaved(X)


# --- the O(T²) closed form ---
# Oracle: the attention-like O(T²) closed form (docs/design.md §1), for small T only.
#
# With Λ(s, t] = Π_{s<r≤t} λ_r (λ^{t-s} for shared decays) and g[t, s] = C (β_s ⊙ Λ(s, t])
# (zero for s > t):
#   a_t   = Σ_s g[t, s] (q_t · k_s) + C(Λ(-1, t] ⊙ X0ᵏ q_t)
#   K[t,s'] = Re(g[t, s']ᴴ a_t)   (conj)   or   Re(g[t, s']ᵀ a_t)   (product)
#   o_t   = Σ_{s'} K[t, s'] v_{s'} + Re((C(Λ(-1, t] ⊙ X0ᵛ))ᴴ a_t)   (ᵀ for product)


class DecayFactors(NamedTuple):
    """Decay factors with a leading batch dim Bd (1 for shared decays, B for per-token ones)."""

    pair: torch.Tensor  # (Bd, H, T, T, M): β_s Λ(s, t] for s ≤ t, else 0
    from_start: torch.Tensor  # (Bd, H, T, M): Λ(-1, t]
    to_end: torch.Tensor  # (Bd, H, T, M): β_s Λ(s, T-1]
    total: torch.Tensor  # (Bd, H, M): Λ(-1, T-1]


def decay_factors(lam: torch.Tensor, beta: torch.Tensor, T: int) -> DecayFactors:
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
    pair = torch.where(causal, pair, torch.zeros_like(pair))
    return DecayFactors(pair, from_start, to_end, total)


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


def interdomain_attention_closed_form_real(q, k, v, decays: Decays, G_hat, Z0, reset=None):
    """The closed form on the real-form contract (the op's impl "closed_form"): with P̂(t, s)
    the interleaved β_s Λ(s, t] and X̂0(t) = Λ(-1, t] ⊙ X0 (rows R key, D value channels),
      b_t = Ĝ (Σ_s (q_t · k_s) P̂(t, s) + X̂0ᵏ(t)ᵀ q_t),
      o_t = Σ_s (P̂(t, s) · b_t) v_s + X̂0ᵛ(t) b_t,
    pairs across a document start cut, X0 reaching only the first document. decays:
    SharedDecays or TokenDecays; G_hat (H, 2M, 2M); Z0 (B, H, R+D, 2M) in the compute dtype.
    Returns (o (B, T, H, D) in q's dtype, final state like Z0)."""
    B, T, H, R = q.shape
    rdtype = Z0.dtype
    lam, beta = (torch.view_as_complex(x.to(rdtype).contiguous()) for x in decays)
    dec = decay_factors(lam, beta, T)
    P = torch.view_as_real(dec.pair).flatten(-2)  # (Bd, H, T, T, 2M)
    qc, kc, vc = q.to(rdtype), k.to(rdtype), v.to(rdtype)
    doc = torch.zeros(B, T, dtype=torch.long, device=q.device)
    if reset is not None:
        doc = reset.long().cumsum(1)  # document index of every position
    same = (doc[:, :, None] == doc[:, None, :])[:, None].to(rdtype)  # (B, 1, T, T)
    first = (doc == 0)[:, None, :, None, None].to(rdtype)  # (B, 1, T, 1, 1)
    X0 = as_complex(Z0)  # (B, H, R+D, M)
    from_X0 = first * as_interleaved(dec.from_start[:, :, :, None, :] * X0[:, :, None])
    scores = torch.einsum("bthr,bshr->bhts", qc, kc) * same  # (B, H, T, T)
    a = torch.einsum("bhts,bhtsj->bhtj", scores, P.expand(B, -1, -1, -1, -1))
    a = a + torch.einsum("bhtrj,bthr->bhtj", from_X0[:, :, :, :R], qc)
    b = torch.einsum("hij,bhtj->bhti", G_hat.to(rdtype), a)
    K = torch.einsum("bhtsj,bhtj->bhts", P.expand(B, -1, -1, -1, -1), b) * same
    o = torch.einsum("bhts,bshd->bthd", K, vc)
    o = o + torch.einsum("bhtdj,bhtj->bthd", from_X0[:, :, :, R:], b)
    # Final state: X_T = Λ(-1, T-1] X0 (first document only) + Σ_s β_s Λ(s, T-1] z_s (last one)
    last = (doc == doc[:, -1:]).to(rdtype)[..., None, None]  # (B, T, 1, 1)
    z = (torch.cat([kc, vc], -1) * last).to(dec.to_end.dtype)  # (B, T, H, R+D)
    X = torch.einsum("bhsm,bshc->bhcm", dec.to_end.expand(B, -1, -1, -1), z)
    X = X + dec.total[:, :, None, :] * (doc[:, -1] == 0)[:, None, None, None] * X0
    return o.to(q.dtype), as_interleaved(X)


# --- T decode steps ---
# The op's impl "recurrent": T applications of the decode step (the code that decodes), over a
# whole sequence.


def interdomain_attention_recurrent(q, k, v, decays: Decays, G_hat, Z0, reset=None):
    """q, k: (B, T, H, R); v: (B, T, H, D); decays: SharedDecays or TokenDecays; G_hat
    (H, 2M, 2M); Z0 (B, H, R+D, 2M) in the compute dtype; reset (B, T) bool or None.
    Returns (o (B, T, H, D) in q's dtype, final state like Z0)."""
    Z, outs = Z0, []
    for t in range(q.shape[1]):
        if reset is not None:  # a select, not a product: 0·NaN would carry a NaN across
            Z = torch.where(reset[:, t, None, None, None], 0, Z)
        lam_t, beta_t = decays.at(t)
        o_t, Z = torch_step(q[:, t], k[:, t], v[:, t], lam_t, beta_t, G_hat, Z)
        outs.append(o_t)
    return torch.stack(outs, dim=1).to(q.dtype), Z
