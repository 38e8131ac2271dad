"""Splitting the chunk-state scans along T (kernels/chunk_states.py), so that a few long rows
fill the GPU as many short ones do.

The chunk recurrence S_{j+1} = c_j ⊙ S_j + inc_j is diagonal: each (channel, mode) entry is a
scalar recurrence. A row's n chunks are cut into `splits` runs of `per_split` chunks and the
scan runs in two launches:

1. split ends: each (row, split) scans its run from a zero state and writes what the run adds,
   E_s, and what it multiplies by, A_s = Π c_j (zero when a document starts in the run);
   for containment, the poison the run carries out when none comes in, and whether a document
   starts in it;
2. splits from their starts: each (row, split) first composes its true start state from the
   row's initial state and the ends of the runs before it (B_{s+1} = A_s ⊙ B_s + E_s, s steps
   of one tile each), then scans its run as the one-launch scan does.

The reverse scan of the backward does the same from the other end. A program walks
per_split + splits steps instead of n, and rows × tiles × splits programs are launched.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .tiles import split_pairs

# Off a GPU (the interpreter) the scans are not split unless a test asks for this many programs.
OFF_GPU_TARGET_PROGRAMS = 0


def target_programs(device: torch.device) -> int:
    """The programs a scan launch should reach: one per SM."""
    if device.type != "cuda":
        return OFF_GPU_TARGET_PROGRAMS
    return torch.cuda.get_device_properties(device).multi_processor_count


# A scan is split when it has fewer programs than half the SMs: by benchmarks/cost_model.py
# (fitted to an H200 run), only then does the chain of chunk steps it saves outweigh the second
# read of its inputs that the split costs (docs/gpu.md, "The split chunk-state scan"). To be
# measured again on a GPU, with the fused kernels.
def plan_splits(programs: int, n: int, target: int) -> tuple[int, int]:
    """(splits, per_split) for a scan of n chunks over `programs` programs (rows × state
    tiles): one split unless they are fewer than half the target, else √n splits (a program
    walks per_split + splits steps); every split non-empty."""
    if 2 * programs >= target or n < 4:
        return 1, n
    return _runs(n, math.isqrt(n))


def _runs(n: int, splits: int) -> tuple[int, int]:
    """(splits, per_split) for n chunks cut into at most `splits` runs, none empty."""
    per_split = math.ceil(n / splits)
    return math.ceil(n / per_split), per_split


def splits_for(splits: int | None, programs: int, n: int, device) -> tuple[int, int]:
    """(splits, per_split) of a scan of n chunks over `programs` programs: as asked (at most
    n), or by plan_splits to fill the device."""
    if n <= 1:
        return 1, n
    if splits is None:
        return plan_splits(programs, n, target_programs(device))
    return _runs(n, max(1, min(splits, n)))


def split_buffers(rows: int, splits: int, C: int, M2: int, device) -> tuple:
    """(ends (rows, splits, C, 2M) fp32, factors (rows, splits, 2M) fp32, flags (rows, splits)
    int8) for the split ends of one scan; placeholders when it is not split."""
    if splits == 1:
        e = torch.empty(1, 1, 1, 1, dtype=torch.float32, device=device)
        return e, e, torch.empty(1, 1, dtype=torch.int8, device=device)
    return (
        torch.empty(rows, splits, C, M2, dtype=torch.float32, device=device),
        torch.empty(rows, splits, M2, dtype=torch.float32, device=device),
        torch.empty(rows, splits, dtype=torch.int8, device=device),
    )


@triton.jit
def pair_factor(base, cols, M, CONJ: tl.constexpr):
    """(re, im) (2·BM,) of an interleaved (2M,) complex vector at base, each value over its
    pair (or its conjugate)."""
    at = base + (cols // 2) * 2
    ok = cols < 2 * M
    re = tl.load(at, mask=ok, other=0.0)
    im = tl.load(at + 1, mask=ok, other=0.0)
    return re, -im if CONJ else im


@triton.jit
def times_factor(re, im, x):
    """(re + i·im) ⊙ x for a per-mode factor (2·BM,) (each value twice) and an interleaved
    (rows, 2·BM) tile x."""
    xr, xi = split_pairs(x)
    swapped = tl.reshape(tl.join(-xi, xr), x.shape)  # (−im, re) of each pair
    return re[None, :] * x + im[None, :] * swapped


@triton.jit
def store_factor(base, cols, re, im, M, writer):
    """The (2·BM,) factor (re, im) stored interleaved at base, by the writer program only."""
    tl.store(base + cols, tl.where(cols % 2 == 0, re, im), mask=(cols < 2 * M) & writer)


@triton.jit
def through_split(ends_ptr, factors_ptr, row, sp, splits, cc, cols, C, M, x):
    """A_sp ⊙ x + E_sp for split sp of a row: a (BC, 2·BM) state tile carried over its run
    (contiguous buffers of split_buffers)."""
    base = row * splits + sp
    ar, ai = pair_factor(factors_ptr + base * 2 * M, cols, M, False)
    ok = (cc < C)[:, None] & (cols < 2 * M)[None, :]
    off = (base * C + cc[:, None].to(tl.int64)) * 2 * M + cols[None, :]
    return times_factor(ar, ai, x) + tl.load(ends_ptr + off, mask=ok, other=0.0)


@triton.jit
def poison_through(flags_ptr, row, sp, splits, carry):
    """The containment carry (kernels/chunk_states.py) after split sp: its own (bit 0), or the
    one coming in where no document starts in it (bit 1)."""
    f = tl.load(flags_ptr + row * splits + sp).to(tl.int32)
    return (f & 1) | (carry & (1 - ((f >> 1) & 1)))
