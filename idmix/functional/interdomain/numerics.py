"""How the chunked paths compute: the precision of their products, the compiled-vs-eager forms of
their complex arithmetic, and the containment of non-finite inputs.

The `precision=` choice: at what precision the matrix products multiply.

- "ieee": fp32 operands, IEEE fp32 multiply-adds (the CPU default, and fp64 inputs always);
- "tf32" / "bf16": operands rounded to TF32 (10 mantissa bits) / bf16 (7), fp32 accumulation:
  the tensor cores' modes on a GPU;
- "auto": ``GPU_DEFAULT`` for CUDA tensors, "ieee" otherwise.

Only the operands of products are rounded (decays, states, accumulators and results stay fp32),
in every engine alike: on CUDA on the tensor cores, on CPU emulated (docs/precision.md).
"""

from __future__ import annotations

import contextlib
import functools
import shutil
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ...debug import check_values
from .layout import as_complex as _c
from .layout import as_interleaved as _r

PRECISIONS = ("auto", "ieee", "tf32", "bf16")


# The GPU default, from the errors against the fp64 reference (docs/precision.md): TF32 keeps
# every output, state and gradient within what bf16 inputs alone cost; bf16 products cost 1.4-2x
# that error. To be chosen again on the fused kernels' measurement (benchmarks/roofline.py).
GPU_DEFAULT = "tf32"


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """x (fp32) rounded to TF32 (10 mantissa bits), to nearest with ties away from zero: what
    the kernels do before a TF32 product (kernels/tiles.py ``operand``; left alone, the tensor
    cores would truncate the low 13 bits)."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def rounded(x: torch.Tensor, precision: str) -> torch.Tensor:
    """x as a product operand at precision (fp32 values)."""
    if precision == "bf16":
        return x.to(torch.bfloat16).to(x.dtype)
    if precision == "tf32":
        return round_tf32(x.float()).to(x.dtype)
    return x


@contextlib.contextmanager
def _cuda_tf32():
    """cuBLAS in TF32 mode for the duration (a process-wide flag, restored on exit)."""
    flags, before = torch.backends.cuda.matmul, torch.backends.cuda.matmul.allow_tf32
    flags.allow_tf32 = True
    try:
        yield
    finally:
        flags.allow_tf32 = before


def matmul(
    a: torch.Tensor, b: torch.Tensor, precision: str = "ieee", dtype: torch.dtype | None = None
) -> torch.Tensor:
    """a @ b with operands at precision and the result in dtype (default a's: fp32 for the
    op's fp32 operands); at precision "bf16" either may be stored in bf16 (its values are the
    operands)."""
    if precision == "ieee":
        return a @ b
    dtype = dtype or a.dtype
    if a.is_cuda:
        if precision == "bf16":
            return _bf16_matmul(a.to(torch.bfloat16), b.to(torch.bfloat16), dtype)
        with _cuda_tf32():
            return a @ b
    return rounded(a, precision).to(dtype) @ rounded(b, precision).to(dtype)


def _bf16_matmul(a16: torch.Tensor, b16: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bf16 operands, fp32 accumulation and result (cuBLAS's out_dtype GEMMs)."""
    if a16.dim() == 2 and b16.dim() == 2:
        return torch.mm(a16, b16, out_dtype=dtype)
    batch = torch.broadcast_shapes(a16.shape[:-2], b16.shape[:-2])
    a3 = a16.expand(*batch, *a16.shape[-2:]).reshape(-1, *a16.shape[-2:])
    b3 = b16.expand(*batch, *b16.shape[-2:]).reshape(-1, *b16.shape[-2:])
    return torch.bmm(a3, b3, out_dtype=dtype).view(*batch, a16.shape[-2], b16.shape[-1])


def baddbmm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, precision: str = "ieee"):
    """acc + a @ b (3-D, batched), operands at precision (at "bf16" either may be stored in
    bf16), accumulated in acc's dtype."""
    if precision == "ieee":
        return torch.baddbmm(acc, a, b)
    if a.is_cuda and precision == "bf16":
        return torch.baddbmm(acc, a.to(torch.bfloat16), b.to(torch.bfloat16), out_dtype=acc.dtype)
    if a.is_cuda:
        with _cuda_tf32():
            return torch.baddbmm(acc, a, b)
    return torch.baddbmm(
        acc, rounded(a, precision).to(acc.dtype), rounded(b, precision).to(acc.dtype)
    )


# --- compiled pieces: one Inductor cache for every caller ---


@functools.cache
def compiled(fn, **options):
    """torch.compile(fn, **options), built once per process for each (fn, options)."""
    return torch.compile(fn, **options)


