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
L·π. Sequence starts (reset) become in-kernel masks from a cumulative count.

Blocking: the modes are walked in blocks of BM (a grid dimension where modes are independent,
pass 1 and the pair sums; a loop where they are summed, pass 2 and the pair gradients), so a
program holds (L, BM) tiles. What is summed over the modes per pair — the (L, L) weights
S[t, s] and ∂ℓ/∂A[t, s] — accumulates as (L, L) tiles whose products with v, q, k and ∂ℓ/∂o are
tile products at the end, and the scores q·k and ∂ℓ/∂o·v are (L, L) products at the start. Those
run as IEEE fp32 products (the pair work is fp32 in every engine); the contractions with the
chunk-start state run at the PREC precision (tiles.mma). tl.exp is ex2.approx on the GPU (the
interpreter is exact): docs/precision.md states its error against the tests' tolerances.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .tiles import (
    IEEE,
    PRECISION_CODES,
    Space,
    block,
    load_pairs,
    load_tile,
    mma,
    on_device,
    program_bhn,
    reset_args,
    store_pairs,
    store_tile,
)

_IEEE = tl.constexpr(IEEE)  # the pair work's products: fp32 in every engine
# measured spill-free on sm_90 and sm_80 at R = D ∈ {64, 128}, M ∈ {32, 64} (offline_compile)
_ALL = [(4, 16), (4, 32), (8, 16), (8, 32)]
_SUMS, _GRADS = Space(sm90=_ALL, sm80=_ALL), Space(sm90=_ALL, sm80=_ALL)
_PASS2 = Space(sm90=[(4, 16), (8, 16), (8, 32)], sm80=[(4, 16), (8, 16), (8, 32)])


@triton.jit
def _documents(reset_ptr, b, n, s_rb, s_rn, L, HAS_RESET: tl.constexpr, BL: tl.constexpr):
    """Document index of each position of the chunk (BL,): starts seen so far (0 without reset)."""
    ll = tl.arange(0, BL)
    if HAS_RESET:
        starts = tl.load(reset_ptr + b * s_rb + n * s_rn + ll, mask=ll < L, other=0)
        return tl.cumsum(starts.to(tl.int32), 0)
    return tl.zeros((BL,), dtype=tl.int32)


@triton.jit
def _pair_decay(c_base, s, s_cl, c_re, c_im, doc, L, mm, M, BL: tl.constexpr):
    """D[:, s] = exp(c_t − c_s) for every t and the modes mm: (re, im) (BL, BM); 0 for t < s,
    t ≥ L or another document (the real exponent is selected before exp: never positive)."""
    ll = tl.arange(0, BL)
    in_m = mm < M
    cs_re = tl.load(c_base + s * s_cl + 2 * mm, mask=in_m, other=0.0).to(tl.float32)
    cs_im = tl.load(c_base + s * s_cl + 2 * mm + 1, mask=in_m, other=0.0).to(tl.float32)
    doc_s = tl.sum(tl.where(ll == s, doc, 0), 0)
    ok = (ll >= s) & (ll < L) & (doc == doc_s)
    mag = tl.exp(tl.where(ok[:, None], c_re - cs_re[None, :], float("-inf")))
    ang = c_im - cs_im[None, :]
    return mag * tl.cos(ang), mag * tl.sin(ang)


@triton.jit
def _pair_weight(c_base, b_base, s, s_cl, c_re, c_im, doc, L, mm, M, BL: tl.constexpr):
    """P[:, s] = D[:, s] ⊙ β_s over the modes mm, and D[:, s]: (P re, P im, D re, D im)."""
    d_re, d_im = _pair_decay(c_base, s, s_cl, c_re, c_im, doc, L, mm, M, BL)
    in_m = mm < M
    b_re = tl.load(b_base + s * s_cl + 2 * mm, mask=in_m, other=0.0).to(tl.float32)[None, :]
    b_im = tl.load(b_base + s * s_cl + 2 * mm + 1, mask=in_m, other=0.0).to(tl.float32)[None, :]
    return d_re * b_re - d_im * b_im, d_re * b_im + d_im * b_re, d_re, d_im


