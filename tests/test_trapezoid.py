"""Interdomain attention with the exponential-trapezoidal update (idmix.functional.trapezoid) up
the reference ladder: the chunked form (the per-token engine on the interleaved sequence)
against the per-step recurrence in float64 (outputs, final states and the gradients of every
input, the initial state's included; ragged T, document starts, strong decays), b = 0 as
interdomain_attention's per-token path, finite differences, split-and-carry, decode steps,
compile and bad input."""

from __future__ import annotations

import pytest
import torch

from idmix.functional import interdomain_attention
from idmix.functional.trapezoid import TrapezoidState, trapezoid_attention, trapezoid_step
from tests.helpers import (
    assert_chunked_matches_naive,
    assert_rel,
    random_resets,
    reset_mask,
)

# Measured (the LADDER cases, float64, chunked vs naive): relative RMSE ≤ 8.4e-16 for o, the
# final state and every gradient, worst position ≤ 6.7e-15 of the reference's RMS; bounds ≥ 100×.
# λ enters by its log-modulus (rate) and phase, as a layer makes it. With strong decays
# (|λ| from e^-8 to e^-20) the gradients of the rate and phase reach 1.3e-11 (worst position
# 1.3e-10): the per-token engine's gradient with respect to λ loses relative precision
# ~ε/|λ| (measured on interdomain_attention alone, fp64: 5e-13 at |λ| ≈ e^-8, 3.5e-8 at
# e^-20), which the chain rule mostly multiplies back by λ. That case has its own bounds.
TOL64, MAX64 = 1e-13, 2e-12
STRONG = dict(tol=1e-10, worst=1e-9)
TOKENS = ("q", "k", "v", "rate", "phase", "g", "b")


@pytest.fixture(autouse=True)
def _poisoned(request):
    """NaN-poisoned fresh allocations for every test here but the compile one (Dynamo does not
    trace under a user dispatch mode)."""
    if request.node.originalname != "test_fullgraph_compile_matches_eager":
        request.getfixturevalue("poison")


