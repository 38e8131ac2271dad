"""The two intra-chunk passes of the chunked algorithm (docs/design.md §4) as Triton kernels, one
program per (batch, head, chunk), for the forward of one segment. q, k, v and o are read and
written by stride in their (B, T, H, ·) layout and dtype (chunk views, no copies); non-finite
inputs are zeroed as they are loaded and the rows containment poisons written as NaN.

pass 1:  p_t = λ^{t+1} ⊙ (Xᵏ_start q_t) + Σ_{s≤t} (q_t · k_s) β λ^{t-s}
         (then w̃ = Ĝ p, one batched GEMM outside the kernels)
pass 2:  o_t = Re(Xᵛ_startᴴ (conj(λ^{t+1}) ⊙ w̃_t)) + Σ_{s≤t} Re(conj(β λ^{t-s}) · w̃_t) v_s

The lag-indexed sums use a shear: scores (t, s) are re-read as (t, j) with s = t + j + 1 - L,
so that Σ_s A[t, s] β λ^{t-s} = lagged @ end with end[j] = β λ^{L-1-j}: every power is λⁿ,
n ≥ 0 (no overflow at large Δ, no sub-chunk reference points). The shear is a gather in
registers and shared memory (tiles.shear_in / shear_out).

Blocking: the (L, L) score tiles are formed once per program; the modes are walked in blocks of
BM (the autotuned block), so that a program holds (L, BM) tiles, never (L, M): pass 1 stores
p block by block, pass 2 accumulates o and the (t, j) lag weights over the blocks and applies
the shear once at the end. Every product is a tile `mma` at the PREC precision (bf16 or TF32
on the tensor cores, or IEEE fp32); decays, states and accumulators stay fp32. Sequence starts
(reset) become in-kernel masks from a cumulative count. p and w̃ may have any strides: the caller
lays them out per head, so that w̃ = Ĝ p is one strided batched GEMM over heads.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import (
    PRECISION_CODES,
    Space,
    block,
    cmul,
    doc_masks,
    finite,
    flags_strides,
    load_tile,
    mma,
    on_device,
    operand,
    program_bhn,
    reset_args,
    shear_in,
    shear_out,
    store_tile,
)

# Keys: the chunk's block BL, never L, T or B: a ragged tail (L = T % chunk) reuses the main
# chunk's tuned config and compiled kernel (L is not specialised on).
_KEY_P1 = ["BL", "R", "M", "HAS_RESET", "PREC"]
_KEY_P2 = ["BL", "D", "M", "HAS_RESET", "PREC"]
_SPACE_P1 = Space(
    sm90=[(4, 8), (4, 16), (4, 32), (8, 8), (8, 16), (8, 32)], sm80=[(8, 8), (8, 16), (8, 32)]
)
_SPACE_P2 = Space(
    sm90=[(4, 8), (4, 16), (8, 8), (8, 16), (8, 32), (8, 64)],
    sm80=[(4, 8), (8, 8), (8, 16)],
)


@triton.jit
def chunk_masks(reset_ptr, b, n, s_rb, s_rn, L, HAS_RESET: tl.constexpr, BL: tl.constexpr):
    """(valid (BL,), same (BL, BL)) of tiles.doc_masks; without resets, placeholders the
    kernels never read (every use sits under HAS_RESET)."""
    if HAS_RESET:
        return doc_masks(reset_ptr, b, n, s_rb, s_rn, L, BL)
    else:
        ll = tl.arange(0, BL)
        return ll >= 0, ll[:, None] >= 0


@triton.jit
def lagged_scores(q_base, k_base, reset_ptr, b, n, s_ql, s_kl, s_rb, s_rn, L, R,
                  HAS_RESET: tl.constexpr, PREC: tl.constexpr, BL: tl.constexpr,
                  BR: tl.constexpr):  # fmt: skip
    """Pass 1's prologue on one chunk: (q (BL, BR) as a PREC operand, the scores q kᵀ sheared
    to (t, j) lags, and chunk_masks' valid and same). q and k zeroed where non-finite."""
    ll, rr = tl.arange(0, BL), tl.arange(0, BR)
    q = operand(finite(load_tile(q_base, ll, rr, s_ql, 1, L, R)), PREC)
    kT = operand(finite(load_tile(k_base, rr, ll, 1, s_kl, R, L)), PREC)
    scores = mma(q, kT, None, PREC)  # (t, s)
    valid, same = chunk_masks(reset_ptr, b, n, s_rb, s_rn, L, HAS_RESET, BL)
    if HAS_RESET:
        scores = tl.where(same, scores, 0.0)
    return q, shear_in(operand(scores, PREC), L, BL), valid, same


