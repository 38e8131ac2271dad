"""Shared decays on the chunked two-pass O(T) algorithm (docs/design.md §4): one segment's math,
plugged into the segment driver (``segments``).

The sequence is cut into chunks of L positions, grouped into segments of about
``SEGMENT_TOKENS`` positions (on a GPU, as many as ``segment_tokens`` allows). Within a segment
every step is a batched matmul over all its chunks; the only sequential work is the chunk-state
carry (one complex multiply-add per chunk). The backward is written out by hand: it recomputes
one segment at a time from the state stored at its start. The primitives (scan, intra-chunk
passes, their backward) come from the backend (``chunk_torch`` or ``chunk_triton``); sequence
starts (``reset``) become 0/1 masks on the intra-chunk weights, the chunk-start state's reach and
the chunk-to-chunk carry (``chunk_layout.DocMasks``), in the forward and the backward alike.
"""

from __future__ import annotations

import torch

from .chunk_layout import doc_masks, to_chunks, to_chunks_T, unchunk
from .chunk_torch import TorchChunkOps, reaching_end
from .decays import ChunkDecays, chunk_decays
from .precision import matmul
from .segments import Piece

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


def plan(T: int, L: int, seg: int) -> list[Piece]:
    """Pieces covering [0, T): full segments of seg positions, then a ragged tail (one chunk
    of length T % L)."""
    per_seg = max(1, seg // L)
    full = T // L
    pieces = [Piece(c * L, min(c + per_seg, full) * L, L) for c in range(0, full, per_seg)]
    if T % L:
        pieces.append(Piece(full * L, T, T % L))
    return pieces


def num_pieces(T, L: int, seg: int):
    """len(plan(T, L, seg)) in arithmetic only, so that a symbolic T adds no guard."""
    full, per_seg = T // L, max(1, seg // L)
    return (full + per_seg - 1) // per_seg + (1 if T % L else 0)


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


def segment_forward(q, zT, dec: ChunkDecays, G_hat, Z0, masks, ops, precision):
    """One segment. q: (B, H, N, L, R); zT = [kᵀ; vᵀ]: (B, H, N, R+D, L); Z0: (B, H, R+D, 2M).
    Returns (o: (B, H, N, L, D), Z_end)."""
    starts, Z_end = ops.chunk_states(zT, dec, Z0, masks, precision)
    return ops.intra_forward(q, zT, starts, dec, G_hat, masks, precision), Z_end


def segment_backward(q, zT, dec: ChunkDecays, G_hat, Z0, do, dZ_end, masks, ops, precision):
    """Gradients of one segment. Returns (dq, dzT, d_decays: ChunkDecays, dG, dZ0)."""
    R = q.shape[-1]
    starts, _ = ops.chunk_states(zT, dec, Z0, masks, precision)
    g = ops.intra_backward(q, zT, starts, dec, G_hat, do, masks, precision)
    g_inc, dZ0, d_chunk = ops.chunk_states_backward(g.dS, dZ_end, dec, starts, masks, precision)
    zc = reaching_end(zT, masks).to(g_inc.dtype)  # the kernels' chunk copies keep bf16/fp16
    d_end = g.d_end + matmul(zc.flatten(2, 3).mT, g_inc.flatten(2, 3), precision).sum(0)
    dzT = matmul(g_inc.flatten(2, 3), dec.end.mT, precision).view(zc.shape)  # (B, H, N, R+D, L)
    if masks is not None:
        dzT = dzT * masks.contrib
    dzT[..., :R, :] += g.dkT
    dzT[..., R:, :] += g.dvT
    return g.dq, dzT, ChunkDecays(g.d_start, d_end, d_chunk), g.dG, dZ0


def forward_piece(q, k, v, start, end, chunk, G_hat, Z0, reset, precision, ops=TorchChunkOps):
    """One piece of positions: q, k (B, n·L, H, R); v (B, n·L, H, D) in any float dtype; the
    decays (ChunkDecays' fields) of its chunk length L; Z0 (B, H, R+D, 2M); reset (B, n·L) or
    None; ops: the backend's primitives. Returns (o: (B, n, L, H, D) in Z0's dtype, Z_end)."""
    L = start.shape[1]
    n = q.shape[1] // L
    dtype = ops.chunk_dtype(q)
    o, Z = segment_forward(
        to_chunks(q, n, L, dtype),
        to_chunks_T(k, v, n, L, dtype),
        ChunkDecays(start, end, chunk),
        G_hat,
        Z0,
        doc_masks(reset, n, L, Z0.dtype),
        ops,
        precision,
    )
    return unchunk(o), Z


def backward_piece(
    q, k, v, start, end, chunk, G_hat, Z0, do, dZ_end, reset, precision, ops=TorchChunkOps
):
    """Gradients of one piece (arguments as for :func:`forward_piece`; do (B, n·L, H, D)).
    Returns (dq, dk, dv as (B, n, L, H, ·) views, d_start, d_end, d_chunk, dG, dZ0)."""
    L = start.shape[1]
    n = q.shape[1] // L
    dtype = ops.chunk_dtype(q)
    dq, dzT, d_decays, dG, dZ0 = segment_backward(
        to_chunks(q, n, L, dtype),
        to_chunks_T(k, v, n, L, dtype),
        ChunkDecays(start, end, chunk),
        G_hat,
        Z0,
        to_chunks(do, n, L, dtype),
        dZ_end,
        doc_masks(reset, n, L, Z0.dtype),
        ops,
        precision,
    )
    R = q.shape[-1]
    dk = unchunk(dzT[..., :R, :], transposed=True)
    dv = unchunk(dzT[..., R:, :], transposed=True)
    return unchunk(dq), dk, dv, *d_decays, dG, dZ0


class SharedSegments:
    """The segment math of shared decays (``segments.SegmentMath``). params: the six decay
    tensors of ``chunk_decay_inputs`` (chunk length L, then the tail T % L) and Ĝ."""

    def __init__(self, decays, G_hat, L: int, backend, precision: str):
        self.decays, self.G_hat, self.L, self.precision = decays, G_hat, L, precision
        self.forward_piece = backend.run(forward_piece)
        self.backward_piece = backend.run(backward_piece)

    def _slot(self, piece: Piece) -> int:
        return 0 if piece.L == self.L else 3  # the tail's decays follow the main ones

    def forward(self, piece, tokens, Z0, reset):
        i = self._slot(piece)
        dec = self.decays[i : i + 3]
        return self.forward_piece(*tokens, *dec, self.G_hat, Z0, reset, self.precision)

    def backward(self, piece, tokens, Z0, do, dZ_end, reset):
        i = self._slot(piece)
        dec = self.decays[i : i + 3]
        dq, dk, dv, *d_dec, dG, dZ0 = self.backward_piece(
            *tokens, *dec, self.G_hat, Z0, do, dZ_end, reset, self.precision
        )
        return [dq, dk, dv], {i: d_dec[0], i + 1: d_dec[1], i + 2: d_dec[2], 6: dG}, dZ0
