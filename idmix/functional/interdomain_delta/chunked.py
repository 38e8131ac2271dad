"""The delta-rule Interdomain op in chunks of L tokens: O(T·L·(R + D + M)) work, two short
passes across chunks (docs/research/interdomain_delta.md derives it).

Tokens t = 0..L−1 of a chunk with start state Z_0 = [Zᵏ_0; Zᵛ_0]; D_n(x) multiplies the
interleaved modes of x by λⁿ (Dₙᵀ by conj(λ)ⁿ), b̂_n = λⁿβ interleaved. The key states do not
depend on the values, so a first pass across chunks gives every Zᵏ_0, and then

    û_t = Ĝ (D_t(Zᵏ_0ᵀ k_t) + Σ_{s<t} (k_s·k_t) b̂_{t−1−s})          (addresses, Ĝ Zᵏ_{t−1}ᵀ k_t)
    p̂_t = D_{t+1}(Zᵏ_0ᵀ q_t) + Σ_{s≤t} (k_s·q_t) b̂_{t−s},  ŵ_t = Ĝ p̂_t   (the query's read)

The values written, e_t = v_t − η_t Zᵛ_{t−1} û_t, solve the unit-lower-triangular system

    (I + diag(η) A) e = V − diag(η) Ũ Zᵛ_0ᵀ,   A[t, s] = b̂_{t−1−s}·û_t (s < t),  Ũ_t = D_tᵀ û_t,

so e = E − W Zᵛ_0ᵀ with E and W solved for every chunk at once; the second pass across chunks
carries Zᵛ:

    o = W̃ Zᵛ_0ᵀ + K e,   K[t, s] = b̂_{t−s}·ŵ_t (s ≤ t),   W̃_t = D_{t+1}ᵀ ŵ_t,
    Zᵛ_end = D_len(Zᵛ_0) + Σ_s e_s b̂_{len−1−s}ᵀ    (len: the chunk's real tokens).

Every decay is a power λⁿ with n ≥ 0: strong decays underflow to zero, nothing overflows. A
reset at t cuts the pairs across it and the Z_0 terms from t on, by the chunk masks; the end
state keeps only the chunk's last document. Padded tokens (k = v = 0, η = 0) write nothing.
Unlike ``interdomain_attention``, a NaN or inf in one document of a packed row is not confined
to it: the masks multiply by zero (in the solve and the state products) where that op selects.
"""

from __future__ import annotations

import torch

from ..chunking import blocks, chunk_masks
from ..interdomain.numerics import cmul, cmul_conj
from ..powers import polar, powers
from .naive import naive_core
from .validation import check_chunk_size, check_impl, prepare


def _chunk_tables(lam_ri, beta_ri, T: int, L: int, N: int):
    """The decay tables of N chunks of L tokens, interleaved (…, 2M): λⁿ, n = 0..L,
    (1, H, 1, L+1, 2M); b̂ at lags t−s and t−1−s (H, L, L, 2M); b̂ at each token's lag to its
    chunk's end (1, H, N, L, 2M); λ^len per chunk (1, H, N, 1, 2M)."""
    log_mag, theta = polar(lam_ri)  # (H, M)
    dev = lam_ri.device

    def interleaved(n):  # λⁿ for exponents n (S,): (H, S, 2M)
        return torch.stack(powers(log_mag, theta, n), -1).flatten(-2)

    lam_pow = interleaved(torch.arange(L + 1, device=dev))  # (H, L+1, 2M)
    b = cmul(lam_pow[:, :L], beta_ri.flatten(-2)[:, None])  # (H, L, 2M): b̂_0..L−1
    idx = torch.arange(L, device=dev)
    lag = idx[:, None] - idx[None, :]
    pair, shifted = b[:, lag.clamp_min(0)], b[:, (lag - 1).clamp_min(0)]
    length = (T - L * torch.arange(N, device=dev)).clamp_max(L)  # (N,)
    end = b[:, (length[:, None] - 1 - idx).clamp_min(0)]  # (H, N, L, 2M)
    return lam_pow[None, :, None], pair, shifted, end[None], interleaved(length)[None, ..., None, :]


