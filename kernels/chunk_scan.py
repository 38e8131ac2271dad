"""The inter-chunk state pass of the chunked algorithm (docs/design.md §4) as one Triton kernel.

forward:  S_0 = Z0, S_{j+1} = c_j ⊙ S_j + inc_j          (returns S_0..S_{N-1} and S_N)
reverse:  G_N = Z0, G_j = conj(c_j) ⊙ G_{j+1} + inc_j     (the adjoint; returns G_1..G_N, G_0)
c_j = λ^L of the head, times carry[b, j] (0 where a sequence starts inside chunk j).
One program per (batch, head, block of channels, block of modes) walks the N chunks with its
(BC, BM) piece of the state in registers: one launch instead of N small kernels, and a tile
that stays a few registers per thread at any M. Complex values are interleaved real pairs.
Elementwise work (no products): fp32 multiply-adds, memory-bound.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .tiles import on_device


@triton.jit
def _chunk_scan_kernel(
    inc_ptr,
    z0_ptr,
    c_ptr,
    carry_ptr,
    seq_ptr,
    last_ptr,
    H,
    N,
    C,
    M,
    s_ib,
    s_ih,
    s_in,
    s_ic,
    s_zb,
    s_zh,
    s_zc,
    s_cb,
    REVERSE: tl.constexpr,
    HAS_CARRY: tl.constexpr,
    BC: tl.constexpr,
    BM: tl.constexpr,
):
    pid_bh, pid_c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    b, h = pid_bh // H, pid_bh % H
    cc = pid_c * BC + tl.arange(0, BC)
    mm = tl.program_id(2) * BM + tl.arange(0, BM)
    ok = (cc < C)[:, None] & (mm < M)[None, :]
    cr = tl.load(c_ptr + h * 2 * M + 2 * mm, mask=mm < M, other=0.0)[None, :]
    ci = tl.load(c_ptr + h * 2 * M + 2 * mm + 1, mask=mm < M, other=0.0)[None, :]
    if REVERSE:
        ci = -ci
    z_off = z0_ptr + b * s_zb + h * s_zh + cc[:, None] * s_zc + 2 * mm[None, :]
    sr = tl.load(z_off, mask=ok, other=0.0).to(tl.float32)
    si = tl.load(z_off + 1, mask=ok, other=0.0).to(tl.float32)
    base = b * s_ib + h * s_ih + cc[:, None] * s_ic + 2 * mm[None, :]
    for step in range(0, N):
        j = N - 1 - step if REVERSE else step
        off = base + j.to(tl.int64) * s_in
        tl.store(seq_ptr + off, sr, mask=ok)  # forward: S_j; reverse: G_{j+1}
        tl.store(seq_ptr + off + 1, si, mask=ok)
        kr, ki = cr, ci
        if HAS_CARRY:
            keep = tl.load(carry_ptr + b * s_cb + j)
            kr, ki = cr * keep, ci * keep
        xr = tl.load(inc_ptr + off, mask=ok, other=0.0)
        xi = tl.load(inc_ptr + off + 1, mask=ok, other=0.0)
        sr, si = kr * sr - ki * si + xr, kr * si + ki * sr + xi
    l_off = last_ptr + b * s_zb + h * s_zh + cc[:, None] * s_zc + 2 * mm[None, :]
    tl.store(l_off, sr, mask=ok)
    tl.store(l_off + 1, si, mask=ok)


def chunk_scan(
    inc: torch.Tensor,
    Z0: torch.Tensor,
    c: torch.Tensor,
    carry: torch.Tensor | None = None,
    reverse: bool = False,
):
    """inc: (B, H, N, C, M) complex64; Z0: (B, H, C, M) complex64; c: (H, M) complex64;
    carry: (B, N) float 0/1 or None. Returns (sequence (B, H, N, C, M), last (B, H, C, M)):
    forward S_0..S_{N-1} and S_N; reverse G_1..G_N (stored at j = 0..N-1) and G_0."""
    B, H, N, C, M = inc.shape
    inc_r = torch.view_as_real(inc.contiguous())
    z0_r = torch.view_as_real(Z0.contiguous())
    c_r = torch.view_as_real(c.to(torch.complex64)).contiguous()
    seq = torch.empty_like(inc_r)
    last = torch.empty_like(z0_r)
    carry_t = carry.float().contiguous() if carry is not None else inc_r.new_ones(1, 1)
    BC = min(32, triton.next_power_of_2(C))
    BM = min(32, triton.next_power_of_2(M))
    grid = (B * H, triton.cdiv(C, BC), triton.cdiv(M, BM))
    with on_device(inc):
        _chunk_scan_kernel[grid](
            inc_r, z0_r, c_r, carry_t, seq, last,
            H, N, C, M,
            *inc_r.stride()[:4], *z0_r.stride()[:3], carry_t.stride(0),
            REVERSE=reverse, HAS_CARRY=carry is not None, BC=BC, BM=BM,
        )  # fmt: skip
    return torch.view_as_complex(seq), torch.view_as_complex(last)