def problem(
    B=2, T=37, H=2, R=4, D=3, M=5, *, decay=(0.0, 0.8), seed=0, with_state=True,
    dtype=torch.float64,
):  # fmt: skip
    """Random inputs by name: per-token decays of modulus exp(−U[decay]) and any phase, the
    trapezoid's weights σΔ and (1 − σ)Δ, a symmetric Ĝ, an initial state."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    rate = decay[0] + (decay[1] - decay[0]) * rand(B, T, H, M)
    phase = 6.3 * rand(B, T, H, M)
    dt, sig = 0.6 * rand(B, T, H), rand(B, T, H)
    G = randn(H, 2 * M, 2 * M) / (2 * M)
    p = dict(
        q=randn(B, T, H, R) * R**-0.5,
        k=randn(B, T, H, R) * R**-0.5,
        v=randn(B, T, H, D),
        rate=rate,  # λ = exp(−rate + i·phase), as a layer makes it (``decays``)
        phase=phase,
        g=sig * dt,
        b=(1 - sig) * dt,
        G=G + G.mT,
        Z0=randn(B, H, R + D, 2 * M) if with_state else None,
        z0=randn(B, H, R + D) if with_state else None,
    )
    return {n: None if x is None else x.to(dtype) for n, x in p.items()}


def decays(p) -> torch.Tensor:
    """λ (B, T, H, M, 2) [re, im] from its log-modulus and phase."""
    modulus = torch.exp(-p["rate"])
    return torch.stack((modulus * p["phase"].cos(), modulus * p["phase"].sin()), -1)


def args(p) -> list:
    return [p["q"], p["k"], p["v"], decays(p), p["g"], p["b"], p["G"]]


def state_of(p):
    return None if p["Z0"] is None else TrapezoidState(p["Z0"], p["z0"])


def run(p, **kw):
    o, state = trapezoid_attention(
        *args(p), initial_state=state_of(p), output_final_state=True, **kw
    )
    return o, torch.cat((state.Z.flatten(1), state.z.flatten(1)), 1)


LADDER = [
    (dict(T=1), 8, (), {}),
    (dict(T=7), 4, ((0, 3),), {}),
    (dict(T=37), 8, ((0, 0), (1, 8), (1, 9), (0, 36)), {}),
    (dict(T=37, with_state=False), 16, ((1, 20),), {}),
    (dict(T=45, M=8, R=6, D=6), 32, ((0, 22),), {}),
    (dict(T=33, decay=(8.0, 20.0)), 8, ((1, 5),), STRONG),
]


@pytest.mark.parametrize("kw, chunk_size, reset_at, bounds", LADDER)
def test_chunked_matches_naive_fp64(kw, chunk_size, reset_at, bounds):
    tol, worst = bounds.get("tol", TOL64), bounds.get("worst", MAX64)
    assert_chunked_matches_naive(run, problem(**kw), chunk_size, reset_at, tol, worst)


def test_without_the_older_end_it_is_the_per_token_interdomain_op():
    p = problem(T=29)
    p["b"] = torch.zeros_like(p["b"])
    reset = reset_mask(2, 29, (1, 11))
    o, state = trapezoid_attention(
        *args(p), initial_state=state_of(p), output_final_state=True, reset=reset, impl="naive"
    )
    M = p["rate"].shape[-1]
    beta = torch.stack((p["g"], torch.zeros_like(p["g"])), -1)[..., None, :].expand(
        -1, -1, -1, M, 2
    )
    o_ref, Z_ref = interdomain_attention(
        p["q"], p["k"], p["v"], decays(p), beta.contiguous(), p["G"], initial_state=p["Z0"],
        output_final_state=True, reset=reset, impl="naive",
    )  # fmt: skip
    assert_rel(o, o_ref, 1e-14, "o")
    assert_rel(state.Z, Z_ref, 1e-14, "state")


def test_gradcheck():
    p = problem(B=1, T=4, H=1, R=2, D=2, M=2)
    names = [*TOKENS, "G", "Z0", "z0"]
    reset = reset_mask(1, 4, (0, 2))

    def f(*xs):
        return run(dict(zip(names, xs, strict=True)), reset=reset, chunk_size=2)

    inputs = [p[n].clone().requires_grad_() for n in names]
    # measured: central differences (eps 1e-6) against autograd along random directions agree to
    # 2.8e-9 relative; the bounds are gradcheck's own defaults tightened tenfold
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("cut", [1, 13, 36])
def test_split_and_carry_equals_one_pass(cut):
    p = problem(T=37)
    reset = random_resets(2, 37, seed=4)
    *tokens, G = args(p)
    kw = dict(output_final_state=True, chunk_size=8)
    o, end = trapezoid_attention(*tokens, G, initial_state=state_of(p), reset=reset, **kw)
    o1, mid = trapezoid_attention(
        *(t[:, :cut] for t in tokens), G, initial_state=state_of(p), reset=reset[:, :cut], **kw
    )
    o2, end2 = trapezoid_attention(
        *(t[:, cut:] for t in tokens), G, initial_state=mid, reset=reset[:, cut:], **kw
    )
    assert_rel(torch.cat((o1, o2), 1), o, TOL64, "o", MAX64)
    assert_rel(end2.Z, end.Z, TOL64, "state", MAX64)


def test_decode_steps_equal_the_chunked_forward():
    """fp32 (measured: relative RMSE 2.9e-7 on o, 1.8e-7 on the state)."""
    p = {n: None if x is None else x.float() for n, x in problem(T=23).items()}
    *tokens, G = args(p)
    o, end = trapezoid_attention(
        *tokens, G, initial_state=state_of(p), output_final_state=True, chunk_size=8
    )
    state, steps = state_of(p), []
    for t in range(23):
        out, state = trapezoid_step(*(x[:, t] for x in tokens), G, state)
        steps.append(out)
    assert_rel(torch.stack(steps, 1), o, 1e-5, "o")
    assert_rel(state.Z, end.Z, 1e-5, "state")


def test_fullgraph_compile_matches_eager():
    p = {n: None if x is None else x.float() for n, x in problem(T=21).items()}
    reset = reset_mask(2, 21, (1, 8))

    def f(*xs):
        return trapezoid_attention(*xs, reset=reset, chunk_size=8, output_final_state=True)[0]

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    # measured: identical (aot_eager runs the eager kernels); fp32 rounding allowed for a
    # decomposition that reorders a sum
    torch.testing.assert_close(compiled(*args(p)), f(*args(p)), rtol=1e-5, atol=1e-6)


BAD = [
    (dict(g=torch.zeros(2, 5, 3)), ValueError, r"g: expected shape \(B, T, H\)"),
    (dict(rate=torch.zeros(2, 5, 2)), ValueError, r"lam: expected"),
    (dict(initial_state=(torch.zeros(1), torch.zeros(1))), ValueError, r"initial_state.Z"),
    (dict(impl="fast"), ValueError, r"impl: expected one of"),
    (dict(reset=torch.zeros(2, 4, dtype=torch.bool)), ValueError, r"reset"),
]


@pytest.mark.parametrize("change, error, match", BAD)
def test_bad_input_names_the_argument(change, error, match):
    p = problem(T=5, with_state=False, dtype=torch.float32)
    options = {n: change.pop(n) for n in ("initial_state", "impl", "reset") if n in change}
    p.update(change)
    if "rate" in change:
        p["phase"] = torch.zeros_like(p["rate"])
    with pytest.raises(error, match=match):
        trapezoid_attention(*args(p), **options)
