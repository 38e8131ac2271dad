"""Gated linear attention in chunks of L tokens: O(T·L·(K+V)) work, one state pass per chunk.

Within a chunk with start state S_0 and cumulative log decays c_t = Σ_{r≤t} log α_r (per key
channel), the recurrence S_t = diag(α_t) S_{t−1} + k_t v_tᵀ unrolls to

    o_t = scale · [(q_t ⊙ exp(c_t))ᵀ S_0 + Σ_{s≤t} A[t, s] v_s],
    A[t, s] = Σ_k q_tk k_sk exp(Σ_{s<r≤t} log α_rk),
    S_L = exp(c_L) ⊙ S_0 + Σ_s (k_s ⊙ exp(Σ_{s<r≤L} log α_r)) v_sᵀ,

so the scores A of every chunk come at once and only the short pass across chunks is
sequential. Every exponent is a segment sum of log decays (Σ over its own terms, never a
difference of two long cumulative sums, never the exp of a positive number: each factor is
≤ 1, and a product underflows only where the decay it stands for does).

One decay per head (Mamba-2 / SSD, log_decay (B, T, H)): the decay factors out of the key dim
and A = (Q Kᵀ) ∘ Γ with the (L, L) pairwise decays Γ of the gated delta rule (chunking.py).

One decay per key channel (GLA, log_decay (B, T, H, K)): the decay stays inside the sum over
k, and the factorisation q_t exp(c_t) · k_s exp(−c_s) of the scores overflows for long chunks
and strong decays (exp(−c_s) ≈ e^1280 at L = 64, log α = −20). So A is built from sub-chunks of
SUB_CHUNK = 16 tokens (the GLA paper's secondary-level chunking): pairs within one
sub-chunk in the direct pairwise form (an (L, 16, K) decay tensor per chunk); a pair (t, s)
with s in an earlier sub-chunk j and t in sub-chunk i splits its exponent at sub-chunk i's
start, into Σ_{i's start ≤ r ≤ t} log α_r (the query's factor) and Σ_{s<r<i's start} log α_r
(the key's, one per target sub-chunk: an (L/16, L, K) tensor per chunk), both ≤ 0.

A reset at t (a document starts) cuts the S_0 path of the tokens from t on and every pair
across t, by masks, within the chunk; across chunks it reaches the state through exp(c_L)
(0 once a chunk holds a reset) and the keys before it (masked out of the state's update).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..chunking import blocks, chunk_masks, scalar_decays, segment_sums
from .naive import naive_core
from .validation import check_chunk_size, check_impl, prepare

SUB_CHUNK = 16  # tokens per sub-chunk of the per-channel scores


def _suffix_sums(g: torch.Tensor, dim: int) -> torch.Tensor:
    """Σ_{r>s} g_r along dim (exclusive, from the end): a reverse cumsum of the shifted terms."""
    g = g.movedim(dim, -1)
    shifted = F.pad(g[..., 1:], (0, 1))
    return shifted.flip(-1).cumsum(-1).flip(-1).movedim(-1, dim)


def _causal(n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    ones = torch.ones(n, n, dtype=torch.bool, device=device)
    return ones.tril(), ones.tril(-1)


def channel_scores(q: torch.Tensor, k: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """q, k, g: (..., L, K) -> A: (..., L, L), A[t, s] = Σ_k q_tk k_sk exp(Σ_{s<r≤t} g_rk) for
    s ≤ t and 0 above the diagonal, by sub-chunks of SUB_CHUNK tokens (the module's docstring).
    """
    L = q.shape[-2]
    c = min(SUB_CHUNK, L)
    n = -(-L // c)
    if n * c != L:  # zero tokens at the end: no keys, so no score reaches the real ones
        q, k, g = (F.pad(x, (0, 0, 0, n * c - L)) for x in (q, k, g))
    q, k, g = (x.unflatten(-2, (n, c)) for x in (q, k, g))  # (..., n, c, K)

    # Pairs within a sub-chunk: exp of the segment sums (..., n, c, c, K), ≤ 1 below the diagonal.
    causal_c, strict_c = _causal(c, q.device)
    Dd = segment_sums(g.transpose(-1, -2), strict_c).movedim(-3, -1)
    diag = torch.einsum("...ak,...abk,...bk->...ab", q, Dd.exp(), k)
    A = torch.where(causal_c, diag, 0)  # (..., n, c, c)
    if n == 1:
        return A[..., 0, :L, :L]

    # Pairs across sub-chunks j < i, the exponent split at sub-chunk i's start.
    _, strict_n = _causal(n, q.device)
    qf = q * g.cumsum(-2).exp()  # Σ from the sub-chunk's start to t (inclusive)
    tail = _suffix_sums(g, -2)  # Σ_{s<r} to the end of s's sub-chunk
    # Σ_{j<m<i} of the sub-chunks' totals: the segment sums Σ_{j<m≤i−1}, one row down.
    between = F.pad(segment_sums(g.sum(-2).transpose(-1, -2), strict_n), (0, 0, 1, 0))
    between = between[..., :-1, :].movedim(-3, -1)  # (..., n_i, n_j, K)
    kf = (between[..., :, :, None, :] + tail[..., None, :, :, :]).exp()  # (..., i, j, c, K)
    kf = torch.where(strict_n[:, :, None, None], kf, 0) * k[..., None, :, :, :]
    off = torch.einsum("...iak,...ijbk->...iajb", qf, kf)
    eye = torch.eye(n, dtype=torch.bool, device=q.device)[:, None, :, None]
    A = torch.where(eye, A[..., :, :, None, :], off)  # (..., n, c, n, c)
    return A.reshape(*A.shape[:-4], n * c, n * c)[..., :L, :L]


def chunked_core(q, k, v, log_decay, state, reset, scale: float, chunk_size: int):
    """The chunkwise form on checked inputs in the compute dtype; returns (o, S_T).

    Padded tokens (k = v = 0, log α = 0) leave the state as it is."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    L = min(chunk_size, T)
    N = -(-T // L)
    q, k, v = blocks(q * scale, N, L), blocks(k, N, L), blocks(v, N, L)
    g = blocks(log_decay, N, L)  # (B, H, N, L), or (B, H, N, L, K) per channel
    masks = chunk_masks(reset, N, L, q.device)

    if g.dim() == 4:  # one decay per head: Γ[t, s] and γ_t, (L, L) per chunk
        gam_pair, gam = scalar_decays(g, masks)
        A = (q @ k.transpose(-1, -2)) * gam_pair
        Qg = q * gam[..., None]
        Kd = k * gam_pair[..., -1, :, None]  # Γ[L, s] k_s
        gL = gam[..., -1, None, None]  # (B, H, N, 1, 1)
    else:
        A = torch.where(masks.pair, channel_scores(q, k, g), 0)
        gam = g.cumsum(-2).exp()  # exp(c_t) per channel
        if masks.fresh is not None:
            gam = torch.where(masks.fresh[..., None], gam, 0)
        Qg = q * gam
        last = masks.pair[..., -1, :, None]  # the keys in the chunk's last document
        Kd = k * torch.where(last, _suffix_sums(g, -2).exp(), 0)
        gL = gam[..., -1, :, None]  # (B, H, N, K, 1)

    intra = A @ v  # (B, H, N, L, V): every chunk at once
    KV = Kd.transpose(-1, -2) @ v  # (B, H, N, K, V): each chunk's write to the state
    S = state
    outs = []
    for n in range(N):
        outs.append(Qg[:, :, n] @ S)
        S = gL[:, :, n] * S + KV[:, :, n]
    o = (torch.stack(outs, 2) + intra).reshape(B, H, N * L, V)[:, :, :T]
    return o.movedim(1, 2), S


def gated_linear_attention_chunked(
    q, k, v, log_decay, *, scale=None, initial_state=None, reset=None, chunk_size=64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated linear attention in chunks of chunk_size tokens (arguments as
    gated_linear_attention)."""
    check_chunk_size(chunk_size)
    p = prepare(q, k, v, log_decay, scale, initial_state, reset)
    o, S = chunked_core(p.q, p.k, p.v, p.log_decay, p.state, p.reset, p.scale, chunk_size)
    return o.to(p.out_dtype), S


def gated_linear_attention(
    q,
    k,
    v,
    log_decay,
    *,
    scale=None,
    initial_state=None,
    reset=None,
    chunk_size=64,
    impl="chunked",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated linear attention (GLA, Yang, Wang, Shen, Panda & Kim 2023; with one decay per head,
    the recurrence of Mamba-2 / SSD, Dao & Gu 2024):

        S_t = diag(α_t) S_{t−1} + k_t v_tᵀ,    o_t = scale · S_tᵀ q_t,

    α_t = exp(log_decay_t), applied along the key dim.

    q, k: (B, T, H, K); v: (B, T, H, V); log_decay: (B, T, H, K) (one decay per key channel,
    GLA) or (B, T, H) (one per head, broadcast over K: Mamba-2 / SSD), entries <= 0; scale:
    default K**-0.5; initial_state: (B, H, K, V) or None (zeros); reset: (B, T) bool or None,
    True where a document starts (the state is zeroed before that token); chunk_size: tokens
    per chunk (impl="chunked"); impl: "chunked" (O(T) chunkwise form) or "naive" (the per-step
    loop).

    Half and bfloat16 inputs are computed in fp32. Returns o: (B, T, H, V) in q's dtype and
    the final state S_T: (B, H, K, V) in the compute dtype.
    """
    check_impl(impl)
    check_chunk_size(chunk_size)
    p = prepare(q, k, v, log_decay, scale, initial_state, reset)
    args = (p.q, p.k, p.v, p.log_decay, p.state, p.reset, p.scale)
    if impl == "naive":
        o, S = naive_core(*args)
    else:
        o, S = chunked_core(*args, chunk_size)
    return o.to(p.out_dtype), S
