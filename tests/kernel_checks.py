"""Checks of the Triton kernels against the PyTorch paths, as a script: the interpreter must be
switched on (TRITON_INTERPRET=1) before triton decorates the kernels, so tests run this in a
fresh process. Usage: python tests/kernel_checks.py [cpu|cuda] [--keep-going] [--only
name,name,... | --first-half]. Exits non-zero on failure."""

from __future__ import annotations

import contextlib
import sys
import time
import traceback

import torch

from idmix.functional import empty_state, interdomain_decode_step, readout_gram
from tests.helpers import PoisonEmpty, assert_rel, make_problem, rel_rmse, selective_problem


def check_decode(device: str) -> None:
    shapes = [(2, 3, 5, 7, 6), (1, 2, 64, 64, 64), (2, 1, 1, 3, 1), (3, 2, 16, 8, 33)]
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])
    for B, H, R, D, M in shapes:
        for dtype in dtypes:
            p = make_problem(B=B, T=3, H=H, R=R, D=D, M=M, dtype=torch.float32)
            G = readout_gram(p["C"]).to(device)
            lam, beta = p["lam"].to(device), p["beta"].to(device)
            ref_state = tuple(s.to(device) for s in p["initial_state"])  # contiguous layout
            state = empty_state(B, H, M, R, D, device=device)  # the kernel's layout
            for dst, src in zip(state, ref_state, strict=True):
                dst.copy_(src)
            for t in range(3):
                q, k, v = (p[n][:, t].to(device, dtype) for n in ("q", "k", "v"))
                o_ref, ref_state = interdomain_decode_step(
                    q, k, v, lam, beta, G, ref_state, backend="torch"
                )
                o, new = interdomain_decode_step(
                    q, k, v, lam, beta, G, state, inplace=True, backend="triton"
                )
                assert new[0] is state[0] and new[1] is state[1], "in place"
                tol = 1e-5 if dtype == torch.float32 else 1e-2
                assert_rel(o, o_ref, tol, f"o {B, H, R, D, M} {dtype} t={t}")
                assert_rel(state[0], ref_state[0], 1e-5, "Xk")
                assert_rel(state[1], ref_state[1], 1e-5, "Xv")
            # functional mode leaves the input state alone; any state layout is accepted
            before = [s.clone() for s in ref_state]
            o1, s1 = interdomain_decode_step(q, k, v, lam, beta, G, ref_state, backend="triton")
            o2, s2 = interdomain_decode_step(q, k, v, lam, beta, G, ref_state, backend="torch")
            assert all(torch.equal(a, b) for a, b in zip(before, ref_state, strict=True))
            assert_rel(o1, o2, 1e-2, "functional")
            assert_rel(s1[1], s2[1], 1e-5, "functional state")


def check_decode_compiles(device: str) -> None:
    """The custom op traces whole under torch.compile(fullgraph=True)."""
    p = make_problem(B=2, T=1, H=2, R=4, D=4, M=3, dtype=torch.float32)
    G = readout_gram(p["C"]).to(device)
    args = [p[n][:, 0].to(device) for n in ("q", "k", "v")] + [
        p["lam"].to(device),
        p["beta"].to(device),
        G,
    ]
    s1 = empty_state(2, 2, 3, 4, 4, device=device)
    s2 = empty_state(2, 2, 3, 4, 4, device=device)

    def step(state):
        return interdomain_decode_step(*args, state, inplace=True, backend="triton")[0]

    ref = step(s1)
    out = torch.compile(step, fullgraph=True, backend="aot_eager")(s2)
    assert_rel(out, ref, 1e-6, "compiled")
    assert_rel(s2[0], s1[0], 1e-6, "compiled state")


CHUNKED_CASES = [
    # (B, T, H, R, D, M, chunk, dt_range, resets {row: starts}, readout, dtype)
    (2, 75, 2, 3, 5, 4, 8, (1e-3, 1e-1), {0: [0, 20, 33, 34]}, "conj", torch.float32),
    (1, 1, 1, 1, 3, 1, 8, (1e-3, 1e-1), {}, "product", torch.float32),
    (2, 37, 1, 6, 2, 5, 16, (1.0, 10.0), {1: [5, 36]}, "conj", torch.float16),
    (1, 130, 2, 4, 4, 3, 32, (1e-3, 1e-1), {0: [64, 65, 129]}, "product", torch.float32),
    # several mode blocks (the interpreter's BM is 8) and feature blocks (BK = 32), all ragged
    (1, 45, 1, 40, 36, 20, 16, (1e-3, 1e-1), {0: [30]}, "conj", torch.float32),
    # keys wider than the fused output kernel takes (R > 64): pass 1, a GEMM and pass 2
    (1, 20, 2, 70, 3, 2, 8, (1e-3, 1e-1), {0: [9]}, "conj", torch.float32),
    # bf16 inputs without resets: the kernels read the bf16 chunk copies as they are
    (1, 40, 2, 5, 4, 3, 16, (1e-3, 1e-1), {}, "product", torch.bfloat16),
]
# The checks compare the kernels with the PyTorch path at precision="ieee" ("auto" would be TF32 on
# a GPU), except these: precision="tf32"/"bf16", the kernels against the PyTorch path at the same
# precision (its rounding emulated on CPU, numerics.py). The two round the same operands; what
# differs is the order of the fp32 sums, and, rarely, an operand that lands on the other side of a
# rounding boundary (a product's operands are themselves sums). Measured over these cases (every
# output, state and gradient): relative RMSE ≤ 5.5e-7 (tf32) and 1.5e-7 (bf16), worst position
# 1.7e-5 / 1.7e-6 of the RMS; either path against its IEEE result: 2e-4..9e-4 (tf32), 1.5e-3..8.5e-3
# (bf16).
PRECISION_CASES = [
    (2, 75, 2, 3, 5, 4, 8, (1e-3, 1e-1), {0: [0, 20, 33, 34]}, "conj", torch.float32),
    (1, 45, 1, 40, 36, 20, 16, (1e-3, 1e-1), {0: [30]}, "product", torch.float32),
]
GPU_CHUNKED_CASES = [  # the paper's head shape at lengths the interpreter cannot afford
    (2, 4096, 4, 64, 64, 64, 64, (1e-3, 1e-1), {0: [0, 1000, 1001]}, "conj", torch.bfloat16),
    (1, 2050, 2, 64, 64, 64, 64, (1.0, 10.0), {}, "product", torch.float16),
    (1, 1500, 3, 32, 48, 16, 32, (1e-3, 1e-1), {0: [700]}, "conj", torch.float32),
]


