"""Containment of non-finite inputs on the kernels (idmix/functional/interdomain/numerics.py
states the rule): the one pass that reads q, k and v only to look at them.

``nonfinite_flags`` marks each (row, head, position): bit 0 where a k or v channel is NaN or
±inf, bit 1 where a q channel is. One program per (row·head, block of positions), all in
parallel; nothing is serial along T. The rest happens where the chunk kernels run anyway: they
zero non-finite entries as they load them (tiles.finite), the forward chunk-state scan turns the
flags into the rows to poison as it walks the chunks (chunk_states._chunk_poison: a bad k or v
poisons its document from there on), the output kernel (or pass 2) writes those rows as NaN,
and the backward zeroes their incoming gradient and the gradients of the non-finite entries.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .tiles import block, is_finite, load_tile, on_device

BLOCK_T = 64


@triton.jit
def _any_nonfinite(base, tt, s_t, T, F, BF: tl.constexpr):
    """(BT,) bool: some channel of the (BT, F) rows at positions tt is NaN or ±inf."""
    bad = tt < 0
    for f0 in range(0, F, BF):
        x = load_tile(base, tt, f0 + tl.arange(0, BF), s_t, 1, T, F)
        bad = bad | (tl.max((~is_finite(x)).to(tl.int32), 1) > 0)
    return bad


@triton.jit
def _flags_kernel(
    q_ptr, k_ptr, v_ptr, flags_ptr,
    H, T, R, D,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,
    s_fb, s_fh,
    BT: tl.constexpr, BF: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    b, h = pid // H, pid % H
    tt = tl.program_id(1) * BT + tl.arange(0, BT)
    carried = _any_nonfinite(k_ptr + b * s_kb + h * s_kh, tt, s_kt, T, R, BF)
    carried = carried | _any_nonfinite(v_ptr + b * s_vb + h * s_vh, tt, s_vt, T, D, BF)
    read = _any_nonfinite(q_ptr + b * s_qb + h * s_qh, tt, s_qt, T, R, BF)
    flags = carried.to(tl.int8) + 2 * read.to(tl.int8)
    tl.store(flags_ptr + b * s_fb + h * s_fh + tt, flags, mask=tt < T)


def nonfinite_flags(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q, k: (B, T, H, R); v: (B, T, H, D), any float dtype, unit last stride. Returns flags
    (B, H, T) int8: bit 0 a non-finite k or v entry at (b, t, h), bit 1 a non-finite q entry."""
    B, T, H, R = q.shape
    D = v.shape[-1]
    flags = torch.empty(B, H, T, dtype=torch.int8, device=q.device)
    grid = (B * H, triton.cdiv(T, BLOCK_T))
    with on_device(q):
        _flags_kernel[grid](
            q, k, v, flags, H, T, R, D,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), flags.stride(0), flags.stride(1),
            BT=BLOCK_T, BF=min(64, block(max(R, D))), num_warps=4,
        )  # fmt: skip
    return flags
