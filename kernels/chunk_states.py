"""The inter-chunk pass of the chunked algorithm (docs/design.md §4) as two Triton kernels, each
one launch that walks the chunks of a segment with its piece of the state in registers.

forward:  S_0 = Z0, S_{j+1} = c_j ⊙ S_j + zc_j end   (returns S_0..S_{N-1} and S_N)
backward: G_N = dZ_end, G_j = dS_j + conj(c_j) ⊙ G_{j+1}, the increments' gradients G_1..G_N,
          G_0 = dZ0, and the gradient of λ^L, Σ_j carry_j Σ_c conj(S_j) ⊙ G_{j+1}

with c_j = λ^L of the head times carry_j (0 when a document starts inside chunk j), zc_j the
chunk's inputs [kᵀ; vᵀ] (C channels × L positions) zeroed where a later start in the chunk cuts
them off the chunk end, and end = β λ^{L-1-s} (L, 2M). The forward's increment zc_j end is a
tile product at the PREC precision (tiles.mma), so no per-chunk increment tensor is written;
the backward reads dS = [dXᵏ; dXᵛ] from the two intra-chunk backward passes as they are (no
concatenation) and sums the λ^L gradient over its rows and chunks in registers. One program
per (batch, head, block of channels, block of modes); complex values are interleaved pairs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .tiles import (
    PRECISION_CODES,
    block,
    load_tile,
    mma,
    on_device,
    reset_args,
    split_pairs,
    store_tile,
    unit_last_stride,
)


@triton.jit
def _chunk_masks(reset_ptr, b, j, s_rb, s_rn, L, BL: tl.constexpr):
    """(contrib (BL,): no start in (s, chunk end], carry: no start in the chunk) of chunk j."""
    ll = tl.arange(0, BL)
    starts = tl.load(reset_ptr + b * s_rb + j * s_rn + ll, mask=ll < L, other=0).to(tl.int32)
    d = tl.cumsum(starts, 0)
    last = tl.sum(starts, 0)
    return d == last, (last == 0).to(tl.float32)


@triton.jit
def _carry_factor(c_ptr, h, cols, M, CONJ: tl.constexpr):
    """(re, im) (2·BM,) of λ^L, duplicated over each pair (or its conjugate)."""
    base = c_ptr + h * 2 * M + (cols // 2) * 2
    ok = cols < 2 * M
    re = tl.load(base, mask=ok, other=0.0)
    im = tl.load(base + 1, mask=ok, other=0.0)
    return re, -im if CONJ else im


@triton.jit
def _cmul_row(re, im, x):
    """(re + i·im) ⊙ x for a per-mode factor (2·BM,) (each value twice) and an interleaved
    (rows, 2·BM) tile x."""
    xr, xi = split_pairs(x)
    swapped = tl.reshape(tl.join(-xi, xr), x.shape)  # (−im, re) of each pair
    return re[None, :] * x + im[None, :] * swapped


@triton.jit
def _states_fwd_kernel(
    zT_ptr, end_ptr, c_ptr, z0_ptr, reset_ptr, st_ptr, last_ptr,
    H, N, L, C, M,
    s_zb, s_zh, s_zn, s_zc,
    s_dh, s_dl,
    s_0b, s_0h, s_0c,
    s_rb, s_rn,
    s_sb, s_sh, s_sn, s_sc,
    HAS_RESET: tl.constexpr, PREC: tl.constexpr,
    BL: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    b, h = pid // H, pid % H
    ll = tl.arange(0, BL)
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    cols = tl.program_id(2) * 2 * BM + tl.arange(0, 2 * BM)
    end = load_tile(end_ptr + h * s_dh, ll, cols, s_dl, 1, L, 2 * M)  # (L, 2·BM)
    lr, li = _carry_factor(c_ptr, h, cols, M, False)
    S = load_tile(z0_ptr + b * s_0b + h * s_0h, cc, cols, s_0c, 1, C, 2 * M)
    for j in range(0, N):
        store_tile(st_ptr + b * s_sb + h * s_sh + j * s_sn, cc, cols, s_sc, 1, C, 2 * M, S)
        z = load_tile(zT_ptr + b * s_zb + h * s_zh + j * s_zn, cc, ll, s_zc, 1, C, L)  # (BC, L)
        kr, ki = lr, li
        if HAS_RESET:
            contrib, carry = _chunk_masks(reset_ptr, b, j, s_rb, s_rn, L, BL)
            z = tl.where(contrib[None, :], z, 0.0)
            kr, ki = lr * carry, li * carry
        S = mma(z, end, _cmul_row(kr, ki, S), PREC)
    store_tile(last_ptr + b * s_0b + h * s_0h, cc, cols, s_0c, 1, C, 2 * M, S)


@triton.jit
def _states_bwd_kernel(
    dxk_ptr, dxv_ptr, dz_ptr, c_ptr, st_ptr, reset_ptr, ginc_ptr, g0_ptr, dc_ptr,
    H, N, L, R, C, M,
    s_kb, s_kh, s_kn, s_kr,
    s_vb, s_vh, s_vn, s_vr,
    s_0b, s_0h, s_0c,
    s_sb, s_sh, s_sn, s_sc,
    s_rb, s_rn,
    HAS_RESET: tl.constexpr, BL: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    b, h = pid // H, pid % H
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    cols = tl.program_id(2) * 2 * BM + tl.arange(0, 2 * BM)
    lr, li = _carry_factor(c_ptr, h, cols, M, True)  # conj(λ^L)
    G = load_tile(dz_ptr + b * s_0b + h * s_0h, cc, cols, s_0c, 1, C, 2 * M)
    d_chunk = tl.zeros((2 * BM,), dtype=tl.float32)
    key, value = cc < R, cc >= R
    for step in range(0, N):
        j = N - 1 - step
        off = b * s_sb + h * s_sh + j * s_sn
        store_tile(ginc_ptr + off, cc, cols, s_sc, 1, C, 2 * M, G)  # the gradient of inc_j
        carry = 1.0
        if HAS_RESET:
            _, carry = _chunk_masks(reset_ptr, b, j, s_rb, s_rn, L, BL)
        # d(λ^L) += carry_j Σ_c conj(S_j) ⊙ G_{j+1}: Re(conj(s) g) and Im(conj(s) g) per pair
        S = load_tile(st_ptr + off, cc, cols, s_sc, 1, C, 2 * M)
        sr, si = split_pairs(S)
        gr, gi = split_pairs(G)
        pair = tl.reshape(tl.join(sr * gr + si * gi, sr * gi - si * gr), S.shape)
        d_chunk += carry * tl.sum(pair, 0)
        dk = load_tile(dxk_ptr + b * s_kb + h * s_kh + j * s_kn, cc, cols, s_kr, 1, R, 2 * M)
        v_rows = tl.maximum(cc - R, 0)  # key rows read value row 0, then dropped
        dv = load_tile(
            dxv_ptr + b * s_vb + h * s_vh + j * s_vn, v_rows, cols, s_vr, 1, C - R, 2 * M
        )
        dS = tl.where(key[:, None], dk, 0.0) + tl.where(value[:, None], dv, 0.0)
        G = dS + _cmul_row(lr * carry, li * carry, G)
    store_tile(g0_ptr + b * s_0b + h * s_0h, cc, cols, s_0c, 1, C, 2 * M, G)
    dc_base = dc_ptr + (pid * tl.num_programs(1) + tl.program_id(1)) * 2 * M
    tl.store(dc_base + cols, d_chunk, mask=cols < 2 * M)


def _blocks(C: int, M: int, rows: int) -> tuple[int, int]:
    """(channel block, mode block): a (BC, 2·BM) state tile of up to rows·64 values."""
    return min(rows, triton.next_power_of_2(C)), min(32, block(M))


def chunk_states(zT, end, chunk, Z0, reset=None, precision="ieee"):
    """zT: (B, H, N, C, L) chunk inputs [kᵀ; vᵀ]; end: (H, L, 2M); chunk: (H, 2M) λ^L;
    Z0: (B, H, C, 2M); reset: (B, N, L) bool or None. Returns (chunk-start states
    (B, H, N, C, 2M) S_0..S_{N-1}, end state S_N (B, H, C, 2M)), fp32."""
    zT, end, chunk, Z0 = unit_last_stride(zT, end, chunk.contiguous(), Z0)
    B, H, N, C, L = zT.shape
    M = end.shape[-1] // 2
    starts = torch.empty(B, H, N, C, 2 * M, dtype=torch.float32, device=zT.device)
    last = torch.empty(B, H, C, 2 * M, dtype=torch.float32, device=zT.device)
    r, s_rb, s_rn, has_reset = reset_args(reset, zT)
    BC, BM = _blocks(C, M, rows=64)  # 64 rows: one warpgroup product (wgmma) on sm_90
    grid = (B * H, triton.cdiv(C, BC), triton.cdiv(M, BM))
    with on_device(zT):
        _states_fwd_kernel[grid](
            zT, end, chunk, Z0, r, starts, last,
            H, N, L, C, M,
            *zT.stride()[:4], *end.stride()[:2], *Z0.stride()[:3], s_rb, s_rn,
            *starts.stride()[:4],
            HAS_RESET=has_reset, PREC=PRECISION_CODES[precision], BL=block(L), BC=BC, BM=BM,
            num_warps=4,
        )  # fmt: skip
    return starts, last


def chunk_states_backward(dXk, dXv, dZ_end, chunk, starts, L, reset=None):
    """dXk: (B, H, N, R, 2M), dXv: (B, H, N, D, 2M) the gradients of the chunk-start states;
    dZ_end: (B, H, C, 2M); chunk: (H, 2M) λ^L; starts: the forward's (B, H, N, C, 2M); L: the
    chunk length; reset as in chunk_states. Returns (the increments' gradients G_1..G_N
    (B, H, N, C, 2M), dZ0 (B, H, C, 2M), the gradient of λ^L (H, 2M)), fp32."""
    dXk, dXv, dZ_end, starts = unit_last_stride(dXk, dXv, dZ_end.contiguous(), starts)
    B, H, N, R, twoM = dXk.shape
    C, M = R + dXv.shape[3], twoM // 2
    g_inc = torch.empty(B, H, N, C, twoM, dtype=torch.float32, device=dXk.device)
    g0 = torch.empty(B, H, C, twoM, dtype=torch.float32, device=dXk.device)
    r, s_rb, s_rn, has_reset = reset_args(reset, dXk)
    BC, BM = _blocks(C, M, rows=32)
    grid = (B * H, triton.cdiv(C, BC), triton.cdiv(M, BM))
    d_chunk = torch.empty(B, H, grid[1], twoM, dtype=torch.float32, device=dXk.device)
    with on_device(dXk):
        _states_bwd_kernel[grid](
            dXk, dXv, dZ_end, chunk.contiguous(), starts, r, g_inc, g0, d_chunk,
            H, N, L, R, C, M,
            *dXk.stride()[:4], *dXv.stride()[:4], *dZ_end.stride()[:3], *starts.stride()[:4],
            s_rb, s_rn,
            HAS_RESET=has_reset, BL=block(L), BC=BC, BM=BM, num_warps=4,
        )  # fmt: skip
    return g_inc, g0, d_chunk.sum((0, 2))