@functools.cache
def have_cxx() -> bool:
    """Whether Inductor can build CPU kernels here (it needs a C++ compiler)."""
    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


# --- compiled-vs-eager forms ---
# The only code of the chunked paths that asks whether it is being traced. Eager, one complex
# kernel on views of the interleaved reals (…, 2M) is fastest, and the scans write each step in
# place. Under torch.compile the complex views do not trace (Dynamo rejects ``view_as_complex`` of
# fake tensors) and ``out=`` into a strided slice does not either, so the traced form is real
# arithmetic on the (re, im) pairs and functional loops, which Inductor fuses with their
# neighbours. Both forms compute the same values (tested).


def _tracing() -> bool:
    return torch.compiler.is_compiling()


def _pairs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.unflatten(-1, (-1, 2)).unbind(-1)


def _interleave(re: torch.Tensor, im: torch.Tensor) -> torch.Tensor:
    return torch.stack([re, im], dim=-1).flatten(-2)


def cmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a ⊙ b on interleaved reals (…, 2M), broadcasting like their complex views."""
    if _tracing():
        (ar, ai), (br, bi) = _pairs(a), _pairs(b)
        return _interleave(ar * br - ai * bi, ar * bi + ai * br)
    return _r(_c(a) * _c(b))


def cmul_conj(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """conj(a) ⊙ b on interleaved reals."""
    if _tracing():
        (ar, ai), (br, bi) = _pairs(a), _pairs(b)
        return _interleave(ar * br + ai * bi, ar * bi - ai * br)
    return _r(_c(a).conj_physical() * _c(b))


def dot_conj(x: torch.Tensor, g: torch.Tensor, dim) -> torch.Tensor:
    """Σ_dim g ⊙ conj(x) (the gradient of a ⊙ x with respect to a); dim counts as in the complex
    view. An explicit conj_physical: under a TorchDispatchMode a custom op's body runs without
    the conjugate fallback, and linalg.vecdot's lazy conjugate would be silently dropped."""
    return cmul_conj(x, g).sum(dim)


def shear_in(A: torch.Tensor) -> torch.Tensor:
    """(t, s) -> (t, j) with Y[t, j] = A[t, t + j + 1 - L] (0 where that s < 0); A: (..., L, L).

    Lines the causal part of each row up with ``end[j] = β λ^{L-1-j}``, so that
    Σ_{s<=t} A[t, s] β λ^{t-s} = (Y @ end)[t]: the intra-chunk decay becomes one shared matrix.
    Eager: a strided view of a zero-padded copy; traced: pads and reshapes. Adjoint of shear_out.
    """
    L = A.shape[-1]
    if _tracing():
        flat = F.pad(F.pad(A, (L, 1)).flatten(-2), (0, L + 1))  # rows [0_L, A, 0]
        return flat[..., 1 : 1 + L * (2 * L + 2)].unflatten(-1, (L, 2 * L + 2))[..., :L]
    padded = torch.cat([A.new_zeros(*A.shape[:-1], L), A], dim=-1)  # (..., L, 2L)
    strides = (*padded.stride()[:-2], 2 * L + 1, 1)
    return padded.as_strided(A.shape, strides, padded.storage_offset() + 1).contiguous()


def shear_out(Y: torch.Tensor) -> torch.Tensor:
    """(t, j) -> (t, s) with A[t, s] = Y[t, L - 1 - t + s] for s <= t, else 0 (see shear_in)."""
    L = Y.shape[-1]
    if _tracing():
        flat = F.pad(Y, (0, L)).flatten(-2)  # rows [Y, 0_L]
        return flat[..., L - 1 : L - 1 + L * (2 * L - 1)].unflatten(-1, (L, 2 * L - 1))[..., :L]
    padded = torch.cat([Y, Y.new_zeros(*Y.shape[:-1], L)], dim=-1)  # (..., L, 2L)
    strides = (*padded.stride()[:-2], 2 * L - 1, 1)
    return padded.as_strided(Y.shape, strides, padded.storage_offset() + L - 1).contiguous()


def scan_interleaved(inc, Z0, carry):
    """S_0 = Z0, S_{j+1} = carry_j ⊙ S_j + inc_j over chunks, on interleaved reals.

    inc: (B, H, N, C, 2M); Z0: (B, H, C, 2M); carry(j): the multiplier of chunk j, (.., 1, 2M)
    broadcasting against Z0. Returns (S_0..S_{N-1}: (B, H, N, C, 2M), contiguous; S_N)."""
    N = inc.shape[2]
    if _tracing():
        S = [Z0]
        for j in range(N):
            S.append(cmul(carry(j), S[-1]) + inc[:, :, j])
        return torch.stack(S[:-1], 2), S[-1]
    inc = _c(inc)
    starts = torch.empty_like(inc)
    starts[:, :, 0] = _c(Z0)
    for j in range(N - 1):
        torch.addcmul(inc[:, :, j], _c(carry(j)), starts[:, :, j], out=starts[:, :, j + 1])
    end = torch.addcmul(inc[:, :, N - 1], _c(carry(N - 1)), starts[:, :, N - 1])
    return _r(starts), _r(end)


