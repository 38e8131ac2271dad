"""Chunked two-pass O(T) algorithm (docs/design.md §4) in real-valued batched GEMMs.

The sequence is cut into chunks of L positions, and chunks are grouped into segments of
about ``SEGMENT_TOKENS`` positions (on a GPU, as many as ``segment_tokens`` allows). Within a
segment every step is a batched matmul over all its chunks; the only sequential work is the
chunk-state carry (one complex multiply-add per chunk). Nothing of size T·M·(R+D) is ever
held: besides inputs and output, memory is bounded by one segment. The backward pass is
written out by hand (no autograd through the chunk loop); it recomputes one segment at a time
from the state stored at its start, which is all the forward keeps besides its inputs.

Layouts inside a segment: q (B, H, N, L, R); zT = [kᵀ; vᵀ] (B, H, N, R+D, L); per-position
mode vectors (.., L, 2M) and states (.., R+D, 2M) = [Xᵏ | Xᵛ]ᵀ, both in interleaved real form
(decays.py), so ``_c`` views them as complex without a copy. Sequence starts (``reset``) become
0/1 masks on the intra-chunk weights, the chunk-start state's reach and the chunk-to-chunk carry
(_DocMasks), in the forward and in the backward alike.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .compiled import compiled, have_cxx
from .decays import ChunkDecays, chunk_decays
from .precision import baddbmm, matmul
from .realform import as_complex as _c
from .realform import as_interleaved as _r
from .realform import cmul, cmul_conj, dot_conj
from .validation import refuse_double_backward

SEGMENT_TOKENS = 512
# On a GPU a segment holds this many token·heads (B·H·positions; about 8 KB each in the
# backward, so ~4 GB at most): short segments there would leave the kernels launch-bound.
GPU_SEGMENT_TOKEN_HEADS = 2**19


def segment_tokens(q: torch.Tensor, L: int) -> int:
    """Positions per segment for inputs like q (B, T, H, ·): SEGMENT_TOKENS on CPU (a segment's
    working set stays in cache), GPU_SEGMENT_TOKEN_HEADS / (B·H) on CUDA; whole chunks."""
    if not q.is_cuda:
        return SEGMENT_TOKENS
    per_row = GPU_SEGMENT_TOKEN_HEADS // max(1, q.shape[0] * q.shape[2])
    return max(L, max(SEGMENT_TOKENS, per_row) // L * L)


def kernels_for(x: torch.Tensor, backend: str):
    """The idmix_kernels module when the Triton kernels should run for x, else None.
    "auto": CUDA tensors with triton installed; "torch", "inductor": never; "triton": always
    (CPU only under TRITON_INTERPRET=1). The kernels take fp32, bf16 or fp16 inputs and compute
    in fp32: fp64 stays on torch."""
    if backend in ("torch", "inductor") or (backend == "auto" and not x.is_cuda):
        return None
    if x.dtype == torch.float64:
        if backend == "triton":
            raise ValueError(
                "backend='triton': the kernels compute in fp32; fp64 inputs take 'torch'"
            )
        return None
    try:
        import idmix_kernels
    except ImportError:
        if backend == "triton":
            raise
        return None
    return idmix_kernels


def _shear_in(A: torch.Tensor) -> torch.Tensor:
    """(t, s) -> (t, j) with Y[t, j] = A[t, t + j + 1 - L] (0 where that s < 0); A: (..., L, L).

    Lines the causal part of each row up with ``end[j] = β λ^{L-1-j}``, so that
    Σ_{s<=t} A[t, s] β λ^{t-s} = (Y @ end)[t]: the intra-chunk decay becomes one shared matrix.
    A zero-padded copy read through a strided view; adjoint of :func:`_shear_out`.
    """
    L = A.shape[-1]
    if torch.compiler.is_compiling():  # as pads and reshapes, which Inductor fuses
        flat = F.pad(F.pad(A, (L, 1)).flatten(-2), (0, L + 1))  # rows [0_L, A, 0]
        return flat[..., 1 : 1 + L * (2 * L + 2)].unflatten(-1, (L, 2 * L + 2))[..., :L]
    padded = torch.cat([A.new_zeros(*A.shape[:-1], L), A], dim=-1)  # (..., L, 2L)
    strides = (*padded.stride()[:-2], 2 * L + 1, 1)
    return padded.as_strided(A.shape, strides, padded.storage_offset() + 1).contiguous()


def _shear_out(Y: torch.Tensor) -> torch.Tensor:
    """(t, j) -> (t, s) with A[t, s] = Y[t, L - 1 - t + s] for s <= t, else 0 (see _shear_in)."""
    L = Y.shape[-1]
    if torch.compiler.is_compiling():
        flat = F.pad(Y, (0, L)).flatten(-2)  # rows [Y, 0_L]
        return flat[..., L - 1 : L - 1 + L * (2 * L - 1)].unflatten(-1, (L, 2 * L - 1))[..., :L]
    padded = torch.cat([Y, Y.new_zeros(*Y.shape[:-1], L)], dim=-1)  # (..., L, 2L)
    strides = (*padded.stride()[:-2], 2 * L - 1, 1)
    return padded.as_strided(Y.shape, strides, padded.storage_offset() + L - 1).contiguous()


class _DocMasks:
    """Document boundaries inside a segment (from reset: (B, N, L), True where a document
    starts), as 0/1 float masks broadcastable against (B, H, N, ...) tensors. All masked
    values are finite, so masking by multiplication is exact.

    same (B, 1, N, L, L): t and s in the same document; valid (B, 1, N, L, 1): no start in
    [chunk start, t], so the chunk-start state reaches t; contrib (B, 1, N, 1, L): no start in
    (s, chunk end], so z_s reaches the chunk-end state; carry (B, N): no start in the chunk.
    """

    def __init__(self, reset: torch.Tensor, dtype):
        self.reset = reset
        d = reset.long().cumsum(-1)  # starts so far within the chunk, (B, N, L)
        self.same = (d[..., :, None] == d[..., None, :]).to(dtype)[:, None]
        self.valid = (d == 0).to(dtype)[:, None, ..., None]
        self.contrib = (d == d[..., -1:]).to(dtype)[:, None, :, None, :]
        self.carry = (d[..., -1] == 0).to(dtype)


def _carry(c, masks, j):
    """Chunk-to-chunk multiplier: c (H, 1, ·), or c scaled by carry[:, j] per row (B, H, 1, ·)."""
    return c if masks is None else c * masks.carry[:, j, None, None, None]


def _scan(inc, Z0, c, masks=None):
    """Linear recurrence over chunks: S_0 = Z0, S_{j+1} = c ⊙ S_j + inc_j, on interleaved reals.

    inc: (B, H, N, C, 2M); Z0: (B, H, C, 2M); c: (H, 2M).
    Returns (starts: (B, H, N, C, 2M) = S_0..S_{N-1}, contiguous; S_N: (B, H, C, 2M)).
    """
    c = c[:, None, :]
    N = inc.shape[2]
    if torch.compiler.is_compiling():  # functional, no complex views
        S = [Z0]
        for j in range(N):
            S.append(cmul(_carry(c, masks, j), S[-1]) + inc[:, :, j])
        return torch.stack(S[:-1], 2), S[-1]
    inc, c = _c(inc), _c(c)
    starts = torch.empty_like(inc)
    starts[:, :, 0] = _c(Z0)
    for j in range(N - 1):
        torch.addcmul(inc[:, :, j], _carry(c, masks, j), starts[:, :, j], out=starts[:, :, j + 1])
    end = torch.addcmul(inc[:, :, N - 1], _carry(c, masks, N - 1), starts[:, :, N - 1])
    return _r(starts), _r(end)


def _scan_adjoint(g_S, g_end, c, masks=None):
    """Adjoint of :func:`_scan`: G_N = g_end, G_j = g_S_j + conj(c) ⊙ G_{j+1}.

    Returns (G_1..G_N: (B, H, N, C, 2M), the gradients of the increments; G_0 = grad of Z0).
    """
    c = c[:, None, :]
    N = g_S.shape[2]
    if torch.compiler.is_compiling():
        G = [g_end]
        for j in range(N - 1, 0, -1):
            G.append(g_S[:, :, j] + cmul_conj(_carry(c, masks, j), G[-1]))
        return torch.stack(G[::-1], 2), g_S[:, :, 0] + cmul_conj(_carry(c, masks, 0), G[-1])
    g_S, c = _c(g_S), _c(c).conj_physical()
    g_inc = torch.empty_like(g_S)
    g_inc[:, :, N - 1] = _c(g_end)
    for j in range(N - 1, 0, -1):
        torch.addcmul(g_S[:, :, j], _carry(c, masks, j), g_inc[:, :, j], out=g_inc[:, :, j - 1])
    g_0 = torch.addcmul(g_S[:, :, 0], _carry(c, masks, 0), g_inc[:, :, 0])
    return _r(g_inc), _r(g_0)


class _Saved:
    """Forward intermediates of one segment, kept only while its backward runs."""

    __slots__ = ("starts", "y", "lagged", "p", "w", "u", "mix")


def _flat(x: torch.Tensor) -> torch.Tensor:
    """(B, H, N, L, F) -> (B, H, N·L, F) view."""
    return x.flatten(2, 3)


def _bmm_acc(acc, a, b, precision: str) -> torch.Tensor:
    """acc + a @ b in one GEMM pass; acc: (B, H, N, L, F); a: (B, H, N·L, K); b: (H, K, F)."""
    B, H = a.shape[:2]
    out = baddbmm(
        acc.reshape(B * H, -1, acc.shape[-1]),
        a.flatten(0, 1),
        b.expand(B, *b.shape).flatten(0, 1),
        precision,
    )
    return out.view(acc.shape)


def _chunk_starts(zT, dec: ChunkDecays, Z0, masks, kernels, precision):
    """The inter-chunk pass of one segment. Returns (chunk-start states (B, H, N, R+D, 2M),
    Z_end (B, H, R+D, 2M)). With kernels, one fused kernel (the increments are tile products
    inside the scan, never stored)."""
    if kernels is not None:
        reset = None if masks is None else masks.reset
        return kernels.chunk_states(zT, dec.end, dec.chunk, Z0, reset, precision)
    inc = matmul(_reaching_end(zT, masks).flatten(2, 3), dec.end, precision).view(
        *zT.shape[:3], -1, dec.end.shape[-1]
    )  # Σ βλ^{L-1-s} z_s
    return _scan(inc, Z0, dec.chunk, masks)


def _reaching_end(zT, masks):
    """zT with the inputs a later document start cuts off their chunk's end zeroed."""
    return zT if masks is None else zT * masks.contrib