@triton.jit
def p_block(q, lagged, valid, st_base, dstart_base, dend_base, cc, ll, rr, s_sc, s_dl, L, R, M,
            HAS_RESET: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """p's (BL, 2·BM) block at interleaved columns cc: λ^{t+1} ⊙ (Xᵏᵀ q_t) + lagged @ end."""
    y = mma(q, load_tile(st_base, rr, cc, s_sc, 1, R, 2 * M), None, PREC)  # Xᵏᵀ q_t
    if HAS_RESET:  # the chunk-start state reaches t only before a document start
        y = tl.where(valid[:, None], y, 0.0)
    start = load_tile(dstart_base, ll, cc, s_dl, 1, L, 2 * M)
    end = load_tile(dend_base, ll, cc, s_dl, 1, L, 2 * M)
    return mma(lagged, end, cmul(start, y, False), PREC)


@triton.jit
def start_part(w, o, dstart_base, xv_base, valid, cc, ll, dd, s_dl, s_sc, L, D, M,
               HAS_RESET: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """o + Re(Xᵛᴴ u) for w̃'s (BL, 2·BM) block at columns cc, u = conj(λ^{t+1}) ⊙ w̃ (zero
    from a document start on)."""
    u = cmul(load_tile(dstart_base, ll, cc, s_dl, 1, L, 2 * M), w, True)
    if HAS_RESET:
        u = tl.where(valid[:, None], u, 0.0)
    return mma(u, tl.trans(load_tile(xv_base, dd, cc, s_sc, 1, D, 2 * M)), o, PREC)


@triton.jit
def lag_part(by_lag, o, same, v_base, ll, dd, s_vl, L, D, HAS_RESET: tl.constexpr,
             PREC: tl.constexpr, BL: tl.constexpr):  # fmt: skip
    """o + mix v: mix the (t, s) weights sheared from the (t, j) lag weights by_lag, within one
    document; v zeroed where non-finite."""
    mix = shear_out(operand(by_lag, PREC), L, BL)
    if HAS_RESET:
        mix = tl.where(same, mix, tl.zeros_like(mix))
    v = finite(load_tile(v_base, ll, dd, s_vl, 1, L, D))
    return mma(mix, operand(v, PREC), o, PREC)


@triton.jit
def store_output(o, o_base, poison_base, ll, dd, s_ol, L, D, POISON: tl.constexpr):
    """o stored, NaN on the rows containment poisons (a nonzero int8 at poison_base + t)."""
    if POISON:
        bad = tl.load(poison_base + ll, mask=ll < L, other=0)
        o = tl.where((bad != 0)[:, None], float("nan"), o)
    store_tile(o_base, ll, dd, s_ol, 1, L, D, o)


@triton.autotune(configs=_SPACE_P1.configs, key=_KEY_P1, prune_configs_by=_SPACE_P1.prune)
@triton.jit(do_not_specialize=["N", "L"])
def _pass1_kernel(
    q_ptr, k_ptr, st_ptr, dstart_ptr, dend_ptr, reset_ptr, p_ptr,
    H, N, L, R, M,
    s_qb, s_qh, s_qn, s_ql,
    s_kb, s_kh, s_kn, s_kl,
    s_sb, s_sh, s_sn, s_sc,
    s_dh, s_dl,
    s_rb, s_rn,
    s_pb, s_ph, s_pn, s_pl,
    HAS_RESET: tl.constexpr, PREC: tl.constexpr,
    BL: tl.constexpr, BR: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    b, h, n = program_bhn(H, N)
    ll, rr = tl.arange(0, BL), tl.arange(0, BR)
    q, lagged, valid, _ = lagged_scores(
        q_ptr + b * s_qb + h * s_qh + n * s_qn, k_ptr + b * s_kb + h * s_kh + n * s_kn,
        reset_ptr, b, n, s_ql, s_kl, s_rb, s_rn, L, R, HAS_RESET, PREC, BL, BR,
    )  # fmt: skip
    st_base = st_ptr + b * s_sb + h * s_sh + n * s_sn
    p_base = p_ptr + b * s_pb + h * s_ph + n * s_pn
    for m0 in range(0, M, BM):
        cc = 2 * m0 + tl.arange(0, 2 * BM)  # interleaved columns of modes [m0, m0 + BM)
        p = p_block(q, lagged, valid, st_base, dstart_ptr + h * s_dh, dend_ptr + h * s_dh, cc,
                    ll, rr, s_sc, s_dl, L, R, M, HAS_RESET, PREC)  # fmt: skip
        store_tile(p_base, ll, cc, s_pl, 1, L, 2 * M, p)


@triton.autotune(configs=_SPACE_P2.configs, key=_KEY_P2, prune_configs_by=_SPACE_P2.prune)
@triton.jit(do_not_specialize=["N", "L"])
def _pass2_kernel(
    w_ptr, v_ptr, st_ptr, dstart_ptr, dend_ptr, reset_ptr, poison_ptr, o_ptr,
    H, N, L, R, D, M,
    s_wb, s_wh, s_wn, s_wl,
    s_vb, s_vh, s_vn, s_vl,
    s_sb, s_sh, s_sn, s_sc,
    s_dh, s_dl,
    s_rb, s_rn,
    s_fb, s_fh, s_fn,
    s_ob, s_oh, s_on, s_ol,
    HAS_RESET: tl.constexpr, PREC: tl.constexpr, POISON: tl.constexpr,
    BL: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    b, h, n = program_bhn(H, N)
    ll, dd = tl.arange(0, BL), tl.arange(0, BD)
    valid, same = chunk_masks(reset_ptr, b, n, s_rb, s_rn, L, HAS_RESET, BL)
    w_base = w_ptr + b * s_wb + h * s_wh + n * s_wn
    # the (t, s) weights: mix = shear_out(Σ_m Re(conj(end[j]) w̃_t)), one pass over the modes
    by_lag = tl.zeros((BL, BL), dtype=tl.float32)
    for m0 in range(0, M, BM):
        cc = 2 * m0 + tl.arange(0, 2 * BM)
        w = load_tile(w_base, ll, cc, s_wl, 1, L, 2 * M)
        end = load_tile(dend_ptr + h * s_dh, ll, cc, s_dl, 1, L, 2 * M)
        by_lag = mma(w, tl.trans(end), by_lag, PREC)
    v_base = v_ptr + b * s_vb + h * s_vh + n * s_vn
    o = lag_part(by_lag, None, same, v_base, ll, dd, s_vl, L, D, HAS_RESET, PREC, BL)
    # the chunk-start state's part, Re(Xᵛᴴ u) with u = conj(λ^{t+1}) ⊙ w̃, a second pass
    sv_base = st_ptr + b * s_sb + h * s_sh + n * s_sn + R * s_sc
    for m0 in range(0, M, BM):
        cc = 2 * m0 + tl.arange(0, 2 * BM)
        w = load_tile(w_base, ll, cc, s_wl, 1, L, 2 * M)
        o = start_part(w, o, dstart_ptr + h * s_dh, sv_base, valid, cc, ll, dd, s_dl, s_sc,
                       L, D, M, HAS_RESET, PREC)  # fmt: skip
    store_output(o, o_ptr + b * s_ob + h * s_oh + n * s_on, poison_ptr + b * s_fb + h * s_fh
                 + n * s_fn, ll, dd, s_ol, L, D, POISON)  # fmt: skip


def intra_chunk_pass1(q, k, starts, d_start, d_end, p, reset=None, precision="ieee", BL=None):
    """One piece of n chunks of length L. q, k: (B, H, n, L, R) chunk views of the (B, T, H, R)
    inputs (chunk_view), any float dtype; starts: (B, H, n, R+D, 2M) chunk-start states;
    d_start, d_end: (H, L, 2M) (ChunkDecays, any strides); p: (B, H, n, L, 2M) fp32 (any
    strides), written; reset: (B, n, L) uint8 or None; precision: "ieee", "tf32" or "bf16" (of
    every product); BL: the block of the call's main chunk length. Every last dimension with
    unit stride. p_t = λ^{t+1} ⊙ (Xᵏ q_t) + Σ_{s≤t} (q_t · k_s) β λ^{t-s}."""
    B, H, N, L, R = q.shape
    M = starts.shape[-1] // 2
    r, s_rb, s_rn, has_reset = reset_args(reset, q)
    with on_device(q):
        _pass1_kernel[(B * H * N,)](
            q, k, starts, d_start, d_end, r, p,
            H, N, L, R, M,
            *q.stride()[:4], *k.stride()[:4], *starts.stride()[:4], *d_start.stride()[:2],
            s_rb, s_rn, *p.stride()[:4],
            HAS_RESET=has_reset, PREC=PRECISION_CODES[precision], BL=BL or block(L),
            BR=block(R),
        )  # fmt: skip
    return p


def intra_chunk_pass2(
    w, v, starts, d_start, d_end, key_dim, o, reset=None, poison=None, precision="ieee", BL=None
):
    """w: (B, H, n, L, 2M) = Ĝ p per position (any strides); v: (B, H, n, L, D) chunk view of
    the (B, T, H, D) input; key_dim: R (starts holds R key rows, then D value rows); o:
    (B, H, n, L, D) chunk view of the (B, T, H, D) output in any float dtype, written; poison:
    (B, H, n·L) int8 or None (rows written as NaN where nonzero); other arguments as in
    intra_chunk_pass1."""
    B, H, N, L, twoM = w.shape
    R, D = key_dim, v.shape[-1]
    r, s_rb, s_rn, has_reset = reset_args(reset, w)
    with on_device(w):
        _pass2_kernel[(B * H * N,)](
            w, v, starts, d_start, d_end, r, poison if poison is not None else r, o,
            H, N, L, R, D, twoM // 2,
            *w.stride()[:4], *v.stride()[:4], *starts.stride()[:4], *d_start.stride()[:2],
            s_rb, s_rn, *flags_strides(poison, L), *o.stride()[:4],
            HAS_RESET=has_reset, PREC=PRECISION_CODES[precision], POISON=poison is not None,
            BL=BL or block(L), BD=block(D),
        )  # fmt: skip
    return o