# the paper's head size at a length the interpreter needs minutes for (tests/test_kernels.py,
# marked slow): ragged T, a reset, several segments
CPU_LARGE_CASES = [
    (1, 1100, 1, 64, 64, 64, 64, (1e-3, 1e-1), {0: [0, 517]}, "conj", torch.float32),
]


def run_chunked(p, device, backend, reset, readout, chunk, precision="ieee"):
    """Outputs, final states and every gradient of the chunked op on one backend (fp32
    leaves; the inputs are rounded to the case's dtype first)."""
    from idmix.functional import interdomain_attention

    leaves = [p[n].to(device).requires_grad_() for n in ("q", "k", "v", "lam", "beta", "C")]
    init = tuple(s.to(device).requires_grad_() for s in p["initial_state"])
    o, (xk, xv) = interdomain_attention(
        *leaves,
        initial_state=init,
        reset=reset,
        readout=readout,
        chunk_size=chunk,
        backend=backend,
        precision=precision,
        output_final_state=True,
    )
    g = torch.Generator().manual_seed(0)
    loss = (o * torch.randn(o.shape, generator=g).to(device)).sum() + (xk.abs() ** 2).sum()
    return [o, xk, xv, *torch.autograd.grad(loss, [*leaves, *init])]


def check_chunked(device: str, cases=None) -> None:
    """The chunked op on the Triton kernels (inter-chunk scan and both intra-chunk passes)
    equals it on PyTorch and the per-step reference: outputs, final states and every gradient;
    ragged T, T = 1, odd dims, sequence starts (a length-1 sequence too), large Δ, fp16 inputs,
    both readouts, several segments, the chunk-state scans split along T."""
    from idmix.functional import interdomain_attention
    from idmix.functional.interdomain import shared

    shared.SEGMENT_TOKENS = 32 if device == "cpu" else 512
    if cases is None:
        cases = CHUNKED_CASES + (GPU_CHUNKED_CASES if device == "cuda" else [])
    with split_scans():
        try:
            for B, T, H, R, D, M, L, dt, starts, readout, dtype in cases:
                p = make_problem(B=B, T=T, H=H, R=R, D=D, M=M, dtype=torch.float32, dt_range=dt)
                for n in ("q", "k", "v"):  # the op takes them in this dtype, computes in fp32
                    p[n] = p[n].to(dtype)
                tol = 1e-5 if dtype == torch.float32 else 4e-3  # o and the grads come back in dtype
                reset = torch.zeros(B, T, dtype=torch.bool, device=device)
                for row, pos in starts.items():
                    reset[row, pos] = True
                case = f"{(B, T, H, R, D, M, L, dt, readout, dtype)}"
                tri = run_chunked(p, device, "triton", reset, readout, L)
                ref = run_chunked(p, device, "torch", reset, readout, L)
                for i, (a, b) in enumerate(zip(tri, ref, strict=True)):
                    assert_rel(a, b, tol, f"triton vs torch {case} tensor {i}")
                naive = interdomain_attention(
                    *(p[n].to(device) for n in ("q", "k", "v", "lam", "beta", "C")),
                    initial_state=tuple(s.to(device) for s in p["initial_state"]),
                    reset=reset,
                    readout=readout,
                    impl="naive",
                )[0]
                # an independent reference at every T: the literal recurrence, compared on up to 256
                # sampled positions (all of them when T is small)
                g = torch.Generator().manual_seed(T)
                at = torch.randperm(T, generator=g)[:256].to(device)
                assert_rel(tri[0][:, at], naive[:, at], max(tol, 1e-4), f"triton vs naive {case}")
        finally:
            shared.SEGMENT_TOKENS = 512


@contextlib.contextmanager
def split_scans():
    """The chunk-state scans split along T (kernels/scan_splits.py) wherever a segment has four
    chunks or more, also off a GPU (where a scan is otherwise one run per row)."""
    import idmix_kernels.scan_splits as splits

    saved = splits.OFF_GPU_TARGET_PROGRAMS
    splits.OFF_GPU_TARGET_PROGRAMS = 2**30
    try:
        yield
    finally:
        splits.OFF_GPU_TARGET_PROGRAMS = saved


