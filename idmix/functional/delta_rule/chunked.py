"""The gated delta rule in chunks of L tokens: O(T·L·(K+V)) work, one state pass per chunk.

Within a chunk with start state S_0, cumulative decays γ_t = Π_{r≤t} α_r and pairwise decays
Γ[t, s] = γ_t/γ_s (s ≤ t), the recurrence S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ
unrolls to S_t = γ_t S_0 + Σ_{s≤t} Γ[t, s] k_s u_sᵀ, where the pseudo-values u solve the
unit-lower-triangular system (the WY / UT form of DeltaNet, Yang et al. 2024)

    (I + diag(β) A) u = diag(β) (V − diag(γ) K S_0),    A[t, s] = Γ[t, s] k_tᵀ k_s  (s < t).

So u = U − W S_0 with U = T⁻¹ diag(β) V and W = T⁻¹ diag(β γ) K independent of S_0: they are
solved for every chunk at once, and only the short pass across chunks is sequential:

    o = scale · (diag(γ) Q S_0 + (Q Kᵀ ∘ Γ) u),    S_L = γ_L S_0 + Σ_s Γ[L, s] k_s u_sᵀ.

The decays come from segment sums of log_decay (Σ_{s<r≤t}, never a difference of two long
cumulative sums, never the exp of a positive number). A reset at t (a document starts) cuts
the S_0 path of the tokens from t on and every pair across t, by masks, within the chunk;
across chunks it reaches the state through γ_L (0 once a chunk holds a reset).
"""

from __future__ import annotations

import torch

from ..chunking import blocks, chunk_masks, scalar_decays
from .naive import naive_core
from .validation import check_chunk_size, check_impl, prepare


def chunked_core(q, k, v, beta, log_decay, state, reset, scale: float, chunk_size: int):
    """The chunkwise form on checked inputs in the compute dtype; returns (o, S_T).

    Padded tokens (k = v = 0, β = 0, log α = 0) leave the state as it is."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    L = min(chunk_size, T)
    N = -(-T // L)
    q, k, v = blocks(q * scale, N, L), blocks(k, N, L), blocks(v, N, L)
    b, g = blocks(beta, N, L), blocks(log_decay, N, L)  # (B, H, N, L)

    masks = chunk_masks(reset, N, L, q.device)
    strict = masks.strict
    # Γ[t, s] (s ≤ t in one document) and γ_t from segment sums of log α (chunking.py).
    gam_pair, gam = scalar_decays(g, masks)

    kk = k @ k.transpose(-1, -2)
    A = torch.where(strict, b[..., :, None] * gam_pair * kk, 0)
    rhs = torch.cat([b[..., None] * v, (b * gam)[..., None] * k], -1)
    # The diagonal of A is zero and unitriangular=True reads it as ones: (I + diag(β) A).
    UW = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    U, W = UW[..., :V], UW[..., V:]

    P = (q @ k.transpose(-1, -2)) * gam_pair  # causal, within a document
    Qg = q * gam[..., None]
    Kd = (k * gam_pair[..., -1, :, None]).transpose(-1, -2)  # (B, H, N, K, L): Γ[L, s] k_s
    gL = gam[..., -1, None, None]  # (B, H, N, 1, 1)

    S = state
    outs = []
    for n in range(N):
        u = U[:, :, n] - W[:, :, n] @ S
        outs.append(Qg[:, :, n] @ S + P[:, :, n] @ u)
        S = gL[:, :, n] * S + Kd[:, :, n] @ u
    o = torch.stack(outs, 2).reshape(B, H, N * L, V)[:, :, :T]
    return o.movedim(1, 2), S


def gated_delta_rule_chunked(
    q, k, v, beta, log_decay, *, scale=None, initial_state=None, reset=None, chunk_size=64
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule in chunks of chunk_size tokens (arguments as gated_delta_rule)."""
    check_chunk_size(chunk_size)
    p = prepare(q, k, v, beta, log_decay, scale, initial_state, reset)
    o, S = chunked_core(p.q, p.k, p.v, p.beta, p.log_decay, p.state, p.reset, p.scale, chunk_size)
    return o.to(p.out_dtype), S


def gated_delta_rule(
    q,
    k,
    v,
    beta,
    log_decay,
    *,
    scale=None,
    initial_state=None,
    reset=None,
    chunk_size=64,
    impl="chunked",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule (Gated DeltaNet, Yang, Kautz & Hatamizadeh 2024):

        S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,    o_t = scale · S_tᵀ q_t,

    α_t = exp(log_decay_t), one scalar per head and token.

    q, k: (B, T, H, K); v: (B, T, H, V); beta: (B, T, H) (the writing strength, typically in
    (0, 1)); log_decay: (B, T, H), entries <= 0; scale: default K**-0.5; initial_state:
    (B, H, K, V) or None (zeros); reset: (B, T) bool or None, True where a document starts
    (the state is zeroed before that token); chunk_size: tokens per chunk (impl="chunked");
    impl: "chunked" (O(T) chunkwise form) or "naive" (the per-step loop).

    Half and bfloat16 inputs are computed in fp32. Returns o: (B, T, H, V) in q's dtype and
    the final state S_T: (B, H, K, V) in the compute dtype.
    """
    check_impl(impl)
    check_chunk_size(chunk_size)
    p = prepare(q, k, v, beta, log_decay, scale, initial_state, reset)
    args = (p.q, p.k, p.v, p.beta, p.log_decay, p.state, p.reset, p.scale)
    if impl == "naive":
        o, S = naive_core(*args)
    else:
        o, S = chunked_core(*args, chunk_size)
    return o.to(p.out_dtype), S