@triton.jit
def _column(x, s, BL: tl.constexpr):
    """Column s of a (BL, BL) tile: (BL,)."""
    return tl.sum(tl.where(tl.arange(0, BL)[None, :] == s, x, 0.0), 1)


@triton.jit
def _add_column(x, s, col, BL: tl.constexpr):
    """x with col (BL,) added to its column s."""
    return x + tl.where(tl.arange(0, BL)[None, :] == s, col[:, None], 0.0)


@triton.jit
def _from_start(c_re, c_im, doc):
    """exp(c_t) where no document starts in [chunk start, t], else 0: (re, im) (BL, BM)."""
    mag = tl.where((doc == 0)[:, None], tl.exp(c_re), 0.0)
    return mag * tl.cos(c_im), mag * tl.sin(c_im)


@triton.autotune(
    configs=_SUMS.configs,
    key=["L", "R", "D", "M", "WITH_START", "WITH_GRAD", "HAS_RESET", "PREC"],
    prune_configs_by=_SUMS.prune,
)
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
    PREC: tl.constexpr, BL: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """For the modes of grid axis 1: p = [exp(c_t) ⊙ (Xᵏ_start q_t) if WITH_START] +
    Σ_s (q_t · k_s) P[t, s], and with WITH_GRAD also gs = Σ_s (∂ℓ/∂o_t · v_s) P[t, s]."""
    b, h, n = program_bhn(H, N)
    ll, rr = tl.arange(0, BL), tl.arange(0, BR)
    mm = tl.program_id(1) * BM + tl.arange(0, BM)
    q = load_tile(q_ptr + b * s_qb + h * s_qh + n * s_qn, ll, rr, s_ql, 1, L, R)
    k_base = k_ptr + b * s_qb + h * s_qh + n * s_qn
    off = b * s_cb + h * s_ch + n * s_cn
    c_base, b_base = c_ptr + off, beta_ptr + off
    c_re, c_im = load_pairs(c_base, ll, mm, s_cl, L, M)
    doc = _documents(reset_ptr, b, n, s_rb, s_rn, L, HAS_RESET, BL)
    p_re = tl.zeros((BL, BM), dtype=tl.float32)
    p_im = tl.zeros((BL, BM), dtype=tl.float32)
    if WITH_START:
        sk_re, sk_im = load_pairs(st_ptr + b * s_sb + h * s_sh + n * s_sn, rr, mm, s_sc, R, M)
        y_re, y_im = mma(q, sk_re, None, PREC), mma(q, sk_im, None, PREC)
        f_re, f_im = _from_start(c_re, c_im, doc)
        p_re, p_im = f_re * y_re - f_im * y_im, f_re * y_im + f_im * y_re
    g_re = tl.zeros((BL, BM), dtype=tl.float32)
    g_im = tl.zeros((BL, BM), dtype=tl.float32)
    if WITH_GRAD:
        dd = tl.arange(0, BD)
        v_base = v_ptr + b * s_vb + h * s_vh + n * s_vn
        go = load_tile(go_ptr + b * s_vb + h * s_vh + n * s_vn, ll, dd, s_vl, 1, L, D)
    for s in range(0, L):
        P_re, P_im, _, _ = _pair_weight(c_base, b_base, s, s_cl, c_re, c_im, doc, L, mm, M, BL)
        k_s = tl.load(k_base + s * s_ql + rr, mask=rr < R, other=0.0).to(tl.float32)
        a_s = tl.sum(q * k_s[None, :], 1)  # A[t, s] = q_t · k_s for every t
        p_re += a_s[:, None] * P_re
        p_im += a_s[:, None] * P_im
        if WITH_GRAD:
            v_s = tl.load(v_base + s * s_vl + dd, mask=dd < D, other=0.0).to(tl.float32)
            g_s = tl.sum(go * v_s[None, :], 1)  # ∂ℓ/∂S[t, s] = ∂ℓ/∂o_t · v_s
            g_re += g_s[:, None] * P_re
            g_im += g_s[:, None] * P_im
    store_pairs(p_ptr + off, ll, mm, s_cl, L, M, p_re, p_im)
    if WITH_GRAD:
        store_pairs(gs_ptr + off, ll, mm, s_cl, L, M, g_re, g_im)