def check_chunked_precisions(device: str, tol: dict | None = None) -> None:
    """precision="tf32" and "bf16": the chunked op on the kernels equals the PyTorch path at the
    same precision (outputs, final states, every gradient), and both are measurably rounded
    (further from the IEEE result than the kernels are from the PyTorch path)."""
    from idmix.functional.interdomain import shared

    # On a GPU the PyTorch path's TF32 GEMMs are cuBLAS's, which converts fp32 operands to TF32
    # itself (its rounding mode is not documented), so there the two TF32 paths are two
    # TF32 approximations: held within 2x of TF32's error against IEEE (≤ 6.8e-4 measured,
    # docs/precision.md); bf16 operands are rounded alike on both (to nearest even).
    # On CPU the kernels' decay tables (binary powers, kernels/decay_tables.py) differ from the
    # PyTorch path's (polar form) by ~1e-6, so a few table entries land on the other side of a
    # rounding boundary, and every chunk reuses each entry: measured up to 1.8e-4 at TF32 (dk of
    # the second case) and 2.9e-5 at bf16 (dq of the second case: the kernels form dp = dw̃ Ĝ
    # on chip, summed in another order than the PyTorch GEMM, before dy is rounded to bf16),
    # below each precision's own error against IEEE (4.9e-4..6.2e-4 and 4.1e-3..4.3e-3 on o).
    # Each run is also held to be that far off IEEE.
    # At bf16 the kernels store the chunk-start states in bf16 (kernels/chunk_states.py), which
    # every kernel reads as bf16 operands anyway, bar the backward scan's d(λ^L) sum: dλ (tensor
    # 6) moves from the PyTorch path's fp32 states by 4.0e-4 and 6.6e-4 relative RMSE (worst
    # position 1.4e-3 and 1.5e-3), held to 1e-3 and 3e-3, below bf16's own 4.7e-3 on dλ against
    # fp64 (docs/precision.md). p, dw̃ and the increments' gradients are stored in bf16 too, and
    # are read only as bf16 operands: every result here is bit for bit what fp32 storage of the
    # three gives (measured on these cases, max |Δ| = 0 on each tensor at bf16 and TF32).
    tol = tol or {"tf32": 3e-4 if device == "cpu" else 1.5e-3, "bf16": 6e-5}
    d_lam, d_lam_bf16 = 6, (1e-3, 3e-3)
    shared.SEGMENT_TOKENS = 32 if device == "cpu" else 512
    try:
        for B, T, H, R, D, M, L, dt, starts, readout, _ in PRECISION_CASES:
            p = make_problem(B=B, T=T, H=H, R=R, D=D, M=M, dtype=torch.float32, dt_range=dt)
            reset = torch.zeros(B, T, dtype=torch.bool, device=device)
            for row, pos in starts.items():
                reset[row, pos] = True
            exact = run_chunked(p, device, "torch", reset, readout, L, "ieee")
            for precision, bound in tol.items():
                tri = run_chunked(p, device, "triton", reset, readout, L, precision)
                ref = run_chunked(p, device, "torch", reset, readout, L, precision)
                for i, (a, b) in enumerate(zip(tri, ref, strict=True)):
                    what = f"{precision}: triton vs torch {T, R, D, M} tensor {i}"
                    rmse, worst = (bound, max(1e-4, 10 * bound))
                    if precision == "bf16" and i == d_lam:
                        rmse, worst = d_lam_bf16
                    assert_rel(a, b, rmse, what, max_tol=worst)
                gap = rel_rmse(ref[0], exact[0])  # the rounding is applied, and applied alike
                assert gap > 10 * rel_rmse(tri[0], ref[0]), f"{precision}: rounding not applied"
                assert rel_rmse(tri[0], exact[0]) > gap / 2, f"{precision}: kernels not rounded"
    finally:
        shared.SEGMENT_TOKENS = 512


def check_selective_precisions(device: str) -> None:
    """The selective path's kernels at tf32/bf16 equal its PyTorch path at the same precision
    (measured: relative RMSE ≤ 3.8e-6, worst position 7.8e-5, as at IEEE: 2.1e-6 / 5.0e-5;
    this case reaches Δ_t = 10)."""
    from idmix.functional import interdomain_attention

    B, T, H, R, D, M, L, dt, starts = SELECTIVE_CASES[2]
    p = selective_problem(B=B, T=T, H=H, R=R, D=D, M=M, dt_range=dt)
    reset = torch.zeros(B, T, dtype=torch.bool, device=device)
    reset[0, starts[0]] = True
    names = ("q", "k", "v", "lam", "beta", "C")
    for precision in ("tf32", "bf16"):
        bound = 1.5e-3 if (precision == "tf32" and device != "cpu") else 1e-5  # as above
        runs = {}
        for backend in ("triton", "torch"):
            cd = {n: (torch.complex64 if p[n].is_complex() else torch.float32) for n in names}
            leaves = [p[n].to(device, cd[n]).requires_grad_() for n in names]
            o, (xk, _) = interdomain_attention(
                *leaves,
                reset=reset,
                chunk_size=L,
                backend=backend,
                precision=precision,
                output_final_state=True,
            )
            loss = o.square().sum() + (xk.abs() ** 2).sum()
            runs[backend] = [o, xk, *torch.autograd.grad(loss, leaves)]
        for i, (a, b) in enumerate(zip(runs["triton"], runs["torch"], strict=True)):
            what = f"selective {precision}: triton vs torch tensor {i}"
            assert_rel(a, b, bound, what, max_tol=max(2e-4, 10 * bound))


