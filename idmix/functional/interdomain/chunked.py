"""Chunked two-pass O(T) algorithm (DESIGN.md §3) in real-valued batched GEMMs.

The sequence is cut into chunks of L positions; chunks are grouped into segments of about
``SEGMENT_TOKENS`` positions. Within a segment every step is a batched matmul over all its
chunks; the only sequential work is the chunk-state carry (one complex multiply-add per chunk).
Nothing of size T·M·(R+D) is ever held: besides the inputs and the output, memory is bounded by
one segment. The backward pass recomputes one segment at a time from its stored start state
(the states at segment boundaries are all that the forward keeps) and differentiates it with
autograd, so it stores no per-position state either.
"""

from __future__ import annotations

import torch

from .decays import ChunkDecays, chunk_decays
from .realform import cmul_last, cmul_rows

SEGMENT_TOKENS = 1024


def _segment(q, k, v, dec: ChunkDecays, G_hat, Z0):
    """One segment of N chunks of length L.

    q, k: (B, H, N, L, R); v: (B, H, N, L, D); G_hat: (H, 2M, 2M);
    Z0: (B, H, 2M, R+D) start state [Xᵏ | Xᵛ] in real rows. Returns (o: (B, H, N, L, D), Z_end).
    """
    B, H, N, L, R = q.shape
    # Chunk-local state increments: Σ_s β λ^{L-1-s} ⊗ z_s, all chunks at once.
    z = torch.cat([k, v], dim=-1)  # (B, H, N, L, R+D)
    dZ = dec.end[None, :, None] @ z  # (B, H, N, 2M, R+D)
    starts = []
    Z = Z0
    for j in range(N):
        starts.append(Z)
        Z = cmul_rows(dec.chunk_re[None], dec.chunk_im[None], Z) + dZ[:, :, j]
    Zs = torch.stack(starts, dim=2)  # (B, H, N, 2M, R+D) chunk-start states
    Xk, Xv = Zs[..., :R], Zs[..., R:]
    start_re, start_im = dec.start_re[None, :, None], dec.start_im[None, :, None]
    # Pass 1: p(t) = λ^{i+1} ⊙ (Xᵏ q_t) + Σ_{s<=t} β λ^{t-s} (q_t · k_s)
    p = cmul_last(start_re, start_im, q @ Xk.transpose(-1, -2))  # (B, H, N, L, 2M)
    scores = q @ k.transpose(-1, -2)  # (B, H, N, L, L); causality lives in dec.intra
    p = p + torch.einsum("bhnts,htsm->bhntm", scores, dec.intra)
    # w̃ = Ĝ p̂ for every position of the segment in one GEMM per (b, h).
    w = (p.reshape(B, H, N * L, -1) @ G_hat.transpose(-1, -2)).reshape(p.shape)
    # Pass 2: o_t = Re(Xᵛᴴ (conj(λ^{i+1}) ⊙ w̃)) + Σ_{s<=t} Re(conj(β λ^{t-s}) · w̃) v_s
    o = cmul_last(start_re, -start_im, w) @ Xv
    mix = torch.einsum("bhntm,htsm->bhnts", w, dec.intra)
    o = o + mix @ v
    return o, Z


