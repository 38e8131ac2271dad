"""The Triton side of the op: the ``idmix_kernels`` import, the per-token pair work on the kernels,
and the shared-decay chunked op on them, as torch custom ops
(``idmix::chunked_kernels_forward`` and ``idmix::chunked_kernels_backward``): every launch of
the GPU training path. The forward launches the decay tables and the non-finite flags once, then
per segment the chunk-start states and the output with p and w̃ = Ĝ p on chip
(kernels/chunk_output.py), for heads of up to 64 features and modes at chunks of up to 64;
others form p in pass 1, w̃ in one strided GEMM and o in pass 2.
The backward reuses the forward's decay tables, recomputes the states and p by pass 1; w̃ = Ĝ p
and dp = dw̃ Ĝ are formed in the kernels that use them, and between its launches run only one
strided GEMM (dĜ += dw̃ᵀ p) and three small sums.

What the kernels take care of, so that no PyTorch op has to (docs/gpu.md, "The GPU path"):
- q, k, v, o and their gradients stay in their (B, T, H, ·) layout and dtype: the kernels read
  and write them by stride through chunk views (no chunk-layout copies, no fp32 casts);
- p, w̃, dw̃ and the decay partials are laid out per head, (H, B, n, L, 2M), so each product
  with Ĝ is one batched GEMM over heads and dĜ sums over every row inside it;
- the decay tables come from (λ, β) in one launch and go back in one (kernels/decay_tables.py);
- containment of non-finite inputs costs one parallel pass over q, k, v (kernels/nonfinite.py);
  the chunk kernels zero bad entries as they load them, the state scan finds the poisoned rows
  as it walks the chunks, the output kernel writes them as NaN, the backward passes them no
  gradient;
- a ragged last chunk (T % L) runs the main chunk's compiled kernels on slices of its tables
  (start[:T%L], end[L-T%L:], λ^{T%L} = start[T%L-1]), masked to its length.

Shapes: q, k (B, T, H, R); v (B, T, H, D) in one float dtype (fp32, bf16 or fp16); lam_ri,
beta_ri (H, M, 2) fp32; G_hat (H, 2M, 2M) fp32; Z0 (B, H, R+D, 2M) fp32 or None (zeros), with
non-finite entries already zeroed; bad_init (B, H) int8 or None (heads whose initial state had
one); reset (B, T) bool or None; precision resolved ("ieee", "tf32" or "bf16").
"""

from __future__ import annotations

import functools

import torch

from .layout import ChunkDecays, Chunked, Piece, chunk_view
from .layout import as_complex as _complex
from .layout import as_interleaved as _real
from .numerics import baddbmm, matmul
from .selective import gram
from .shared import num_pieces, plan, segment_tokens
from .validation import refuse_double_backward


def kernels_module():
    """The idmix_kernels module (raises the ImportError that says why when it is missing)."""
    import idmix_kernels

    return idmix_kernels


@functools.cache
def kernels_if_installed():
    """The idmix_kernels module, or None where it (or triton) is not installed."""
    try:
        return kernels_module()
    except ImportError:
        return None


def _starts(ch: Chunked):
    """(B, n, L) document starts, or None."""
    return None if ch.starts is None else ch.starts[:, 0]


class KernelPairs:
    """The backward's work over the pairs, given go (.., L, D), o's gradient."""

    def __init__(self, kernels, ch: Chunked, go: torch.Tensor):
        self.kernels, self.ch, self.go = kernels, ch, go
        self.starts = _starts(ch)
        self.c, self.beta = _real(ch.c), _real(ch.beta)

    def sums(self):
        ch = self.ch
        sums = self.kernels.selective_pair_sums(
            ch.q, ch.k, ch.v, self.go, self.c, self.beta, self.starts
        )
        return tuple(_complex(x) for x in sums)

    def grads(self, w, g_p):
        ch = self.ch
        g_q, g_k, g_v, g_beta = self.kernels.selective_pair_grads(
            ch.q, ch.k, ch.v, self.go, self.c, self.beta, _real(w), _real(g_p), self.starts
        )
        return g_q, g_k, g_v, _complex(g_beta)