NONFINITE_CASES = [  # (what, [(input, index, value)], a bad initial state at (row, head) or None)
    ("NaN in k", [("k", (0, 9, 1, 0), float("nan"))], None),
    ("inf in q, NaN in v", [("q", (1, 3, 0, 2), float("inf")), ("v", (1, 18, 1, 1), float("nan"))],
     None),
    ("-inf in k at a tail", [("k", (1, 19, 0, 1), -float("inf"))], (1, 1)),
    ("a bad initial state", [], (1, 0)),
    ("a bad initial state before a start", [("q", (0, 2, 1, 0), float("nan"))], (0, 0)),
]  # fmt: skip


def check_nonfinite(device: str) -> None:
    """NaN and ±inf inputs on the Triton backend (containment inside the kernels) poison
    exactly what the torch backend's does, over several segments and a ragged tail: the same
    NaN outputs (a bad k or v from its position to the end of its document, a bad q at its
    position only, a bad initial state until the first start) and final states; every other
    output, state and gradient equal and finite. Twice: segments of one chunk, and one segment
    of five chunks of 4 with the chunk-state scans split along T (two runs)."""
    from idmix.functional.interdomain import shared

    B, T = 2, 21
    reset = torch.zeros(B, T, dtype=torch.bool, device=device)
    reset[0, [0, 6, 14]] = True
    for segment, L, scans in ((8, 8, contextlib.nullcontext), (512, 4, split_scans)):
        shared.SEGMENT_TOKENS = segment
        try:
            with scans():
                _check_nonfinite_cases(device, reset, L)
        finally:
            shared.SEGMENT_TOKENS = 512


def _check_nonfinite_cases(device: str, reset, L: int) -> None:
    from idmix.functional import interdomain_attention

    B, T, H = reset.shape[0], reset.shape[1], 2
    for what, entries, bad_init in NONFINITE_CASES:
        p = make_problem(B=B, T=T, H=H, R=3, D=4, M=5, dtype=torch.float32)
        for name, index, value in entries:
            p[name][index] = value
        if bad_init is not None:
            p["initial_state"][0][bad_init[0], bad_init[1], 0, 0] = float("nan")
        outs = {}
        for backend in ("triton", "torch"):
            leaves = [p[n].to(device).requires_grad_() for n in ("q", "k", "v")]
            init = tuple(s.to(device).requires_grad_() for s in p["initial_state"])
            o, (xk, xv) = interdomain_attention(
                *leaves,
                *(p[n].to(device) for n in ("lam", "beta", "C")),
                initial_state=init,
                reset=reset,
                chunk_size=L,
                backend=backend,
                precision="ieee",
                output_final_state=True,
            )
            loss = sum(torch.where(torch.isfinite(x), x, 0).abs().sum() for x in (o, xk, xv))
            grads = torch.autograd.grad(loss, [*leaves, *init])
            outs[backend] = (o.detach(), xk.detach(), xv.detach(), *grads)
        for i, (a, b) in enumerate(zip(outs["triton"], outs["torch"], strict=True)):
            same = torch.isfinite(a) == torch.isfinite(b)
            assert bool(same.all()), f"{what}: tensor {i} poisoned elsewhere than on torch"
            if i >= 3:
                assert bool(torch.isfinite(a).all()), f"{what}: non-finite gradient {i}"
            keep = torch.isfinite(b)
            assert_rel(a[keep], b[keep], 1e-5, f"{what}: triton vs torch tensor {i}")
        assert not torch.isfinite(outs["triton"][0]).all(), f"{what}: nothing poisoned"
        if what == "NaN in k":  # exactly that head, from t = 9 to its document's end (14)
            hit = ~torch.isfinite(outs["triton"][0]).all(-1)
            expected = torch.zeros(B, T, H, dtype=torch.bool, device=device)
            expected[0, 9:14, 1] = True
            assert torch.equal(hit, expected), "triton: a NaN escaped its document"


def check_varlen(device: str) -> None:
    """cu_seqlens through the kernels: both the packed (resets) and the per-length paths equal
    the PyTorch backend, a length-1 sequence included."""
    from idmix.functional import interdomain_attention
    from tests.test_varlen import packed_problem

    p, cu = packed_problem([1, 9, 20, 9, 3], dtype=torch.float32)
    args = [p[n].to(device) for n in ("q", "k", "v", "lam", "beta", "C")]
    init = tuple(s.to(device) for s in p["initial_state"])
    for kw in ({}, {"initial_state": init, "output_final_state": True}):
        got, ref = (
            interdomain_attention(
                *args, cu_seqlens=cu.to(device), chunk_size=8, backend=b, precision="ieee", **kw
            )
            for b in ("triton", "torch")
        )
        if not kw:
            got, ref = got[0], ref[0]
        if kw:  # (o, (Xk, Xv))
            got, ref = (got[0], *got[1]), (ref[0], *ref[1])
        else:
            got, ref = (got,), (ref,)
        for i, (a, b) in enumerate(zip(got, ref, strict=True)):
            assert_rel(a, b, 1e-5, f"varlen {sorted(kw)} output {i}")