def _segment_forward(
    q, zT, dec: ChunkDecays, G_hat, Z0, masks=None, keep=False, kernels=None, precision="ieee"
):
    """One segment. q: (B, H, N, L, R); zT = [kᵀ; vᵀ]: (B, H, N, R+D, L); Z0: (B, H, R+D, 2M);
    masks: _DocMasks or None (no document starts inside); kernels: idmix_kernels or None;
    precision: of every product ("ieee", "tf32", "bf16": precision.py).

    Returns (o: (B, H, N, L, D), Z_end, intermediates or None). With kernels, the scan and
    (unless keep) the two intra-chunk passes run in Triton; keep recomputes in torch.
    """
    B, H, N, L, R = q.shape
    kT, v = zT[..., :R, :], zT[..., R:, :].mT
    f = _Saved()
    starts, Z_end = _chunk_starts(zT, dec, Z0, masks, kernels, precision)
    f.starts = starts
    if kernels is not None and not keep:
        reset = None if masks is None else masks.reset
        p = kernels.intra_chunk_pass1(q, zT, starts, dec.start, dec.end, reset, precision)
        w = matmul(_flat(p), G_hat.mT, precision).view(p.shape)
        o = kernels.intra_chunk_pass2(w, zT, starts, dec.start, dec.end, R, reset, precision)
        return o, Z_end, None
    start = dec.start[None, :, None]  # (1, H, 1, L, 2M) = λ^{i+1}
    # Pass 1: p(t) = λ^{i+1} ⊙ (Xᵏ q_t) + Σ_{s<=t} β λ^{t-s} (q_t · k_s)
    f.y = matmul(q, starts[..., :R, :], precision)  # (B, H, N, L, 2M)
    scores = matmul(q, kT, precision)
    if masks is not None:
        f.y, scores = f.y * masks.valid, scores * masks.same
    f.lagged = _shear_in(scores)  # (B, H, N, L, L), aligned with dec.end
    f.p = _bmm_acc(cmul(start, f.y), _flat(f.lagged), dec.end, precision)
    f.w = matmul(_flat(f.p), G_hat.mT, precision).view(f.p.shape)  # w̃ = Ĝ p̂
    # Pass 2: o_t = Re(Xᵛᴴ (conj(λ^{i+1}) ⊙ w̃)) + Σ_{s<=t} Re(conj(β λ^{t-s}) · w̃) v_s
    f.u = cmul_conj(start, f.w)
    by_lag = matmul(_flat(f.w), dec.end.mT, precision).view(B, H, N, L, L)
    f.mix = _shear_out(by_lag)  # (t, s) weights
    if masks is not None:
        f.u, f.mix = f.u * masks.valid, f.mix * masks.same
    o = baddbmm(
        matmul(f.mix, v, precision).flatten(0, 2),
        f.u.flatten(0, 2),
        starts[..., R:, :].transpose(-1, -2).flatten(0, 2),
        precision,
    ).view(v.shape)
    return o, Z_end, (f if keep else None)


