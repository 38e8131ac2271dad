"""The delta-rule Interdomain recurrence as a literal per-step loop: the reference, and the
decode step. Per head, with the state Z = [Zᵏ; Zᵛ] (R+D channels × 2M, interleaved modes):

    û_t = Ĝ Zᵏ_{t−1}ᵀ k_t                 (the key's address in the modes)
    v̂_t = Zᵛ_{t−1} û_t                    (what the state returns for k_t)
    e_t = v_t − η_t v̂_t                   (the value written: the retrieval error when η = 1)
    Z_t = λ ⊙ Z_{t−1} + β ⊗ [k_t; e_t],   o_t = Zᵛ_t Ĝ Zᵏ_tᵀ q_t

(docs/research/interdomain_delta.md). With η = 0 it is ``interdomain_attention``.
"""

from __future__ import annotations

import torch

from ..interdomain.decode import torch_step
from .validation import prepare


def interdomain_delta_step(q, k, v, eta, lam_ri, beta_ri, G_hat, Z):
    """One token of every row, in Z's dtype: q, k (B, H, R); v (B, H, D); eta (B, H); lam_ri,
    beta_ri (H, M, 2); G_hat (H, 2M, 2M); Z (B, H, R+D, 2M). Returns (o (B, H, D) in q's
    dtype, the next Z): the erase, then ``interdomain_decode_step``'s torch step."""
    R, dtype = k.shape[-1], Z.dtype
    addr = torch.einsum("hij,bhrj,bhr->bhi", G_hat.to(dtype), Z[..., :R, :], k.to(dtype))
    retrieved = torch.einsum("bhdi,bhi->bhd", Z[..., R:, :], addr)
    e = v.to(dtype) - eta.to(dtype)[..., None] * retrieved
    return torch_step(q, k, e, lam_ri, beta_ri, G_hat, Z)


def naive_core(q, k, v, eta, lam_ri, beta_ri, G_hat, Z, reset):
    """The loop on checked inputs in the compute dtype; returns (o, Z_T)."""
    outs = []
    for t in range(q.shape[1]):
        if reset is not None:  # a select: a NaN in an earlier document never crosses
            Z = torch.where(reset[:, t, None, None, None], 0, Z)
        tok = (x[:, t] for x in (q, k, v, eta))
        o, Z = interdomain_delta_step(*tok, lam_ri, beta_ri, G_hat, Z)
        outs.append(o)
    return torch.stack(outs, 1), Z


def interdomain_delta_naive(
    q, k, v, eta, lam_ri, beta_ri, G_hat, *, initial_state=None, reset=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence one token at a time (arguments as ``interdomain_delta``)."""
    p = prepare(q, k, v, eta, lam_ri, beta_ri, G_hat, initial_state, reset)
    o, Z = naive_core(p.q, p.k, p.v, p.eta, p.lam_ri, p.beta_ri, p.G_hat, p.state, p.reset)
    return o.to(p.out_dtype), Z