def chunked_core(q, k, v, eta, lam_ri, beta_ri, G_hat, Z0, reset, chunk_size: int):
    """The chunkwise form on checked inputs in the compute dtype; returns (o, Z_T)."""
    B, T, H, R = q.shape
    L = min(chunk_size, T)
    N = -(-T // L)
    q, k, v, eta = (blocks(x, N, L) for x in (q, k, v, eta))  # (B, H, N, L, ·)
    lam_pow, pair, shifted, end, lam_len = _chunk_tables(lam_ri, beta_ri, T, L, N)
    masks = chunk_masks(reset, N, L, q.device)
    causal = masks.pair.expand(*masks.pair.shape[:-2] or (1, 1, N), L, L)  # (·, 1, N, L, L)
    strict = causal & masks.strict
    seen = masks.fresh if masks.fresh is not None else q.new_ones(1, 1, N, L, dtype=torch.bool)
    fresh = seen[..., None].to(q.dtype)  # (·, 1, N, L, 1): the tokens that still see Z_0
    keep = fresh[..., -1:, :]  # (·, 1, N, 1, 1): no document starts in the chunk
    last = causal[..., -1, :, None].to(q.dtype)  # the tokens in the chunk's last document
    gram = lambda x: torch.einsum("hij,bhnlj->bhnli", G_hat, x)  # noqa: E731

    # pass 1 across chunks: the key states at each chunk's start
    Zk, starts = Z0[..., :R, :], []
    for n in range(N):
        starts.append(Zk)
        Zk = keep[:, :, n] * cmul(lam_len[:, :, n], Zk) + torch.einsum(
            "bhsr,hsj->bhrj", k[:, :, n] * last[:, :, n], end[0, :, n]
        )
    Zk0 = torch.stack(starts, 2)  # (B, H, N, R, 2M)

    def read(x, table, mask, lag0: int):  # Ĝ times the key state before/at each token, read by x
        scores = torch.where(mask, x @ k.mT, 0)  # (B, H, N, L, L)
        start = cmul(lam_pow[..., lag0 : lag0 + L, :], x @ Zk0)
        return gram(torch.einsum("bhnts,htsj->bhntj", scores, table) + fresh * start)

    addr, w = read(k, shifted, strict, 0), read(q, pair, causal, 1)
    A = torch.where(strict, torch.einsum("bhntj,htsj->bhnts", addr, shifted), 0)
    Kmat = torch.where(causal, torch.einsum("bhntj,htsj->bhnts", w, pair), 0)
    addr0 = fresh * cmul_conj(lam_pow[..., :L, :], addr)
    w0 = fresh * cmul_conj(lam_pow[..., 1:, :], w)
    rhs = torch.cat((v, eta[..., None] * addr0), -1)
    # A's diagonal is zero and unitriangular=True reads it as ones: I + diag(η) A.
    EW = torch.linalg.solve_triangular(eta[..., None] * A, rhs, upper=False, unitriangular=True)
    E, W = EW[..., : v.shape[-1]], EW[..., v.shape[-1] :]

    # pass 2 across chunks: the value states, the errors and the outputs
    Zv, outs = Z0[..., R:, :], []
    for n in range(N):
        e = E[:, :, n] - W[:, :, n] @ Zv.mT  # (B, H, L, D)
        outs.append(w0[:, :, n] @ Zv.mT + Kmat[:, :, n] @ e)
        Zv = keep[:, :, n] * cmul(lam_len[:, :, n], Zv) + torch.einsum(
            "bhsd,hsj->bhdj", e * last[:, :, n], end[0, :, n]
        )
    o = torch.stack(outs, 2).flatten(2, 3)[:, :, :T].movedim(1, 2)
    return o, torch.cat((Zk, Zv), -2)


def interdomain_delta(
    q, k, v, eta, lam_ri, beta_ri, G_hat, *, initial_state=None, output_final_state=False,
    reset=None, chunk_size=64, impl="chunked",
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """Interdomain attention with a delta-rule erase in the value modes (``naive``'s
    docstring has the recurrence; docs/research/interdomain_delta.md the design).

    q, k: (B, T, H, R); v: (B, T, H, D); eta: (B, T, H), the erase strength (η = 0:
    ``interdomain_attention``; η = 1: the value written is the retrieval error); lam_ri,
    beta_ri: (H, M, 2) shared decays [re, im]; G_hat: (H, 2M, 2M) as ``interdomain_attention``'s
    real form; initial_state: (B, H, R+D, 2M) interleaved, or None (zeros); reset: (B, T) bool
    or None, True where a document starts; chunk_size: tokens per chunk (impl="chunked"); impl:
    "chunked" (O(T)) or "naive" (the per-step loop). Computes in fp32 (fp64 for fp64 inputs).
    Returns (o (B, T, H, D) in q's dtype, the final state like initial_state or None unless
    output_final_state).
    """
    check_impl(impl)
    check_chunk_size(chunk_size)
    p = prepare(q, k, v, eta, lam_ri, beta_ri, G_hat, initial_state, reset)
    args = (p.q, p.k, p.v, p.eta, p.lam_ri, p.beta_ri, p.G_hat, p.state, p.reset)
    o, Z = naive_core(*args) if impl == "naive" else chunked_core(*args, chunk_size)
    return o.to(p.out_dtype), Z if output_final_state else None