class _IntraGrads(NamedTuple):
    """Gradients through the two intra-chunk passes of one segment (before the state scan)."""

    dq: torch.Tensor  # (B, H, N, L, R)
    dkT: torch.Tensor  # (B, H, N, R, L)
    dvT: torch.Tensor  # (B, H, N, D, L)
    dS: tuple[torch.Tensor, torch.Tensor]  # (B, H, N, R | D, 2M): of the start states' rows
    d_start: torch.Tensor  # (H, L, 2M)
    d_end: torch.Tensor  # (H, L, 2M), the intra-chunk part
    dG: torch.Tensor  # (H, 2M, 2M)


def _intra_backward_torch(f: _Saved, q, zT, dec, G_hat, do, masks, precision) -> _IntraGrads:
    def mask(x, name):
        return x if masks is None else x * getattr(masks, name)

    def mm(a, b):
        return matmul(a, b, precision)

    B, H, N, L, R = q.shape
    kT, v = zT[..., :R, :], zT[..., R:, :].mT
    starts = f.starts
    start = dec.start[None, :, None]
    # o = u Xᵛᵀ + mix v, mix = shear_out(w endᵀ), u = conj(start) ⊙ w
    dvT = mm(do.transpose(-1, -2), f.mix)  # (B, H, N, D, L)
    d_mix = _shear_in(mask(mm(do, v.transpose(-1, -2)), "same"))  # aligned with dec.end
    du = mask(mm(do, starts[..., R:, :]), "valid")  # (B, H, N, L, 2M)
    dXv = mm(do.transpose(-1, -2), f.u)  # (B, H, N, D, 2M)
    dw = _bmm_acc(cmul(start, du), _flat(d_mix), dec.end, precision)
    d_end = mm(_flat(d_mix).transpose(-1, -2), _flat(f.w)).sum(0)
    # start enters as start ⊙ y and as conj(start) ⊙ w: gradient Σ dp ⊙ conj(y) + w ⊙ conj(du)
    d_start = dot_conj(du, f.w, dim=2).sum(0)
    # w = Ĝ p
    dp = mm(_flat(dw), G_hat).view(dw.shape)
    dG = mm(_flat(dw).transpose(-1, -2), _flat(f.p)).sum(0)
    # p = start ⊙ y + shear_in(q kᵀ) end
    d_scores = mask(_shear_out(mm(_flat(dp), dec.end.mT).view(B, H, N, L, L)), "same")
    d_end = d_end + mm(_flat(f.lagged).transpose(-1, -2), _flat(dp)).sum(0)
    dy = mask(cmul_conj(start, dp), "valid")
    d_start = d_start + dot_conj(f.y, dp, dim=2).sum(0)
    # y = q Xᵏ, scores = q kᵀ
    dq = mm(dy, starts[..., :R, :].transpose(-1, -2)) + mm(d_scores, kT.mT)
    dkT = mm(q.transpose(-1, -2), d_scores)  # (B, H, N, R, L)
    return _IntraGrads(dq, dkT, dvT, (mm(q.transpose(-1, -2), dy), dXv), d_start, d_end, dG)


