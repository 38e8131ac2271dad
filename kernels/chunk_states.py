"""The inter-chunk pass of the chunked algorithm (docs/design.md §4) as two Triton kernels, each
walking the chunks of a segment with its piece of the state in registers: in one launch, or,
on few rows, split along T in two (kernels/scan_splits.py).

forward:  S_0 = Z0, S_{j+1} = c_j ⊙ S_j + zc_j end   (returns S_0..S_{N-1} and S_N)
backward: G_N = dZ_end, G_j = dS_j + conj(c_j) ⊙ G_{j+1}, the increments' gradients G_1..G_N,
          G_0 = dZ0, and the gradient of λ^L, Σ_j carry_j Σ_c conj(S_j) ⊙ G_{j+1}

with c_j = λ^L of the head times carry_j (0 when a document starts inside chunk j), zc_j the
chunk's inputs [kᵀ; vᵀ] (C channels × L positions) zeroed where a later start in the chunk cuts
them off the chunk end, and end = β λ^{L-1-s} (L, 2M). The forward's increment zc_j end is a
tile product at the PREC precision (tiles.mma), so no per-chunk increment tensor is written;
the backward reads dS = [dXᵏ; dXᵛ] from the two intra-chunk backward passes as they are (no
concatenation) and sums the λ^L gradient over its rows and chunks in registers. One program
per (batch, head, split, block of channels, block of modes); complex values are interleaved
pairs.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .scan_splits import (
    pair_factor,
    poison_through,
    split_buffers,
    splits_for,
    store_factor,
    through_split,
    times_factor,
)
from .tiles import (
    MAX_REGISTERS,
    PRECISION_CODES,
    block,
    finite,
    flags_strides,
    load_tile,
    mma,
    on_device,
    operand_dtype,
    reset_args,
    split_pairs,
    store_tile,
    unit_last_stride,
)


@triton.jit
def _chunk_starts(reset_ptr, b, j, s_rb, s_rn, L, BL: tl.constexpr, HAS_RESET: tl.constexpr):
    """(BL,) int32: 1 where a document starts at that position of chunk j (0 without resets)."""
    ll = tl.arange(0, BL)
    if HAS_RESET:
        return tl.load(reset_ptr + b * s_rb + j * s_rn + ll, mask=ll < L, other=0).to(tl.int32)
    else:
        return tl.zeros((BL,), dtype=tl.int32)


@triton.jit
def _chunk_masks(starts):
    """(contrib (BL,): no start in (s, chunk end], carry: no start in the chunk) from a chunk's
    document starts."""
    d = tl.cumsum(starts, 0)
    last = tl.sum(starts, 0)
    return d == last, (last == 0).to(tl.float32)


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _chunk_poison(flags, starts, carry_in):
    """Containment along one chunk (kernels/nonfinite.py): flags (BL,) int8, bit 0 a non-finite
    k or v, bit 1 a non-finite q, at each position; starts (BL,) document starts; carry_in: the
    chunk opens inside a poisoned document. Returns (the output poison (BL,): a bad k or v at or
    before t in t's document, or a bad q at t; the poison carried out of the chunk end, int32).
    Documents only grow along the chunk, so t's is poisoned when the last bad position up to t
    is in it: one prefix max (an in-register scan)."""
    d = tl.cumsum(starts, 0)  # the document within the chunk; 0 continues the carried one
    last_bad = tl.associative_scan(tl.where((flags & 1) != 0, d, -1), 0, _max)
    poisoned = (last_bad == d) | ((d == 0) & (carry_in != 0))
    carry_out = tl.max(tl.where(d == tl.sum(starts, 0), poisoned.to(tl.int32), 0), 0)
    return poisoned | ((flags & 2) != 0), carry_out


@triton.jit
def _load_z(k_base, v_base, cc, ll, s_kl, s_vl, L, R, C):
    """The chunk's inputs [kᵀ; vᵀ] for channels cc: (BC, BL), read by stride from k and v
    (B, T, H, ·), non-finite entries zeroed (containment)."""
    zk = load_tile(k_base, cc, ll, 1, s_kl, R, L)
    zv = load_tile(v_base, tl.maximum(cc - R, 0), ll, 1, s_vl, C - R, L)
    return finite(tl.where((cc < R)[:, None], zk, zv))


@triton.jit
def _states_fwd_kernel(
    k_ptr, v_ptr, end_ptr, c_ptr, z0_ptr, reset_ptr, st_ptr, last_ptr,
    flags_ptr, poison_ptr, cin_ptr, cout_ptr, ends_ptr, factors_ptr, sflags_ptr,
    H, N, L, R, C, M, SPLITS, NS,
    s_kb, s_kh, s_kn, s_kl,
    s_vb, s_vh, s_vn, s_vl,
    s_dh, s_dl, s_ch,
    s_0b, s_0h, s_0c,
    s_rb, s_rn,
    s_fb, s_fh, s_fn,
    s_sb, s_sh, s_sn, s_sc,
    s_lb, s_lh, s_lc,
    HAS_RESET: tl.constexpr, HAS_Z0: tl.constexpr, PREC: tl.constexpr,
    CONTAIN: tl.constexpr, HAS_CARRY: tl.constexpr, POISON_END: tl.constexpr,
    PHASE: tl.constexpr, BL: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """PHASE 0: each row's whole scan; 1: the split ends; 2: each split from its composed start
    (kernels/scan_splits.py). Program axis 0 is (row, split)."""
    pid = tl.program_id(0).to(tl.int64)
    row, sp = pid // SPLITS, pid % SPLITS
    b, h = row // H, row % H
    ll = tl.arange(0, BL)
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    cols = tl.program_id(2) * 2 * BM + tl.arange(0, 2 * BM)
    end = load_tile(end_ptr + h * s_dh, ll, cols, s_dl, 1, L, 2 * M)  # (L, 2·BM)
    lr, li = pair_factor(c_ptr + h * s_ch, cols, M, False)
    if HAS_Z0 and PHASE != 1:
        S = load_tile(z0_ptr + b * s_0b + h * s_0h, cc, cols, s_0c, 1, C, 2 * M)
    else:
        S = tl.zeros((BC, 2 * BM), dtype=tl.float32)
    k_base = k_ptr + b * s_kb + h * s_kh
    v_base = v_ptr + b * s_vb + h * s_vh
    carry_in = 0
    writer = (tl.program_id(1) == 0) & (tl.program_id(2) == 0)
    if CONTAIN and HAS_CARRY and PHASE != 1:
        carry_in = tl.load(cin_ptr + row).to(tl.int32)
    if PHASE == 2:  # the split's start: the row's initial state carried over the runs before
        for before in range(0, sp):
            S = through_split(ends_ptr, factors_ptr, row, before, SPLITS, cc, cols, C, M, S)
            if CONTAIN:
                carry_in = poison_through(sflags_ptr, row, before, SPLITS, carry_in)
    pr, pi = lr * 0.0 + 1.0, lr * 0.0  # the run's product of carry factors (PHASE 1)
    opened = 0  # a document starts in the run (PHASE 1)
    for j in range(sp * NS, tl.minimum(sp * NS + NS, N)):
        if PHASE != 1:
            store_tile(st_ptr + b * s_sb + h * s_sh + j * s_sn, cc, cols, s_sc, 1, C, 2 * M, S)
        z = _load_z(k_base + j * s_kn, v_base + j * s_vn, cc, ll, s_kl, s_vl, L, R, C)
        starts = _chunk_starts(reset_ptr, b, j, s_rb, s_rn, L, BL, HAS_RESET)
        kr, ki = lr, li
        if HAS_RESET:
            contrib, carry = _chunk_masks(starts)
            z = tl.where(contrib[None, :], z, 0.0)
            kr, ki = lr * carry, li * carry
            opened = tl.maximum(opened, tl.max(starts, 0))
        if CONTAIN:
            f_off = b * s_fb + h * s_fh + j * s_fn + ll
            flags = tl.load(flags_ptr + f_off, mask=ll < L, other=0)
            poisoned, carry_in = _chunk_poison(flags, starts, carry_in)
            if PHASE != 1:
                tl.store(poison_ptr + f_off, poisoned.to(tl.int8), mask=(ll < L) & writer)
        S = mma(z, end, times_factor(kr, ki, S), PREC)
        pr, pi = pr * kr - pi * ki, pr * ki + pi * kr
    if PHASE == 1:
        at = pid * C * 2 * M + cc[:, None].to(tl.int64) * 2 * M + cols[None, :]
        tl.store(ends_ptr + at, S, mask=(cc < C)[:, None] & (cols < 2 * M)[None, :])
        store_factor(factors_ptr + pid * 2 * M, cols, pr, pi, M, tl.program_id(1) == 0)
        if CONTAIN:
            tl.store(sflags_ptr + pid, (carry_in | (opened << 1)).to(tl.int8), mask=writer)
    elif sp == SPLITS - 1:
        if POISON_END:  # the final state of a head whose last document is poisoned: NaN
            S = tl.where(carry_in != 0, float("nan"), S)
        store_tile(last_ptr + b * s_lb + h * s_lh, cc, cols, s_lc, 1, C, 2 * M, S)
        if CONTAIN:
            tl.store(cout_ptr + row, carry_in.to(tl.int8), mask=writer)


@triton.jit
def _states_bwd_kernel(
    dxk_ptr, dxv_ptr, dz_ptr, c_ptr, st_ptr, reset_ptr, end_poison_ptr, ginc_ptr, g0_ptr, dc_ptr,
    ends_ptr, factors_ptr,
    H, N, L, R, C, M, SPLITS, NS,
    s_kb, s_kh, s_kn, s_kr,
    s_vb, s_vh, s_vn, s_vr,
    s_0b, s_0h, s_0c,
    s_ch,
    s_sb, s_sh, s_sn, s_sc,
    s_rb, s_rn,
    HAS_RESET: tl.constexpr, HAS_DZ: tl.constexpr, POISON_END: tl.constexpr,
    PHASE: tl.constexpr, BL: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """PHASE 0: each row's whole reverse scan; 1: the split ends (what each run adds to the
    gradient at its start from a zero one at its end, and its product of conj(c_j)); 2: each
    split from the gradient at its end, composed from the runs after it. Program axis 0 is
    (row, split)."""
    pid = tl.program_id(0).to(tl.int64)
    row, sp = pid // SPLITS, pid % SPLITS
    b, h = row // H, row % H
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    cols = tl.program_id(2) * 2 * BM + tl.arange(0, 2 * BM)
    lr, li = pair_factor(c_ptr + h * s_ch, cols, M, True)  # conj(λ^L)
    if HAS_DZ and PHASE != 1:
        G = load_tile(dz_ptr + b * s_0b + h * s_0h, cc, cols, s_0c, 1, C, 2 * M)
        if POISON_END:  # a NaN final state passes no gradient back
            G = tl.where(tl.load(end_poison_ptr + row) != 0, 0.0, G)
    else:
        G = tl.zeros((BC, 2 * BM), dtype=tl.float32)
    if PHASE == 2:  # the gradient at the split's end: dZ_end carried back over the runs after
        for step in range(0, SPLITS - 1 - sp):
            G = through_split(ends_ptr, factors_ptr, row, SPLITS - 1 - step, SPLITS, cc, cols,
                              C, M, G)  # fmt: skip
    d_chunk = tl.zeros((2 * BM,), dtype=tl.float32)
    pr, pi = lr * 0.0 + 1.0, lr * 0.0  # the run's product of conj(c_j) (PHASE 1)
    key, value = cc < R, cc >= R
    j_end = tl.minimum(sp * NS + NS, N)
    for step in range(0, j_end - sp * NS):
        j = j_end - 1 - step
        off = b * s_sb + h * s_sh + j * s_sn
        carry = 1.0
        if HAS_RESET:
            _, carry = _chunk_masks(_chunk_starts(reset_ptr, b, j, s_rb, s_rn, L, BL, True))
        if PHASE != 1:
            store_tile(ginc_ptr + off, cc, cols, s_sc, 1, C, 2 * M, G)  # the gradient of inc_j
            # d(λ^L) += carry_j Σ_c conj(S_j) ⊙ G_{j+1}: Re(conj(s) g), Im(conj(s) g) per pair
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
        G = dS + times_factor(lr * carry, li * carry, G)
        pr, pi = pr * lr * carry - pi * li * carry, pr * li * carry + pi * lr * carry
    if PHASE == 1:
        at = pid * C * 2 * M + cc[:, None].to(tl.int64) * 2 * M + cols[None, :]
        tl.store(ends_ptr + at, G, mask=(cc < C)[:, None] & (cols < 2 * M)[None, :])
        store_factor(factors_ptr + pid * 2 * M, cols, pr, pi, M, tl.program_id(1) == 0)
    else:
        if sp == 0:
            store_tile(g0_ptr + b * s_0b + h * s_0h, cc, cols, s_0c, 1, C, 2 * M, G)
        dc_base = dc_ptr + (pid * tl.num_programs(1) + tl.program_id(1)) * 2 * M
        tl.store(dc_base + cols, d_chunk, mask=cols < 2 * M)


def _blocks(C: int, M: int, rows: int) -> tuple[int, int]:
    """(channel block, mode block): a (BC, 2·BM) state tile of up to rows·64 values."""
    return min(rows, triton.next_power_of_2(C)), min(32, block(M))


class Containment(NamedTuple):
    """What the forward's scan does for containment (kernels/nonfinite.py): flags (B, H, n·L)
    int8 of the piece; poison (B, H, n·L) int8 it writes (the output rows to set to NaN);
    carry_in (B, H) int8 or None (the piece opens inside a poisoned document); carry_out
    (B, H) int8 it writes; poison_end: set the final state of a poisoned head to NaN."""

    flags: torch.Tensor
    poison: torch.Tensor
    carry_in: torch.Tensor | None
    carry_out: torch.Tensor
    poison_end: bool


def chunk_states(
    k, v, end, chunk, Z0, last, reset=None, precision="ieee", contain=None, BL=None, splits=None
):
    """One piece of n chunks of length L. k: (B, H, n, L, R) and v: (B, H, n, L, D) chunk views
    of the (B, T, H, ·) inputs (chunk_view), any float dtype; end: (H, L, 2M); chunk: (H, 2M)
    λ^L (any strides); Z0: (B, H, R+D, 2M) or None (zeros); last: (B, H, R+D, 2M) fp32, written
    with the end state S_n; reset: (B, n, L) uint8 view or None; contain: Containment or None;
    BL: the block of the call's main chunk length (a ragged tail reuses its compiled kernel);
    splits: runs of chunks scanned in parallel (kernels/scan_splits.py; None: as many as fill
    the device). Returns the chunk-start states (B, H, n, R+D, 2M) S_0..S_{n-1}: bf16 at
    precision "bf16" (every kernel reads them only as product operands, rounded to bf16 anyway,
    and the backward's d(λ^L) sum; the scan itself carries fp32), fp32 otherwise."""
    B, H, N, L, R = k.shape
    C, M = R + v.shape[-1], end.shape[-1] // 2
    starts = torch.empty(B, H, N, C, 2 * M, dtype=operand_dtype(precision), device=k.device)
    r, s_rb, s_rn, has_reset = reset_args(reset, k)
    c = contain
    f = c.flags if c else r
    BC, BM = _blocks(C, M, rows=64)  # 64 rows: one warpgroup product (wgmma) on sm_90
    tiles = (triton.cdiv(C, BC), triton.cdiv(M, BM))
    S, NS = splits_for(splits, B * H * math.prod(tiles), N, k.device)
    split_ends = split_buffers(B * H, S, C, 2 * M, k.device)
    z0 = Z0 if Z0 is not None else last
    args = (
        k, v, end, chunk, z0, r, starts, last,
        f, c.poison if c else r, c.carry_in if c and c.carry_in is not None else r,
        c.carry_out if c else r, *split_ends,
        H, N, L, R, C, M, S, NS,
        *k.stride()[:4], *v.stride()[:4], *end.stride()[:2], chunk.stride(0),
        *z0.stride()[:3], s_rb, s_rn,
        *flags_strides(c.flags if c else None, L),
        *starts.stride()[:4], *last.stride()[:3],
    )  # fmt: skip
    meta = dict(
        HAS_RESET=has_reset, HAS_Z0=Z0 is not None, PREC=PRECISION_CODES[precision],
        CONTAIN=c is not None, HAS_CARRY=bool(c and c.carry_in is not None),
        POISON_END=bool(c and c.poison_end), BL=BL or block(L), BC=BC, BM=BM,
        num_warps=8,  # with k and v read by stride and containment, 4 warps spill
        maxnreg=MAX_REGISTERS,
    )  # fmt: skip
    with on_device(k):
        for phase in (0,) if S == 1 else (1, 2):
            _states_fwd_kernel[(B * H * S, *tiles)](*args, PHASE=phase, **meta)
    return starts


def chunk_states_backward(
    dXk, dXv, dZ_end, chunk, starts, L, reset=None, end_poison=None, BL=None, splits=None,
    precision="ieee",
):  # fmt: skip
    """dXk: (B, H, N, R, 2M), dXv: (B, H, N, D, 2M) the gradients of the chunk-start states;
    dZ_end: (B, H, C, 2M) or None (zeros); chunk: (H, 2M) λ^L (any strides); starts: the
    forward's (B, H, N, C, 2M) (fp32 or bf16); L: the chunk length; reset and splits as in
    chunk_states; end_poison: (B, H) int8 or None (heads whose final state was set to NaN
    pass no dZ_end); precision: of the products that read the increments' gradients
    (input_grads). Returns (the increments' gradients G_1..G_N (B, H, N, C, 2M): bf16 at
    precision "bf16", which input_grads reads only as product operands, else fp32; dZ0 (B, H,
    C, 2M) fp32; the per-program gradient of λ^L (B, H, splits × channel blocks, 2M) fp32, to be
    summed over its first three dims)."""
    dXk, dXv, starts = unit_last_stride(dXk, dXv, starts)
    B, H, N, R, twoM = dXk.shape
    C, M = R + dXv.shape[3], twoM // 2
    g_inc = torch.empty(B, H, N, C, twoM, dtype=operand_dtype(precision), device=dXk.device)
    g0 = torch.empty(B, H, C, twoM, dtype=torch.float32, device=dXk.device)
    r, s_rb, s_rn, has_reset = reset_args(reset, dXk)
    dz = dZ_end if dZ_end is not None else g0
    BC, BM = _blocks(C, M, rows=32)
    tiles = (triton.cdiv(C, BC), triton.cdiv(M, BM))
    S, NS = splits_for(splits, B * H * math.prod(tiles), N, dXk.device)
    ends, factors, _ = split_buffers(B * H, S, C, twoM, dXk.device)
    d_chunk = torch.empty(B, H, S * tiles[0], twoM, dtype=torch.float32, device=dXk.device)
    args = (
        dXk, dXv, dz, chunk, starts, r, end_poison if end_poison is not None else r,
        g_inc, g0, d_chunk, ends, factors,
        H, N, L, R, C, M, S, NS,
        *dXk.stride()[:4], *dXv.stride()[:4], *g0.stride()[:3], chunk.stride(0),
        *starts.stride()[:4], s_rb, s_rn,
    )  # fmt: skip
    meta = dict(
        HAS_RESET=has_reset, HAS_DZ=dZ_end is not None, POISON_END=end_poison is not None,
        BL=BL or block(L), BC=BC, BM=BM, num_warps=4, maxnreg=MAX_REGISTERS,
    )  # fmt: skip
    with on_device(dXk):
        for phase in (0,) if S == 1 else (1, 2):
            _states_bwd_kernel[(B * H * S, *tiles)](*args, PHASE=phase, **meta)
    return g_inc, g0, d_chunk
