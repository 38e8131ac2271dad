"""Shared decays on the chunked two-pass O(T) algorithm (docs/design.md §4): the primitives in
PyTorch (``TorchChunkOps``) and one segment's math from them, plugged into the segment driver
(``driver``).

The sequence is cut into chunks of L positions, grouped into segments of about
``SEGMENT_TOKENS`` positions (on a GPU, as many as ``segment_tokens`` allows). Within a segment
every step is a batched matmul over all its chunks; the only sequential work is the chunk-state
carry (one complex multiply-add per chunk). The backward is written out by hand: it recomputes
one segment at a time from the state stored at its start. The primitives (scan, intra-chunk
passes, their backward) come from the backend (``TorchChunkOps``); sequence
starts (``reset``) become 0/1 masks on the intra-chunk weights, the chunk-start state's reach and
the chunk-to-chunk carry (``layout.DocMasks``), in the forward and the backward alike.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from .layout import (
    ChunkDecays,
    Piece,
    chunk_decays,
    doc_masks,
    mask,
    to_chunks,
    to_chunks_T,
    unchunk,
)
from .numerics import (
    baddbmm,
    cmul,
    cmul_conj,
    dot_conj,
    matmul,
    scan_adjoint_interleaved,
    scan_interleaved,
    shear_in,
    shear_out,
)

# --- the primitives in PyTorch ---
# The shared-decay segment primitives in PyTorch (docs/design.md §4): the chunk-state scan,
# the two intra-chunk passes, and their hand-written backward. ``SharedSegments`` (below)
# composes them into a segment; on the kernels, ``triton_engine`` runs its own segment loop.
#
# Shapes as in ``layout``; dec: ChunkDecays of the segment's chunk length L; G_hat
# (H, 2M, 2M) interleaved; masks: DocMasks or None; the precision of every product ("ieee",
# "tf32", "bf16": numerics.py) is bound into the engine when ``driver.resolve_backend`` builds it.


class IntraGrads(NamedTuple):
    """Gradients through the two intra-chunk passes of one segment (before the state scan)."""

    dq: torch.Tensor  # (B, H, N, L, R)
    dkT: torch.Tensor  # (B, H, N, R, L)
    dvT: torch.Tensor  # (B, H, N, D, L)
    dS: tuple[torch.Tensor, torch.Tensor]  # (B, H, N, R | D, 2M): of the start states' rows
    d_start: torch.Tensor  # (H, L, 2M)
    d_end: torch.Tensor  # (H, L, 2M), the intra-chunk part
    dG: torch.Tensor  # (H, 2M, 2M)


class _Saved(NamedTuple):
    """Forward intermediates of one segment, kept only while its backward runs."""

    y: torch.Tensor
    lagged: torch.Tensor
    p: torch.Tensor
    w: torch.Tensor
    u: torch.Tensor
    mix: torch.Tensor


def flat(x: torch.Tensor) -> torch.Tensor:
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


def _carry(chunk: torch.Tensor, masks):
    """The chunk-to-chunk multiplier of chunk j: λ^L (H, 1, 2M), times carry[:, j] per row
    (B, H, 1, 2M) where documents start."""
    c = chunk[:, None, :]
    if masks is None:
        return lambda j: c
    return lambda j: c * masks.carry[:, j, None, None, None]


def reaching_end(zT, masks):
    """zT with the inputs a later document start cuts off their chunk's end zeroed."""
    return mask(zT, masks, "contrib")


class ChunkOps(Protocol):
    """The shared-decay segment primitives an engine supplies, its product precision bound in.
    ``TorchChunkOps`` implements them; the Triton engine fuses the same four into its own
    custom-op pair (``triton_engine``), checked against these by ``tests/kernel_checks.py``."""

    precision: str

    def chunk_dtype(self, x: torch.Tensor) -> torch.dtype:
        """The dtype of the chunk copies of x."""

    def chunk_states(self, zT, dec: ChunkDecays, Z0, masks):
        """Chunk-start states (B, H, N, R+D, 2M) and Z_end (B, H, R+D, 2M)."""

    def intra_forward(self, q, zT, starts, dec, G_hat, masks) -> torch.Tensor:
        """o (B, H, N, L, D) of one segment from its chunk-start states."""

    def intra_backward(self, q, zT, starts, dec, G_hat, do, masks) -> IntraGrads:
        """Gradients through the two passes, recomputing their intermediates from starts."""

    def chunk_states_backward(self, dS, dZ_end, dec, starts, masks):
        """(g_inc, dZ0, d_chunk) through the chunk-state scan."""