def _intra_backward_kernels(kernels, starts, q, zT, dec, G_hat, do, masks, precision):
    """The same gradients from the Triton backward passes (each recomputes its own pass)."""
    R = q.shape[-1]
    reset = None if masks is None else masks.reset
    p = kernels.intra_chunk_pass1(q, zT, starts, dec.start, dec.end, reset, precision)
    w = matmul(_flat(p), G_hat.mT, precision).view(p.shape)
    dv, dXv, dw, ge2, gs2 = kernels.intra_chunk_pass2_backward(
        do, w, zT, starts, dec.start, dec.end, R, reset, precision
    )
    dp = matmul(_flat(dw), G_hat, precision).view(dw.shape)
    dG = matmul(_flat(dw).transpose(-1, -2), _flat(p), precision).sum(0)
    dq, dkT, dXk, ge1, gs1 = kernels.intra_chunk_pass1_backward(
        dp, q, zT, starts, dec.start, dec.end, reset, precision
    )
    d_start = gs1.sum((0, 2)) + gs2.sum((0, 2))  # each read once, no temporary
    d_end = ge1.sum((0, 2)) + ge2.sum((0, 2))
    return _IntraGrads(dq, dkT, dv.mT, (dXk, dXv), d_start, d_end, dG)


def _segment_backward(
    q, zT, dec: ChunkDecays, G_hat, Z0, do, dZ_end, masks=None, kernels=None, precision="ieee"
):
    """Gradients of one segment. Returns (dq, dzT, d_decays: ChunkDecays, dG, dZ0)."""
    R = q.shape[-1]
    if kernels is None:
        _, _, f = _segment_forward(q, zT, dec, G_hat, Z0, masks, True, None, precision)
        g = _intra_backward_torch(f, q, zT, dec, G_hat, do, masks, precision)
        # g_inc: the gradient of each chunk's increment, (B, H, N, R+D, 2M)
        g_inc, dZ0 = _scan_adjoint(torch.cat(g.dS, dim=-2), dZ_end, dec.chunk, masks)
        d_chunk = dot_conj(f.starts, g_inc, dim=-2)  # (B, H, N, 2M)
        if masks is not None:
            d_chunk = d_chunk * masks.carry[:, None, :, None]
        d_chunk = d_chunk.sum((0, 2))
    else:  # only the chunk-start states are recomputed here; the passes recompute inside
        starts, _ = _chunk_starts(zT, dec, Z0, masks, kernels, precision)
        g = _intra_backward_kernels(kernels, starts, q, zT, dec, G_hat, do, masks, precision)
        reset = None if masks is None else masks.reset
        g_inc, dZ0, d_chunk = kernels.chunk_states_backward(
            *g.dS, dZ_end, dec.chunk, starts, q.shape[3], reset
        )
    zc = _reaching_end(zT, masks).to(g_inc.dtype)  # the kernels' chunk copies keep bf16/fp16
    d_end = g.d_end + matmul(zc.flatten(2, 3).mT, g_inc.flatten(2, 3), precision).sum(0)
    dzT = matmul(g_inc.flatten(2, 3), dec.end.mT, precision).view(zc.shape)  # (B, H, N, R+D, L)
    if masks is not None:
        dzT = dzT * masks.contrib
    dzT[..., :R, :] += g.dkT
    dzT[..., R:, :] += g.dvT
    return g.dq, dzT, ChunkDecays(g.d_start, d_end, d_chunk), g.dG, dZ0