class SelectiveTritonOps:
    """``selective.PairOps`` as kernel launches at one precision; kernels: the idmix_kernels
    module."""

    needs_log_decay = True

    def __init__(self, kernels, precision: str):
        self.kernels, self.precision = kernels, precision

    def pairs(self, ch: Chunked, go: torch.Tensor) -> KernelPairs:
        return KernelPairs(self.kernels, ch, go)

    def intra_forward(self, ch: Chunked, Xs, G_hat, R: int) -> torch.Tensor:
        """``selective_pass1``, Ĝ, ``selective_pass2``: o (B, H, n, L, D)."""
        starts, precision = _starts(ch), self.precision
        c, beta, Xs_ri = _real(ch.c), _real(ch.beta), _real(Xs)
        p = self.kernels.selective_pass1(ch.q, ch.k, c, beta, Xs_ri, starts, precision)
        w = _real(gram(_complex(p), G_hat.mT, precision))
        return self.kernels.selective_pass2(w, c, beta, ch.v, Xs_ri, R, starts, precision)


class _Views:
    """One piece's chunk views (B, H, n, L, ·) of the (B, T, H, ·) tensors, its decay tables,
    its document starts (B, n, L) uint8 and its slice of a (B, H, T) per-position tensor."""

    def __init__(self, piece: Piece, L: int, dec: ChunkDecays, reset):
        self.t0, self.t1, self.Lp = piece.t0, piece.t1, piece.L
        self.n = (piece.t1 - piece.t0) // piece.L
        self.dec = _piece_decays(dec, L, piece.L)
        self.reset = (
            None if reset is None else reset[:, self.t0 : self.t1].unflatten(1, (self.n, self.Lp))
        )

    def chunks(self, x):
        return chunk_view(x[:, self.t0 : self.t1], self.n, self.Lp, transpose=False)

    def positions(self, x):
        return x[:, :, self.t0 : self.t1]

    def per_head(self, H, B, M2, like, dtype=torch.float32):
        """An (H, B, n, L, 2M) buffer and its (B, H, n, L, 2M) view."""
        buf = like.new_empty(H, B, self.n, self.Lp, M2, dtype=dtype)
        return buf, buf.transpose(0, 1)


def _piece_decays(dec: ChunkDecays, L: int, Lp: int) -> ChunkDecays:
    """The tables of a ragged tail of length Lp < L as slices of the main ones."""
    if Lp == L:
        return dec
    return ChunkDecays(dec.start[:, :Lp], dec.end[:, L - Lp :], dec.start[:, Lp - 1])


def _plan(q, L):
    return plan(q.shape[1], L, segment_tokens(q, L))


def _uint8(reset):
    return None if reset is None else reset.contiguous().view(torch.uint8)


def _with_G(p_heads, G, precision):
    """w̃ = Ĝ p per head: p (H, B, n, L, 2M) -> (H, B, n, L, 2M), one batched GEMM."""
    H, M2 = p_heads.shape[0], p_heads.shape[-1]
    return matmul(p_heads.view(H, -1, M2), G.mT, precision).view(p_heads.shape)


def _states(kern, pv: _Views, k, v, Z, last, contain, precision, BL):
    """One piece's chunk-start states (B, H, n, R+D, 2M) (bf16 at precision "bf16", else fp32),
    its end state written into last (fp32)."""
    return kern.chunk_states(
        pv.chunks(k), pv.chunks(v), pv.dec.end, pv.dec.chunk, Z, last, pv.reset, precision,
        contain, BL,
    )  # fmt: skip


def _p(kern, pv: _Views, q, k, st, M2, precision, BL, dtype=torch.float32):
    """p on one piece by pass 1: (p (H, B, n, L, 2M) in dtype, its (B, H, n, L, 2M) view)."""
    H, B = q.shape[2], q.shape[0]
    p, p_bh = pv.per_head(H, B, M2, q, dtype)
    kern.intra_chunk_pass1(
        pv.chunks(q), pv.chunks(k), st, pv.dec.start, pv.dec.end, p_bh, pv.reset, precision, BL
    )
    return p, p_bh