def check_chunked_compiles_and_exports(device: str) -> None:
    """The chunked op on the kernels traces whole: torch.compile(fullgraph=True) forward and
    backward, and torch.export of the forward, both equal to eager."""
    from idmix.functional import interdomain_attention, readout_gram_real
    from idmix.functional.interdomain.layout import state_to_interleaved

    p = make_problem(B=2, T=21, H=2, R=4, D=3, M=5, dtype=torch.float32)
    lam, beta = (torch.view_as_real(p[n]).to(device) for n in ("lam", "beta"))
    G = readout_gram_real(p["C"].real.to(device), p["C"].imag.to(device))
    Z0 = state_to_interleaved(*p["initial_state"]).to(device)

    def f(q, k, v):
        return interdomain_attention(
            q,
            k,
            v,
            lam,
            beta,
            G,
            initial_state=Z0,
            chunk_size=8,
            backend="triton",
            precision="ieee",
            output_final_state=True,
        )

    args = [p[n].to(device).requires_grad_() for n in ("q", "k", "v")]
    eager = f(*args)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(*args)
    for a, b in zip(compiled, eager, strict=True):
        assert_rel(a, b, 1e-6, "compiled chunked op")
    ge = torch.autograd.grad(eager[0].sum() + eager[1].sum(), args)
    gc = torch.autograd.grad(compiled[0].sum() + compiled[1].sum(), args)
    for a, b in zip(gc, ge, strict=True):
        assert_rel(a, b, 1e-6, "compiled chunked op gradient")

    class Core(torch.nn.Module):
        def forward(self, q, k, v):
            return f(q, k, v)

    program = torch.export.export(Core(), tuple(a.detach() for a in args))
    for a, b in zip(program.module()(*args), eager, strict=True):
        assert_rel(a, b, 1e-6, "exported chunked op")


