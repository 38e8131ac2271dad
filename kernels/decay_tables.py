"""The chunked op's decay tables from (λ, β), forward and backward, one launch each: the small
per-call preprocessing of the parameters, which as PyTorch ops (polar form, powers, interleave,
and autograd through each) would be dozens of tiny launches.

start[i] = λ^{i+1}, end[j] = β λ^{L-1-j}, chunk = λ^L  (i, j < L; decays.ChunkDecays)

Powers are taken by binary exponentiation (at most 2·log2 L complex products: no exp, log or
angle; every exponent ≥ 0). The backward applies the holomorphic chain rule in PyTorch's
convention for a real view, g_z = conj(f'(z)) g_f:
  g_λ = Σ_i conj((i+1) λ^i) g_start[i] + Σ_j conj((L-1-j) β λ^{L-2-j}) g_end[j]
        + conj(L λ^{L-1}) g_chunk
  g_β = Σ_j conj(λ^{L-1-j}) g_end[j]
One program per (head, block of modes); complex values are interleaved (re, im) pairs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .tiles import block, load_pairs, on_device, store_pairs

BLOCK_MODES = 16


@triton.jit
def _cpow(xr, xi, e, NBITS: tl.constexpr):
    """x^e for a complex x (1, BM) and integer exponents e ≥ 0 (BN, 1): (re, im) (BN, BM)."""
    ones = (e == e).to(tl.float32) * (xr == xr).to(tl.float32)
    rr, ri = ones, ones * 0.0
    for bit in tl.static_range(NBITS):
        on = ((e >> bit) & 1) != 0
        nr = rr * xr - ri * xi
        ni = rr * xi + ri * xr
        rr = tl.where(on, nr, rr)
        ri = tl.where(on, ni, ri)
        xr, xi = xr * xr - xi * xi, 2.0 * xr * xi
    return rr, ri


@triton.jit
def _load_param(ptr, h, mm, s_h, s_m, M):
    """(re, im) (1, BM) of a (H, M, 2) parameter at head h."""
    ok = mm < M
    re = tl.load(ptr + h * s_h + mm * s_m, mask=ok, other=0.0).to(tl.float32)
    im = tl.load(ptr + h * s_h + mm * s_m + 1, mask=ok, other=0.0).to(tl.float32)
    return re[None, :], im[None, :]


@triton.jit
def _program(lam_ptr, beta_ptr, M, s_lh, s_lm, s_bh, s_bm, BN: tl.constexpr, BM: tl.constexpr):
    """(head, its modes (BM,), rows (BN,), λ and β of those modes as (re, im) (1, BM) each)."""
    h = tl.program_id(0).to(tl.int64)
    mm = tl.program_id(1) * BM + tl.arange(0, BM)
    lr, li = _load_param(lam_ptr, h, mm, s_lh, s_lm, M)
    br, bi = _load_param(beta_ptr, h, mm, s_bh, s_bm, M)
    return h, mm, tl.arange(0, BN), lr, li, br, bi


@triton.jit
def _tables_fwd_kernel(
    lam_ptr, beta_ptr, start_ptr, end_ptr, chunk_ptr,
    L, M, s_lh, s_lm, s_bh, s_bm,
    BN: tl.constexpr, BM: tl.constexpr, NBITS: tl.constexpr,
):  # fmt: skip
    h, mm, nn, lr, li, br, bi = _program(lam_ptr, beta_ptr, M, s_lh, s_lm, s_bh, s_bm, BN, BM)
    table = h * L * 2 * M
    sr, si = _cpow(lr, li, (nn + 1)[:, None], NBITS)
    store_pairs(start_ptr + table, nn, mm, 2 * M, L, M, sr, si)
    er, ei = _cpow(lr, li, tl.maximum(L - 1 - nn, 0)[:, None], NBITS)
    store_pairs(end_ptr + table, nn, mm, 2 * M, L, M, br * er - bi * ei, br * ei + bi * er)
    cr, ci = _cpow(lr, li, (nn * 0 + L)[:, None], NBITS)
    store_pairs(chunk_ptr + h * 2 * M, nn, mm, 0, 1, M, cr, ci)


@triton.jit
def _conj_dot(ar, ai, gr, gi):
    """Σ over rows of conj(a) ⊙ g: (re, im) (BM,)."""
    return tl.sum(ar * gr + ai * gi, 0), tl.sum(ar * gi - ai * gr, 0)


@triton.jit
def _tables_bwd_kernel(
    lam_ptr, beta_ptr, gs_ptr, ge_ptr, gc_ptr, dlam_ptr, dbeta_ptr,
    L, M, s_lh, s_lm, s_bh, s_bm,
    BN: tl.constexpr, BM: tl.constexpr, NBITS: tl.constexpr,
):  # fmt: skip
    h, mm, nn, lr, li, br, bi = _program(lam_ptr, beta_ptr, M, s_lh, s_lm, s_bh, s_bm, BN, BM)
    table = h * L * 2 * M
    gsr, gsi = load_pairs(gs_ptr + table, nn, mm, 2 * M, L, M)
    ger, gei = load_pairs(ge_ptr + table, nn, mm, 2 * M, L, M)
    gcr, gci = load_pairs(gc_ptr + h * 2 * M, nn, mm, 0, 1, M)  # row 0 only
    # d start[i] / dλ = (i+1) λ^i
    pr, pi = _cpow(lr, li, nn[:, None], NBITS)
    coef = (nn + 1).to(tl.float32)[:, None]
    dr, di = _conj_dot(coef * pr, coef * pi, gsr, gsi)
    # d end[j] / dλ = (L-1-j) β λ^{L-2-j}; d end[j] / dβ = λ^{L-1-j}
    qr, qi = _cpow(lr, li, tl.maximum(L - 2 - nn, 0)[:, None], NBITS)
    coef = tl.maximum(L - 1 - nn, 0).to(tl.float32)[:, None]
    ar, ai = coef * (br * qr - bi * qi), coef * (br * qi + bi * qr)
    xr, xi = _conj_dot(ar, ai, ger, gei)
    dr, di = dr + xr, di + xi
    er, ei = _cpow(lr, li, tl.maximum(L - 1 - nn, 0)[:, None], NBITS)
    gbr, gbi = _conj_dot(er, ei, ger, gei)
    # d chunk / dλ = L λ^{L-1}
    cr, ci = _cpow(lr, li, (nn * 0 + L - 1)[:, None], NBITS)
    xr, xi = _conj_dot(L * cr, L * ci, gcr, gci)
    dr, di = dr + xr, di + xi
    ok = mm < M
    base = h * M * 2 + mm * 2
    tl.store(dlam_ptr + base, dr, mask=ok)
    tl.store(dlam_ptr + base + 1, di, mask=ok)
    tl.store(dbeta_ptr + base, gbr, mask=ok)
    tl.store(dbeta_ptr + base + 1, gbi, mask=ok)


def _launch(kernel, lam_ri, beta_ri, L, *tensors):
    H, M = lam_ri.shape[:2]
    grid = (H, triton.cdiv(M, BLOCK_MODES))
    with on_device(lam_ri):
        kernel[grid](
            lam_ri, beta_ri, *tensors, L, M, lam_ri.stride(0), lam_ri.stride(1),
            beta_ri.stride(0), beta_ri.stride(1),
            BN=block(L), BM=BLOCK_MODES, NBITS=max(1, L.bit_length()), num_warps=4,
        )  # fmt: skip


def decay_tables(lam_ri: torch.Tensor, beta_ri: torch.Tensor, L: int):
    """lam_ri, beta_ri: (H, M, 2) fp32 [re, im] with unit last stride. Returns (start (H, L, 2M),
    end (H, L, 2M), chunk (H, 2M)), fp32, interleaved."""
    H, M = lam_ri.shape[:2]
    start, end = (lam_ri.new_empty(H, L, 2 * M) for _ in range(2))
    chunk = lam_ri.new_empty(H, 2 * M)
    _launch(_tables_fwd_kernel, lam_ri, beta_ri, L, start, end, chunk)
    return start, end, chunk


def decay_tables_backward(lam_ri, beta_ri, d_start, d_end, d_chunk, L: int):
    """The gradients (d_lam, d_beta), (H, M, 2) fp32, from those of the three tables
    (contiguous)."""
    d_lam, d_beta = (
        torch.empty(x.shape, dtype=torch.float32, device=x.device) for x in (lam_ri, beta_ri)
    )
    _launch(_tables_bwd_kernel, lam_ri, beta_ri, L, d_start, d_end, d_chunk, d_lam, d_beta)
    return d_lam, d_beta
