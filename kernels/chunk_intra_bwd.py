"""Backward of the two intra-chunk passes (chunk_intra.py), one program per (batch, head,
chunk). Each recomputes what it needs of its pass from the chunk-start states and writes the
gradients of its inputs; the decay gradients come out per program, accumulated across the four
kernels into two buffers (summed over batch and chunks outside). Between the two passes,
dĜ += dw̃ᵀ p is a batched GEMM over heads in PyTorch; w̃ = Ĝ p (pass 2's kernels) and dp = dw̃ Ĝ
(pass 1's) are formed on chip, block by block, where they are used. q, k, v and do are read
by stride from their (B, T, H, ·) layout (non-finite q, k, v entries zeroed, do's poisoned rows
zeroed: containment); dq is written there in its dtype, zero where q was not finite; the
intra-chunk parts of dk and dv go to fp32 buffers that chunk_input_grads.py completes.

pass 2 backward (given do, p):   dv, dXᵛ, dw̃ and the partial dλ^{i+1}, d(βλ^{L-1-j})
pass 1 backward (given dw̃):     dq, dk, dXᵏ and the partial dλ^{i+1}, d(βλ^{L-1-j})

Each pass is two kernels, run in turn: the lag part (the (L, L) weights by lag and the
gradients through them) and the chunk-start part (the products with the start state). Split,
each kernel holds two loop-invariant product operands instead of four, which is what keeps
them clear of spills (benchmarks/offline_compile.py). Pass 1's second kernel reads what the
first wrote of dq; pass 2's forms d_lag = shear_in(do vᵀ) again (L·L·D multiply-adds) and
writes dw̃ whole, once, so no lag part of it goes through HBM. Blocked like the forward: the (L, L) tiles once per
program, the modes in blocks of BM, every product a tile `mma` at the PREC precision with fp32
accumulation.
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
    is_finite,
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

# _pass2_bwd_lag_kernel forms w̃ = Ĝ p on chip: (8, 64) on sm_90 and (8, 32) on sm_80 spill;
# _pass2_bwd_state_kernel also holds d_lag: at R = D = 128 (8, 32) spills at bf16 and (8, 16)
# at TF32 on sm_90
_LAG2 = Space(sm90=[(4, 8), (4, 16), (8, 8), (8, 16), (8, 32)], sm80=[(8, 8), (8, 16)])
_STATE2 = Space(sm90=[(4, 8), (8, 8)], sm80=[(8, 8)])
_LAG1 = Space(
    sm90=[(4, 8), (4, 16), (8, 8), (8, 16), (8, 32), (8, 64)],
    sm80=[(4, 8), (8, 8), (8, 16)],
)
_STATE1 = Space(sm90=[(8, 8), (8, 16)], sm80=[(8, 8)])
_KEY_P2 = ["BL", "D", "M", "HAS_RESET", "PREC"]
_KEY_P1 = ["BL", "R", "M", "HAS_RESET", "PREC"]

# Shared signature tails: (s_*b, s_*h, s_*n, s_*row) strides of each (B, H, N, rows, ·) tensor;
# dw̃ and the two decay-partial buffers share w̃'s strides (pass 2), the partials dp's (pass 1).


@triton.jit
def _load_do(do_base, ll, cols, s_ol, L, D, bad, POISON: tl.constexpr):
    """do rows (BL, cols) of a chunk, zero where containment set the output to NaN."""
    do = load_tile(do_base, ll, cols, s_ol, 1, L, D)
    if POISON:
        do = tl.where(bad[:, None], 0.0, do)
    return do


@triton.jit
def _poisoned(poison_ptr, b, h, n, s_fb, s_fh, s_fn, L, BL: tl.constexpr, POISON: tl.constexpr):
    """(BL,) bool: the chunk's rows containment poisoned (all False without POISON)."""
    ll = tl.arange(0, BL)
    if POISON:
        bad = tl.load(poison_ptr + b * s_fb + h * s_fh + n * s_fn + ll, mask=ll < L, other=0)
        return bad != 0
    else:
        return ll < 0