def check_parts_alone(device: str) -> None:
    """Each kernel on its own equals the PyTorch segment code's intermediates: the decay tables
    (and their gradients), the chunk-state scan (start and end states), pass 1 (p) and pass 2
    (o), the fused pass 1 + Ĝ + pass 2 (o), reading q, k, v by stride from (B, T, H, ·); and
    the non-finite flags."""
    import idmix_kernels as kern

    from idmix.functional.interdomain import shared
    from idmix.functional.interdomain.layout import (
        DocMasks,
        chunk_decays,
        chunk_view,
        to_chunks,
        to_chunks_T,
    )

    B, H, N, L, R, D, M = 2, 3, 2, 8, 5, 3, 4
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(B, N * L, H, R, generator=g).to(device) for _ in range(2))
    v = torch.randn(B, N * L, H, D, generator=g).to(device)
    Z0 = torch.randn(B, H, R + D, 2 * M, generator=g).to(device)
    p = make_problem(H=H, M=M, dtype=torch.float32)
    lam, beta = (torch.view_as_real(p[n]).to(device).requires_grad_() for n in ("lam", "beta"))
    dec = chunk_decays(lam, beta, L)
    tables = kern.decay_tables(lam.detach(), beta.detach(), L)
    for name, a, b in zip(("start", "end", "chunk"), tables, dec, strict=True):
        assert_rel(a, b, 1e-5, f"decay table {name}")
    cot = [torch.randn(t.shape, generator=g).to(device) for t in tables]
    ref = torch.autograd.grad(dec, (lam, beta), cot)
    got = kern.decay_tables_backward(lam.detach(), beta.detach(), *cot, L)
    assert_rel(got[0], ref[0], 1e-5, "decay tables: d lam")
    assert_rel(got[1], ref[1], 1e-5, "decay tables: d beta")
    dec = type(dec)(*(t.detach() for t in dec))
    G = torch.randn(H, 2 * M, 2 * M, generator=g).to(device)
    reset = torch.rand(B, N, L, generator=g).to(device) < 0.2
    qc, zT = to_chunks(q, N, L, torch.float32), to_chunks_T(k, v, N, L, torch.float32)
    ops = shared.TorchChunkOps("ieee")
    views = [chunk_view(x, N, L, transpose=False) for x in (q, k, v)]
    for masks in (None, DocMasks(reset, torch.float32)):
        starts, Z_end = ops.chunk_states(zT, dec, Z0, masks)
        o_ref, f = shared._intra(qc, zT, starts, dec, G, masks, "ieee")
        r = None if masks is None else reset.view(torch.uint8)
        last = torch.empty_like(Z0)
        st = kern.chunk_states(views[1], views[2], dec.end, dec.chunk, Z0, last, r)
        assert_rel(st, starts, 1e-5, f"chunk states (reset={r is not None})")
        assert_rel(last, Z_end, 1e-5, f"end state (reset={r is not None})")
        # at bf16 products the states are stored in bf16 (the scan still carries fp32): the
        # PyTorch path's fp32 states at bf16 rounded to nearest (0 of 768 entries off on CPU),
        # bar entries whose fp32 sums, in another order on a GPU, land on the other side of a
        # rounding boundary (one bf16 step); truncating would be off in about half of them
        st16 = kern.chunk_states(
            views[1], views[2], dec.end, dec.chunk, Z0, last, r, precision="bf16"
        )
        starts16, Z_end16 = shared.TorchChunkOps("bf16").chunk_states(zT, dec, Z0, masks)
        assert st16.dtype == torch.bfloat16, "bf16 chunk states: dtype"
        step = torch.finfo(torch.bfloat16).eps * starts16.abs()
        off = (st16.float() - starts16.to(torch.bfloat16).float()).abs()
        assert (off <= step).all(), f"bf16 chunk states: {off.max():.3e} off (reset={r})"
        assert (off > 0).float().mean() < 0.05, "bf16 chunk states: rounded elsewhere"
        assert last.dtype == torch.float32, "bf16 chunk states: the end state stays fp32"
        assert_rel(last, Z_end16, 1e-5, f"end state at bf16 (reset={r is not None})")
        p1 = torch.empty(B, H, N, L, 2 * M, device=device)
        kern.intra_chunk_pass1(views[0], views[1], starts, dec.start, dec.end, p1, r)
        assert_rel(p1, f.p, 1e-5, f"pass 1 (reset={r is not None})")
        o = torch.empty(B, N * L, H, D, device=device)
        o_view = chunk_view(o, N, L, transpose=False)
        kern.intra_chunk_pass2(f.w, views[2], starts, dec.start, dec.end, R, o_view, r)
        assert_rel(o_view, o_ref, 1e-5, f"pass 2 (reset={r is not None})")
        o.zero_()
        kern.chunk_output(*views, starts, dec.start, dec.end, G, o_view, r)
        # measured: relative RMSE ≤ 8.3e-8, worst position 5.3e-7 (fp32 sums in another order)
        assert_rel(o_view, o_ref, 1e-5, f"fused output (reset={r is not None})")
    # the end-of-chunk gradients alone, with more features than one block (BK = 64)
    Rw, dkT = 70, torch.randn(B, H, N, 70, L, generator=g).to(device)
    kw = torch.randn(B, N * L, H, Rw, generator=g).to(device)
    g_inc = torch.randn(B, H, N, Rw + D, 2 * M, generator=g).to(device)
    dv_in = torch.randn(B, H, N, L, D, generator=g).to(device)
    ge = torch.randn(B, H, N, L, 2 * M, generator=g).to(device)
    dk, dv = torch.empty_like(kw), torch.empty_like(v)
    kwv, dkv, dvv = (chunk_view(x, N, L, transpose=False) for x in (kw, dk, dv))
    ge_ref = ge + to_chunks_T(kw, v, N, L, torch.float32).mT @ g_inc
    kern.input_grads(g_inc, dec.end, kwv, views[2], dkT, dv_in, ge, dkv, dvv)
    dz = (g_inc @ dec.end.mT[:, None]).mT  # (B, H, N, L, R+D)
    assert_rel(dkv, dz[..., :Rw] + dkT.mT, 1e-5, "input grads: dk")
    assert_rel(dvv, dz[..., Rw:] + dv_in, 1e-5, "input grads: dv")
    assert_rel(ge, ge_ref, 1e-5, "input grads: end partials")
    k[1, 3, 2, 0], q[0, 5, 1, 4] = float("nan"), float("inf")
    flags = kern.nonfinite_flags(q, k, v)
    expected = torch.zeros(B, H, N * L, dtype=torch.int8, device=device)
    expected[1, 2, 3], expected[0, 1, 5] = 1, 2
    assert torch.equal(flags, expected), "non-finite flags"


def check_split_scans(device: str) -> None:
    """Both chunk-state scans split along T (11 chunks in runs of 3, 3, 3, 2) equal them in one:
    the chunk-start states, the end state, the poisoned rows and the carried poison (a NaN in k,
    an inf in v, poison carried in), the increments' gradients, dZ0 and d(λ^L); with document
    starts and an initial state."""
    import idmix_kernels as kern

    from idmix.functional.interdomain.layout import chunk_decays, chunk_view

    B, H, N, L, R, D, M = 2, 3, 11, 8, 5, 3, 4
    g = torch.Generator().manual_seed(3)
    k = torch.randn(B, N * L, H, R, generator=g)
    v = torch.randn(B, N * L, H, D, generator=g)
    Z0 = torch.randn(B, H, R + D, 2 * M, generator=g)
    dXk = torch.randn(B, H, N, R, 2 * M, generator=g)
    dXv = torch.randn(B, H, N, D, 2 * M, generator=g)
    dZ = torch.randn(B, H, R + D, 2 * M, generator=g)
    reset = torch.zeros(B, N, L, dtype=torch.bool)
    reset[1, 4, 3] = reset[1, 7, 0] = True  # two runs with a start (A_s = 0), row 0 none
    k[1, 20, 2, 0], v[0, 50, 1, 1] = float("nan"), float("inf")
    p = make_problem(H=H, M=M, dtype=torch.float32)
    dec = chunk_decays(*(torch.view_as_real(p[n]) for n in ("lam", "beta")), L)
    kv, vv = (chunk_view(x.to(device), N, L, transpose=False) for x in (k, v))
    flags = kern.nonfinite_flags(*(x.to(device) for x in (torch.zeros_like(k), k, v)))
    dec = type(dec)(*(t.to(device) for t in dec))
    r = reset.to(device).view(torch.uint8)
    runs = {}
    for splits in (1, 4):
        last = torch.empty(B, H, R + D, 2 * M, device=device)
        poison = torch.zeros(B, H, N * L, dtype=torch.int8, device=device)
        carry = torch.zeros(B, H, dtype=torch.int8, device=device)
        carry[1, 0] = 1
        out = torch.empty_like(carry)
        c = kern.Containment(flags, poison, carry, out, True)
        st = kern.chunk_states(kv, vv, dec.end, dec.chunk, Z0.to(device), last, r, contain=c,
                               splits=splits)  # fmt: skip
        g_inc, g0, d_chunk = kern.chunk_states_backward(
            dXk.to(device), dXv.to(device), dZ.to(device), dec.chunk, st.nan_to_num(), L, r,
            out, splits=splits,
        )  # fmt: skip
        runs[splits] = (st, last, poison, out, g_inc, g0, d_chunk.sum((0, 2)))
    names = ("states", "end state", "poison", "carry out", "increments' grads", "dZ0", "dλ^L")
    for name, a, b in zip(names, runs[4], runs[1], strict=True):
        if a.dtype == torch.int8:
            assert torch.equal(a, b), f"split scans: {name}"
            continue
        keep = torch.isfinite(b)
        assert torch.equal(keep, torch.isfinite(a)), f"split scans: {name} poisoned elsewhere"
        # measured: relative RMSE ≤ 2.0e-7, worst position 1.5e-6 (fp32 sums in another order)
        assert_rel(a[keep], b[keep], 1e-6, f"split scans: {name}")
    assert int(runs[1][2].sum()) > 0 and bool(runs[1][3].any()), "nothing was poisoned"