@triton.autotune(
    configs=_PASS2.configs, key=["L", "D", "M", "HAS_RESET", "PREC"], prune_configs_by=_PASS2.prune
)
@triton.jit(do_not_specialize=["N"])
def _pass2_kernel(
    w_ptr, c_ptr, beta_ptr, v_ptr, st_ptr, reset_ptr, o_ptr,
    H, N, L, R, D, M,
    s_cb, s_ch, s_cn, s_cl,
    s_vb, s_vh, s_vn, s_vl,
    s_sb, s_sh, s_sn, s_sc,
    s_rb, s_rn,
    HAS_RESET: tl.constexpr, PREC: tl.constexpr,
    BL: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    b, h, n = program_bhn(H, N)
    ll, dd = tl.arange(0, BL), tl.arange(0, BD)
    c_base = c_ptr + b * s_cb + h * s_ch + n * s_cn
    b_base = beta_ptr + b * s_cb + h * s_ch + n * s_cn
    w_base = w_ptr + b * s_cb + h * s_ch + n * s_cn
    sv_base = st_ptr + b * s_sb + h * s_sh + n * s_sn + R * s_sc
    doc = _documents(reset_ptr, b, n, s_rb, s_rn, L, HAS_RESET, BL)
    o = tl.zeros((BL, BD), dtype=tl.float32)
    mix = tl.zeros((BL, BL), dtype=tl.float32)  # S[t, s] = Re Σ_m conj(P[t, s]) w̃_t
    for m0 in range(0, M, BM):
        mm = m0 + tl.arange(0, BM)
        w_re, w_im = load_pairs(w_base, ll, mm, s_cl, L, M)
        c_re, c_im = load_pairs(c_base, ll, mm, s_cl, L, M)
        f_re, f_im = _from_start(c_re, c_im, doc)
        u_re, u_im = f_re * w_re + f_im * w_im, f_re * w_im - f_im * w_re  # conj(exp(c_t)) ⊙ w̃
        sv_re, sv_im = load_pairs(sv_base, dd, mm, s_sc, D, M)
        o = mma(u_re, tl.trans(sv_re), o, PREC)
        o = mma(u_im, tl.trans(sv_im), o, PREC)
        for s in range(0, L):
            P_re, P_im, _, _ = _pair_weight(c_base, b_base, s, s_cl, c_re, c_im, doc, L, mm, M, BL)
            mix = _add_column(mix, s, tl.sum(P_re * w_re + P_im * w_im, 1), BL)
    v = load_tile(v_ptr + b * s_vb + h * s_vh + n * s_vn, ll, dd, s_vl, 1, L, D)
    o = mma(mix, v, o, _IEEE)
    store_tile(o_ptr + b * s_vb + h * s_vh + n * s_vn, ll, dd, s_vl, 1, L, D, o)


@triton.autotune(
    configs=_GRADS.configs, key=["L", "R", "D", "M", "HAS_RESET"], prune_configs_by=_GRADS.prune
)
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
    BK: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """The backward over the pairs (t, s) of one chunk: with S[t, s] = Re Σ_m conj(P[t, s]) w̃_t
    and ∂ℓ/∂A[t, s] = Re Σ_m conj(P[t, s]) g_p(t), accumulated over the mode blocks,
    gv = Sᵀ ∂ℓ/∂o, gk = (∂ℓ/∂A)ᵀ q, gq = ∂ℓ/∂A k; and per mode block
    gβ_s = Σ_t conj(D[t, s]) ((∂ℓ/∂o_t · v_s) w̃_t + (q_t · k_s) g_p(t))."""
    b, h, n = program_bhn(H, N)
    ll = tl.arange(0, BL)
    q_base = q_ptr + b * s_qb + h * s_qh + n * s_qn
    k_base = k_ptr + b * s_qb + h * s_qh + n * s_qn
    v_base = v_ptr + b * s_vb + h * s_vh + n * s_vn
    go_base = go_ptr + b * s_vb + h * s_vh + n * s_vn
    scores = tl.zeros((BL, BL), dtype=tl.float32)  # A[t, s] = q_t · k_s
    for r0 in range(0, R, BK):
        rk = r0 + tl.arange(0, BK)
        q = load_tile(q_base, ll, rk, s_ql, 1, L, R)
        scores = mma(q, load_tile(k_base, rk, ll, 1, s_ql, R, L), scores, _IEEE)
    g_S = tl.zeros((BL, BL), dtype=tl.float32)  # ∂ℓ/∂S[t, s] = ∂ℓ/∂o_t · v_s
    for d0 in range(0, D, BK):
        dk = d0 + tl.arange(0, BK)
        go = load_tile(go_base, ll, dk, s_vl, 1, L, D)
        g_S = mma(go, load_tile(v_base, dk, ll, 1, s_vl, D, L), g_S, _IEEE)
    off = b * s_cb + h * s_ch + n * s_cn
    c_base, b_base, gb_base = c_ptr + off, beta_ptr + off, gb_ptr + off
    doc = _documents(reset_ptr, b, n, s_rb, s_rn, L, HAS_RESET, BL)
    mix = tl.zeros((BL, BL), dtype=tl.float32)
    g_A = tl.zeros((BL, BL), dtype=tl.float32)
    for m0 in range(0, M, BM):
        mm = m0 + tl.arange(0, BM)
        c_re, c_im = load_pairs(c_base, ll, mm, s_cl, L, M)
        w_re, w_im = load_pairs(w_ptr + off, ll, mm, s_cl, L, M)
        gp_re, gp_im = load_pairs(gp_ptr + off, ll, mm, s_cl, L, M)
        for s in range(0, L):
            P_re, P_im, d_re, d_im = _pair_weight(
                c_base, b_base, s, s_cl, c_re, c_im, doc, L, mm, M, BL
            )
            mix = _add_column(mix, s, tl.sum(P_re * w_re + P_im * w_im, 1), BL)
            g_A = _add_column(g_A, s, tl.sum(P_re * gp_re + P_im * gp_im, 1), BL)
            g_s, a_s = _column(g_S, s, BL), _column(scores, s, BL)
            x_re = g_s[:, None] * w_re + a_s[:, None] * gp_re
            x_im = g_s[:, None] * w_im + a_s[:, None] * gp_im
            gb_re = tl.sum(d_re * x_re + d_im * x_im, 0)  # Σ_t conj(D) x
            gb_im = tl.sum(d_re * x_im - d_im * x_re, 0)
            tl.store(gb_base + s * s_cl + 2 * mm, gb_re, mask=mm < M)
            tl.store(gb_base + s * s_cl + 2 * mm + 1, gb_im, mask=mm < M)
    gv_base = gv_ptr + b * s_vb + h * s_vh + n * s_vn
    for d0 in range(0, D, BK):  # the products with the (L, D) and (L, R) rows, in column blocks
        dk = d0 + tl.arange(0, BK)
        gv = mma(tl.trans(mix), load_tile(go_base, ll, dk, s_vl, 1, L, D), None, _IEEE)
        store_tile(gv_base, ll, dk, s_vl, 1, L, D, gv)
    gk_base = gk_ptr + b * s_qb + h * s_qh + n * s_qn
    gq_base = gq_ptr + b * s_qb + h * s_qh + n * s_qn
    for r0 in range(0, R, BK):
        rk = r0 + tl.arange(0, BK)
        gk = mma(tl.trans(g_A), load_tile(q_base, ll, rk, s_ql, 1, L, R), None, _IEEE)
        store_tile(gk_base, ll, rk, s_ql, 1, L, R, gk)
        gq = mma(g_A, load_tile(k_base, ll, rk, s_ql, 1, L, R), None, _IEEE)
        store_tile(gq_base, ll, rk, s_ql, 1, L, R, gq)


def _sums(q, k, c, beta, reset, starts=None, v=None, go=None, precision="ieee"):
    B, H, N, L, R = q.shape
    M = c.shape[-1] // 2
    with_start, with_grad = starts is not None, go is not None
    q, k, c, beta = (x.contiguous() for x in (q, k, c, beta))  # q and k share strides
    v = v.contiguous() if with_grad else q.new_zeros(1, 1, 1, 1, 1)
    go = go.contiguous() if with_grad else v
    starts = starts.contiguous() if with_start else c
    p = torch.empty_like(c, dtype=torch.float32)
    gs = torch.empty_like(p) if with_grad else p
    r, s_rb, s_rn, has_reset = reset_args(reset, q)

    def grid(meta):
        return (B * H * N, triton.cdiv(M, meta["BM"]))

    with on_device(q):
        _sums_kernel[grid](
            q, k, v, go, c, beta, starts, r, p, gs,
            H, N, L, R, v.shape[-1], M,
            *q.stride()[:4], *v.stride()[:4], *c.stride()[:4], *starts.stride()[:4], s_rb, s_rn,
            WITH_START=with_start, WITH_GRAD=with_grad, HAS_RESET=has_reset,
            PREC=PRECISION_CODES[precision], BL=block(L), BR=block(R), BD=block(v.shape[-1]),
        )  # fmt: skip
    return p, gs


def selective_pass1(q, k, c, beta, starts, reset=None, precision="ieee"):
    """q, k: (B, H, N, L, R); c, beta: (B, H, N, L, 2M) interleaved (c: the chunk's cumulative
    log λ); starts: (B, H, N, R+D, 2M) chunk-start states; reset: (B, N, L) bool or None;
    precision: of the product with the start state ("ieee", "tf32", "bf16").
    Returns p: (B, H, N, L, 2M) fp32."""
    return _sums(q, k, c, beta, reset, starts=starts, precision=precision)[0]


def selective_pass2(w, c, beta, v, starts, key_dim, reset=None, precision="ieee"):
    """w: (B, H, N, L, 2M) = Ĝ p per position; v: (B, H, N, L, D); key_dim: R (starts hold R
    key rows, then D value rows); other arguments as in selective_pass1.
    Returns o: (B, H, N, L, D) fp32."""
    B, H, N, L, D = v.shape
    M = c.shape[-1] // 2
    w, c, beta, v, starts = (x.contiguous() for x in (w, c, beta, v, starts))
    o = torch.empty_like(v, dtype=torch.float32)
    r, s_rb, s_rn, has_reset = reset_args(reset, v)
    with on_device(v):
        _pass2_kernel[(B * H * N,)](
            w, c, beta, v, starts, r, o,
            H, N, L, key_dim, D, M,
            *c.stride()[:4], *v.stride()[:4], *starts.stride()[:4], s_rb, s_rn,
            HAS_RESET=has_reset, PREC=PRECISION_CODES[precision], BL=block(L), BD=block(D),
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
    r, s_rb, s_rn, has_reset = reset_args(reset, q)
    with on_device(q):
        _grads_kernel[(B * H * N,)](
            q, k, v, go, c, beta, w, g_p, r, gq, gk, gv, gb,
            H, N, L, R, D, M,
            *q.stride()[:4], *v.stride()[:4], *c.stride()[:4], s_rb, s_rn,
            HAS_RESET=has_reset, BL=block(L), BR=block(R), BD=block(D),
            BK=min(32, block(R), block(D)),
        )  # fmt: skip
    return gq, gk, gv, gb