def scan_adjoint_interleaved(g_S, g_end, carry):
    """Adjoint of :func:`scan_interleaved`: G_N = g_end, G_j = g_S_j + conj(carry_j) ⊙ G_{j+1}.

    Returns (G_1..G_N: (B, H, N, C, 2M), the gradients of the increments; G_0 = grad of Z0)."""
    N = g_S.shape[2]
    if _tracing():
        G = [g_end]
        for j in range(N - 1, 0, -1):
            G.append(g_S[:, :, j] + cmul_conj(carry(j), G[-1]))
        return torch.stack(G[::-1], 2), g_S[:, :, 0] + cmul_conj(carry(0), G[-1])
    g_S = _c(g_S)
    g_inc = torch.empty_like(g_S)
    g_inc[:, :, N - 1] = _c(g_end)
    for j in range(N - 1, 0, -1):
        c = _c(carry(j)).conj_physical()
        torch.addcmul(g_S[:, :, j], c, g_inc[:, :, j], out=g_inc[:, :, j - 1])
    g_0 = torch.addcmul(g_S[:, :, 0], _c(carry(0)).conj_physical(), g_inc[:, :, 0])
    return _r(g_inc), _r(g_0)


def scan_complex(inc: torch.Tensor, carry: torch.Tensor, first: torch.Tensor, reverse: bool):
    """X_0 = first, X_{j+1} = carry_j ⊙ X_j + inc_j over dim 2 (from the end when reverse), on
    complex tensors: inc (B, H, n, C, M), carry (B, H, n, 1, M). Returns (X_0..X_{n−1} stacked
    in the order of inc, and X_n). Eager writes each step in place (no stack copy)."""
    n = inc.shape[2]
    order = range(n - 1, -1, -1) if reverse else range(n)
    if _tracing():
        xs, X = [None] * n, first
        for j in order:
            xs[j], X = X, torch.addcmul(inc[:, :, j], carry[:, :, j], X)
        return torch.stack(xs, 2), X
    xs = torch.empty_like(inc)
    prev = None
    for j in order:
        if prev is None:
            xs[:, :, j] = first
        else:
            torch.addcmul(inc[:, :, prev], carry[:, :, prev], xs[:, :, prev], out=xs[:, :, j])
        prev = j
    return xs, torch.addcmul(inc[:, :, prev], carry[:, :, prev], xs[:, :, prev])


# --- non-finite containment (the fast paths: chunked, its kernels, closed form) ---
# The per-step recurrence contains a NaN/inf by itself: it reaches the state at its position and
# every later position of its document, and a reset (a select, never a product with 0) drops it.
# The chunked path multiplies whole chunks (0·NaN = NaN inside a matrix product) and would spread
# it to earlier positions and later documents. So the fast paths see sanitised inputs, and the
# damage is put back where the recurrence would have it:
#
# - a head's inputs at position t are *bad* if any of its q, k or v channels is non-finite there
#   (q only at t itself; k and v from t on); the initial state of a head is bad if any entry is;
# - bad entries are replaced by zeros before the products;
# - the head's output is NaN at every position of the document from the first bad k/v on (and at
#   each bad q), every channel; its final state is NaN if its last document is poisoned.
#
# Granularity is the head: where the recurrence would leave some channels finite (a NaN in one
# value channel only), the whole head row is NaN here. Everything else (earlier positions, other
# documents, other heads) equals the result on the sanitised inputs, i.e. is untouched.


class Poison(NamedTuple):
    output: torch.Tensor  # (B, T, H) bool: output rows to set to NaN
    final: torch.Tensor  # (B, H) bool: final states to set to NaN


