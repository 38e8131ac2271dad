"""The intra-chunk passes with per-token (selective) decays as Triton kernels, one program per
(batch, head, chunk), for the forward of ``idmix.functional.interdomain.selective``.

With c the cumulative sum of log λ over the chunk (interleaved [log|λ|, wrapped phase] pairs)
and P[t, s] = β_s exp(c_t − c_s) for s ≤ t in one document:

pass 1:  p_t = exp(c_t) ⊙ (Xᵏ_start q_t) + Σ_{s≤t} (q_t · k_s) P[t, s]
         (then w̃ = Ĝ p, one batched GEMM outside the kernels)
pass 2:  o_t = Re(Xᵛ_startᴴ (conj(exp(c_t)) ⊙ w̃_t)) + Σ_{s≤t} Re(conj(P[t, s]) · w̃_t) v_s

The pair decays are formed in registers, one source position s per loop step, GLA-style: the
real exponent c_t − c_s is selected (−inf for s > t or across a document start) before exp,
so it is never positive, and the phase difference of two wrapped cumulative sums stays below
L·π. Sequence starts (reset) become in-kernel masks from a cumulative count. Everything
accumulates in fp32 with IEEE-exact dots.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .chunk_intra import _block, _configs, _load_pairs, _program_bhn, _reset_args, _store_pairs


@triton.jit
def _documents(reset_ptr, b, n, s_rb, s_rn, L, HAS_RESET: tl.constexpr, BL: tl.constexpr):
    """Document index of each position of the chunk (BL,): starts seen so far (0 without reset)."""
    ll = tl.arange(0, BL)
    if HAS_RESET:
        starts = tl.load(reset_ptr + b * s_rb + n * s_rn + ll, mask=ll < L, other=0)
        return tl.cumsum(starts.to(tl.int32), 0)
    return tl.zeros((BL,), dtype=tl.int32)


@triton.jit
def _pair_decay(c_base, b_base, s, s_cl, c_re, c_im, doc, M, BL: tl.constexpr, BM: tl.constexpr):
    """P[:, s] = β_s exp(c_t − c_s) for every t (0 for t < s or another document): (BL, BM)²."""
    ll, mm = tl.arange(0, BL), tl.arange(0, BM)
    in_m = mm < M
    cs_re = tl.load(c_base + s * s_cl + 2 * mm, mask=in_m, other=0.0).to(tl.float32)
    cs_im = tl.load(c_base + s * s_cl + 2 * mm + 1, mask=in_m, other=0.0).to(tl.float32)
    bs_re = tl.load(b_base + s * s_cl + 2 * mm, mask=in_m, other=0.0).to(tl.float32)
    bs_im = tl.load(b_base + s * s_cl + 2 * mm + 1, mask=in_m, other=0.0).to(tl.float32)
    doc_s = tl.sum(tl.where(ll == s, doc, 0), 0)
    ok = (ll >= s) & (doc == doc_s)
    mag = tl.exp(tl.where(ok[:, None], c_re - cs_re[None, :], float("-inf")))
    ang = c_im - cs_im[None, :]
    d_re, d_im = mag * tl.cos(ang), mag * tl.sin(ang)
    return d_re * bs_re[None, :] - d_im * bs_im[None, :], d_re * bs_im[None, :] + d_im * bs_re[
        None, :
    ]


@triton.jit
def _from_start(c_re, c_im, doc):
    """exp(c_t) where no document starts in [chunk start, t], else 0: (re, im) (BL, BM)."""
    mag = tl.where((doc == 0)[:, None], tl.exp(c_re), 0.0)
    return mag * tl.cos(c_im), mag * tl.sin(c_im)


@triton.autotune(configs=_configs(), key=["L", "R", "M"])
@triton.jit(do_not_specialize=["N"])
def _pass1_kernel(
    q_ptr, k_ptr, c_ptr, beta_ptr, st_ptr, reset_ptr, p_ptr,
    H, N, L, R, M,
    s_qb, s_qh, s_qn, s_ql,
    s_cb, s_ch, s_cn, s_cl,
    s_sb, s_sh, s_sn, s_sc,
    s_rb, s_rn,
    HAS_RESET: tl.constexpr, BL: tl.constexpr, BR: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    pid, b, h, n = _program_bhn(H, N)
    ll, rr, mm = tl.arange(0, BL), tl.arange(0, BR), tl.arange(0, BM)
    in_l, in_r = ll < L, rr < R
    q_base = q_ptr + b * s_qb + h * s_qh + n * s_qn
    k_base = k_ptr + b * s_qb + h * s_qh + n * s_qn
    ok = in_l[:, None] & in_r[None, :]
    q = tl.load(q_base + ll[:, None] * s_ql + rr[None, :], mask=ok, other=0.0).to(tl.float32)
    c_base = c_ptr + b * s_cb + h * s_ch + n * s_cn
    b_base = beta_ptr + b * s_cb + h * s_ch + n * s_cn
    c_re, c_im = _load_pairs(c_base, ll, mm, s_cl, L, M)
    doc = _documents(reset_ptr, b, n, s_rb, s_rn, L, HAS_RESET, BL)
    sk_re, sk_im = _load_pairs(st_ptr + b * s_sb + h * s_sh + n * s_sn, rr, mm, s_sc, R, M)
    y_re = tl.dot(q, sk_re, input_precision="ieee")
    y_im = tl.dot(q, sk_im, input_precision="ieee")
    f_re, f_im = _from_start(c_re, c_im, doc)
    p_re, p_im = f_re * y_re - f_im * y_im, f_re * y_im + f_im * y_re
    for s in range(0, L):
        k_s = tl.load(k_base + s * s_ql + rr, mask=in_r, other=0.0).to(tl.float32)
        a_s = tl.sum(q * k_s[None, :], 1)  # (q_t · k_s) for every t
        P_re, P_im = _pair_decay(c_base, b_base, s, s_cl, c_re, c_im, doc, M, BL, BM)
        p_re += a_s[:, None] * P_re
        p_im += a_s[:, None] * P_im
    _store_pairs(p_ptr + b * s_cb + h * s_ch + n * s_cn, ll, mm, s_cl, L, M, p_re, p_im)


@triton.autotune(configs=_configs(), key=["L", "D", "M"])
@triton.jit(do_not_specialize=["N"])
def _pass2_kernel(
    w_ptr, c_ptr, beta_ptr, v_ptr, st_ptr, reset_ptr, o_ptr,
    H, N, L, R, D, M,
    s_cb, s_ch, s_cn, s_cl,
    s_vb, s_vh, s_vn, s_vl,
    s_sb, s_sh, s_sn, s_sc,
    s_rb, s_rn,
    HAS_RESET: tl.constexpr, BL: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    pid, b, h, n = _program_bhn(H, N)
    ll, dd, mm = tl.arange(0, BL), tl.arange(0, BD), tl.arange(0, BM)
    in_l, in_d = ll < L, dd < D
    c_base = c_ptr + b * s_cb + h * s_ch + n * s_cn
    b_base = beta_ptr + b * s_cb + h * s_ch + n * s_cn
    w_re, w_im = _load_pairs(w_ptr + b * s_cb + h * s_ch + n * s_cn, ll, mm, s_cl, L, M)
    c_re, c_im = _load_pairs(c_base, ll, mm, s_cl, L, M)
    doc = _documents(reset_ptr, b, n, s_rb, s_rn, L, HAS_RESET, BL)
    f_re, f_im = _from_start(c_re, c_im, doc)
    u_re, u_im = f_re * w_re + f_im * w_im, f_re * w_im - f_im * w_re  # conj(exp(c_t)) ⊙ w̃
    s_base = st_ptr + b * s_sb + h * s_sh + n * s_sn + R * s_sc
    sv_re, sv_im = _load_pairs(s_base, dd, mm, s_sc, D, M)
    o = tl.dot(u_re, tl.trans(sv_re), input_precision="ieee")
    o += tl.dot(u_im, tl.trans(sv_im), input_precision="ieee")
    v_base = v_ptr + b * s_vb + h * s_vh + n * s_vn
    for s in range(0, L):
        P_re, P_im = _pair_decay(c_base, b_base, s, s_cl, c_re, c_im, doc, M, BL, BM)
        mix_s = tl.sum(P_re * w_re + P_im * w_im, 1)  # Re Σ_m conj(P[t, s]) w̃_t, every t
        v_s = tl.load(v_base + s * s_vl + dd, mask=in_d, other=0.0).to(tl.float32)
        o += mix_s[:, None] * v_s[None, :]
    out = o_ptr + b * s_vb + h * s_vh + n * s_vn + ll[:, None] * s_vl + dd[None, :]
    tl.store(out, o, mask=in_l[:, None] & in_d[None, :])


def selective_pass1(q, k, c, beta, starts, reset=None):
    """q, k: (B, H, N, L, R); c, beta: (B, H, N, L, 2M) interleaved (c: the chunk's cumulative
    log λ); starts: (B, H, N, R+D, 2M) chunk-start states; reset: (B, N, L) bool or None.
    Returns p: (B, H, N, L, 2M) fp32."""
    B, H, N, L, R = q.shape
    M = c.shape[-1] // 2
    q, k, c, beta, starts = (x.contiguous() for x in (q, k, c, beta, starts))
    p = torch.empty_like(c, dtype=torch.float32)
    r, s_rb, s_rn, has_reset = _reset_args(reset, q)
    _pass1_kernel[(B * H * N,)](
        q, k, c, beta, starts, r, p,
        H, N, L, R, M,
        *q.stride()[:4], *c.stride()[:4], *starts.stride()[:4], s_rb, s_rn,
        HAS_RESET=has_reset, BL=_block(L), BR=_block(R), BM=_block(M),
    )  # fmt: skip
    return p


def selective_pass2(w, c, beta, v, starts, key_dim, reset=None):
    """w: (B, H, N, L, 2M) = Ĝ p per position; v: (B, H, N, L, D); key_dim: R (starts hold R
    key rows, then D value rows); other arguments as in selective_pass1.
    Returns o: (B, H, N, L, D) fp32."""
    B, H, N, L, D = v.shape
    M = c.shape[-1] // 2
    w, c, beta, v, starts = (x.contiguous() for x in (w, c, beta, v, starts))
    o = torch.empty_like(v, dtype=torch.float32)
    r, s_rb, s_rn, has_reset = _reset_args(reset, v)
    _pass2_kernel[(B * H * N,)](
        w, c, beta, v, starts, r, o,
        H, N, L, key_dim, D, M,
        *c.stride()[:4], *v.stride()[:4], *starts.stride()[:4], s_rb, s_rn,
        HAS_RESET=has_reset, BL=_block(L), BD=_block(D), BM=_block(M),
    )  # fmt: skip
    return o