@torch.library.custom_op("idmix::chunked_kernels_forward", mutates_args=())
def chunked_kernels_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam_ri: torch.Tensor,
    beta_ri: torch.Tensor,
    G_hat: torch.Tensor,
    Z0: torch.Tensor | None,
    bad_init: torch.Tensor | None,
    reset: torch.Tensor | None,
    chunk_size: int,
    precision: str,
) -> tuple[
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
]:
    """Returns (o (B, T, H, D) in q's dtype, NaN on poisoned rows; the final state (B, H, R+D,
    2M) fp32, NaN for a head whose last document is poisoned; the states at the segment
    boundaries (P-1, B, H, R+D, 2M); the poisoned rows (B, H, T) int8; the poison carried past
    each segment (P+1, B, H) int8; the decay tables start, end (H, L, 2M) and chunk (H, 2M)
    fp32, kept for the backward)."""
    kern = kernels_module()
    B, T, H, R = q.shape
    D, M, L = v.shape[-1], lam_ri.shape[1], chunk_size
    pieces = _plan(q, L)
    dec = ChunkDecays(*kern.decay_tables(lam_ri, beta_ri, L))
    flags = kern.nonfinite_flags(q, k, v)
    o = q.new_empty(B, T, H, D)
    poison = torch.empty(B, H, T, dtype=torch.int8, device=q.device)
    carry = torch.empty(len(pieces) + 1, B, H, dtype=torch.int8, device=q.device)
    bounds = q.new_empty(len(pieces) - 1, B, H, R + D, 2 * M, dtype=torch.float32)
    Z_end = q.new_empty(B, H, R + D, 2 * M, dtype=torch.float32)
    reset8, BL = _uint8(reset), kern.block(L)
    fused = kern.fits_fused_output(R, D, M, L)
    Z = Z0
    for i, piece in enumerate(pieces):
        pv = _Views(piece, L, dec, reset8)
        final = i == len(pieces) - 1
        last = Z_end if final else bounds[i]
        contain = kern.Containment(
            pv.positions(flags), pv.positions(poison), bad_init if i == 0 else carry[i],
            carry[i + 1], final,
        )  # fmt: skip
        st = _states(kern, pv, k, v, Z, last, contain, precision, BL)
        ov, rows = pv.chunks(o), pv.positions(poison)
        if fused:
            kern.chunk_output(
                pv.chunks(q), pv.chunks(k), pv.chunks(v), st, pv.dec.start, pv.dec.end, G_hat,
                ov, pv.reset, rows, precision, BL,
            )  # fmt: skip
        else:
            p = _p(kern, pv, q, k, st, 2 * M, precision, BL)[0]
            w_bh = _with_G(p, G_hat, precision).transpose(0, 1)
            kern.intra_chunk_pass2(
                w_bh, pv.chunks(v), st, pv.dec.start, pv.dec.end, R, ov, pv.reset, rows,
                precision, BL,
            )  # fmt: skip
        Z = last
    return o, Z_end, bounds, poison, carry, *dec


@chunked_kernels_forward.register_fake
def _(q, k, v, lam_ri, beta_ri, G_hat, Z0, bad_init, reset, chunk_size, precision):
    B, T, H, R = q.shape
    C, M2 = R + v.shape[-1], 2 * lam_ri.shape[1]
    P = num_pieces(T, chunk_size, segment_tokens(q, chunk_size))
    f32 = dict(dtype=torch.float32)
    return (
        q.new_empty(B, T, H, v.shape[-1]),
        q.new_empty(B, H, C, M2, **f32),
        q.new_empty(P - 1, B, H, C, M2, **f32),
        q.new_empty(B, H, T, dtype=torch.int8),
        q.new_empty(P + 1, B, H, dtype=torch.int8),
        q.new_empty(H, chunk_size, M2, **f32),
        q.new_empty(H, chunk_size, M2, **f32),
        q.new_empty(H, M2, **f32),
    )