class TorchChunkOps:
    """``ChunkOps`` in PyTorch at one precision; chunk copies in the compute dtype."""

    def __init__(self, precision: str):
        self.precision = precision

    @staticmethod
    def chunk_dtype(x: torch.Tensor) -> torch.dtype:
        return torch.promote_types(x.dtype, torch.float32)

    def chunk_states(self, zT, dec: ChunkDecays, Z0, masks):
        """Chunk-start states (B, H, N, R+D, 2M) and Z_end (B, H, R+D, 2M)."""
        inc = matmul(flat(reaching_end(zT, masks)), dec.end, self.precision).view(
            *zT.shape[:3], -1, dec.end.shape[-1]
        )  # Σ βλ^{L-1-s} z_s
        return scan_interleaved(inc, Z0, _carry(dec.chunk, masks))

    def intra_forward(self, q, zT, starts, dec, G_hat, masks):
        """o (B, H, N, L, D) of one segment from its chunk-start states."""
        return _intra(q, zT, starts, dec, G_hat, masks, self.precision)[0]

    def intra_backward(self, q, zT, starts, dec, G_hat, do, masks) -> IntraGrads:
        """Gradients through the two passes, recomputing their intermediates from starts."""
        f = _intra(q, zT, starts, dec, G_hat, masks, self.precision)[1]
        return _intra_grads(f, starts, q, zT, dec, G_hat, do, masks, self.precision)

    def chunk_states_backward(self, dS, dZ_end, dec, starts, masks):
        """(g_inc (B, H, N, R+D, 2M): the gradients of each chunk's increment, dZ0, d_chunk
        (H, 2M)) through the scan, from dS = the start states' gradients."""
        carry = _carry(dec.chunk, masks)
        g_inc, dZ0 = scan_adjoint_interleaved(torch.cat(dS, dim=-2), dZ_end, carry)
        d_chunk = dot_conj(starts, g_inc, dim=-2)  # (B, H, N, 2M)
        if masks is not None:
            d_chunk = d_chunk * masks.carry[:, None, :, None]
        return g_inc, dZ0, d_chunk.sum((0, 2))


def _intra(q, zT, starts, dec: ChunkDecays, G_hat, masks, precision):
    """The two passes of one segment: (o (B, H, N, L, D), the intermediates _Saved)."""
    B, H, N, L, R = q.shape
    kT, v = zT[..., :R, :], zT[..., R:, :].mT
    start = dec.start[None, :, None]  # (1, H, 1, L, 2M) = λ^{i+1}
    # Pass 1: p(t) = λ^{i+1} ⊙ (Xᵏ q_t) + Σ_{s<=t} β λ^{t-s} (q_t · k_s)
    y = mask(matmul(q, starts[..., :R, :], precision), masks, "valid")  # (B, H, N, L, 2M)
    scores = mask(matmul(q, kT, precision), masks, "same")
    lagged = shear_in(scores)  # (B, H, N, L, L), aligned with dec.end
    p = _bmm_acc(cmul(start, y), flat(lagged), dec.end, precision)
    w = matmul(flat(p), G_hat.mT, precision).view(p.shape)  # w̃ = Ĝ p̂
    # Pass 2: o_t = Re(Xᵛᴴ (conj(λ^{i+1}) ⊙ w̃)) + Σ_{s<=t} Re(conj(β λ^{t-s}) · w̃) v_s
    u = mask(cmul_conj(start, w), masks, "valid")
    by_lag = matmul(flat(w), dec.end.mT, precision).view(B, H, N, L, L)
    mix = mask(shear_out(by_lag), masks, "same")  # (t, s) weights
    o = baddbmm(
        matmul(mix, v, precision).flatten(0, 2),
        u.flatten(0, 2),
        starts[..., R:, :].transpose(-1, -2).flatten(0, 2),
        precision,
    ).view(v.shape)
    return o, _Saved(y, lagged, p, w, u, mix)