def _finite(x: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(x.detach())  # on x itself, autograd would save x for abs's backward


def _bad(x: torch.Tensor) -> torch.Tensor:
    """(B, T, H, C) -> (B, T, H): any channel non-finite."""
    return ~_finite(x).all(dim=-1)


def _zero_nonfinite(x: torch.Tensor) -> torch.Tensor:
    """x with non-finite entries zeroed; autograd keeps only the bool mask (1 byte/entry)."""
    return torch.where(_finite(x), x, torch.zeros((), dtype=x.dtype, device=x.device))


def _surely_finite(x0, tensors, initial_state) -> bool:
    """Where a host sync is free (eager, CPU: ``idmix.debug.check_values``), one sum per tensor
    tells that everything is finite and containment can be skipped (an overflowing sum only
    sends finite inputs down the containing path, which is exact for them too). Elsewhere
    (compiled graphs, GPU) containment always runs: it is elementwise and fuses."""
    if not check_values(x0):
        return False
    parts = list(tensors)
    if initial_state is not None:
        parts += (
            list(initial_state) if isinstance(initial_state, (tuple, list)) else [initial_state]
        )
    total = sum(p.detach().sum() for p in parts)
    return bool(torch.isfinite(total))


def _poisoned(bad: torch.Tensor, reset, bad_init) -> torch.Tensor:
    """(B, T, H): a bad position at or before t in t's document (or a bad initial state, for
    document 0), by parallel ops only: the running bad count less its value at the doc start."""
    B, T, H = bad.shape
    count = bad.long().cumsum(dim=1)  # bad positions in [0, t]
    if reset is None:
        within = count
        doc0 = torch.ones(B, T, 1, dtype=torch.bool, device=bad.device)
    else:
        doc = reset.long().cumsum(dim=1)  # the document of each position; 0 continues the state
        t = torch.arange(T, device=bad.device).expand(B, T)
        first = torch.full((B, T + 1), T, dtype=torch.long, device=bad.device)
        first = first.scatter_reduce(1, doc, torch.where(reset, t, T), "amin", include_self=True)
        start = first.gather(1, doc).clamp(max=T - 1)  # (B, T): t's document start (0 for doc 0)
        start = torch.where(doc == 0, 0, start)
        before = (count - bad.long()).gather(1, start[..., None].expand(B, T, H))
        within = count - before
        doc0 = (doc == 0)[..., None]
    poisoned = within > 0
    if bad_init is not None:
        poisoned = poisoned | (doc0 & bad_init[:, None, :])
    return poisoned


def contain_state(state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A state (B, H, ...) -> (it, non-finite entries zeroed; (B, H) bool: heads that had one)."""
    return _zero_nonfinite(state), ~_finite(state).flatten(2).all(dim=-1)


def contain(carried, read, reset, initial_state):
    """carried: tensors (B, T, H, ·) that enter the state (k, v; z of the S4D readout); read:
    tensors (B, T, H, ·) used at their own position only (q); initial_state: None, a tensor
    (B, H, ...) or a tuple of them. Returns (carried, read, initial_state) with non-finite
    entries zeroed, and the Poison of the outputs and final state (None: all were finite)."""
    x0 = carried[0]
    if _surely_finite(x0, (*carried, *read), initial_state):
        return carried, read, initial_state, None
    B, T, H = x0.shape[:3]
    bad = torch.zeros(B, T, H, dtype=torch.bool, device=x0.device)
    for x in carried:  # out of place: under torch.func.vmap, x may be batched and bad not
        bad = bad | _bad(x)
    bad_init = None
    if initial_state is not None:  # a bad initial state poisons document 0 of its head
        parts = initial_state if isinstance(initial_state, (tuple, list)) else (initial_state,)
        contained = [contain_state(part) for part in parts]
        clean = tuple(c for c, _ in contained)
        bad_init = torch.stack([bad for _, bad in contained]).any(dim=0)
        initial_state = clean if isinstance(initial_state, (tuple, list)) else clean[0]
    poisoned = _poisoned(bad, reset, bad_init)  # (B, T, H)
    output = poisoned
    for x in read:
        output = output | _bad(x)
    carried = tuple(_zero_nonfinite(x) for x in carried)
    read = tuple(_zero_nonfinite(x) for x in read)
    return carried, read, initial_state, Poison(output, poisoned[:, -1])


def sanitise(q, k, v, reset, initial_state):
    """``contain`` for the interdomain op: returns (q, k, v, initial_state, Poison)."""
    (k, v), (q,), initial_state, poison = contain((k, v), (q,), reset, initial_state)
    return q, k, v, initial_state, poison


def poison_output(o: torch.Tensor, poison: Poison | None) -> torch.Tensor:
    """o: (B, T, H, D) with the poisoned rows set to NaN."""
    if poison is None:
        return o
    return torch.where(poison.output[..., None], torch.full((), float("nan"), dtype=o.dtype), o)


def poison_state(state, poison: Poison | None):
    """A final state (B, H, ...) tensor or tuple of them, NaN where its head is poisoned."""
    if poison is None or state is None:
        return state

    def one(x):
        mask = poison.final.view(*poison.final.shape, *([1] * (x.dim() - 2)))
        return torch.where(mask, torch.full((), float("nan"), dtype=x.dtype), x)

    return tuple(one(x) for x in state) if isinstance(state, (tuple, list)) else one(state)