def check_real_decode(device: str) -> None:
    """The layers' real-state step (interdomain_decode_step in place) through the kernel: the state
    is updated in place in the layers' (B, H, R+D, 2M) layout. Grouped (4-dim) queries fall back
    to the torch step by default."""
    from idmix.functional import interdomain_decode_step
    from idmix.functional.interdomain.layout import state_to_interleaved

    p = make_problem(B=2, T=3, H=2, R=5, D=7, M=6, dtype=torch.float32)
    G = readout_gram(p["C"]).to(device)
    lam, beta = (torch.view_as_real(p[n]).to(device) for n in ("lam", "beta"))
    Z0 = state_to_interleaved(*p["initial_state"]).to(device)
    for t in range(3):
        q, k, v = (p[n][:, t].to(device) for n in ("q", "k", "v"))
        ref = Z0.clone()
        o_ref = interdomain_decode_step(q, k, v, lam, beta, G, ref, backend="torch", inplace=True)[
            0
        ]
        o = interdomain_decode_step(q, k, v, lam, beta, G, Z0, backend="triton", inplace=True)[0]
        assert_rel(o, o_ref, 1e-5, f"real step o t={t}")
        assert_rel(Z0, ref, 1e-5, f"real step state t={t}")
    q4 = p["q"][:, 0, :, None].to(device)  # (B, H, 1, R): the default backend takes the torch path
    o4 = interdomain_decode_step(q4, k, v, lam, beta, G, Z0.clone(), inplace=True)[0]
    assert o4.shape == (2, 2, 1, 7)


def check_decode_mode_blocks(device: str) -> None:
    """The small-batch step split by modes (kernels/decode_step.py: a key launch and a value
    launch over (B·H, blocks), shares of o summed) equals the torch step, and the one-program
    step, over three tokens: o and the state, ragged blocks (M = 33: 5 blocks of 7; M = 20:
    3 of 7), blocks walked in several tiles (R = 256: 4 modes a key tile, 7 to walk; 2M = 66
    and 40: 4 modes a value tile)."""
    from unittest import mock

    import idmix_kernels.decode_step as step_kernel

    from idmix.functional import interdomain_decode_step
    from idmix.functional.interdomain.layout import state_to_interleaved

    cases = ((1, 3, 16, 8, 33, 5), (2, 2, 5, 7, 20, 3), (1, 1, 256, 4, 20, 3))
    for B, H, R, D, M, blocks in cases:
        assert step_kernel.mode_blocks(B * H, M, 2**30) == blocks
        p = make_problem(B=B, T=3, H=H, R=R, D=D, M=M, dtype=torch.float32)
        G = readout_gram(p["C"]).to(device)
        lam, beta = (torch.view_as_real(p[n]).to(device) for n in ("lam", "beta"))
        Z0 = state_to_interleaved(*p["initial_state"]).to(device)
        states = {"torch": Z0.clone(), 0: Z0.clone(), 2**30: Z0.clone()}  # by target programs
        for t in range(3):
            q, k, v = (p[n][:, t].to(device) for n in ("q", "k", "v"))
            outs = {
                "torch": interdomain_decode_step(
                    q, k, v, lam, beta, G, states["torch"], backend="torch", inplace=True
                )[0]
            }
            for target in (0, 2**30):
                with mock.patch.object(step_kernel, "target_programs", lambda _, n=target: n):
                    outs[target] = interdomain_decode_step(
                        q, k, v, lam, beta, G, states[target], backend="triton", inplace=True
                    )[0]
                where = f"{B, H, R, D, M} target {target} t={t}"
                assert_rel(outs[target], outs["torch"], 1e-5, f"o {where}")
                assert_rel(states[target], states["torch"], 1e-5, f"state {where}")