def _intra_grads(f: _Saved, starts, q, zT, dec, G_hat, do, masks, precision) -> IntraGrads:
    def mm(a, b):
        return matmul(a, b, precision)

    B, H, N, L, R = q.shape
    kT, v = zT[..., :R, :], zT[..., R:, :].mT
    start = dec.start[None, :, None]
    # o = u Xᵛᵀ + mix v, mix = shear_out(w endᵀ), u = conj(start) ⊙ w
    dvT = mm(do.transpose(-1, -2), f.mix)  # (B, H, N, D, L)
    d_mix = shear_in(mask(mm(do, v.transpose(-1, -2)), masks, "same"))  # aligned with dec.end
    du = mask(mm(do, starts[..., R:, :]), masks, "valid")  # (B, H, N, L, 2M)
    dXv = mm(do.transpose(-1, -2), f.u)  # (B, H, N, D, 2M)
    dw = _bmm_acc(cmul(start, du), flat(d_mix), dec.end, precision)
    d_end = mm(flat(d_mix).transpose(-1, -2), flat(f.w)).sum(0)
    # start enters as start ⊙ y and as conj(start) ⊙ w: gradient Σ dp ⊙ conj(y) + w ⊙ conj(du)
    d_start = dot_conj(du, f.w, dim=2).sum(0)
    # w = Ĝ p
    dp = mm(flat(dw), G_hat).view(dw.shape)
    dG = mm(flat(dw).transpose(-1, -2), flat(f.p)).sum(0)
    # p = start ⊙ y + shear_in(q kᵀ) end
    d_scores = mask(shear_out(mm(flat(dp), dec.end.mT).view(B, H, N, L, L)), masks, "same")
    d_end = d_end + mm(flat(f.lagged).transpose(-1, -2), flat(dp)).sum(0)
    dy = mask(cmul_conj(start, dp), masks, "valid")
    d_start = d_start + dot_conj(f.y, dp, dim=2).sum(0)
    # y = q Xᵏ, scores = q kᵀ
    dq = mm(dy, starts[..., :R, :].transpose(-1, -2)) + mm(d_scores, kT.mT)
    dkT = mm(q.transpose(-1, -2), d_scores)  # (B, H, N, R, L)
    return IntraGrads(dq, dkT, dvT, (mm(q.transpose(-1, -2), dy), dXv), d_start, d_end, dG)


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


def segment_forward(q, zT, dec: ChunkDecays, G_hat, Z0, masks, ops: ChunkOps):
    """One segment. q: (B, H, N, L, R); zT = [kᵀ; vᵀ]: (B, H, N, R+D, L); Z0: (B, H, R+D, 2M).
    Returns (o: (B, H, N, L, D), Z_end)."""
    starts, Z_end = ops.chunk_states(zT, dec, Z0, masks)
    return ops.intra_forward(q, zT, starts, dec, G_hat, masks), Z_end


def segment_backward(q, zT, dec: ChunkDecays, G_hat, Z0, do, dZ_end, masks, ops: ChunkOps):
    """Gradients of one segment. Returns (dq, dzT, d_decays: ChunkDecays, dG, dZ0)."""
    R, precision = q.shape[-1], ops.precision
    starts, _ = ops.chunk_states(zT, dec, Z0, masks)
    g = ops.intra_backward(q, zT, starts, dec, G_hat, do, masks)
    g_inc, dZ0, d_chunk = ops.chunk_states_backward(g.dS, dZ_end, dec, starts, masks)
    zc = reaching_end(zT, masks).to(g_inc.dtype)  # the kernels' chunk copies keep bf16/fp16
    d_end = g.d_end + matmul(zc.flatten(2, 3).mT, g_inc.flatten(2, 3), precision).sum(0)
    dzT = matmul(g_inc.flatten(2, 3), dec.end.mT, precision).view(zc.shape)  # (B, H, N, R+D, L)
    if masks is not None:
        dzT = dzT * masks.contrib
    dzT[..., :R, :] += g.dkT
    dzT[..., R:, :] += g.dvT
    return g.dq, dzT, ChunkDecays(g.d_start, d_end, d_chunk), g.dG, dZ0


def forward_piece(q, k, v, start, end, chunk, G_hat, Z0, reset, ops: ChunkOps):
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
    )
    return unchunk(o), Z


def backward_piece(q, k, v, start, end, chunk, G_hat, Z0, do, dZ_end, reset, ops: ChunkOps):
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
    )
    R = q.shape[-1]
    dk = unchunk(dzT[..., :R, :], transposed=True)
    dv = unchunk(dzT[..., R:, :], transposed=True)
    return unchunk(dq), dk, dv, *d_decays, dG, dZ0


class SharedSegments:
    """The segment math of shared decays (``driver.SegmentMath``). params: the six decay
    tensors of ``chunk_decay_inputs`` (chunk length L, then the tail T % L) and Ĝ."""

    def __init__(self, decays, G_hat, L: int, backend):
        self.decays, self.G_hat, self.L, self.ops = decays, G_hat, L, backend.chunk
        self.forward_piece = backend.run(forward_piece)
        self.backward_piece = backend.run(backward_piece)

    def _slot(self, piece: Piece) -> int:
        return 0 if piece.L == self.L else 3  # the tail's decays follow the main ones

    def forward(self, piece, tokens, Z0, reset):
        i = self._slot(piece)
        dec = self.decays[i : i + 3]
        return self.forward_piece(*tokens, *dec, self.G_hat, Z0, reset, self.ops)

    def backward(self, piece, tokens, Z0, do, dZ_end, reset):
        i = self._slot(piece)
        dec = self.decays[i : i + 3]
        dq, dk, dv, *d_dec, dG, dZ0 = self.backward_piece(
            *tokens, *dec, self.G_hat, Z0, do, dZ_end, reset, self.ops
        )
        return [dq, dk, dv], {i: d_dec[0], i + 1: d_dec[1], i + 2: d_dec[2], 6: dG}, dZ0
