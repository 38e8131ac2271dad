"""The delta-rule Interdomain op (idmix.functional.interdomain_delta) up the reference ladder:
the chunked UT form against the per-step recurrence in float64 (outputs, final states and the
gradients of every input, the initial state's included; ragged T, document starts, strong
decays, η up to 1), η = 0 as interdomain_attention, finite differences, split-and-carry, decode
steps, compile and bad input."""

from __future__ import annotations

import pytest
import torch

from idmix.functional import interdomain_attention
from idmix.functional.interdomain_delta import interdomain_delta, interdomain_delta_step
from tests.helpers import (
    assert_chunked_matches_naive,
    assert_rel,
    random_resets,
    reset_mask,
    run_in_two_parts,
)

# Measured (the LADDER cases, float64, chunked vs naive): relative RMSE ≤ 3.4e-15 for o, the
# final state and every gradient, worst position ≤ 1.8e-14 of the reference's RMS, strong decays
# (|λ| from e^-8 to e^-20) included: every decay is a power λⁿ from λ's log-modulus and phase,
# so no gradient divides by λ. Bounds ≥ 30×.
TOL64, MAX64 = 1e-13, 1e-12
NAMES = ("q", "k", "v", "eta", "rate", "phase", "beta", "G", "Z0")


@pytest.fixture(autouse=True)
def _poisoned(request):
    """NaN-poisoned fresh allocations for every test here but the compile one (Dynamo does not
    trace under a user dispatch mode)."""
    if request.node.originalname != "test_fullgraph_compile_matches_eager":
        request.getfixturevalue("poison")