@torch.library.custom_op("idmix::chunked_kernels_backward", mutates_args=())
def chunked_kernels_backward(
    do: torch.Tensor,
    dZ_end: torch.Tensor | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam_ri: torch.Tensor,
    beta_ri: torch.Tensor,
    G_hat: torch.Tensor,
    Z0: torch.Tensor | None,
    reset: torch.Tensor | None,
    bounds: torch.Tensor,
    poison: torch.Tensor,
    carry: torch.Tensor,
    start_table: torch.Tensor,
    end_table: torch.Tensor,
    chunk_table: torch.Tensor,
    chunk_size: int,
    precision: str,
) -> list[torch.Tensor]:
    """Gradients of (q, k, v, lam_ri, beta_ri, G_hat, Z0), recomputing each segment from the
    state at its start with the forward's decay tables; Z0's is computed whether or not Z0 was
    given."""
    kern = kernels_module()
    B, T, H, R = q.shape
    D, M, L = v.shape[-1], lam_ri.shape[1], chunk_size
    pieces = _plan(q, L)
    dec = ChunkDecays(start_table, end_table, chunk_table)
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    reset8, BL = _uint8(reset), kern.block(L)
    scratch = q.new_empty(B, H, R + D, 2 * M, dtype=torch.float32)
    grads = _TableGrads(dec)
    dG, dZ = None, dZ_end
    operands = kern.operand_dtype(precision)
    f32 = dict(dtype=torch.float32)
    for i in reversed(range(len(pieces))):
        pv = _Views(pieces[i], L, dec, reset8)
        final = i == len(pieces) - 1
        qv, kv, vv = pv.chunks(q), pv.chunks(k), pv.chunks(v)
        Zi = Z0 if i == 0 else bounds[i - 1]
        st = _states(kern, pv, k, v, Zi, scratch, None, precision, BL)
        # p and dw̃ are read only as product operands (w̃ = Ĝ p and dp = dw̃ Ĝ on chip, dĜ's
        # GEMM): at bf16 products they are stored in bf16; dw̃ is written once, whole
        p, p_bh = _p(kern, pv, q, k, st, 2 * M, precision, BL, operands)
        dw, dw_bh = pv.per_head(H, B, 2 * M, q, operands)
        ge, ge_bh = pv.per_head(H, B, 2 * M, q)
        gs, gs_bh = pv.per_head(H, B, 2 * M, q)
        dv_in = q.new_empty(B, H, pv.n, pv.Lp, D, **f32)
        dxv = q.new_empty(B, H, pv.n, D, 2 * M, **f32)
        kern.intra_chunk_pass2_backward(
            pv.chunks(do), p_bh, G_hat, vv, st, pv.dec.start, pv.dec.end, R, dv_in, dw_bh, ge_bh,
            gs_bh, dxv, pv.reset, pv.positions(poison), precision, BL,
        )  # fmt: skip
        dw_rows, p_rows = dw.view(H, -1, 2 * M), p.view(H, -1, 2 * M)
        dG = (
            matmul(dw_rows.mT, p_rows, precision, dtype=torch.float32)
            if dG is None
            else baddbmm(dG, dw_rows.mT, p_rows, precision)
        )
        dq_lag = q.new_empty(B, H, pv.n, pv.Lp, R, **f32)
        dkT = q.new_empty(B, H, pv.n, R, pv.Lp, **f32)
        dxk = q.new_empty(B, H, pv.n, R, 2 * M, **f32)
        kern.intra_chunk_pass1_backward(
            dw_bh, G_hat, qv, kv, st, pv.dec.start, pv.dec.end, dq_lag, dkT, dxk, ge_bh, gs_bh,
            pv.chunks(dq), pv.reset, precision, BL,
        )  # fmt: skip
        g_inc, dZ, d_chunk = kern.chunk_states_backward(
            dxk, dxv, dZ, pv.dec.chunk, st, pv.Lp, pv.reset, carry[-1] if final else None, BL,
            precision=precision,
        )  # fmt: skip
        kern.input_grads(
            g_inc, pv.dec.end, kv, vv, dkT, dv_in, ge_bh, pv.chunks(dk), pv.chunks(dv),
            pv.reset, precision, BL,
        )  # fmt: skip
        grads.add(pv.Lp, gs.flatten(1, 2).sum(1), ge.flatten(1, 2).sum(1), d_chunk.sum((0, 2)))
    d_lam, d_beta = kern.decay_tables_backward(lam_ri, beta_ri, *grads.tables(), L)
    return [dq, dk, dv, d_lam, d_beta, dG, dZ]


