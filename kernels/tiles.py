"""Pieces every chunk kernel shares: program ids, document masks, interleaved (re, im) tile loads
and stores, the two lag shears, the precision-selecting matrix product, and the launch helpers
(block sizes, autotune spaces, the CUDA device guard).

Complex vectors are interleaved real pairs (docs/design.md §3): mode m of a row sits at columns
2m (re) and 2m + 1 (im). A tile of modes [m0, m0 + BM) is loaded as two (rows, BM) tiles.
"""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

# the `precision=` choice as the kernels' PREC constexpr
IEEE, TF32, BF16 = 0, 1, 2
PRECISION_CODES = {"ieee": IEEE, "tf32": TF32, "bf16": BF16}


def operand_dtype(precision: str) -> torch.dtype:
    """The dtype of a buffer every kernel reads only as a product operand: bf16 at precision
    "bf16" (a bf16 operand rounds it on load anyway, to nearest even as a bf16 store does, so
    storing it in bf16 changes no result), fp32 otherwise (TF32 keeps 10 mantissa bits, and
    fp16's range does not bound an undecayed sum)."""
    return torch.bfloat16 if precision == "bf16" else torch.float32


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# An explicit register cap: without one ptxas sizes some kernels to as few as 32-64 registers
# and spills the rest (measured: benchmarks/offline_compile.py), though 255 are free to use.
MAX_REGISTERS = 255