@triton.jit
def _times_G(x_base, g_base, co, ll, s_xl, s_gi, s_go, L, M, PREC: tl.constexpr,
             BM: tl.constexpr):  # fmt: skip
    """(BL, 2·BM) block at interleaved output columns co of x Γ, where Γ[i, o] sits at
    g_base + i·s_gi + o·s_go: Σ over input mode blocks of x's block times Γ's tile, formed where
    it is used and never stored. dp = dw̃ Ĝ: (s_gi, s_go) = Ĝ's (row, column) strides; w̃ = p Ĝᵀ:
    its (column, row) strides."""
    acc = tl.zeros((ll.shape[0], 2 * BM), dtype=tl.float32)
    for mi in range(0, M, BM):
        ci = 2 * mi + tl.arange(0, 2 * BM)
        x = load_tile(x_base, ll, ci, s_xl, 1, L, 2 * M)
        acc = mma(x, load_tile(g_base, ci, co, s_gi, s_go, 2 * M, 2 * M), acc, PREC)
    return acc


@triton.autotune(configs=_LAG2.configs, key=_KEY_P2, prune_configs_by=_LAG2.prune)
@triton.jit(do_not_specialize=["N", "L"])
def _pass2_bwd_lag_kernel(
    do_ptr, p_ptr, g_ptr, v_ptr, dend_ptr, reset_ptr, poison_ptr, dv_ptr, gend_ptr,
    H, N, L, R, D, M,
    s_ob, s_oh, s_on, s_ol,
    s_wb, s_wh, s_wn, s_wl,
    s_gh, s_gr, s_gc,
    s_vb, s_vh, s_vn, s_vl,
    s_dh, s_dl,
    s_rb, s_rn,
    s_fb, s_fh, s_fn,
    s_xb, s_xh, s_xn, s_xl,
    HAS_RESET: tl.constexpr, PREC: tl.constexpr, POISON: tl.constexpr,
    BL: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """dv = mixᵀ do with mix = shear_out(w̃ endᵀ) (recomputed); d_lag = shear_in(do vᵀ) and the
    end partial d_lagᵀ w̃, with w̃ = Ĝ p formed block by block (_times_G). do and v are walked
    in blocks of BK channels: on sm_80 a whole (L, D) product operand is held by every warp."""
    b, h, n = program_bhn(H, N)
    ll = tl.arange(0, BL)
    if HAS_RESET:
        valid, same = doc_masks(reset_ptr, b, n, s_rb, s_rn, L, BL)
    bad = _poisoned(poison_ptr, b, h, n, s_fb, s_fh, s_fn, L, BL, POISON)
    do_base = do_ptr + b * s_ob + h * s_oh + n * s_on
    v_base = v_ptr + b * s_vb + h * s_vh + n * s_vn
    d_mix = tl.zeros((BL, BL), dtype=tl.float32)  # (t, s): Σ_d do_t v_s
    for d0 in range(0, D, BK):
        dk = d0 + tl.arange(0, BK)
        do = _load_do(do_base, ll, dk, s_ol, L, D, bad, POISON)
        v = finite(load_tile(v_base, ll, dk, s_vl, 1, L, D))
        d_mix = mma(do, tl.trans(v), d_mix, PREC)
    if HAS_RESET:
        d_mix = tl.where(same, d_mix, 0.0)
    d_lag = shear_in(operand(d_mix, PREC), L, BL)  # aligned with end
    p_base, g_base = p_ptr + b * s_wb + h * s_wh + n * s_wn, g_ptr + h * s_gh
    by_lag = tl.zeros((BL, BL), dtype=tl.float32)
    for m0 in range(0, M, BM):
        cc = 2 * m0 + tl.arange(0, 2 * BM)
        w = _times_G(p_base, g_base, cc, ll, s_wl, s_gc, s_gr, L, M, PREC, BM)
        end = load_tile(dend_ptr + h * s_dh, ll, cc, s_dl, 1, L, 2 * M)
        by_lag = mma(w, tl.trans(end), by_lag, PREC)
    mix = shear_out(operand(by_lag, PREC), L, BL)
    if HAS_RESET:
        mix = tl.where(same, mix, tl.zeros_like(mix))
    dv_base = dv_ptr + b * s_xb + h * s_xh + n * s_xn
    for d0 in range(0, D, BK):
        dk = d0 + tl.arange(0, BK)
        do = _load_do(do_base, ll, dk, s_ol, L, D, bad, POISON)
        dv = mma(tl.trans(mix), do, None, PREC)  # (s, d)
        store_tile(dv_base, ll, dk, s_xl, 1, L, D, dv)
    ge_base = gend_ptr + b * s_wb + h * s_wh + n * s_wn
    for m0 in range(0, M, BM):
        cc = 2 * m0 + tl.arange(0, 2 * BM)
        w = _times_G(p_base, g_base, cc, ll, s_wl, s_gc, s_gr, L, M, PREC, BM)
        store_tile(ge_base, ll, cc, s_wl, 1, L, 2 * M, mma(tl.trans(d_lag), w, None, PREC))


@triton.autotune(configs=_STATE2.configs, key=_KEY_P2, prune_configs_by=_STATE2.prune)
@triton.jit(do_not_specialize=["N", "L"])
def _pass2_bwd_state_kernel(
    do_ptr, p_ptr, g_ptr, v_ptr, st_ptr, dstart_ptr, dend_ptr, reset_ptr, poison_ptr, dxv_ptr,
    dw_ptr, gstart_ptr,
    H, N, L, R, D, M,
    s_ob, s_oh, s_on, s_ol,
    s_wb, s_wh, s_wn, s_wl,
    s_gh, s_gr, s_gc,
    s_vb, s_vh, s_vn, s_vl,
    s_sb, s_sh, s_sn, s_sc,
    s_dh, s_dl,
    s_rb, s_rn,
    s_fb, s_fh, s_fn,
    s_xb, s_xh, s_xn, s_xd,
    HAS_RESET: tl.constexpr, PREC: tl.constexpr, POISON: tl.constexpr,
    BL: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """du = do Xᵛ (the start state's read); dXᵛ = doᵀ u with u = conj(λ^{t+1}) ⊙ w̃;
    dw̃ = d_lag end + λ^{t+1} ⊙ du, whole, with d_lag = shear_in(do vᵀ) formed here as the lag
    kernel forms it, stored at dw_ptr in its dtype (fp32, or bf16 at bf16 products); the start
    partial conj(du) ⊙ w̃; w̃ = Ĝ p formed block by block."""
    b, h, n = program_bhn(H, N)
    ll, dd = tl.arange(0, BL), tl.arange(0, BD)
    if HAS_RESET:
        valid, same = doc_masks(reset_ptr, b, n, s_rb, s_rn, L, BL)
    bad = _poisoned(poison_ptr, b, h, n, s_fb, s_fh, s_fn, L, BL, POISON)
    do = _load_do(do_ptr + b * s_ob + h * s_oh + n * s_on, ll, dd, s_ol, L, D, bad, POISON)
    do = operand(do, PREC)
    v = finite(load_tile(v_ptr + b * s_vb + h * s_vh + n * s_vn, ll, dd, s_vl, 1, L, D))
    d_mix = mma(do, tl.trans(v), None, PREC)  # (t, s): Σ_d do_t v_s
    if HAS_RESET:
        d_mix = tl.where(same, d_mix, 0.0)
    d_lag = shear_in(operand(d_mix, PREC), L, BL)  # aligned with end
    p_base, g_base = p_ptr + b * s_wb + h * s_wh + n * s_wn, g_ptr + h * s_gh
    sv_base = st_ptr + b * s_sb + h * s_sh + n * s_sn + R * s_sc
    dxv_base = dxv_ptr + b * s_xb + h * s_xh + n * s_xn
    dw_base = dw_ptr + b * s_wb + h * s_wh + n * s_wn
    gs_base = gstart_ptr + b * s_wb + h * s_wh + n * s_wn
    for m0 in range(0, M, BM):
        cc = 2 * m0 + tl.arange(0, 2 * BM)
        w = _times_G(p_base, g_base, cc, ll, s_wl, s_gc, s_gr, L, M, PREC, BM)
        start = load_tile(dstart_ptr + h * s_dh, ll, cc, s_dl, 1, L, 2 * M)
        du = mma(do, load_tile(sv_base, dd, cc, s_sc, 1, D, 2 * M), None, PREC)  # (t, modes)
        u = cmul(start, w, True)
        if HAS_RESET:
            du = tl.where(valid[:, None], du, 0.0)
            u = tl.where(valid[:, None], u, 0.0)
        store_tile(dxv_base, dd, cc, s_xd, 1, D, 2 * M, mma(tl.trans(do), u, None, PREC))
        end = load_tile(dend_ptr + h * s_dh, ll, cc, s_dl, 1, L, 2 * M)
        dw = mma(d_lag, end, cmul(start, du, False), PREC)
        store_tile(dw_base, ll, cc, s_wl, 1, L, 2 * M, dw)
        store_tile(gs_base, ll, cc, s_wl, 1, L, 2 * M, cmul(du, w, True))


# it adds into the end partials pass 2 wrote: autotuning must put them back after each run
@triton.autotune(
    configs=_LAG1.configs, key=_KEY_P1, prune_configs_by=_LAG1.prune, restore_value=["gend_ptr"]
)
@triton.jit(do_not_specialize=["N", "L"])
def _pass1_bwd_lag_kernel(
    dw_ptr, g_ptr, q_ptr, k_ptr, dend_ptr, reset_ptr, dq_ptr, dk_ptr, gend_ptr,
    H, N, L, R, M,
    s_pb, s_ph, s_pn, s_pl,
    s_gh, s_gr, s_gc,
    s_qb, s_qh, s_qn, s_ql,
    s_kb, s_kh, s_kn, s_kl,
    s_dh, s_dl,
    s_rb, s_rn,
    s_ib, s_ih, s_in, s_il,
    s_jb, s_jh, s_jn, s_jr,
    HAS_RESET: tl.constexpr, PREC: tl.constexpr,
    BL: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """d_scores = shear_out(dp endᵀ); dq = d_scores k (the lag part, to the fp32 buffer);
    dkᵀ = qᵀ d_scores; the end partial += laggedᵀ dp with lagged = shear_in(q kᵀ) (recomputed)
    and dp = dw̃ Ĝ formed block by block (_times_G). q and k are walked in blocks of BK
    features (see _pass2_bwd_lag_kernel)."""
    b, h, n = program_bhn(H, N)
    ll = tl.arange(0, BL)
    q_base = q_ptr + b * s_qb + h * s_qh + n * s_qn
    k_base = k_ptr + b * s_kb + h * s_kh + n * s_kn
    scores = tl.zeros((BL, BL), dtype=tl.float32)  # (t, s)
    for r0 in range(0, R, BK):
        rk = r0 + tl.arange(0, BK)
        q = finite(load_tile(q_base, ll, rk, s_ql, 1, L, R))
        kT = finite(load_tile(k_base, rk, ll, 1, s_kl, R, L))
        scores = mma(q, kT, scores, PREC)
    if HAS_RESET:
        _, same = doc_masks(reset_ptr, b, n, s_rb, s_rn, L, BL)
        scores = tl.where(same, scores, 0.0)
    lagged = shear_in(operand(scores, PREC), L, BL)
    dw_base = dw_ptr + b * s_pb + h * s_ph + n * s_pn
    ge_base = gend_ptr + b * s_pb + h * s_ph + n * s_pn
    by_lag = tl.zeros((BL, BL), dtype=tl.float32)  # (t, j): Σ_m Re(conj(end[j]) dp_t)
    for m0 in range(0, M, BM):
        cc = 2 * m0 + tl.arange(0, 2 * BM)
        dp = _times_G(dw_base, g_ptr + h * s_gh, cc, ll, s_pl, s_gr, s_gc, L, M, PREC, BM)
        end = load_tile(dend_ptr + h * s_dh, ll, cc, s_dl, 1, L, 2 * M)
        by_lag = mma(dp, tl.trans(end), by_lag, PREC)
        ge = load_tile(ge_base, ll, cc, s_pl, 1, L, 2 * M)
        store_tile(ge_base, ll, cc, s_pl, 1, L, 2 * M, mma(tl.trans(lagged), dp, ge, PREC))
    d_scores = shear_out(operand(by_lag, PREC), L, BL)
    if HAS_RESET:
        d_scores = tl.where(same, d_scores, tl.zeros_like(d_scores))
    dq_base = dq_ptr + b * s_ib + h * s_ih + n * s_in
    dk_base = dk_ptr + b * s_jb + h * s_jh + n * s_jn
    for r0 in range(0, R, BK):
        rk = r0 + tl.arange(0, BK)
        k = finite(load_tile(k_base, ll, rk, s_kl, 1, L, R))
        store_tile(dq_base, ll, rk, s_il, 1, L, R, mma(d_scores, k, None, PREC))
        q = finite(load_tile(q_base, ll, rk, s_ql, 1, L, R))
        dkT = mma(tl.trans(q), d_scores, None, PREC)  # (r, s)
        store_tile(dk_base, rk, ll, s_jr, 1, R, L, dkT)


# it adds into the start partials pass 2 wrote: autotuning must put them back after each run
@triton.autotune(
    configs=_STATE1.configs, key=_KEY_P1, prune_configs_by=_STATE1.prune,
    restore_value=["gstart_ptr"],
)  # fmt: skip
@triton.jit(do_not_specialize=["N", "L"])
def _pass1_bwd_state_kernel(
    dw_ptr, g_ptr, q_ptr, st_ptr, dstart_ptr, reset_ptr, dqin_ptr, dq_ptr, dxk_ptr, gstart_ptr,
    H, N, L, R, M,
    s_pb, s_ph, s_pn, s_pl,
    s_gh, s_gr, s_gc,
    s_qb, s_qh, s_qn, s_ql,
    s_sb, s_sh, s_sn, s_sc,
    s_dh, s_dl,
    s_rb, s_rn,
    s_xb, s_xh, s_xn, s_xr,
    s_ib, s_ih, s_in, s_il,
    s_ob, s_oh, s_on, s_ol,
    HAS_RESET: tl.constexpr, PREC: tl.constexpr,
    BL: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """y = q Xᵏ, dy = conj(λ^{t+1}) ⊙ dp (dp = dw̃ Ĝ formed block by block); dq = (the lag
    part) + dy Xᵏᵀ, written in q's layout and dtype (zero where q was not finite); dXᵏ = qᵀ dy;
    the start partial += conj(y) ⊙ dp.
    The features are walked in blocks of BK, each holding its block of dq through the pass over
    the modes (the first block also forms y, over every feature block)."""
    b, h, n = program_bhn(H, N)
    ll = tl.arange(0, BL)
    if HAS_RESET:
        valid, _ = doc_masks(reset_ptr, b, n, s_rb, s_rn, L, BL)
    q_base = q_ptr + b * s_qb + h * s_qh + n * s_qn
    dw_base = dw_ptr + b * s_pb + h * s_ph + n * s_pn
    sk_base = st_ptr + b * s_sb + h * s_sh + n * s_sn
    dxk_base = dxk_ptr + b * s_xb + h * s_xh + n * s_xn
    gs_base = gstart_ptr + b * s_pb + h * s_ph + n * s_pn
    for r0 in range(0, R, BK):
        rk = r0 + tl.arange(0, BK)
        q_raw = load_tile(q_base, ll, rk, s_ql, 1, L, R)
        q = operand(finite(q_raw), PREC)
        dq = load_tile(dqin_ptr + b * s_ib + h * s_ih + n * s_in, ll, rk, s_il, 1, L, R)
        for m0 in range(0, M, BM):
            cc = 2 * m0 + tl.arange(0, 2 * BM)
            dp = _times_G(dw_base, g_ptr + h * s_gh, cc, ll, s_pl, s_gr, s_gc, L, M, PREC, BM)
            dy = cmul(load_tile(dstart_ptr + h * s_dh, ll, cc, s_dl, 1, L, 2 * M), dp, True)
            if HAS_RESET:
                dy = tl.where(valid[:, None], dy, 0.0)
            sk = load_tile(sk_base, rk, cc, s_sc, 1, R, 2 * M)
            dq = mma(dy, tl.trans(sk), dq, PREC)
            store_tile(dxk_base, rk, cc, s_xr, 1, R, 2 * M, mma(tl.trans(q), dy, None, PREC))
            if r0 == 0:  # y = Σ over every feature block of q Xᵏ, and the start partial
                y = tl.zeros((BL, 2 * BM), dtype=tl.float32)
                for r1 in range(0, R, BK):
                    rj = r1 + tl.arange(0, BK)
                    qj = finite(load_tile(q_base, ll, rj, s_ql, 1, L, R))
                    y = mma(qj, load_tile(sk_base, rj, cc, s_sc, 1, R, 2 * M), y, PREC)
                if HAS_RESET:
                    y = tl.where(valid[:, None], y, 0.0)
                gs = load_tile(gs_base, ll, cc, s_pl, 1, L, 2 * M) + cmul(y, dp, True)
                store_tile(gs_base, ll, cc, s_pl, 1, L, 2 * M, gs)
        dq = tl.where(is_finite(q_raw), dq, 0.0)
        store_tile(dq_ptr + b * s_ob + h * s_oh + n * s_on, ll, rk, s_ol, 1, L, R, dq)


def intra_chunk_pass2_backward(
    do, p, G_hat, v, starts, d_start, d_end, key_dim, dv, dw, g_end, g_start, dxv,
    reset=None, poison=None, precision="ieee", BL=None,
):  # fmt: skip
    """do, v: (B, H, n, L, D) chunk views of the (B, T, H, D) output gradient and input; p:
    (B, H, n, L, 2M) (pass 1's, fp32 or bf16) and G_hat (H, 2M, 2M), w̃ = Ĝ p formed on chip;
    starts, d_start, d_end, reset, precision, BL as in intra_chunk_pass1; key_dim: R; poison as
    in intra_chunk_pass2. Writes dv (B, H, n, L, D) fp32 (the intra-chunk part), dw (p's shape,
    any float dtype: dw̃, written once), g_end and g_start (p's shape and strides, fp32: the
    per-program decay partials) and dxv (B, H, n, D, 2M) fp32."""
    B, H, N, L, twoM = p.shape
    R, D = key_dim, v.shape[-1]
    r, s_rb, s_rn, has_reset = reset_args(reset, p)
    f = poison if poison is not None else r
    meta = dict(
        HAS_RESET=has_reset, PREC=PRECISION_CODES[precision], POISON=poison is not None,
        BL=BL or block(L),
    )  # fmt: skip
    with on_device(p):
        _pass2_bwd_lag_kernel[(B * H * N,)](
            do, p, G_hat, v, d_end, r, f, dv, g_end,
            H, N, L, R, D, twoM // 2,
            *do.stride()[:4], *p.stride()[:4], *G_hat.stride(), *v.stride()[:4],
            *d_end.stride()[:2],
            s_rb, s_rn, *flags_strides(poison, L), *dv.stride()[:4], **meta,
            BK=min(block(D), 32),
        )  # fmt: skip
        _pass2_bwd_state_kernel[(B * H * N,)](
            do, p, G_hat, v, starts, d_start, d_end, r, f, dxv, dw, g_start,
            H, N, L, R, D, twoM // 2,
            *do.stride()[:4], *p.stride()[:4], *G_hat.stride(), *v.stride()[:4],
            *starts.stride()[:4], *d_start.stride()[:2],
            s_rb, s_rn, *flags_strides(poison, L), *dxv.stride()[:4], **meta, BD=block(D),
        )  # fmt: skip


def intra_chunk_pass1_backward(
    dw, G_hat, q, k, starts, d_start, d_end, dq_lag, dkT, dxk, g_end, g_start, dq,
    reset=None, precision="ieee", BL=None,
):  # fmt: skip
    """dw: (B, H, n, L, 2M) gradient of w̃, fp32 or bf16 (g_end and g_start share its shape
    and strides, fp32, and are added into); G_hat: (H, 2M, 2M), dp = dw̃ Ĝ formed on chip; q,
    k: chunk views of the (B, T, H, R) inputs; other arguments as in intra_chunk_pass1. Writes
    dq_lag (B, H, n, L, R) fp32 (scratch), dkT (B, H, n, R, L) fp32 (the intra-chunk part of
    dk), dxk (B, H, n, R, 2M) fp32 and dq, the chunk view of the (B, T, H, R) gradient in its
    dtype."""
    B, H, N, L, R = q.shape
    twoM = dw.shape[-1]
    r, s_rb, s_rn, has_reset = reset_args(reset, q)
    meta = dict(HAS_RESET=has_reset, PREC=PRECISION_CODES[precision], BL=BL or block(L))
    with on_device(q):
        _pass1_bwd_lag_kernel[(B * H * N,)](
            dw, G_hat, q, k, d_end, r, dq_lag, dkT, g_end,
            H, N, L, R, twoM // 2,
            *dw.stride()[:4], *G_hat.stride(), *q.stride()[:4], *k.stride()[:4],
            *d_end.stride()[:2],
            s_rb, s_rn, *dq_lag.stride()[:4], *dkT.stride()[:4], **meta, BK=min(block(R), 32),
        )  # fmt: skip
        _pass1_bwd_state_kernel[(B * H * N,)](
            dw, G_hat, q, starts, d_start, r, dq_lag, dq, dxk, g_start,
            H, N, L, R, twoM // 2,
            *dw.stride()[:4], *G_hat.stride(), *q.stride()[:4], *starts.stride()[:4],
            *d_start.stride()[:2],
            s_rb, s_rn, *dxk.stride()[:4], *dq_lag.stride()[:4], *dq.stride()[:4], **meta,
            BK=min(block(R), 64),
        )  # fmt: skip