SELECTIVE_CASES = [  # B, T, H, R, D, M, L, Δ range, {row: sequence starts}
    (2, 37, 2, 4, 3, 5, 16, (1e-3, 1.0), {0: [18]}),
    (1, 1, 1, 2, 2, 2, 16, (1e-3, 1.0), {}),
    (1, 45, 2, 8, 8, 16, 8, (1e-3, 10.0), {0: [0, 7, 8, 44]}),
]


def check_selective(device: str) -> None:
    """Per-token decays: the intra-chunk passes in Triton (forward: selective_pass1/2; backward:
    selective_pair_sums/grads) equal the PyTorch path (outputs, final states and every gradient,
    λ_t and β_t included) and the per-step reference; ragged T, T = 1, odd dims, sequence starts
    (a length-1 sequence too), Δ_t up to 10."""
    from idmix.functional import interdomain_attention

    names = ("q", "k", "v", "lam", "beta", "C")
    for B, T, H, R, D, M, L, dt, starts in SELECTIVE_CASES:
        p = selective_problem(B=B, T=T, H=H, R=R, D=D, M=M, dt_range=dt)
        reset = torch.zeros(B, T, dtype=torch.bool, device=device)
        for row, pos in starts.items():
            reset[row, pos] = True
        case = f"selective {(B, T, H, R, D, M, L, dt)}"
        runs = {}
        for backend in ("triton", "torch"):
            cd = {n: (torch.complex64 if p[n].is_complex() else torch.float32) for n in names}
            leaves = [p[n].to(device, cd[n]).requires_grad_() for n in names]
            init = tuple(s.to(device, torch.complex64).requires_grad_() for s in p["initial_state"])
            o, (xk, xv) = interdomain_attention(
                *leaves,
                initial_state=init,
                reset=reset,
                chunk_size=L,
                backend=backend,
                precision="ieee",
                output_final_state=True,
            )
            g = torch.Generator().manual_seed(0)
            loss = (o * torch.randn(o.shape, generator=g).to(device)).sum() + (xk.abs() ** 2).sum()
            runs[backend] = [o, xk, xv, *torch.autograd.grad(loss, [*leaves, *init])]
        for i, (a, b) in enumerate(zip(runs["triton"], runs["torch"], strict=True)):
            assert_rel(a, b, 1e-5, f"triton vs torch {case} tensor {i}")
        naive = interdomain_attention(
            *(p[n].to(device) for n in names),
            initial_state=p["initial_state"],
            reset=reset,
            impl="naive",
        )[0]
        assert_rel(runs["triton"][0], naive, 1e-4, f"triton vs naive {case}")


def check_under_poisoned_allocations(device: str) -> None:
    """The decode and chunked checks again with every fresh buffer reading as NaN, so a kernel
    that leaves part of its output unwritten fails."""
    with PoisonEmpty() as mode:
        check_decode(device)
        check_real_decode(device)
        check_chunked(device)
        check_selective(device)
    assert mode.poisoned > 0


CHECKS = [  # the widest first, so a run stopped at a time cap has done the most
    check_chunked, check_selective, check_chunked_precisions, check_selective_precisions,
    check_decode, check_real_decode, check_decode_mode_blocks, check_decode_compiles,
    check_parts_alone,
    check_split_scans, check_nonfinite, check_varlen, check_chunked_compiles_and_exports,
    check_under_poisoned_allocations,
]  # fmt: skip


# the per-token-decay checks and the poisoned repeat: the half of the CPU run that
# tests/test_kernels_selective.py takes, so that two test workers share the interpreter's time
SECOND_HALF = ("check_selective", "check_selective_precisions", "check_under_poisoned_allocations")


def run_all(device: str, keep_going: bool, names=None) -> int:
    """Every check (or those named) in turn, each timed; with keep_going a failure is reported
    and the rest still run (a first GPU run shows every problem at once). Returns the number
    failed."""
    unknown = set(names or ()) - {c.__name__ for c in CHECKS}
    if unknown:
        raise SystemExit(f"--only: no checks named {sorted(unknown)}")
    failed = 0
    for check in (c for c in CHECKS if names is None or c.__name__ in names):
        start = time.perf_counter()
        try:
            check(device)
        except Exception:
            if not keep_going:
                raise
            failed += 1
            print(f"FAIL {check.__name__} ({time.perf_counter() - start:.1f} s)")
            print(traceback.format_exc()[-4000:], flush=True)
            continue
        print(f"ok   {check.__name__} ({time.perf_counter() - start:.1f} s)", flush=True)
    return failed


if __name__ == "__main__":
    dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    if "--large" in sys.argv:
        check_chunked(dev, CPU_LARGE_CASES)
        print("kernel checks passed")
        sys.exit(0)
    only = None
    if "--only" in sys.argv:  # --only name,name,...
        only = sys.argv[sys.argv.index("--only") + 1].split(",")
    elif "--first-half" in sys.argv:
        only = [c.__name__ for c in CHECKS if c.__name__ not in SECOND_HALF]
    n_failed = run_all(dev, keep_going="--keep-going" in sys.argv, names=only)
    if n_failed:
        sys.exit(f"{n_failed} kernel checks failed")
    print("kernel checks passed")
