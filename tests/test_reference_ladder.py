"""Chunked O(T) path vs the per-step reference, the O(T²) closed form and T decode steps:
outputs, final states and the gradients of every input."""

from __future__ import annotations

import pytest
import torch

from idmix.functional import interdomain_attention, interdomain_attention_naive
from tests.helpers import TOL_FP32, TOL_FP64, assert_rel, make_problem

GRAD_INPUTS = ("q", "k", "v", "lam", "beta", "C", "Xk0", "Xv0")


def run(p, impl, readout, chunk_size=16, grads=True, seed=1, reset=None, backend="auto"):
    """Forward + backward of a fixed random functional of (o, final state)."""
    leaves = {
        n: p[n].detach().clone().requires_grad_(grads) for n in ("q", "k", "v", "lam", "beta", "C")
    }
    Xk0, Xv0 = (s.detach().clone().requires_grad_(grads) for s in p["initial_state"])
    if impl == "paper":  # the paper's literal complex form, C and the readout as they are
        o, (Xk, Xv) = interdomain_attention_naive(
            *leaves.values(), readout, initial_state=(Xk0, Xv0), reset=reset
        )
        return _with_grads(o, Xk, Xv, [*leaves.values(), Xk0, Xv0], grads, seed)
    o, (Xk, Xv) = interdomain_attention(
        leaves["q"],
        leaves["k"],
        leaves["v"],
        leaves["lam"],
        leaves["beta"],
        leaves["C"],
        readout=readout,
        initial_state=(Xk0, Xv0),
        chunk_size=chunk_size,
        impl=impl,
        reset=reset,
        backend=backend,
        output_final_state=True,
    )
    return _with_grads(o, Xk, Xv, [*leaves.values(), Xk0, Xv0], grads, seed)


def _with_grads(o, Xk, Xv, ins, grads, seed):
    if not grads:
        return o, (Xk, Xv), None
    g = torch.Generator().manual_seed(seed)  # weights drawn by shape, independent of layout
    wo = torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)
    wk = torch.randn(Xk.shape, generator=g, dtype=torch.complex128).to(Xk.dtype)
    wv = torch.randn(Xv.shape, generator=g, dtype=torch.complex128).to(Xv.dtype)
    loss = (o * wo).sum() + (Xk * wk).real.sum() + (Xv * wv).imag.sum()
    return o, (Xk, Xv), dict(zip(GRAD_INPUTS, torch.autograd.grad(loss, ins), strict=True))


def compare(got, ref, tol, tag):
    o, (Xk, Xv), grads = got
    o_r, (Xk_r, Xv_r), grads_r = ref
    assert_rel(o, o_r, tol, f"{tag} output")
    assert_rel(Xk, Xk_r, tol, f"{tag} final Xk")
    assert_rel(Xv, Xv_r, tol, f"{tag} final Xv")
    if grads is not None:
        for n in grads:
            assert_rel(grads[n], grads_r[n], tol, f"{tag} grad {n}")


@pytest.mark.parametrize("readout", ["conj", "product"])
@pytest.mark.parametrize("T", [1, 15, 16, 63, 130])
def test_float64_all_impls_agree(T, readout):
    p = make_problem(B=2, T=T, H=2, R=5, D=7, M=6)
    ref = run(p, "naive", readout)
    for impl in ("chunked", "closed_form", "recurrent"):
        compare(run(p, impl, readout), ref, TOL_FP64, f"{impl} T={T} {readout}")


@pytest.mark.parametrize("readout", ["conj", "product"])
@pytest.mark.parametrize("decays", ["shared", "per_token"])
def test_every_impl_equals_the_papers_complex_form(decays, readout):
    """The bottom rung: every impl of the real-form contract (naive and closed_form included,
    which compute through Ĝ) against the paper's equations with C (U = C Xᵏ, Γ = C Xᵛ), with
    document starts, outputs, states and every gradient, fp64."""
    B, T = 2, 45
    p = make_problem(B=B, T=T, H=2, R=3, D=4, M=5)
    if decays == "per_token":  # a different λ_t, β_t at every position
        g = torch.Generator().manual_seed(7)
        scale = 1 - 0.3 * torch.rand(B, T, 2, 5, generator=g, dtype=torch.float64)
        p["lam"], p["beta"] = p["lam"] * scale, p["beta"] * scale.flip(1)
    reset = random_resets(B, T, seed=5, p=0.1)
    ref = run(p, "paper", readout, reset=reset)
    for impl in ("naive", "closed_form", "recurrent", "chunked"):
        got = run(p, impl, readout, chunk_size=8, reset=reset)
        compare(got, ref, TOL_FP64, f"{impl} vs the paper's form ({decays}, {readout})")


@pytest.mark.parametrize("readout", ["conj", "product"])
@pytest.mark.parametrize("segments", ["default", "small"])
def test_float64_ragged_long(readout, segments, request):
    """T = 500: one or many segments of the chunked path, plus a ragged tail chunk."""
    if segments == "small":
        request.getfixturevalue("small_segments")
    p = make_problem(B=1, T=500, H=2, R=3, D=4, M=5)
    compare(run(p, "chunked", readout, chunk_size=8), run(p, "naive", readout), TOL_FP64, "T=500")