class _TableGrads:
    """The decay tables' gradients summed over the pieces; a ragged tail's go to the slices of
    the main tables it read (``_piece_decays``)."""

    def __init__(self, dec: ChunkDecays):
        self.L, self.dec = dec.start.shape[1], dec
        self.start = self.end = self.chunk = None

    def add(self, Lp: int, d_start, d_end, d_chunk) -> None:
        if self.start is None and Lp == self.L:
            self.start, self.end, self.chunk = d_start, d_end, d_chunk
            return
        if self.start is None:
            self.start, self.end, self.chunk = (torch.zeros_like(t) for t in self.dec)
        if Lp == self.L:
            self.start.add_(d_start)
            self.end.add_(d_end)
            self.chunk.add_(d_chunk)
        else:  # in place on the slices (an augmented assignment would copy them back)
            self.start[:, :Lp].add_(d_start)
            self.end[:, self.L - Lp :].add_(d_end)
            self.start[:, Lp - 1].add_(d_chunk)

    def tables(self):
        return self.start, self.end, self.chunk


@chunked_kernels_backward.register_fake
def _(do, dZ_end, q, k, v, lam_ri, beta_ri, G_hat, Z0, reset, bounds, poison, carry, *_rest):
    B, _, H, R = q.shape
    C, M2 = R + v.shape[-1], 2 * lam_ri.shape[1]
    grads = [torch.empty_like(t) for t in (q, k, v, lam_ri, beta_ri, G_hat)]
    return [*grads, q.new_empty(B, H, C, M2, dtype=torch.float32)]


def _setup_context(ctx, inputs, output):
    q, k, v, lam_ri, beta_ri, G_hat, Z0, _bad_init, reset, chunk_size, precision = inputs
    _o, _Z, bounds, poison, carry, *tables = output
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None, not zeros
    ctx.chunk_size, ctx.precision = chunk_size, precision
    ctx.has_Z0, ctx.has_reset = Z0 is not None, reset is not None
    extra = [t for t in (Z0, reset) if t is not None]
    ctx.save_for_backward(q, k, v, lam_ri, beta_ri, G_hat, bounds, poison, carry, *tables, *extra)
    ctx.mark_non_differentiable(bounds, poison, carry, *tables)


def _backward(ctx, do, dZ_end, _d_bounds, _d_poison, _d_carry, *_d_tables):
    q, k, v, lam_ri, beta_ri, G_hat, bounds, poison, carry, *extra = ctx.saved_tensors
    tables, extra = extra[:3], extra[3:]
    Z0 = extra.pop(0) if ctx.has_Z0 else None
    reset = extra.pop(0) if ctx.has_reset else None
    if do is None:
        do = q.new_zeros(*q.shape[:-1], v.shape[-1])
    # the kernels read by stride with a unit last one (a sum's gradient comes expanded)
    do = do if do.stride(-1) == 1 else do.contiguous()
    dZ_end = None if dZ_end is None else dZ_end.contiguous()
    grads = torch.ops.idmix.chunked_kernels_backward(
        do, dZ_end, q, k, v, lam_ri, beta_ri, G_hat, Z0, reset, bounds, poison, carry,
        *tables, ctx.chunk_size, ctx.precision,
    )  # fmt: skip
    grads = refuse_double_backward(grads, (do, q, k, v, lam_ri, beta_ri, G_hat))
    dq, dk, dv, d_lam, d_beta, dG, dZ0 = grads
    return dq, dk, dv, d_lam, d_beta, dG, dZ0 if ctx.has_Z0 else None, None, None, None, None


chunked_kernels_forward.register_autograd(_backward, setup_context=_setup_context)