class Space:
    """The autotune space of one kernel: the (num_warps, BM) pairs measured spill-free on sm_90
    and on sm_80 at chunk 64 and the builders' head shapes (benchmarks/offline_compile.py
    --declared; its default run re-checks every kept config and fails on a spill). The
    autotuner sees the union; `prune` keeps the current device's pairs (sm_90's beyond it,
    sm_80's below it), with BM halved per doubling of the chunk past 64 (the tiles grow with
    chunk × BM), and no mode block larger than the padded mode count. One pipeline stage: two
    gave byte-identical PTX (the loads are issued ahead of the products anyway); the register
    cap MAX_REGISTERS. The
    interpreter gets one config (autotuning there only costs time)."""

    def __init__(self, sm90, sm80):
        self.sm90, self.sm80 = frozenset(sm90), frozenset(sm80)
        pairs = sorted(self.sm90 | self.sm80)
        if INTERPRETED:  # the smallest block, so the tests run every loop over several blocks
            pairs = [(4, min(bm for _, bm in pairs))]
        self.configs = [
            triton.Config({"BM": bm}, num_warps=w, num_stages=1, maxnreg=MAX_REGISTERS)
            for w, bm in pairs
        ]
        self.prune = {"early_config_prune": self._prune}

    def _prune(self, configs, named_args, **kwargs):
        if INTERPRETED:
            return configs
        arch = triton.runtime.driver.active.get_current_target().arch
        allowed = self.sm90 if arch >= 90 else self.sm80
        scale = max(1, named_args.get("BL", block(named_args["L"])) // 64)
        full = block(named_args["M"])
        kept = [
            c
            for c in configs
            if (c.num_warps, c.kwargs["BM"] * scale) in allowed and c.kwargs["BM"] <= full
        ]
        return kept or [min(configs, key=lambda c: (c.kwargs["BM"], -c.num_warps))]


def block(x: int) -> int:
    """Power-of-two tile side ≥ 16 (tl.dot needs 16 on every side)."""
    return max(16, triton.next_power_of_2(x))


def on_device(x: torch.Tensor):
    """Launch on x's CUDA device (Triton launches on the current one), nothing for CPU tensors
    (the interpreter)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def unit_last_stride(*tensors):
    """The tensors with a unit-stride last dimension (a copy only where one is not): the
    kernels take every other stride as an argument."""
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors)


def reset_args(reset: torch.Tensor | None, like: torch.Tensor):
    """(tensor, stride over chunks' batch, stride over chunks, HAS_RESET) for a (B, N, L) reset
    mask (uint8 or int8 as it is, e.g. a bool mask's ``.view(torch.uint8)``; bool is cast) or
    None (then ``like`` stands in as a pointer that is never read)."""
    if reset is None:
        return like, 0, 0, False
    r = reset if reset.dtype in (torch.uint8, torch.int8) else reset.to(torch.int8)
    r = unit_last_stride(r)[0]
    return r, r.stride(0), r.stride(1), True


def flags_strides(flags: torch.Tensor | None, L: int) -> tuple[int, int, int]:
    """(batch, head, chunk) strides of a (B, H, n·L) int8 per-position tensor, zeros for None."""
    if flags is None:
        return 0, 0, 0
    return flags.stride(0), flags.stride(1), L * flags.stride(2)


# Under the interpreter bf16 is emulated: its fp32 -> bf16 cast truncates and its bf16 dot
# multiplies the raw 16-bit patterns, so there the operands are rounded to bf16 values (to
# nearest even, as the GPU's cvt.rn.bf16 does) but kept in fp32; products of bf16 values are
# exact in fp32 and both accumulate in fp32, so the result is the tensor cores'.
_BF16_IN_FP32 = tl.constexpr(INTERPRETED)


@triton.jit
def _round_bits(x, LOW: tl.constexpr, TIES_EVEN: tl.constexpr):
    """fp32 x with its LOW low mantissa bits rounded off (to nearest; ties to even or away)."""
    bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
    keep: tl.constexpr = (0xFFFFFFFF << LOW) & 0xFFFFFFFF
    half: tl.constexpr = 1 << (LOW - 1)
    if TIES_EVEN:
        bits = bits + (half - 1) + ((bits >> LOW) & 1)
    else:
        bits = bits + half
    return (bits & keep).to(tl.float32, bitcast=True)


@triton.jit
def operand(x, PREC: tl.constexpr):
    """x as a product operand at PREC: bf16 (BF16), fp32 rounded to TF32 (TF32: to nearest,
    ties away from zero, as cvt.rna.tf32 and idmix's PyTorch emulation round; the tensor cores
    would otherwise truncate the low 13 bits), or fp32 (IEEE). Idempotent, so rounding before a
    shear or a mask is the rounding the product does."""
    if PREC == 2:
        if _BF16_IN_FP32:
            return _round_bits(x, 16, True)
        else:
            return x.to(tl.bfloat16)
    elif PREC == 1:
        return _round_bits(x, 13, False)
    else:
        return x.to(tl.float32)


@triton.jit
def is_finite(x):
    """True where x is neither NaN nor ±inf (a NaN compares false)."""
    return tl.abs(x) < float("inf")


@triton.jit
def finite(x):
    """x with its NaN and ±inf entries zeroed: what the kernels do to q, k and v as they load
    them (containment, kernels/nonfinite.py)."""
    return tl.where(is_finite(x), x, 0.0)


@triton.jit
def mma(a, b, acc, PREC: tl.constexpr):
    """acc + a @ b with fp32 accumulation: bf16 operands on the tensor cores (PREC = BF16), fp32
    operands rounded to TF32 on the tensor cores (TF32), or IEEE fp32 multiply-adds (IEEE)."""
    a, b = operand(a, PREC), operand(b, PREC)
    if PREC == 1:
        return tl.dot(a, b, acc, input_precision="tf32")
    elif PREC == 2:
        if _BF16_IN_FP32:
            return tl.dot(a, b, acc, input_precision="ieee")
        else:
            return tl.dot(a, b, acc)
    else:
        return tl.dot(a, b, acc, input_precision="ieee")


@triton.jit
def program_bhn(H, N):
    """(batch, head, chunk) of a (B·H·N,) grid, int64 for the offsets."""
    pid = tl.program_id(0).to(tl.int64)
    return pid // (H * N), (pid // N) % H, pid % N


@triton.jit
def doc_masks(reset_ptr, b, n, s_rb, s_rn, L, BL: tl.constexpr):
    """(valid (BL,), same (BL, BL)): no start in [chunk start, t]; t and s in one document."""
    ll = tl.arange(0, BL)
    starts = tl.load(reset_ptr + b * s_rb + n * s_rn + ll, mask=ll < L, other=0).to(tl.int32)
    d = tl.cumsum(starts, 0)
    return d == 0, d[:, None] == d[None, :]


@triton.jit
def load_tile(base, rows, cols, s_row, s_col, n_rows, n_cols):
    """fp32 (rows, cols) tile of a strided block, 0 outside [0, n_rows) × [0, n_cols)."""
    ok = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    off = rows[:, None].to(tl.int64) * s_row + cols[None, :].to(tl.int64) * s_col
    return tl.load(base + off, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def load_pairs(base, rows, modes, s_row, n_rows, M):
    """(re, im) (rows, modes) tiles of an interleaved (…, rows, 2M) block."""
    off = base + rows[:, None].to(tl.int64) * s_row + 2 * modes[None, :]
    ok = (rows < n_rows)[:, None] & (modes < M)[None, :]
    re = tl.load(off, mask=ok, other=0.0).to(tl.float32)
    return re, tl.load(off + 1, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def split_pairs(x):
    """(rows, 2·BM) interleaved -> (re, im) (rows, BM)."""
    return tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))


@triton.jit
def join_pairs(re, im):
    """(re, im) (rows, BM) -> (rows, 2·BM) interleaved."""
    return tl.reshape(tl.join(re, im), (re.shape[0], 2 * re.shape[1]))


@triton.jit
def cmul(x, y, CONJ: tl.constexpr):
    """x ⊙ y, or conj(x) ⊙ y with CONJ, on interleaved (rows, 2·BM) tiles."""
    xr, xi = split_pairs(x)
    yr, yi = split_pairs(y)
    if CONJ:
        return join_pairs(xr * yr + xi * yi, xr * yi - xi * yr)
    else:
        return join_pairs(xr * yr - xi * yi, xr * yi + xi * yr)


@triton.jit
def store_pairs(base, rows, modes, s_row, n_rows, M, re, im):
    off = base + rows[:, None].to(tl.int64) * s_row + 2 * modes[None, :]
    ok = (rows < n_rows)[:, None] & (modes < M)[None, :]
    tl.store(off, re, mask=ok)
    tl.store(off + 1, im, mask=ok)


@triton.jit
def store_tile(base, rows, cols, s_row, s_col, n_rows, n_cols, x):
    """x stored into a strided block, cast to its element type (to nearest: under the
    interpreter a bf16 store would truncate, so x is rounded to bf16 values first)."""
    if _BF16_IN_FP32:
        if base.dtype.element_ty == tl.bfloat16:
            x = _round_bits(x, 16, True)
    ok = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    off = rows[:, None].to(tl.int64) * s_row + cols[None, :].to(tl.int64) * s_col
    tl.store(base + off, x, mask=ok)


@triton.jit
def shear_in(x, L, BL: tl.constexpr):
    """(t, s) -> (t, j) with s = t + j + 1 - L (0 where s < 0 or outside the chunk): lines each
    row's causal part up with end[j] = β λ^{L-1-j}. A gather along rows (through shared
    memory where a row spans warps), no global scratch."""
    ll = tl.arange(0, BL)
    src = ll[:, None] + ll[None, :] + 1 - L
    y = tl.gather(x, tl.minimum(tl.maximum(src, 0), BL - 1), 1)
    keep = (src >= 0) & (ll < L)[None, :] & (ll < L)[:, None]
    return tl.where(keep, y, tl.zeros_like(y))


@triton.jit
def shear_out(y, L, BL: tl.constexpr):
    """(t, j) -> (t, s) with j = L - 1 - t + s for s ≤ t (0 above the diagonal): the adjoint
    of shear_in."""
    ll = tl.arange(0, BL)
    src = L - 1 - ll[:, None] + ll[None, :]
    x = tl.gather(y, tl.minimum(tl.maximum(src, 0), BL - 1), 1)
    causal = (ll[None, :] <= ll[:, None]) & (ll < L)[:, None]
    return tl.where(causal, x, tl.zeros_like(x))