def _plan(T: int, L: int) -> list[tuple[int, int, int]]:
    """Pieces (t0, n_chunks, chunk_len) covering [0, T): full segments, then a ragged tail."""
    per_seg = max(1, SEGMENT_TOKENS // L)
    full = T // L
    pieces = [(c * L, min(per_seg, full - c), L) for c in range(0, full, per_seg)]
    if T % L:
        pieces.append((full * L, 1, T % L))
    return pieces


def _to_chunks(x: torch.Tensor, t0: int, n: int, L: int) -> torch.Tensor:
    """(B, T, H, F) -> (B, H, n, L, F) slice of positions [t0, t0 + n·L)."""
    B, _, H, F = x.shape
    return x[:, t0 : t0 + n * L].reshape(B, n, L, H, F).permute(0, 3, 1, 2, 4).contiguous()


def _from_chunks(o: torch.Tensor) -> torch.Tensor:
    """(B, H, n, L, D) -> (B, n·L, H, D)."""
    B, H, n, L, D = o.shape
    return o.permute(0, 2, 3, 1, 4).reshape(B, n * L, H, D)


def _run(q, k, v, decays_by_len, G_hat, Z0, L):
    """Forward over all pieces. Returns (o: (B, T, H, D), Z_end, piece start states)."""
    B, T, H, _ = q.shape
    o = q.new_empty(B, T, H, v.shape[-1])
    Z, starts = Z0, []
    for t0, n, Lp in _plan(T, L):
        starts.append(Z)
        o_p, Z = _segment(
            _to_chunks(q, t0, n, Lp), _to_chunks(k, t0, n, Lp), _to_chunks(v, t0, n, Lp),
            decays_by_len[Lp], G_hat, Z,
        )
        o[:, t0 : t0 + n * Lp] = _from_chunks(o_p)
    return o, Z, starts


def _all_decays(lam_ri, beta_ri, T, L) -> dict[int, ChunkDecays]:
    return {Lp: chunk_decays(lam_ri, beta_ri, Lp) for Lp in {p[2] for p in _plan(T, L)}}


class ChunkedInterdomain(torch.autograd.Function):
    """Real-form chunked op with a segment-recomputing backward.

    Inputs: q, k: (B, T, H, R); v: (B, T, H, D); lam_ri, beta_ri: (H, M, 2); G_hat: (H, 2M, 2M);
    Z0: (B, H, 2M, R+D); L: chunk length. Outputs: o (B, T, H, D), Z_end (B, H, 2M, R+D).
    All tensors share one real dtype (fp32 or fp64).
    """

    @staticmethod
    def forward(ctx, q, k, v, lam_ri, beta_ri, G_hat, Z0, L):
        with torch.no_grad():
            decays = _all_decays(lam_ri, beta_ri, q.shape[1], L)
            o, Z_end, starts = _run(q, k, v, decays, G_hat, Z0, L)
        ctx.L = L
        ctx.save_for_backward(q, k, v, lam_ri, beta_ri, G_hat, *starts)
        return o, Z_end

    @staticmethod
    def backward(ctx, do, dZ_end):
        q, k, v, lam_ri, beta_ri, G_hat, *starts = ctx.saved_tensors
        L = ctx.L
        B, T, H, R = q.shape
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if do is None:
            do = torch.zeros(B, T, H, v.shape[-1], dtype=q.dtype, device=q.device)
        dZ = torch.zeros_like(starts[0]) if dZ_end is None else dZ_end
        with torch.enable_grad():
            lam_, beta_ = lam_ri.detach().requires_grad_(), beta_ri.detach().requires_grad_()
            decays = _all_decays(lam_, beta_, T, L)
            leaves = {Lp: ChunkDecays(*(t.detach().requires_grad_() for t in d))
                      for Lp, d in decays.items()}
            d_leaves = {Lp: [torch.zeros_like(t) for t in d] for Lp, d in leaves.items()}
            G_leaf = G_hat.detach().requires_grad_()
            dG = torch.zeros_like(G_hat)
            for (t0, n, Lp), Z0 in reversed(list(zip(_plan(T, L), starts, strict=True))):
                xs = [_to_chunks(x, t0, n, Lp).requires_grad_() for x in (q, k, v)]
                Z0_ = Z0.detach().requires_grad_()
                o_p, Z_p = _segment(*xs, leaves[Lp], G_leaf, Z0_)
                inputs = (*xs, *leaves[Lp], G_leaf, Z0_)
                grads = torch.autograd.grad(
                    (o_p, Z_p),
                    inputs,
                    (_to_chunks(do, t0, n, Lp), dZ),
                    allow_unused=True,
                )
                for dst, g in zip((dq, dk, dv), grads[:3], strict=True):
                    dst[:, t0 : t0 + n * Lp] = _from_chunks(g)
                for acc, g in zip(d_leaves[Lp], grads[3:9], strict=True):
                    if g is not None:
                        acc += g
                dG += grads[9]
                dZ = grads[10]
            outs = [t for d in decays.values() for t in d]
            gouts = [g for Lp in decays for g in d_leaves[Lp]]
            dlam, dbeta = torch.autograd.grad(outs, (lam_, beta_), gouts, allow_unused=True)
        return dq, dk, dv, dlam, dbeta, dG, dZ, None
