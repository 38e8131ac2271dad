"""The intra-chunk passes with per-token (selective) decays as Triton kernels, one program per
(batch, head, chunk), for the forward and backward of ``idmix.functional.interdomain.selective``.

With c the cumulative sum of log λ over the chunk (interleaved [log|λ|, wrapped phase] pairs)
and P[t, s] = β_s exp(c_t − c_s) for s ≤ t in one document:

pass 1:  p_t = exp(c_t) ⊙ (Xᵏ_start q_t) + Σ_{s≤t} (q_t · k_s) P[t, s]
         (then w̃ = Ĝ p, one batched GEMM outside the kernels)
pass 2:  o_t = Re(Xᵛ_startᴴ (conj(exp(c_t)) ⊙ w̃_t)) + Σ_{s≤t} Re(conj(P[t, s]) · w̃_t) v_s
backward: the sums over pairs Σ_s A P and Σ_s g_S P (``selective_pair_sums``), then every
         gradient that flows through the pairs (``selective_pair_grads``); the rest of the
         backward (scan, Ĝ, the chain rule through the cumulative log) is batched PyTorch.

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
def _pair_decay(c_base, s, s_cl, c_re, c_im, doc, L, M, BL: tl.constexpr, BM: tl.constexpr):
    """D[:, s] = exp(c_t − c_s) for every t: (re, im) (BL, BM); 0 for t < s, t ≥ L or another
    document (the real exponent is selected before exp, so it is never positive)."""
    ll, mm = tl.arange(0, BL), tl.arange(0, BM)
    in_m = mm < M
    cs_re = tl.load(c_base + s * s_cl + 2 * mm, mask=in_m, other=0.0).to(tl.float32)
    cs_im = tl.load(c_base + s * s_cl + 2 * mm + 1, mask=in_m, other=0.0).to(tl.float32)
    doc_s = tl.sum(tl.where(ll == s, doc, 0), 0)
    ok = (ll >= s) & (ll < L) & (doc == doc_s)
    mag = tl.exp(tl.where(ok[:, None], c_re - cs_re[None, :], float("-inf")))
    ang = c_im - cs_im[None, :]
    return mag * tl.cos(ang), mag * tl.sin(ang)


@triton.jit
def _row_pair(base, s, s_l, M, BM: tl.constexpr):
    """Row s of an interleaved (L, 2M) block: (re, im) (BM,)."""
    mm = tl.arange(0, BM)
    re = tl.load(base + s * s_l + 2 * mm, mask=mm < M, other=0.0).to(tl.float32)
    return re, tl.load(base + s * s_l + 2 * mm + 1, mask=mm < M, other=0.0).to(tl.float32)


@triton.jit
def _times_row(d_re, d_im, b_re, b_im):
    """D ⊙ β_s for a (BL, BM) tile and a (BM,) row: (re, im)."""
    return d_re * b_re[None, :] - d_im * b_im[None, :], d_re * b_im[None, :] + d_im * b_re[None, :]


@triton.jit
def _load_tile(base, ll, cols, s_l, L, n_cols):
    """(BL, B·) fp32 tile of a row-major (L, n_cols) block (rows past L, columns past n_cols: 0)."""
    ok = (ll < L)[:, None] & (cols < n_cols)[None, :]
    return tl.load(base + ll[:, None] * s_l + cols[None, :], mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _from_start(c_re, c_im, doc):
    """exp(c_t) where no document starts in [chunk start, t], else 0: (re, im) (BL, BM)."""
    mag = tl.where((doc == 0)[:, None], tl.exp(c_re), 0.0)
    return mag * tl.cos(c_im), mag * tl.sin(c_im)


@triton.autotune(configs=_configs(), key=["L", "R", "D", "M"])
@triton.jit(do_not_specialize=["N"])
def _sums_kernel(
    q_ptr, k_ptr, v_ptr, go_ptr, c_ptr, beta_ptr, st_ptr, reset_ptr, p_ptr, gs_ptr,
    H, N, L, R, D, M,
    s_qb, s_qh, s_qn, s_ql,
    s_vb, s_vh, s_vn, s_vl,
    s_cb, s_ch, s_cn, s_cl,
    s_sb, s_sh, s_sn, s_sc,
    s_rb, s_rn,
    WITH_START: tl.constexpr, WITH_GRAD: tl.constexpr, HAS_RESET: tl.constexpr,
    BL: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """p = [exp(c_t) ⊙ (Xᵏ_start q_t) if WITH_START] + Σ_s (q_t · k_s) P[t, s], and with
    WITH_GRAD also gs = Σ_s (∂ℓ/∂o_t · v_s) P[t, s] (the backward's Σ_s g_S P)."""
    pid, b, h, n = _program_bhn(H, N)
    ll, rr, dd, mm = tl.arange(0, BL), tl.arange(0, BR), tl.arange(0, BD), tl.arange(0, BM)
    in_r, in_d = rr < R, dd < D
    q = _load_tile(q_ptr + b * s_qb + h * s_qh + n * s_qn, ll, rr, s_ql, L, R)
    k_base = k_ptr + b * s_qb + h * s_qh + n * s_qn
    c_base = c_ptr + b * s_cb + h * s_ch + n * s_cn
    b_base = beta_ptr + b * s_cb + h * s_ch + n * s_cn
    c_re, c_im = _load_pairs(c_base, ll, mm, s_cl, L, M)
    doc = _documents(reset_ptr, b, n, s_rb, s_rn, L, HAS_RESET, BL)
    p_re = tl.zeros((BL, BM), dtype=tl.float32)
    p_im = tl.zeros((BL, BM), dtype=tl.float32)
    if WITH_START:
        sk_re, sk_im = _load_pairs(st_ptr + b * s_sb + h * s_sh + n * s_sn, rr, mm, s_sc, R, M)
        y_re = tl.dot(q, sk_re, input_precision="ieee")
        y_im = tl.dot(q, sk_im, input_precision="ieee")
        f_re, f_im = _from_start(c_re, c_im, doc)
        p_re, p_im = f_re * y_re - f_im * y_im, f_re * y_im + f_im * y_re
    g_re = tl.zeros((BL, BM), dtype=tl.float32)
    g_im = tl.zeros((BL, BM), dtype=tl.float32)
    v_base = v_ptr + b * s_vb + h * s_vh + n * s_vn
    go = tl.zeros((BL, BD), dtype=tl.float32)
    if WITH_GRAD:
        go = _load_tile(go_ptr + b * s_vb + h * s_vh + n * s_vn, ll, dd, s_vl, L, D)
    for s in range(0, L):
        k_s = tl.load(k_base + s * s_ql + rr, mask=in_r, other=0.0).to(tl.float32)
        a_s = tl.sum(q * k_s[None, :], 1)  # (q_t · k_s) for every t
        d_re, d_im = _pair_decay(c_base, s, s_cl, c_re, c_im, doc, L, M, BL, BM)
        P_re, P_im = _times_row(d_re, d_im, *_row_pair(b_base, s, s_cl, M, BM))
        p_re += a_s[:, None] * P_re
        p_im += a_s[:, None] * P_im
        if WITH_GRAD:
            v_s = tl.load(v_base + s * s_vl + dd, mask=in_d, other=0.0).to(tl.float32)
            g_s = tl.sum(go * v_s[None, :], 1)
            g_re += g_s[:, None] * P_re
            g_im += g_s[:, None] * P_im
    _store_pairs(p_ptr + b * s_cb + h * s_ch + n * s_cn, ll, mm, s_cl, L, M, p_re, p_im)
    if WITH_GRAD:
        _store_pairs(gs_ptr + b * s_cb + h * s_ch + n * s_cn, ll, mm, s_cl, L, M, g_re, g_im)


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
        d_re, d_im = _pair_decay(c_base, s, s_cl, c_re, c_im, doc, L, M, BL, BM)
        P_re, P_im = _times_row(d_re, d_im, *_row_pair(b_base, s, s_cl, M, BM))
        mix_s = tl.sum(P_re * w_re + P_im * w_im, 1)  # Re Σ_m conj(P[t, s]) w̃_t, every t
        v_s = tl.load(v_base + s * s_vl + dd, mask=in_d, other=0.0).to(tl.float32)
        o += mix_s[:, None] * v_s[None, :]
    out = o_ptr + b * s_vb + h * s_vh + n * s_vn + ll[:, None] * s_vl + dd[None, :]
    tl.store(out, o, mask=in_l[:, None] & in_d[None, :])


@triton.autotune(configs=_configs(), key=["L", "R", "D", "M"])
@triton.jit(do_not_specialize=["N"])
def _grads_kernel(
    q_ptr, k_ptr, v_ptr, go_ptr, c_ptr, beta_ptr, w_ptr, gp_ptr, reset_ptr,
    gq_ptr, gk_ptr, gv_ptr, gb_ptr,
    H, N, L, R, D, M,
    s_qb, s_qh, s_qn, s_ql,
    s_vb, s_vh, s_vn, s_vl,
    s_cb, s_ch, s_cn, s_cl,
    s_rb, s_rn,
    HAS_RESET: tl.constexpr, BL: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr,
    BM: tl.constexpr,
):  # fmt: skip
    """The backward over the pairs (t, s) of one chunk, one source position s per loop step:
    with S[t, s] = Re Σ_m conj(P[t, s]) w̃_t and ∂ℓ/∂A[t, s] = Re Σ_m conj(P[t, s]) g_p(t),
    gv_s = Σ_t S[t, s] ∂ℓ/∂o_t, gk_s = Σ_t ∂ℓ/∂A[t, s] q_t, gq_t = Σ_s ∂ℓ/∂A[t, s] k_s and
    gβ_s = Σ_t conj(D[t, s]) ((∂ℓ/∂o_t · v_s) w̃_t + (q_t · k_s) g_p(t))."""
    pid, b, h, n = _program_bhn(H, N)
    ll, rr, dd, mm = tl.arange(0, BL), tl.arange(0, BR), tl.arange(0, BD), tl.arange(0, BM)
    in_l, in_r, in_d = ll < L, rr < R, dd < D
    q = _load_tile(q_ptr + b * s_qb + h * s_qh + n * s_qn, ll, rr, s_ql, L, R)
    k_base = k_ptr + b * s_qb + h * s_qh + n * s_qn
    v_base = v_ptr + b * s_vb + h * s_vh + n * s_vn
    go = _load_tile(go_ptr + b * s_vb + h * s_vh + n * s_vn, ll, dd, s_vl, L, D)
    c_base = c_ptr + b * s_cb + h * s_ch + n * s_cn
    b_base = beta_ptr + b * s_cb + h * s_ch + n * s_cn
    c_re, c_im = _load_pairs(c_base, ll, mm, s_cl, L, M)
    w_re, w_im = _load_pairs(w_ptr + b * s_cb + h * s_ch + n * s_cn, ll, mm, s_cl, L, M)
    gp_re, gp_im = _load_pairs(gp_ptr + b * s_cb + h * s_ch + n * s_cn, ll, mm, s_cl, L, M)
    doc = _documents(reset_ptr, b, n, s_rb, s_rn, L, HAS_RESET, BL)
    gq = tl.zeros((BL, BR), dtype=tl.float32)
    gk_base = gk_ptr + b * s_qb + h * s_qh + n * s_qn
    gv_base = gv_ptr + b * s_vb + h * s_vh + n * s_vn
    gb_base = gb_ptr + b * s_cb + h * s_ch + n * s_cn
    for s in range(0, L):
        k_s = tl.load(k_base + s * s_ql + rr, mask=in_r, other=0.0).to(tl.float32)
        v_s = tl.load(v_base + s * s_vl + dd, mask=in_d, other=0.0).to(tl.float32)
        a_s = tl.sum(q * k_s[None, :], 1)  # A[t, s] for every t
        g_s = tl.sum(go * v_s[None, :], 1)  # ∂ℓ/∂S[t, s]
        d_re, d_im = _pair_decay(c_base, s, s_cl, c_re, c_im, doc, L, M, BL, BM)
        P_re, P_im = _times_row(d_re, d_im, *_row_pair(b_base, s, s_cl, M, BM))
        mix_s = tl.sum(P_re * w_re + P_im * w_im, 1)
        ga_s = tl.sum(P_re * gp_re + P_im * gp_im, 1)
        tl.store(gv_base + s * s_vl + dd, tl.sum(mix_s[:, None] * go, 0), mask=in_d)
        tl.store(gk_base + s * s_ql + rr, tl.sum(ga_s[:, None] * q, 0), mask=in_r)
        gq += ga_s[:, None] * k_s[None, :]
        x_re = g_s[:, None] * w_re + a_s[:, None] * gp_re
        x_im = g_s[:, None] * w_im + a_s[:, None] * gp_im
        gb_re = tl.sum(d_re * x_re + d_im * x_im, 0)  # Σ_t conj(D) x
        gb_im = tl.sum(d_re * x_im - d_im * x_re, 0)
        tl.store(gb_base + s * s_cl + 2 * mm, gb_re, mask=mm < M)
        tl.store(gb_base + s * s_cl + 2 * mm + 1, gb_im, mask=mm < M)
    tl.store(
        gq_ptr + b * s_qb + h * s_qh + n * s_qn + ll[:, None] * s_ql + rr[None, :],
        gq,
        mask=in_l[:, None] & in_r[None, :],
    )


def _sums(q, k, c, beta, reset, starts=None, v=None, go=None):
    B, H, N, L, R = q.shape
    M = c.shape[-1] // 2
    with_start, with_grad = starts is not None, go is not None
    q, k, c, beta = (x.contiguous() for x in (q, k, c, beta))
    v = v.contiguous() if with_grad else q.new_zeros(1, 1, 1, 1, 1)
    go = go.contiguous() if with_grad else v
    starts = starts.contiguous() if with_start else c
    p = torch.empty_like(c, dtype=torch.float32)
    gs = torch.empty_like(p) if with_grad else p
    r, s_rb, s_rn, has_reset = _reset_args(reset, q)
    _sums_kernel[(B * H * N,)](
        q, k, v, go, c, beta, starts, r, p, gs,
        H, N, L, R, v.shape[-1], M,
        *q.stride()[:4], *v.stride()[:4], *c.stride()[:4], *starts.stride()[:4], s_rb, s_rn,
        WITH_START=with_start, WITH_GRAD=with_grad, HAS_RESET=has_reset,
        BL=_block(L), BR=_block(R), BD=_block(v.shape[-1]), BM=_block(M),
    )  # fmt: skip
    return p, gs


def selective_pass1(q, k, c, beta, starts, reset=None):
    """q, k: (B, H, N, L, R); c, beta: (B, H, N, L, 2M) interleaved (c: the chunk's cumulative
    log λ); starts: (B, H, N, R+D, 2M) chunk-start states; reset: (B, N, L) bool or None.
    Returns p: (B, H, N, L, 2M) fp32."""
    return _sums(q, k, c, beta, reset, starts=starts)[0]


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


def selective_pair_sums(q, k, v, go, c, beta, reset=None):
    """The backward's two sums over pairs: (Σ_s A[t, s] P[t, s], Σ_s (go_t · v_s) P[t, s]), each
    (B, H, N, L, 2M) fp32. q, k: (B, H, N, L, R); v, go: (B, H, N, L, D) (go: ∂ℓ/∂o); c, beta,
    reset as in selective_pass1."""
    return _sums(q, k, c, beta, reset, v=v, go=go)


def selective_pair_grads(q, k, v, go, c, beta, w, g_p, reset=None):
    """The backward over pairs (see _grads_kernel): w = Ĝ p, g_p = ∂ℓ/∂p, both (B, H, N, L, 2M);
    other arguments as in selective_pair_sums. Returns (gq, gk (B, H, N, L, R), gv (.., L, D),
    gβ (.., L, 2M)), fp32: the parts of those gradients that come through the pairs."""
    B, H, N, L, R = q.shape
    D, M = v.shape[-1], c.shape[-1] // 2
    q, k, v, go, c, beta, w, g_p = (x.contiguous() for x in (q, k, v, go, c, beta, w, g_p))
    gq, gk = (torch.empty_like(q, dtype=torch.float32) for _ in range(2))
    gv = torch.empty_like(v, dtype=torch.float32)
    gb = torch.empty_like(c, dtype=torch.float32)
    r, s_rb, s_rn, has_reset = _reset_args(reset, q)
    _grads_kernel[(B * H * N,)](
        q, k, v, go, c, beta, w, g_p, r, gq, gk, gv, gb,
        H, N, L, R, D, M,
        *q.stride()[:4], *v.stride()[:4], *c.stride()[:4], s_rb, s_rn,
        HAS_RESET=has_reset, BL=_block(L), BR=_block(R), BD=_block(D), BM=_block(M),
    )  # fmt: skip
    return gq, gk, gv, gb
