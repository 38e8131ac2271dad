"""References: the per-step complex recurrence (docs/design.md §1), written out literally,
in the paper's complex form (C, readout) and on the real-form contract (Ĝ, interleaved state)."""

from __future__ import annotations

import torch

from .decay_values import Decays
from .realform import as_complex, as_interleaved
from .validation import State


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