@pytest.mark.parametrize("readout", ["conj", "product"])
@pytest.mark.parametrize("T", [1, 63, 200])
def test_float32_matches_float64_reference(T, readout):
    p64 = make_problem(B=2, T=T, H=3, R=8, D=8, M=8, dt_range=(1e-3, 1e-1))
    p32 = make_problem(B=2, T=T, H=3, R=8, D=8, M=8, dt_range=(1e-3, 1e-1), dtype=torch.float32)
    compare(
        run(p32, "chunked", readout, chunk_size=32), run(p64, "naive", readout), TOL_FP32, "fp32"
    )


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_large_step_sizes(chunk_size):
    """Δ·|Re A| up to 5 (λ decays by e^-5 per step): fp32 chunked stays finite and exact."""
    p64 = make_problem(B=1, T=150, H=2, R=4, D=4, M=6, dt_range=(2.0, 10.0))
    p32 = make_problem(B=1, T=150, H=2, R=4, D=4, M=6, dt_range=(2.0, 10.0), dtype=torch.float32)
    assert (p64["lam"].abs() < 0.37).all()
    ref = run(p64, "naive", "conj")
    compare(run(p64, "chunked", "conj", chunk_size), ref, TOL_FP64, "fp64 large dt")
    compare(run(p32, "chunked", "conj", chunk_size), ref, 1e-5, "fp32 large dt")  # measured 2e-7


def test_odd_dims_without_initial_state():
    p = make_problem(B=3, T=41, H=1, R=1, D=3, M=1, with_state=False)
    for impl in ("chunked", "closed_form", "recurrent"):
        o = interdomain_attention(
            p["q"], p["k"], p["v"], p["lam"], p["beta"], p["C"], impl=impl, chunk_size=8
        )[0]
        ref = interdomain_attention(
            p["q"], p["k"], p["v"], p["lam"], p["beta"], p["C"], impl="naive"
        )[0]
        assert_rel(o, ref, TOL_FP64, impl)


@pytest.mark.parametrize("T", [1, 77])
def test_chunked_writes_every_output(poison, T):
    """With fresh allocations poisoned to NaN, the chunked forward and backward equal the
    literal reference (every gradient, λ's included)."""
    p = make_problem(B=2, T=T, H=2, R=4, D=3, M=5)
    got = run(p, "chunked", "conj", chunk_size=8)
    assert poison.poisoned > 0
    compare(got, run(p, "naive", "conj"), TOL_FP64, "poisoned chunked")


def test_chunked_gradients_under_a_dispatch_mode():
    """Regression: under FlopCounterMode the custom op's body runs with the conjugate fallback
    excluded, and a lazy conj (linalg.vecdot) was silently dropped: λ's gradient came out wrong
    by more than its own size. Every gradient must equal the one computed without the mode."""
    from torch.utils.flop_counter import FlopCounterMode

    p = make_problem(B=2, T=77, H=2, R=4, D=3, M=5)
    ref = run(p, "chunked", "conj", chunk_size=8)
    with FlopCounterMode(display=False):
        got = run(p, "chunked", "conj", chunk_size=8)
    compare(got, ref, 0.0, "chunked under FlopCounterMode")


def test_poison_mode_catches_unwritten_output(poison):
    """The poisoning itself works: a half-written buffer reads as NaN."""
    x = torch.empty(4)
    x[:2] = 1.0
    assert torch.isnan(x[2:]).all()


def random_resets(B, T, seed, p=0.08):
    g = torch.Generator().manual_seed(seed)
    reset = torch.rand(B, T, generator=g) < p
    reset[0, 0] = True  # one row discards its initial state, the other keeps it
    if B > 1:
        reset[1, 0] = False
    return reset


@pytest.mark.parametrize("readout", ["conj", "product"])
@pytest.mark.parametrize("segments", ["default", "small"])
def test_resets_match_reference_with_gradients(readout, segments, request):
    """Packed sequences (reset masks inside chunks, at chunk edges, consecutive): chunked,
    closed form and decode steps vs the naive recurrence, outputs, states and all gradients."""
    if segments == "small":
        request.getfixturevalue("small_segments")
    p = make_problem(B=2, T=90, H=2, R=3, D=4, M=5)
    reset = random_resets(2, 90, seed=3)
    reset[1, 16] = reset[1, 17] = reset[1, 32] = True  # chunk edges, back-to-back starts
    ref = run(p, "naive", readout, reset=reset)
    for impl in ("chunked", "closed_form", "recurrent"):
        compare(run(p, impl, readout, chunk_size=16, reset=reset), ref, TOL_FP64, f"{impl} reset")