def _plan(T: int, L: int, seg: int) -> list[tuple[int, int, int]]:
    """Pieces (t0, n_chunks, chunk_len) covering [0, T): full segments of seg positions, then
    a ragged tail."""
    per_seg = max(1, seg // L)
    full = T // L
    pieces = [(c * L, min(per_seg, full - c), L) for c in range(0, full, per_seg)]
    if T % L:
        pieces.append((full * L, 1, T % L))
    return pieces


def _chunk_view(x: torch.Tensor, t0: int, n: int, L: int, transpose: bool) -> torch.Tensor:
    """(B, T, H, F) -> view (B, H, n, L, F), or (B, H, n, F, L) if transpose, of [t0, t0+n·L)."""
    B, _, H, F = x.shape
    x = x[:, t0 : t0 + n * L].unflatten(1, (n, L))  # (B, n, L, H, F)
    return x.permute(0, 3, 1, 4, 2) if transpose else x.permute(0, 3, 1, 2, 4)


def _to_chunks(x: torch.Tensor, n: int, L: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, n·L, H, F) -> (B, H, n, L, F) copy in dtype (the cast rides on the copy)."""
    return _chunk_view(x, 0, n, L, transpose=False).to(dtype, memory_format=torch.contiguous_format)


def _to_chunks_T(k: torch.Tensor, v: torch.Tensor, n: int, L: int, dtype) -> torch.Tensor:
    """zT = [kᵀ; vᵀ] per chunk: (B, H, n, R+D, L) in dtype, one copy from the (B, n·L, H, ·)
    inputs."""
    B, _, H, R = k.shape
    zT = k.new_empty(B, H, n, R + v.shape[-1], L, dtype=dtype)
    zT[..., :R, :] = _chunk_view(k, 0, n, L, transpose=True)
    zT[..., R:, :] = _chunk_view(v, 0, n, L, transpose=True)
    return zT


def _write_chunks(dst: torch.Tensor, t0: int, x: torch.Tensor, transposed: bool = False) -> None:
    """Write x: (B, H, n, L, F) (or (B, H, n, F, L) if transposed) into dst: (B, T, H, F)."""
    n, L = x.shape[2], x.shape[-1] if transposed else x.shape[-2]
    _chunk_view(dst, t0, n, L, transpose=transposed).copy_(x)


def _num_pieces(T: int, L: int, seg: int) -> int:
    full, per_seg = T // L, max(1, seg // L)
    return (full + per_seg - 1) // per_seg + (1 if T % L else 0)


def _decays_by_len(L, T, main, tail) -> dict[int, ChunkDecays]:
    out = {L: ChunkDecays(*main)}
    if T % L:
        out[T % L] = ChunkDecays(*tail)
    return out


def _span(reset, span: slice):
    """reset[:, span], or None without resets."""
    return None if reset is None else reset[:, span]


def _masks(reset, n, L, dtype):
    """_DocMasks of one piece's reset (B, n·L), or None without resets."""
    return None if reset is None else _DocMasks(reset.unflatten(1, (n, L)), dtype)


def _chunk_dtype(q: torch.Tensor, kernels) -> torch.dtype:
    """The dtype of the chunk copies: the inputs' own for the kernels (they read bf16 and fp16
    as they are and compute in fp32), the compute dtype (the state's) for the PyTorch path."""
    return q.dtype if kernels is not None else torch.promote_types(q.dtype, torch.float32)


def _forward_piece(q, k, v, start, end, chunk, G_hat, Z0, reset, precision, kernels=None):
    """One piece of positions: q, k (B, n·L, H, R); v (B, n·L, H, D) in any float dtype; the
    decays (ChunkDecays' fields) of its chunk length L; Z0 (B, H, R+D, 2M); reset (B, n·L) or
    None; precision of the products. Returns (o: (B, H, n, L, D) in Z0's dtype, Z_end)."""
    L = start.shape[1]
    n = q.shape[1] // L
    dtype = _chunk_dtype(q, kernels)
    o, Z, _ = _segment_forward(
        _to_chunks(q, n, L, dtype),
        _to_chunks_T(k, v, n, L, dtype),
        ChunkDecays(start, end, chunk),
        G_hat,
        Z0,
        _masks(reset, n, L, Z0.dtype),
        kernels=kernels,
        precision=precision,
    )
    return o, Z


def _backward_piece(
    q, k, v, start, end, chunk, G_hat, Z0, do, dZ_end, reset, precision, kernels=None
):
    """Gradients of one piece (arguments as for :func:`_forward_piece`; do (B, n·L, H, D)).
    Returns (dq (B, H, n, L, R), dzT (B, H, n, R+D, L), d_start, d_end, d_chunk, dG, dZ0)."""
    L = start.shape[1]
    n = q.shape[1] // L
    dtype = _chunk_dtype(q, kernels)
    dq, dzT, d_decays, dG, dZ0 = _segment_backward(
        _to_chunks(q, n, L, dtype),
        _to_chunks_T(k, v, n, L, dtype),
        ChunkDecays(start, end, chunk),
        G_hat,
        Z0,
        _to_chunks(do, n, L, dtype),
        dZ_end,
        _masks(reset, n, L, Z0.dtype),
        kernels,
        precision,
    )
    return dq, dzT, *d_decays, dG, dZ0


def _runner(piece, backend: str, x: torch.Tensor):
    """The piece function as the backend runs it for x: "inductor", compiled by torch.compile
    (the same PyTorch math, its glue fused around the GEMMs: 1.3-1.4x the eager pieces on CPU
    at 512-token segments). Compiled once per process and input shape (a run at one length
    meets at most three: a full segment, a shorter last one and the ragged tail), ~15 s per
    direction on 2 cores; static shapes, since a dynamic graph would also take the full
    segments, slower. Not fullgraph (the pieces trace whole: tested), so that past Dynamo's
    recompile limit (8 shapes: evaluation at many lengths) they run eagerly with torch's warning
    instead of failing. Else eager, on the Triton kernels where kernels_for gives them."""
    if backend != "inductor":
        return functools.partial(piece, kernels=kernels_for(x, backend))
    if not x.is_cuda and not have_cxx():
        raise RuntimeError("backend: 'inductor' on CPU needs a C++ compiler (g++ or clang++)")
    return compiled(piece, dynamic=False)


def _forward_impl(q, k, v, main, tail, G_hat, Z0, L, reset, backend, precision):
    B, T, H, _ = q.shape
    forward_piece = _runner(_forward_piece, backend, q)
    decays = _decays_by_len(L, T, main, tail)
    o = q.new_empty(B, T, H, v.shape[-1])
    Z, starts = Z0.contiguous(), []
    for t0, n, Lp in _plan(T, L, segment_tokens(q, L)):
        starts.append(Z)
        span = slice(t0, t0 + n * Lp)
        o_p, Z = forward_piece(
            q[:, span], k[:, span], v[:, span], *decays[Lp], G_hat, Z, _span(reset, span),
            precision,
        )  # fmt: skip
        _write_chunks(o, t0, o_p)
    return o, Z, torch.stack(starts)


def _backward_impl(do, dZ_end, q, k, v, main, tail, G_hat, starts, L, reset, backend, precision):
    T, R = q.shape[1], q.shape[-1]
    backward_piece = _runner(_backward_piece, backend, q)
    decays = _decays_by_len(L, T, main, tail)
    d_decays = {Lp: [torch.zeros_like(t) for t in d] for Lp, d in decays.items()}
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dG = torch.zeros_like(G_hat)
    dZ = dZ_end.contiguous()
    plan = _plan(T, L, segment_tokens(q, L))
    for (t0, n, Lp), Z0 in reversed(list(zip(plan, starts.unbind(0), strict=True))):
        span = slice(t0, t0 + n * Lp)
        gq, g_zT, *g_dec, g_G, dZ = backward_piece(
            q[:, span],
            k[:, span],
            v[:, span],
            *decays[Lp],
            G_hat,
            Z0,
            do[:, span],
            dZ,
            _span(reset, span),
            precision,
        )
        _write_chunks(dq, t0, gq)
        _write_chunks(dk, t0, g_zT[..., :R, :], transposed=True)
        _write_chunks(dv, t0, g_zT[..., R:, :], transposed=True)
        for acc, g in zip(d_decays[Lp], g_dec, strict=True):
            acc += g
        dG += g_G
    d_main = d_decays[L]
    d_tail = d_decays[T % L] if T % L else [torch.zeros_like(t) for t in tail]
    return dq, dk, dv, *d_main, *d_tail, dG, dZ


def chunk_decay_inputs(lam_ri, beta_ri, T, L):
    """The decay tensors the chunked op takes: (start, end, chunk) for chunk length L and for
    the ragged tail T % L (empty tensors when T is a multiple of L). Differentiable."""
    main = chunk_decays(lam_ri, beta_ri, L)
    tail = (
        chunk_decays(lam_ri, beta_ri, T % L)
        if T % L
        else ChunkDecays(*(t[:, :0] for t in main[:2]), main.chunk)
    )
    return (*main, *tail)


# Registered as custom ops so torch.compile / torch.export see one opaque node per direction
# (the chunk loop, complex views and in-place scans stay out of the traced graph). The decay
# tensors are inputs, so autograd carries their gradients on to λ and β outside the op. No
# argument has a default: autograd matches the backward's outputs against the arguments as
# passed, which leave out a default-valued one.
# Shapes: q, k (B, T, H, R); v (B, T, H, D) in one float dtype (o and the gradients come back in
# it); decays as in ChunkDecays for chunk length L and for the tail T % L; G_hat (H, 2M, 2M)
# interleaved; Z0 (B, H, R+D, 2M): the compute dtype (fp32, or fp64 for fp64 inputs).


@torch.library.custom_op("idmix::chunked_forward", mutates_args=())
def chunked_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decays: list[torch.Tensor],
    G_hat: torch.Tensor,
    Z0: torch.Tensor,
    reset: torch.Tensor | None,
    chunk_size: int,
    backend: str,
    precision: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """decays = chunk_decay_inputs(...) (6 tensors); reset: (B, T) bool or None; backend: one
    of validation.BACKENDS (see kernels_for; "inductor": _runner); precision: "ieee", "tf32" or
    "bf16" (resolved: precision.py). Returns (o (B, T, H, D), Z_end (B, H, R+D, 2M), segment
    start states (P, B, H, R+D, 2M))."""
    with torch.autocast(q.device.type, enabled=False):
        main, tail = decays[:3], decays[3:]
        return _forward_impl(q, k, v, main, tail, G_hat, Z0, chunk_size, reset, backend, precision)


@chunked_forward.register_fake
def _(q, k, v, decays, G_hat, Z0, reset, chunk_size, backend, precision):
    B, T, H, _ = q.shape
    pieces = _num_pieces(T, chunk_size, segment_tokens(q, chunk_size))
    return q.new_empty(B, T, H, v.shape[-1]), torch.empty_like(Z0), Z0.new_empty(pieces, *Z0.shape)


@torch.library.custom_op("idmix::chunked_backward", mutates_args=())
def chunked_backward(
    do: torch.Tensor,
    dZ_end: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decays: list[torch.Tensor],
    G_hat: torch.Tensor,
    starts: torch.Tensor,
    reset: torch.Tensor | None,
    chunk_size: int,
    backend: str,
    precision: str,
) -> list[torch.Tensor]:
    """Gradients of (q, k, v, *decays, G_hat, Z0), recomputing the forward segment by segment
    from the saved segment start states."""
    with torch.autocast(q.device.type, enabled=False):
        return list(
            _backward_impl(
                do,
                dZ_end,
                q,
                k,
                v,
                decays[:3],
                decays[3:],
                G_hat,
                starts,
                chunk_size,
                reset,
                backend,
                precision,
            )
        )


@chunked_backward.register_fake
def _(do, dZ_end, q, k, v, decays, G_hat, starts, reset, chunk_size, backend, precision):
    return [torch.empty_like(t) for t in (q, k, v, *decays, G_hat, dZ_end)]


def _setup_context(ctx, inputs, output):
    q, k, v, decays, G_hat, _Z0, reset, chunk_size, backend, precision = inputs
    ctx.chunk_size, ctx.n_decays = chunk_size, len(decays)
    ctx.backend, ctx.precision = backend, precision
    ctx.save_for_backward(
        q, k, v, *decays, G_hat, output[2], *([reset] if reset is not None else [])
    )


def _backward(ctx, do, dZ_end, _d_starts):
    q, k, v, *rest = ctx.saved_tensors
    decays, (G_hat, starts, *reset) = rest[: ctx.n_decays], rest[ctx.n_decays :]
    if do is None:
        do = q.new_zeros(*q.shape[:-1], v.shape[-1])
    if dZ_end is None:
        dZ_end = torch.zeros_like(starts[0])
    grads = torch.ops.idmix.chunked_backward(
        do,
        dZ_end,
        q,
        k,
        v,
        list(decays),
        G_hat,
        starts,
        reset[0] if reset else None,
        ctx.chunk_size,
        ctx.backend,
        ctx.precision,
    )
    # create_graph=True: a backward through these gradients raises a named error
    grads = refuse_double_backward(grads, (do, dZ_end, q, k, v, *decays, G_hat))
    dq, dk, dv, *d_dec, dG, dZ0 = grads
    return dq, dk, dv, d_dec, dG, dZ0, None, None, None, None


chunked_forward.register_autograd(_backward, setup_context=_setup_context)
