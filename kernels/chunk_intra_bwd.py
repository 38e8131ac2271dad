"""Backward of the two intra-chunk passes (chunk_intra.py), one program per (batch, head,
chunk). Each recomputes what it needs of its pass from the chunk-start states and writes the
gradients of its inputs; the decay gradients come out per program (summed over batch and
chunks outside). Between the two passes, dp = dw̃ Ĝ and dĜ are batched GEMMs in PyTorch.

pass 2 backward (given do, w̃):  dv, dXᵛ, dw̃ and the partial dλ^{i+1}, d(βλ^{L-1-j})
pass 1 backward (given dp):     dq, dk, dXᵏ and the partial dλ^{i+1}, d(βλ^{L-1-j})

Each pass is two kernels, run in turn: the lag part (the (L, L) weights by lag and the
gradients through them) and the chunk-start part (the products with the start state). Split,
each kernel holds two loop-invariant product operands instead of four, which is what keeps
them clear of spills (benchmarks/offline_compile.py); the second reads what the first wrote of
the gradient they share (dw̃, dq). Blocked like the forward: the (L, L) tiles once per
program, the modes in blocks of BM, every product a tile `mma` at the PREC precision with fp32
accumulation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .tiles import (
    PRECISION_CODES,
    Space,
    block,
    cmul,
    doc_masks,
    load_tile,
    mma,
    on_device,
    operand,
    program_bhn,
    reset_args,
    shear_in,
    shear_out,
    store_tile,
    unit_last_stride,
)

_LAG2 = Space(
    sm90=[(4, 8), (4, 16), (8, 8), (8, 16), (8, 32), (8, 64)], sm80=[(8, 8), (8, 16), (8, 32)]
)
_STATE2 = Space(sm90=[(4, 8), (8, 8), (8, 16), (8, 32)], sm80=[(8, 8)])
_LAG1 = Space(
    sm90=[(4, 8), (4, 16), (4, 32), (8, 8), (8, 16), (8, 32), (8, 64)],
    sm80=[(4, 8), (8, 8), (8, 16)],
)
_STATE1 = Space(sm90=[(8, 8), (8, 16)], sm80=[(8, 8)])
_KEY_P2 = ["L", "D", "M", "HAS_RESET", "PREC"]
_KEY_P1 = ["L", "R", "M", "HAS_RESET", "PREC"]

# Shared signature tails: (s_*b, s_*h, s_*n, s_*row) strides of each (B, H, N, rows, ·) tensor.


@triton.autotune(configs=_LAG2.configs, key=_KEY_P2, prune_configs_by=_LAG2.prune)
@triton.jit(do_not_specialize=["N"])
def _pass2_bwd_lag_kernel(
    do_ptr, w_ptr, zT_ptr, dend_ptr, reset_ptr, dv_ptr, dw_ptr, gend_ptr,
    H, N, L, R, D, M,
    s_ob, s_oh, s_on, s_ol,
    s_wb, s_wh, s_wn, s_wl,
    s_zb, s_zh, s_zn, s_zc,
    s_dh, s_dl,
    s_rb, s_rn,
    s_vb, s_vh, s_vn, s_vl,
    HAS_RESET: tl.constexpr, PREC: tl.constexpr,
    BL: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """dv = mixᵀ do with mix = shear_out(w̃ endᵀ) (recomputed); d_lag = shear_in(do vᵀ);
    dw̃ = d_lag end (the lag part) and the end partial d_lagᵀ w̃. do and v are walked in blocks
    of BK channels: on sm_80 a whole (L, D) product operand is held by every warp."""
    b, h, n = program_bhn(H, N)
    ll = tl.arange(0, BL)
    if HAS_RESET:
        valid, same = doc_masks(reset_ptr, b, n, s_rb, s_rn, L, BL)
    do_base = do_ptr + b * s_ob + h * s_oh + n * s_on
    v_base = zT_ptr + b * s_zb + h * s_zh + n * s_zn + R * s_zc
    d_mix = tl.zeros((BL, BL), dtype=tl.float32)  # (t, s): Σ_d do_t v_s
    for d0 in range(0, D, BK):
        dk = d0 + tl.arange(0, BK)
        do = load_tile(do_base, ll, dk, s_ol, 1, L, D)
        d_mix = mma(do, tl.trans(load_tile(v_base, ll, dk, 1, s_zc, L, D)), d_mix, PREC)
    if HAS_RESET:
        d_mix = tl.where(same, d_mix, 0.0)
    d_lag = shear_in(operand(d_mix, PREC), L, BL)  # aligned with end
    w_base = w_ptr + b * s_wb + h * s_wh + n * s_wn
    by_lag = tl.zeros((BL, BL), dtype=tl.float32)
    for m0 in range(0, M, BM):
        cc = 2 * m0 + tl.arange(0, 2 * BM)
        w = load_tile(w_base, ll, cc, s_wl, 1, L, 2 * M)
        end = load_tile(dend_ptr + h * s_dh, ll, cc, s_dl, 1, L, 2 * M)
        by_lag = mma(w, tl.trans(end), by_lag, PREC)
    mix = shear_out(operand(by_lag, PREC), L, BL)
    if HAS_RESET:
        mix = tl.where(same, mix, tl.zeros_like(mix))
    dv_base = dv_ptr + b * s_vb + h * s_vh + n * s_vn
    for d0 in range(0, D, BK):
        dk = d0 + tl.arange(0, BK)
        dv = mma(tl.trans(mix), load_tile(do_base, ll, dk, s_ol, 1, L, D), None, PREC)  # (s, d)
        store_tile(dv_base, ll, dk, s_vl, 1, L, D, dv)
    dw_base = dw_ptr + b * s_wb + h * s_wh + n * s_wn
    ge_base = gend_ptr + b * s_wb + h * s_wh + n * s_wn
    for m0 in range(0, M, BM):
        cc = 2 * m0 + tl.arange(0, 2 * BM)
        end = load_tile(dend_ptr + h * s_dh, ll, cc, s_dl, 1, L, 2 * M)
        store_tile(dw_base, ll, cc, s_wl, 1, L, 2 * M, mma(d_lag, end, None, PREC))
        w = load_tile(w_base, ll, cc, s_wl, 1, L, 2 * M)
        store_tile(ge_base, ll, cc, s_wl, 1, L, 2 * M, mma(tl.trans(d_lag), w, None, PREC))


# it adds into dw̃: autotuning must put dw̃ back after each timed run
@triton.autotune(
    configs=_STATE2.configs, key=_KEY_P2, prune_configs_by=_STATE2.prune, restore_value=["dw_ptr"]
)
@triton.jit(do_not_specialize=["N"])
def _pass2_bwd_state_kernel(
    do_ptr, w_ptr, st_ptr, dstart_ptr, reset_ptr, dxv_ptr, dw_ptr, gstart_ptr,
    H, N, L, R, D, M,
    s_ob, s_oh, s_on, s_ol,
    s_wb, s_wh, s_wn, s_wl,
    s_sb, s_sh, s_sn, s_sc,
    s_dh, s_dl,
    s_rb, s_rn,
    s_xb, s_xh, s_xn, s_xd,
    HAS_RESET: tl.constexpr, PREC: tl.constexpr,
    BL: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """du = do Xᵛ (the start state's read); dXᵛ = doᵀ u with u = conj(λ^{t+1}) ⊙ w̃;
    dw̃ += λ^{t+1} ⊙ du; the start partial conj(du) ⊙ w̃."""
    b, h, n = program_bhn(H, N)
    ll, dd = tl.arange(0, BL), tl.arange(0, BD)
    if HAS_RESET:
        valid, _ = doc_masks(reset_ptr, b, n, s_rb, s_rn, L, BL)
    do = operand(load_tile(do_ptr + b * s_ob + h * s_oh + n * s_on, ll, dd, s_ol, 1, L, D), PREC)
    w_base = w_ptr + b * s_wb + h * s_wh + n * s_wn
    sv_base = st_ptr + b * s_sb + h * s_sh + n * s_sn + R * s_sc
    dxv_base = dxv_ptr + b * s_xb + h * s_xh + n * s_xn
    dw_base = dw_ptr + b * s_wb + h * s_wh + n * s_wn
    gs_base = gstart_ptr + b * s_wb + h * s_wh + n * s_wn
    for m0 in range(0, M, BM):
        cc = 2 * m0 + tl.arange(0, 2 * BM)
        w = load_tile(w_base, ll, cc, s_wl, 1, L, 2 * M)
        start = load_tile(dstart_ptr + h * s_dh, ll, cc, s_dl, 1, L, 2 * M)
        du = mma(do, load_tile(sv_base, dd, cc, s_sc, 1, D, 2 * M), None, PREC)  # (t, modes)
        u = cmul(start, w, True)
        if HAS_RESET:
            du = tl.where(valid[:, None], du, 0.0)
            u = tl.where(valid[:, None], u, 0.0)
        store_tile(dxv_base, dd, cc, s_xd, 1, D, 2 * M, mma(tl.trans(do), u, None, PREC))
        dw = load_tile(dw_base, ll, cc, s_wl, 1, L, 2 * M) + cmul(start, du, False)
        store_tile(dw_base, ll, cc, s_wl, 1, L, 2 * M, dw)
        store_tile(gs_base, ll, cc, s_wl, 1, L, 2 * M, cmul(du, w, True))


@triton.autotune(configs=_LAG1.configs, key=_KEY_P1, prune_configs_by=_LAG1.prune)
@triton.jit(do_not_specialize=["N"])
def _pass1_bwd_lag_kernel(
    dp_ptr, q_ptr, zT_ptr, dend_ptr, reset_ptr, dq_ptr, dk_ptr, gend_ptr,
    H, N, L, R, M,
    s_pb, s_ph, s_pn, s_pl,
    s_qb, s_qh, s_qn, s_ql,
    s_zb, s_zh, s_zn, s_zc,
    s_dh, s_dl,
    s_rb, s_rn,
    s_kb, s_kh, s_kn, s_kr,
    HAS_RESET: tl.constexpr, PREC: tl.constexpr,
    BL: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """d_scores = shear_out(dp endᵀ); dq = d_scores k (the lag part); dkᵀ = qᵀ d_scores; the
    end partial laggedᵀ dp with lagged = shear_in(q kᵀ) (recomputed). q and k are walked in
    blocks of BK features (see _pass2_bwd_lag_kernel)."""
    b, h, n = program_bhn(H, N)
    ll = tl.arange(0, BL)
    q_base = q_ptr + b * s_qb + h * s_qh + n * s_qn
    z_base = zT_ptr + b * s_zb + h * s_zh + n * s_zn
    scores = tl.zeros((BL, BL), dtype=tl.float32)  # (t, s)
    for r0 in range(0, R, BK):
        rk = r0 + tl.arange(0, BK)
        q = load_tile(q_base, ll, rk, s_ql, 1, L, R)
        scores = mma(q, load_tile(z_base, rk, ll, s_zc, 1, R, L), scores, PREC)
    if HAS_RESET:
        _, same = doc_masks(reset_ptr, b, n, s_rb, s_rn, L, BL)
        scores = tl.where(same, scores, 0.0)
    lagged = shear_in(operand(scores, PREC), L, BL)
    dp_base = dp_ptr + b * s_pb + h * s_ph + n * s_pn
    ge_base = gend_ptr + b * s_pb + h * s_ph + n * s_pn
    by_lag = tl.zeros((BL, BL), dtype=tl.float32)  # (t, j): Σ_m Re(conj(end[j]) dp_t)
    for m0 in range(0, M, BM):
        cc = 2 * m0 + tl.arange(0, 2 * BM)
        dp = load_tile(dp_base, ll, cc, s_pl, 1, L, 2 * M)
        end = load_tile(dend_ptr + h * s_dh, ll, cc, s_dl, 1, L, 2 * M)
        by_lag = mma(dp, tl.trans(end), by_lag, PREC)
        store_tile(ge_base, ll, cc, s_pl, 1, L, 2 * M, mma(tl.trans(lagged), dp, None, PREC))
    d_scores = shear_out(operand(by_lag, PREC), L, BL)
    if HAS_RESET:
        d_scores = tl.where(same, d_scores, tl.zeros_like(d_scores))
    dq_base = dq_ptr + b * s_qb + h * s_qh + n * s_qn
    dk_base = dk_ptr + b * s_kb + h * s_kh + n * s_kn
    for r0 in range(0, R, BK):
        rk = r0 + tl.arange(0, BK)
        k = load_tile(z_base, ll, rk, 1, s_zc, L, R)
        store_tile(dq_base, ll, rk, s_ql, 1, L, R, mma(d_scores, k, None, PREC))
        q = load_tile(q_base, ll, rk, s_ql, 1, L, R)
        dkT = mma(tl.trans(q), d_scores, None, PREC)  # (r, s)
        store_tile(dk_base, rk, ll, s_kr, 1, R, L, dkT)


@triton.autotune(
    configs=_STATE1.configs, key=_KEY_P1, prune_configs_by=_STATE1.prune, restore_value=["dq_ptr"]
)
@triton.jit(do_not_specialize=["N"])
def _pass1_bwd_state_kernel(
    dp_ptr, q_ptr, st_ptr, dstart_ptr, reset_ptr, dq_ptr, dxk_ptr, gstart_ptr,
    H, N, L, R, M,
    s_pb, s_ph, s_pn, s_pl,
    s_qb, s_qh, s_qn, s_ql,
    s_sb, s_sh, s_sn, s_sc,
    s_dh, s_dl,
    s_rb, s_rn,
    s_xb, s_xh, s_xn, s_xr,
    HAS_RESET: tl.constexpr, PREC: tl.constexpr,
    BL: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """y = q Xᵏ, dy = conj(λ^{t+1}) ⊙ dp; dq += dy Xᵏᵀ; dXᵏ = qᵀ dy; the start partial
    conj(y) ⊙ dp. The features are walked in blocks of BK, each holding its block of dq
    through the pass over the modes (the first block also forms y, over every feature block)."""
    b, h, n = program_bhn(H, N)
    ll = tl.arange(0, BL)
    if HAS_RESET:
        valid, _ = doc_masks(reset_ptr, b, n, s_rb, s_rn, L, BL)
    q_base = q_ptr + b * s_qb + h * s_qh + n * s_qn
    dp_base = dp_ptr + b * s_pb + h * s_ph + n * s_pn
    sk_base = st_ptr + b * s_sb + h * s_sh + n * s_sn
    dxk_base = dxk_ptr + b * s_xb + h * s_xh + n * s_xn
    gs_base = gstart_ptr + b * s_pb + h * s_ph + n * s_pn
    dq_base = dq_ptr + b * s_qb + h * s_qh + n * s_qn
    for r0 in range(0, R, BK):
        rk = r0 + tl.arange(0, BK)
        q = operand(load_tile(q_base, ll, rk, s_ql, 1, L, R), PREC)
        dq = load_tile(dq_base, ll, rk, s_ql, 1, L, R)
        for m0 in range(0, M, BM):
            cc = 2 * m0 + tl.arange(0, 2 * BM)
            dp = load_tile(dp_base, ll, cc, s_pl, 1, L, 2 * M)
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
                    qj = load_tile(q_base, ll, rj, s_ql, 1, L, R)
                    y = mma(qj, load_tile(sk_base, rj, cc, s_sc, 1, R, 2 * M), y, PREC)
                if HAS_RESET:
                    y = tl.where(valid[:, None], y, 0.0)
                store_tile(gs_base, ll, cc, s_pl, 1, L, 2 * M, cmul(y, dp, True))
        store_tile(dq_base, ll, rk, s_ql, 1, L, R, dq)


def intra_chunk_pass2_backward(
    do, w, zT, starts, d_start, d_end, key_dim, reset=None, precision="ieee"
):
    """do: (B, H, N, L, D); w: (B, H, N, L, 2M); zT, starts, d_start, d_end, reset, precision as
    in intra_chunk_pass1; key_dim: R. Returns (dv (B, H, N, L, D), dXv (B, H, N, D, 2M),
    dw (B, H, N, L, 2M), per-program d_end and d_start partials (B, H, N, L, 2M)), fp32."""
    do, w = do.contiguous(), w.contiguous()  # dw and the partials reuse w's strides
    zT, starts, d_start, d_end = unit_last_stride(zT, starts, d_start, d_end)
    B, H, N, L, twoM = w.shape
    R, D = key_dim, zT.shape[3] - key_dim
    f32 = dict(dtype=torch.float32, device=w.device)
    dv = torch.empty(B, H, N, L, D, **f32)
    dxv = torch.empty(B, H, N, D, twoM, **f32)
    dw, g_end, g_start = (torch.empty(B, H, N, L, twoM, **f32) for _ in range(3))
    r, s_rb, s_rn, has_reset = reset_args(reset, w)
    meta = dict(HAS_RESET=has_reset, PREC=PRECISION_CODES[precision], BL=block(L))
    with on_device(w):
        _pass2_bwd_lag_kernel[(B * H * N,)](
            do, w, zT, d_end, r, dv, dw, g_end,
            H, N, L, R, D, twoM // 2,
            *do.stride()[:4], *w.stride()[:4], *zT.stride()[:4], *d_end.stride()[:2],
            s_rb, s_rn, *dv.stride()[:4], **meta, BK=min(block(D), 32),
        )  # fmt: skip
        _pass2_bwd_state_kernel[(B * H * N,)](
            do, w, starts, d_start, r, dxv, dw, g_start,
            H, N, L, R, D, twoM // 2,
            *do.stride()[:4], *w.stride()[:4], *starts.stride()[:4], *d_start.stride()[:2],
            s_rb, s_rn, *dxv.stride()[:4], **meta, BD=block(D),
        )  # fmt: skip
    return dv, dxv, dw, g_end, g_start


def intra_chunk_pass1_backward(dp, q, zT, starts, d_start, d_end, reset=None, precision="ieee"):
    """dp: (B, H, N, L, 2M) gradient of p; other arguments as in intra_chunk_pass1. Returns
    (dq (B, H, N, L, R), dkT (B, H, N, R, L), dXk (B, H, N, R, 2M), per-program d_end and
    d_start partials (B, H, N, L, 2M)), fp32."""
    dp, q = dp.contiguous(), q.contiguous()  # dq reuses q's strides, the partials dp's
    zT, starts, d_start, d_end = unit_last_stride(zT, starts, d_start, d_end)
    B, H, N, L, R = q.shape
    twoM = dp.shape[-1]
    f32 = dict(dtype=torch.float32, device=q.device)
    dq = torch.empty(B, H, N, L, R, **f32)
    dkT = torch.empty(B, H, N, R, L, **f32)
    dxk = torch.empty(B, H, N, R, twoM, **f32)
    g_end, g_start = (torch.empty(B, H, N, L, twoM, **f32) for _ in range(2))
    r, s_rb, s_rn, has_reset = reset_args(reset, q)
    meta = dict(HAS_RESET=has_reset, PREC=PRECISION_CODES[precision], BL=block(L))
    with on_device(q):
        _pass1_bwd_lag_kernel[(B * H * N,)](
            dp, q, zT, d_end, r, dq, dkT, g_end,
            H, N, L, R, twoM // 2,
            *dp.stride()[:4], *q.stride()[:4], *zT.stride()[:4], *d_end.stride()[:2],
            s_rb, s_rn, *dkT.stride()[:4], **meta, BK=min(block(R), 32),
        )  # fmt: skip
        _pass1_bwd_state_kernel[(B * H * N,)](
            dp, q, starts, d_start, r, dq, dxk, g_start,
            H, N, L, R, twoM // 2,
            *dp.stride()[:4], *q.stride()[:4], *starts.stride()[:4], *d_start.stride()[:2],
            s_rb, s_rn, *dxk.stride()[:4], **meta, BK=min(block(R), 64),
        )  # fmt: skip
    return dq, dkT, dxk, g_end, g_start