def test_resets_equal_separate_sequences():
    p = make_problem(B=1, T=50, H=2, R=3, D=2, M=4, with_state=False)
    reset = torch.zeros(1, 50, dtype=torch.bool)
    reset[0, [0, 13, 14, 40]] = True
    args = [p[n] for n in ("q", "k", "v", "lam", "beta", "C")]
    o = interdomain_attention(*args, reset=reset, chunk_size=8)[0]
    cuts = [0, 13, 14, 40, 50]
    ref = torch.cat(
        [
            interdomain_attention(*(a[:, t0:t1] for a in args[:3]), *args[3:], impl="naive")[0]
            for t0, t1 in zip(cuts[:-1], cuts[1:], strict=True)
        ],
        dim=1,
    )
    assert_rel(o, ref, TOL_FP64, "packed")


@pytest.mark.parametrize("compiler", ["dynamo", pytest.param("inductor", marks=pytest.mark.slow)])
@pytest.mark.parametrize("T", [1, 90])
def test_inductor_backend_matches_reference(T, compiler, request):
    """backend="inductor" (each segment's math compiled by torch.compile) against the naive
    recurrence in float64: a ragged tail, packed sequences across chunk edges, T = 1, and, traced
    only (each compile costs Inductor ~10 s), segments of two chunks and of one; outputs, final
    states and every gradient."""
    if compiler == "dynamo":
        request.getfixturevalue("dynamo_only")
        request.getfixturevalue("small_segments")
    p = make_problem(B=2, T=T, H=2, R=3, D=4, M=5)
    reset = random_resets(2, T, seed=3) if T > 1 else None
    ref = run(p, "naive", "conj", reset=reset)
    got = run(p, "chunked", "conj", chunk_size=8, reset=reset, backend="inductor")
    compare(got, ref, TOL_FP64, f"inductor ({compiler})")


@pytest.mark.parametrize("decays", ["shared", "per_token"])
def test_the_real_form_entry_runs_every_impl(decays):
    """The real form takes impl= like the complex one: the same table, the same
    numbers (fp64), and an unknown name is refused by name."""
    from idmix.functional import readout_gram
    from idmix.functional.interdomain import state_to_interleaved

    B, T, H, R, D, M = 2, 29, 2, 3, 4, 5
    p = make_problem(B=B, T=T, H=H, R=R, D=D, M=M)
    lam, beta = p["lam"], p["beta"]
    if decays == "per_token":
        lam, beta = lam.expand(B, T, H, M) * 0.9, beta.expand(B, T, H, M)
    args = (
        p["q"], p["k"], p["v"], torch.view_as_real(lam), torch.view_as_real(beta),
        readout_gram(p["C"]),
    )  # fmt: skip
    Z0 = state_to_interleaved(*p["initial_state"])
    reset = random_resets(B, T, seed=2)
    kw = dict(initial_state=Z0, output_final_state=True, reset=reset)
    o_ref, Z_ref = interdomain_attention(*args, impl="naive", **kw)
    for impl in ("chunked", "closed_form", "recurrent"):
        o, Z = interdomain_attention(*args, impl=impl, chunk_size=8, **kw)
        assert_rel(o, o_ref, TOL_FP64, f"{impl} output")
        assert_rel(Z, Z_ref, TOL_FP64, f"{impl} state")
    with pytest.raises(ValueError, match="impl: expected one of"):
        interdomain_attention(*args, impl="fast")


def test_the_impl_names_are_the_implementations():
    """validation.IMPLS (what the check and the docs list) names exactly the impl table."""
    from idmix.functional import IMPLS
    from idmix.functional.interdomain import api

    assert tuple(api.IMPLEMENTATIONS) == IMPLS


@pytest.mark.parametrize("grad", [False, True])
def test_real_decode_step_in_place_or_not(grad):
    """The real-form step: inplace=True advances the given state; inplace=False leaves it and
    returns the same new state, and with autograd recording, gradients flow through a
    sequence of steps (checked against finite differences in fp64)."""
    from idmix.functional import interdomain_decode_step, readout_gram
    from idmix.functional.interdomain import state_to_interleaved

    p = make_problem(B=2, T=3, H=2, R=3, D=4, M=3)
    lam, beta = (torch.view_as_real(p[n]) for n in ("lam", "beta"))
    G = readout_gram(p["C"])
    Z0 = state_to_interleaved(*p["initial_state"]).contiguous()
    step = [p[n][:, 0] for n in ("q", "k", "v")]
    kept = Z0.clone()
    o, new = interdomain_decode_step(*step, lam, beta, G, kept)
    assert torch.equal(kept, Z0), "inplace=False changed the given state"
    advanced = Z0.clone()
    o2, same = interdomain_decode_step(*step, lam, beta, G, advanced, inplace=True)
    assert same is advanced
    assert_rel(o, o2, 1e-14, "o")
    assert_rel(new, advanced, 1e-14, "state")
    if grad:

        def two_steps(q, Z):
            o1, Z1 = interdomain_decode_step(q, step[1], step[2], lam, beta, G, Z)
            o2, Z2 = interdomain_decode_step(q, step[1], step[2], lam, beta, G, Z1)
            return o1 + o2, Z2

        leaves = (step[0].clone().requires_grad_(), Z0.clone().requires_grad_())
        assert torch.autograd.gradcheck(two_steps, leaves)
