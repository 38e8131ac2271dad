"""Backward of the two intra-chunk passes (chunk_intra.py), one program per (batch, head,
chunk). Each recomputes what it needs of its pass from the chunk-start states and writes the
gradients of its inputs; the decay gradients come out per program (summed over batch and
chunks outside). Between the two, dp = dw̃ Ĝ and dĜ are batched GEMMs in PyTorch.

pass 2 backward (given do, w̃):  dv, dXᵛ, dw̃ and the partial dλ^{i+1}, d(βλ^{L-1-j})
pass 1 backward (given dp):     dq, dk, dXᵏ and the partial dλ^{i+1}, d(βλ^{L-1-j})
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .chunk_intra import (
    _block,
    _configs,
    _doc_masks,
    _load_pairs,
    _program_bhn,
    _reset_args,
    _shear_in,
    _shear_out,
    _store_pairs,
)


@triton.autotune(configs=_configs(), key=["L", "D", "M"])
@triton.jit(do_not_specialize=["N"])
def _pass2_bwd_kernel(
    do_ptr, w_ptr, zT_ptr, st_ptr, dstart_ptr, dend_ptr, reset_ptr, scratch_ptr,
    dv_ptr, dxv_ptr, dw_ptr, gend_ptr, gstart_ptr,
    H, N, L, R, D, M,
    s_ob, s_oh, s_on, s_ol,
    s_wb, s_wh, s_wn, s_wl,
    s_zb, s_zh, s_zn, s_zc,
    s_sb, s_sh, s_sn, s_sc,
    s_dh, s_dl,
    s_rb, s_rn,
    s_vb, s_vh, s_vn, s_vl,
    s_xb, s_xh, s_xn, s_xd,
    HAS_RESET: tl.constexpr, BL: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    pid, b, h, n = _program_bhn(H, N)
    ll, dd, mm = tl.arange(0, BL), tl.arange(0, BD), tl.arange(0, BM)
    in_l, in_d = ll < L, dd < D
    ld = in_l[:, None] & in_d[None, :]
    do = tl.load(
        do_ptr + b * s_ob + h * s_oh + n * s_on + ll[:, None] * s_ol + dd[None, :],
        mask=ld,
        other=0.0,
    )
    do = do.to(tl.float32)
    z_base = zT_ptr + b * s_zb + h * s_zh + n * s_zn + R * s_zc
    v = tl.load(z_base + dd[None, :] * s_zc + ll[:, None], mask=ld, other=0.0).to(tl.float32)
    s_base = st_ptr + b * s_sb + h * s_sh + n * s_sn + R * s_sc
    sv_re, sv_im = _load_pairs(s_base, dd, mm, s_sc, D, M)
    w_base = w_ptr + b * s_wb + h * s_wh + n * s_wn
    w_re, w_im = _load_pairs(w_base, ll, mm, s_wl, L, M)
    a_re, a_im = _load_pairs(dstart_ptr + h * s_dh, ll, mm, s_dl, L, M)
    e_re, e_im = _load_pairs(dend_ptr + h * s_dh, ll, mm, s_dl, L, M)
    tiles = scratch_ptr + pid * 2 * BL * BL
    # recompute u = conj(λ^{t+1}) ⊙ w̃ and mix (t, s)
    u_re, u_im = a_re * w_re + a_im * w_im, a_re * w_im - a_im * w_re
    by_lag = tl.dot(w_re, tl.trans(e_re), input_precision="ieee")
    by_lag += tl.dot(w_im, tl.trans(e_im), input_precision="ieee")
    mix = _shear_out(tiles, by_lag, L, BL)
    d_mix = tl.dot(do, tl.trans(v), input_precision="ieee")  # (t, s)
    du_re = tl.dot(do, sv_re, input_precision="ieee")
    du_im = tl.dot(do, sv_im, input_precision="ieee")
    if HAS_RESET:
        valid, same = _doc_masks(reset_ptr, b, n, s_rb, s_rn, L, BL)
        u_re, u_im = tl.where(valid[:, None], u_re, 0.0), tl.where(valid[:, None], u_im, 0.0)
        du_re, du_im = tl.where(valid[:, None], du_re, 0.0), tl.where(valid[:, None], du_im, 0.0)
        mix, d_mix = tl.where(same, mix, 0.0), tl.where(same, d_mix, 0.0)
    d_lag = _shear_in(tiles + BL * BL, d_mix, L, BL)  # aligned with end
    dv = tl.dot(tl.trans(mix), do, input_precision="ieee")  # (s, d)
    v_out = dv_ptr + b * s_vb + h * s_vh + n * s_vn + ll[:, None] * s_vl + dd[None, :]
    tl.store(v_out, dv, mask=ld)
    dxv_re = tl.dot(tl.trans(do), u_re, input_precision="ieee")  # (d, m)
    dxv_im = tl.dot(tl.trans(do), u_im, input_precision="ieee")
    x_base = dxv_ptr + b * s_xb + h * s_xh + n * s_xn
    _store_pairs(x_base, dd, mm, s_xd, D, M, dxv_re, dxv_im)
    dw_re = a_re * du_re - a_im * du_im + tl.dot(d_lag, e_re, input_precision="ieee")
    dw_im = a_re * du_im + a_im * du_re + tl.dot(d_lag, e_im, input_precision="ieee")
    _store_pairs(dw_ptr + b * s_wb + h * s_wh + n * s_wn, ll, mm, s_wl, L, M, dw_re, dw_im)
    ge_re = tl.dot(tl.trans(d_lag), w_re, input_precision="ieee")  # (j, m)
    ge_im = tl.dot(tl.trans(d_lag), w_im, input_precision="ieee")
    _store_pairs(gend_ptr + b * s_wb + h * s_wh + n * s_wn, ll, mm, s_wl, L, M, ge_re, ge_im)
    gs_re, gs_im = du_re * w_re + du_im * w_im, du_re * w_im - du_im * w_re  # conj(du) w̃
    _store_pairs(gstart_ptr + b * s_wb + h * s_wh + n * s_wn, ll, mm, s_wl, L, M, gs_re, gs_im)


@triton.autotune(configs=_configs(), key=["L", "R", "M"])
@triton.jit(do_not_specialize=["N"])
def _pass1_bwd_kernel(
    dp_ptr, q_ptr, zT_ptr, st_ptr, dstart_ptr, dend_ptr, reset_ptr, scratch_ptr,
    dq_ptr, dk_ptr, dxk_ptr, gend_ptr, gstart_ptr,
    H, N, L, R, M,
    s_pb, s_ph, s_pn, s_pl,
    s_qb, s_qh, s_qn, s_ql,
    s_zb, s_zh, s_zn, s_zc,
    s_sb, s_sh, s_sn, s_sc,
    s_dh, s_dl,
    s_rb, s_rn,
    s_kb, s_kh, s_kn, s_kr,
    s_xb, s_xh, s_xn, s_xr,
    HAS_RESET: tl.constexpr, BL: tl.constexpr, BR: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    pid, b, h, n = _program_bhn(H, N)
    ll, rr, mm = tl.arange(0, BL), tl.arange(0, BR), tl.arange(0, BM)
    in_l, in_r = ll < L, rr < R
    lr = in_l[:, None] & in_r[None, :]
    q_off = b * s_qb + h * s_qh + n * s_qn + ll[:, None] * s_ql + rr[None, :]
    q = tl.load(q_ptr + q_off, mask=lr, other=0.0).to(tl.float32)
    z_base = zT_ptr + b * s_zb + h * s_zh + n * s_zn
    kT = tl.load(
        z_base + rr[:, None] * s_zc + ll[None, :], mask=in_r[:, None] & in_l[None, :], other=0.0
    )
    kT = kT.to(tl.float32)
    sk_re, sk_im = _load_pairs(st_ptr + b * s_sb + h * s_sh + n * s_sn, rr, mm, s_sc, R, M)
    dp_base = dp_ptr + b * s_pb + h * s_ph + n * s_pn
    dp_re, dp_im = _load_pairs(dp_base, ll, mm, s_pl, L, M)
    a_re, a_im = _load_pairs(dstart_ptr + h * s_dh, ll, mm, s_dl, L, M)
    e_re, e_im = _load_pairs(dend_ptr + h * s_dh, ll, mm, s_dl, L, M)
    tiles = scratch_ptr + pid * 2 * BL * BL
    # recompute y = Xᵏ q and the lag-aligned scores
    y_re = tl.dot(q, sk_re, input_precision="ieee")
    y_im = tl.dot(q, sk_im, input_precision="ieee")
    scores = tl.dot(q, kT, input_precision="ieee")
    if HAS_RESET:
        valid, same = _doc_masks(reset_ptr, b, n, s_rb, s_rn, L, BL)
        y_re, y_im = tl.where(valid[:, None], y_re, 0.0), tl.where(valid[:, None], y_im, 0.0)
        scores = tl.where(same, scores, 0.0)
    lagged = _shear_in(tiles, scores, L, BL)
    by_lag = tl.dot(dp_re, tl.trans(e_re), input_precision="ieee")
    by_lag += tl.dot(dp_im, tl.trans(e_im), input_precision="ieee")  # (t, j)
    d_scores = _shear_out(tiles + BL * BL, by_lag, L, BL)
    dy_re, dy_im = a_re * dp_re + a_im * dp_im, a_re * dp_im - a_im * dp_re  # conj(λ^{t+1}) dp
    if HAS_RESET:
        d_scores = tl.where(same, d_scores, 0.0)
        dy_re, dy_im = tl.where(valid[:, None], dy_re, 0.0), tl.where(valid[:, None], dy_im, 0.0)
    dq = tl.dot(d_scores, tl.trans(kT), input_precision="ieee")
    dq += tl.dot(dy_re, tl.trans(sk_re), input_precision="ieee")
    dq += tl.dot(dy_im, tl.trans(sk_im), input_precision="ieee")
    tl.store(dq_ptr + q_off, dq, mask=lr)
    dkT = tl.dot(tl.trans(q), d_scores, input_precision="ieee")  # (r, s)
    k_out = dk_ptr + b * s_kb + h * s_kh + n * s_kn + rr[:, None] * s_kr + ll[None, :]
    tl.store(k_out, dkT, mask=in_r[:, None] & in_l[None, :])
    dxk_re = tl.dot(tl.trans(q), dy_re, input_precision="ieee")  # (r, m)
    dxk_im = tl.dot(tl.trans(q), dy_im, input_precision="ieee")
    _store_pairs(dxk_ptr + b * s_xb + h * s_xh + n * s_xn, rr, mm, s_xr, R, M, dxk_re, dxk_im)
    ge_re = tl.dot(tl.trans(lagged), dp_re, input_precision="ieee")
    ge_im = tl.dot(tl.trans(lagged), dp_im, input_precision="ieee")
    _store_pairs(gend_ptr + b * s_pb + h * s_ph + n * s_pn, ll, mm, s_pl, L, M, ge_re, ge_im)
    gs_re, gs_im = y_re * dp_re + y_im * dp_im, y_re * dp_im - y_im * dp_re  # conj(y) dp
    _store_pairs(gstart_ptr + b * s_pb + h * s_ph + n * s_pn, ll, mm, s_pl, L, M, gs_re, gs_im)


def intra_chunk_pass2_backward(do, w, zT, starts, d_start, d_end, key_dim, reset=None):
    """do: (B, H, N, L, D); w: (B, H, N, L, 2M); zT, starts, d_start, d_end, reset as in
    intra_chunk_pass1; key_dim: R. Returns (dv (B, H, N, L, D), dXv (B, H, N, D, 2M),
    dw (B, H, N, L, 2M), per-program d_end and d_start partials (B, H, N, L, 2M)), fp32."""
    do, w = do.contiguous(), w.contiguous()  # the outputs reuse w's strides
    B, H, N, L, twoM = w.shape
    R, D = key_dim, zT.shape[3] - key_dim
    f32 = dict(dtype=torch.float32, device=w.device)
    dv = torch.empty(B, H, N, L, D, **f32)
    dxv = torch.empty(B, H, N, D, twoM, **f32)
    dw, g_end, g_start = (torch.empty(B, H, N, L, twoM, **f32) for _ in range(3))
    BL = _block(L)
    scratch = torch.empty(B * H * N * 2 * BL * BL, **f32)
    r, s_rb, s_rn, has_reset = _reset_args(reset, w)
    _pass2_bwd_kernel[(B * H * N,)](
        do, w, zT, starts, d_start, d_end, r, scratch, dv, dxv, dw, g_end, g_start,
        H, N, L, R, D, twoM // 2,
        *do.stride()[:4], *w.stride()[:4], *zT.stride()[:4], *starts.stride()[:4],
        *d_start.stride()[:2], s_rb, s_rn, *dv.stride()[:4], *dxv.stride()[:4],
        HAS_RESET=has_reset, BL=BL, BD=_block(D), BM=_block(twoM // 2),
    )  # fmt: skip
    return dv, dxv, dw, g_end, g_start


def intra_chunk_pass1_backward(dp, q, zT, starts, d_start, d_end, reset=None):
    """dp: (B, H, N, L, 2M) gradient of p; other arguments as in intra_chunk_pass1. Returns
    (dq (B, H, N, L, R), dkT (B, H, N, R, L), dXk (B, H, N, R, 2M), per-program d_end and
    d_start partials (B, H, N, L, 2M)), fp32."""
    dp, q = dp.contiguous(), q.contiguous()  # the outputs reuse dp's and q's strides
    B, H, N, L, R = q.shape
    twoM = dp.shape[-1]
    f32 = dict(dtype=torch.float32, device=q.device)
    dq = torch.empty(B, H, N, L, R, **f32)
    dkT = torch.empty(B, H, N, R, L, **f32)
    dxk = torch.empty(B, H, N, R, twoM, **f32)
    g_end, g_start = (torch.empty(B, H, N, L, twoM, **f32) for _ in range(2))
    BL = _block(L)
    scratch = torch.empty(B * H * N * 2 * BL * BL, **f32)
    r, s_rb, s_rn, has_reset = _reset_args(reset, q)
    _pass1_bwd_kernel[(B * H * N,)](
        dp, q, zT, starts, d_start, d_end, r, scratch, dq, dkT, dxk, g_end, g_start,
        H, N, L, R, twoM // 2,
        *dp.stride()[:4], *q.stride()[:4], *zT.stride()[:4], *starts.stride()[:4],
        *d_start.stride()[:2], s_rb, s_rn, *dkT.stride()[:4], *dxk.stride()[:4],
        HAS_RESET=has_reset, BL=BL, BR=_block(R), BM=_block(twoM // 2),
    )  # fmt: skip
    return dq, dkT, dxk, g_end, g_start