def problem(
    B=2, T=37, H=2, R=4, D=3, M=5, *, decay=(0.05, 0.8), eta=(0.0, 1.0), seed=0,
    with_state=True, dtype=torch.float64,
):  # fmt: skip
    """Random inputs by name: shared decays of modulus exp(−U[decay]) and any phase, erase
    strengths U[eta], unit-norm keys (as the layer's normalised inputs), a symmetric Ĝ scaled so
    that a key written once reads back about once, an initial state."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    G = randn(H, 2 * M, 2 * M) / (2 * M)
    k = randn(B, T, H, R)
    p = dict(
        q=randn(B, T, H, R) * R**-0.5,
        k=k / k.norm(dim=-1, keepdim=True),
        v=randn(B, T, H, D),
        eta=eta[0] + (eta[1] - eta[0]) * rand(B, T, H),
        rate=decay[0] + (decay[1] - decay[0]) * rand(H, M),
        phase=6.3 * rand(H, M),
        beta=randn(H, M, 2) * 0.5,
        G=G + G.mT,
        Z0=randn(B, H, R + D, 2 * M) * 0.3 if with_state else None,
    )
    return {n: None if x is None else x.to(dtype) for n, x in p.items()}


def decays(p) -> torch.Tensor:
    """λ (H, M, 2) [re, im] from its log-modulus and phase."""
    modulus = torch.exp(-p["rate"])
    return torch.stack((modulus * p["phase"].cos(), modulus * p["phase"].sin()), -1)


def args(p) -> list:
    return [p["q"], p["k"], p["v"], p["eta"], decays(p), p["beta"], p["G"]]


def run(p, **kw):
    return interdomain_delta(*args(p), initial_state=p["Z0"], output_final_state=True, **kw)


LADDER = [
    (dict(T=1), 8, ()),
    (dict(T=7), 4, ((0, 3),)),
    (dict(T=37), 8, ((0, 0), (1, 8), (1, 9), (0, 36))),
    (dict(T=37, with_state=False), 16, ((1, 20),)),
    (dict(T=45, M=8, R=6, D=6), 32, ((0, 22),)),
    (dict(T=70, eta=(0.9, 1.0)), 64, ((1, 40),)),
    (dict(T=33, decay=(8.0, 20.0)), 8, ((1, 5),)),
]


@pytest.mark.parametrize("kw, chunk_size, reset_at", LADDER)
def test_chunked_matches_naive_fp64(kw, chunk_size, reset_at):
    assert_chunked_matches_naive(run, problem(**kw), chunk_size, reset_at, TOL64, MAX64)


@pytest.mark.parametrize("impl", ["naive", "chunked"])
def test_without_the_erase_it_is_interdomain_attention(impl):
    p = problem(T=29)
    p["eta"] = torch.zeros_like(p["eta"])
    reset = reset_mask(2, 29, (1, 11))
    o, Z = run(p, reset=reset, impl=impl, chunk_size=8)
    o_ref, Z_ref = interdomain_attention(
        p["q"], p["k"], p["v"], decays(p), p["beta"], p["G"], initial_state=p["Z0"],
        output_final_state=True, reset=reset, impl="naive",
    )  # fmt: skip
    assert_rel(o, o_ref, 1e-14, "o")
    assert_rel(Z, Z_ref, 1e-14, "state")


def test_a_full_erase_overwrites_the_value_of_a_repeated_key():
    """η = 1 writes the retrieval error: with a unit self-retrieval gain (b̂ᵀĜb̂ = 1, ‖k‖ = 1)
    and no decay, writing (k, v₁) then (k, v₂) leaves the value modes holding b̂ v₂ᵀ, where
    η = 0 sums them to b̂ (v₁ + v₂)ᵀ (the point of the delta rule)."""
    p = problem(B=1, T=2, H=1, R=3, D=2, M=4, with_state=False)
    p["k"] = p["k"][:, :1].expand_as(p["k"]).contiguous()  # one key, written twice
    p["rate"] = torch.zeros_like(p["rate"])  # λ = 1: nothing fades on its own
    p["phase"] = torch.zeros_like(p["phase"])
    b = p["beta"].flatten(-2)[0]  # (2M,): b̂ = β interleaved
    p["G"] = torch.outer(b, b)[None] / (b @ b) ** 2
    v1, v2 = p["v"][0, :, 0]
    for eta, expected in ((1.0, v2), (0.0, v1 + v2)):
        p["eta"] = torch.full_like(p["eta"], eta)
        for impl in ("naive", "chunked"):
            _, Z = run(p, impl=impl, chunk_size=2)
            assert_rel(Z[0, 0, 3:], torch.outer(expected, b), 1e-14, f"value modes, η = {eta}")


def test_gradcheck():
    p = problem(B=1, T=4, H=1, R=2, D=2, M=2)
    reset = reset_mask(1, 4, (0, 2))

    def f(*xs):
        return run(dict(zip(NAMES, xs, strict=True)), reset=reset, chunk_size=2)

    inputs = [p[n].clone().requires_grad_() for n in NAMES]
    # measured: central differences (eps 1e-6) against autograd along random directions agree to
    # 4.9e-10 relative; the bounds are gradcheck's own defaults tightened tenfold
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("cut", [1, 13, 36])
def test_split_and_carry_equals_one_pass(cut):
    p = problem(T=37)
    reset = random_resets(2, 37, seed=4)

    def run_from(p, **kw):
        return interdomain_delta(*args(p), initial_state=p["initial_state"], **kw)

    whole = dict(p, initial_state=p["Z0"])
    kw = dict(output_final_state=True, chunk_size=8)
    o, end = run_from(whole, reset=reset, **kw)
    o2, end2 = run_in_two_parts(run_from, whole, ("q", "k", "v", "eta"), cut, reset, **kw)
    assert_rel(o2, o, TOL64, "o", MAX64)
    assert_rel(end2, end, TOL64, "state", MAX64)


def test_decode_steps_equal_the_chunked_forward():
    """fp32 (measured: relative RMSE 3.0e-7 on o, 1.7e-7 on the state)."""
    p = {n: None if x is None else x.float() for n, x in problem(T=23).items()}
    *tokens, lam, beta, G = args(p)
    o, end = interdomain_delta(
        *tokens, lam, beta, G, initial_state=p["Z0"], output_final_state=True, chunk_size=8
    )
    Z, steps = p["Z0"], []
    for t in range(23):
        out, Z = interdomain_delta_step(*(x[:, t] for x in tokens), lam, beta, G, Z)
        steps.append(out)
    assert_rel(torch.stack(steps, 1), o, 1e-5, "o")
    assert_rel(Z, end, 1e-5, "state")


def test_fullgraph_compile_matches_eager():
    p = {n: None if x is None else x.float() for n, x in problem(T=21).items()}
    reset = reset_mask(2, 21, (1, 8))

    def f(*xs):
        return interdomain_delta(*xs, reset=reset, chunk_size=8, output_final_state=True)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(*args(p)), f(*args(p)), rtol=1e-5, atol=1e-6)


BAD = [
    (dict(eta=torch.zeros(2, 5, 3)), ValueError, r"eta: expected shape \(B, T, H\)"),
    (dict(rate=torch.zeros(3, 5), phase=torch.zeros(3, 5)), ValueError, r"lam_ri: expected"),
    (dict(initial_state=torch.zeros(1)), ValueError, r"initial_state: expected"),
    (dict(impl="fast"), ValueError, r"impl: expected one of"),
    (dict(chunk_size=0), ValueError, r"chunk_size: expected"),
    (dict(reset=torch.zeros(2, 4, dtype=torch.bool)), ValueError, r"reset"),
]


@pytest.mark.parametrize("change, error, match", BAD)
def test_bad_input_names_the_argument(change, error, match):
    p = problem(T=5, with_state=False, dtype=torch.float32)
    options = {n: change.pop(n) for n in ("initial_state", "impl", "reset", "chunk_size")
               if n in change}  # fmt: skip
    p.update(change)
    with pytest.raises(error, match=match):
        interdomain_delta(*args(p), **options)
