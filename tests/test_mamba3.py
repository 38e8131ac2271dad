"""Mamba-3's SISO recurrence (idmix.functional.mamba3) up the reference ladder: the chunked form
against the per-step recurrence in float64 (outputs, final states and the gradients of every
input, the initial state's included; ragged T, document starts, strong decays), both against
an independent statement of the rotations as a complex-diagonal SSM, finite differences, fp32
against fp64, split-and-carry, decode steps, compile, dtypes and bad input."""

from __future__ import annotations

import math

import pytest
import torch

from idmix.functional.mamba3 import (
    Mamba3State,
    mamba3_attention,
    mamba3_naive,
    mamba3_step,
)
from tests.helpers import (
    assert_chunked_matches_naive,
    assert_rel,
    random_resets,
    reset_mask,
)


@pytest.fixture(autouse=True)
def _poisoned(request):
    """NaN-poisoned fresh allocations for every test here but the compile one (Dynamo does not
    trace under a user dispatch mode)."""
    if request.node.originalname != "test_fullgraph_compile_matches_eager":
        request.getfixturevalue("poison")


# Measured (the LADDER cases, float64, chunked vs naive): relative RMSE ≤ 1.8e-15 for y, the
# final state and every gradient, worst position ≤ 4.3e-14 of the reference's RMS. Bounds ~50×.
TOL64, MAX64 = 1e-13, 2e-12
TOKENS = ("q", "k", "x", "dt", "A", "trap", "angles")
STATE = ("h0", "k0", "x0", "angle0")


def problem(
    B=2, T=37, H=2, N=8, P=5, S=3, *, decay=(0.1, 2.0), dt=(0.05, 0.6), seed=0,
    with_state=True, dtype=torch.float64,
):  # fmt: skip
    """Random inputs by name: A uniform in −decay, Δ in dt, λ in [0, 1], θ in (−π, π), keys and
    queries of norm ≈ 1; an initial state (h, previous rotated key and value, angles)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, lo=0.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(*shape, generator=g, dtype=torch.float64)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    p = dict(
        q=randn(B, T, H, N) * N**-0.5,
        k=randn(B, T, H, N) * N**-0.5,
        x=randn(B, T, H, P),
        dt=rand(B, T, H, lo=dt[0], hi=dt[1]),
        A=-rand(B, T, H, lo=decay[0], hi=decay[1]),
        trap=rand(B, T, H),
        angles=rand(B, T, H, S, lo=-math.pi, hi=math.pi),
        h0=randn(B, H, N, P) if with_state else None,
        k0=randn(B, H, N) * N**-0.5 if with_state else None,
        x0=randn(B, H, P) if with_state else None,
        angle0=rand(B, H, S, hi=2 * math.pi) if with_state else None,
    )
    return {n: None if x is None else x.to(dtype) for n, x in p.items()}


def state_of(p):
    return None if p["h0"] is None else Mamba3State(*(p[n] for n in STATE))


def flat(state: Mamba3State) -> torch.Tensor:
    """The state as one tensor (angles by cosine and sine: equal modulo 2π)."""
    parts = (state.h, state.k, state.x, state.angle.cos(), state.angle.sin())
    return torch.cat([s.flatten(1) for s in parts], 1)


def run(p, **kw):
    y, state = mamba3_attention(*(p[n] for n in TOKENS), initial_state=state_of(p), **kw)
    return y, flat(state)


LADDER = [
    (dict(T=1), 8, ()),
    (dict(T=7), 4, ((0, 3),)),
    (dict(T=37), 8, ((0, 0), (1, 8), (1, 9), (0, 36))),  # at a chunk's start, the last token
    (dict(T=37, with_state=False), 16, ((1, 20),)),
    (dict(T=67, H=3, N=16, P=4, S=8), 64, ((0, 31), (1, 64))),  # every channel rotated
    (dict(T=40, N=6, S=1), 8, ()),  # most channels real modes
    (dict(T=33, decay=(20.0, 40.0), dt=(0.5, 1.0)), 8, ((1, 5),)),  # ΔA down to −40
    (dict(T=33, dt=(1e-4, 1e-3)), 16, ()),  # nearly frozen state
]


@pytest.mark.parametrize("kw, chunk_size, reset_at", LADDER)
def test_chunked_matches_naive_fp64(kw, chunk_size, reset_at):
    assert_chunked_matches_naive(run, problem(**kw), chunk_size, reset_at, TOL64, MAX64)


def _complex_ssm(p, reset=None):
    """The same model stated as a complex-diagonal SSM on the unrotated keys and queries
    (derived in docs/research/mamba3.md): each pair (2j, 2j+1) is one complex mode with decay
    exp(Δ(A − iθ_j)), each unrotated channel a real mode with decay exp(ΔA); no rotation
    anywhere. One row and head at a time, float64."""
    q, k, x, dt, A, trap, angles = (p[n] for n in TOKENS)
    B, T, H, N = q.shape
    S = angles.shape[-1]
    y = torch.zeros(B, T, H, x.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            angle0 = p["angle0"][b, h] if p["angle0"] is not None else torch.zeros(S)
            # the state in the query's frame: the carried h turned back by the carried angles
            mode = (
                lambda v: torch.cat(  # noqa: E731
                    (
                        torch.complex(v[0 : 2 * S : 2], v[1 : 2 * S : 2]),
                        v[2 * S :].to(torch.cdouble),
                    )
                )
            )
            turn = torch.cat((torch.exp(-1j * angle0), torch.ones(N - 2 * S)))
            G = torch.zeros(N - S, x.shape[-1], dtype=torch.cdouble)
            k_prev = torch.zeros(N - S, dtype=torch.cdouble)
            x_prev = torch.zeros(x.shape[-1], dtype=torch.float64)
            if p["h0"] is not None:
                hc = torch.complex(p["h0"][b, h, 0 : 2 * S : 2], p["h0"][b, h, 1 : 2 * S : 2])
                G = torch.cat((hc, p["h0"][b, h, 2 * S :].to(torch.cdouble))) * turn[:, None]
                k_prev, x_prev = mode(p["k0"][b, h]) * turn, p["x0"][b, h]
            for t in range(T):
                if reset is not None and reset[b, t]:
                    G, k_prev, x_prev = torch.zeros_like(G), torch.zeros_like(k_prev), 0 * x_prev
                step = torch.cat((-1j * angles[b, t, h] * dt[b, t, h], torch.zeros(N - 2 * S)))
                rot = torch.exp(step)  # the rotation of this token's step, as a decay phase
                alpha = torch.exp(dt[b, t, h] * A[b, t, h])
                beta = (1 - trap[b, t, h]) * dt[b, t, h] * alpha
                gamma = trap[b, t, h] * dt[b, t, h]
                kc = mode(k[b, t, h])
                G = rot[:, None] * (alpha * G + beta * k_prev[:, None] * x_prev[None])
                G = G + gamma * kc[:, None] * x[b, t, h][None]
                k_prev, x_prev = rot * k_prev * 0 + kc, x[b, t, h]
                qc = mode(q[b, t, h])
                y[b, t, h] = (qc.conj()[:, None] * G).real.sum(0)
    return y


@pytest.mark.parametrize("with_state", [False, True])
def test_rotations_are_a_complex_diagonal_ssm(with_state):
    p = problem(T=19, N=7, S=3, with_state=with_state)
    reset = reset_mask(2, 19, (1, 6))
    y = mamba3_naive(*(p[n] for n in TOKENS), initial_state=state_of(p), reset=reset)[0]
    assert_rel(y, _complex_ssm(p, reset), 1e-13, "y", 1e-12)  # measured 3.3e-16 / 2.0e-15


def test_gradcheck():
    p = problem(B=1, T=5, H=1, N=4, P=2, S=2)
    names = [n for n in (*TOKENS, *STATE)]
    reset = reset_mask(1, 5, (0, 3))

    def f(*xs):
        q = dict(zip(names, xs, strict=True))
        y, S = run(q, reset=reset, chunk_size=2)
        return y, S

    inputs = [p[n].clone().requires_grad_() for n in names]
    # measured: central differences (eps 1e-6) against autograd along random directions agree to
    # 2.5e-8 relative; the bounds are gradcheck's own defaults tightened tenfold
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


def test_strong_decays_stay_finite_and_exact():
    p = problem(T=70, decay=(200.0, 400.0), dt=(1.0, 2.0))
    y, S = run(p, chunk_size=32)
    y_ref, S_ref = run(p, impl="naive")
    assert torch.isfinite(y).all() and torch.isfinite(S).all()
    assert_rel(y, y_ref, TOL64, "y", MAX64)
    assert_rel(S, S_ref, TOL64, "final state", MAX64)


def test_fp32_chunked_against_fp64_naive():
    p64 = problem(T=200, H=2, N=16, P=8, S=4)
    p32 = {n: None if x is None else x.float() for n, x in p64.items()}
    y_ref, S_ref = run(p64, impl="naive")
    y, S = run(p32, chunk_size=64)
    # measured: relative RMSE 1.8e-7 (y), 2.8e-7 (state)
    assert_rel(y.double(), y_ref, 2e-6, "y")
    assert_rel(S.double(), S_ref, 2e-6, "final state")


@pytest.mark.parametrize("cut", [1, 13, 32, 36])
def test_split_and_carry_equals_one_pass(cut):
    p = problem(T=37)
    reset = random_resets(2, 37, seed=3)
    tokens = [p[n] for n in TOKENS]
    y, state = mamba3_attention(*tokens, initial_state=state_of(p), reset=reset, chunk_size=8)
    y1, mid = mamba3_attention(
        *(t[:, :cut] for t in tokens), initial_state=state_of(p), reset=reset[:, :cut],
        chunk_size=8,
    )  # fmt: skip
    y2, end = mamba3_attention(
        *(t[:, cut:] for t in tokens), initial_state=mid, reset=reset[:, cut:], chunk_size=8
    )
    assert_rel(torch.cat((y1, y2), 1), y, TOL64, "y", MAX64)
    assert_rel(flat(end), flat(state), TOL64, "final state", MAX64)


def test_decode_steps_equal_the_chunked_forward():
    """fp32: the steps one token at a time, states carried, give the chunked prefill's outputs
    (measured: relative RMSE 1.8e-7, y and state)."""
    p = {n: None if x is None else x.float() for n, x in problem(T=23).items()}
    y, final = mamba3_attention(*(p[n] for n in TOKENS), initial_state=state_of(p), chunk_size=8)
    state, steps = state_of(p), []
    for t in range(23):
        o, state = mamba3_step(*(p[n][:, t] for n in TOKENS), state)
        steps.append(o)
    assert_rel(torch.stack(steps, 1), y, 1e-5, "y")
    assert_rel(flat(state), flat(final), 1e-5, "final state")


def test_fullgraph_compile_matches_eager():
    p = {n: None if x is None else x.float() for n, x in problem(T=21).items()}
    reset = reset_mask(2, 21, (1, 8))

    def f(*xs):
        y, state = mamba3_attention(*xs, reset=reset, chunk_size=8)
        return y, state.h

    tokens = [p[n] for n in TOKENS]
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(*tokens), f(*tokens), strict=True):
        # measured: identical (aot_eager runs the eager kernels); fp32 rounding allowed for a
        # decomposition that reorders a sum
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_fp32(dtype):
    p = {n: None if x is None else x.to(dtype) for n, x in problem(T=40).items()}
    y, state = mamba3_attention(*(p[n] for n in TOKENS), initial_state=state_of(p))
    assert y.dtype == dtype and state.h.dtype == torch.float32
    ref = mamba3_attention(
        *(p[n].float() for n in TOKENS), initial_state=Mamba3State(*(p[n].float() for n in STATE))
    )[0]
    assert_rel(y.float(), ref, 1e-2, "y")  # measured 2.1e-4 (fp16), 1.5e-3 (bf16): input rounding


BAD = [
    (dict(A=torch.zeros(2, 5, 2, 1)), ValueError, r"A: expected shape \(B, T, H\)"),
    (dict(angles=torch.zeros(2, 5, 2, 5)), ValueError, r"angles: S = 5 angles rotate 2S = 10"),
    (dict(angles=torch.zeros(2, 5, 3)), ValueError, r"angles: expected \(B, T, H, S\)"),
    (dict(x=torch.zeros(2, 5, 3, 4)), ValueError, r"v: expected \(B, T, H, V\)"),
    (dict(trap=torch.zeros(2, 5, 2, dtype=torch.long)), TypeError, r"trap"),
    (dict(initial_state=(1, 2)), TypeError, r"initial_state: expected a Mamba3State"),
    (dict(chunk_size=0), ValueError, r"chunk_size"),
    (dict(impl="fast"), ValueError, r"impl: expected one of"),
    (dict(reset=torch.zeros(2, 4, dtype=torch.bool)), ValueError, r"reset"),
]


@pytest.mark.parametrize("change, error, match", BAD)
def test_bad_input_names_the_argument(change, error, match):
    p = problem(T=5, with_state=False, dtype=torch.float32)
    kw = {n: p[n] for n in TOKENS}
    extra = {
        n: change.pop(n) for n in ("initial_state", "chunk_size", "impl", "reset") if n in change
    }
    kw.update(change)
    with pytest.raises(error, match=match):
        mamba3_attention(*(kw[n] for n in TOKENS), **extra)


def test_a_wrong_state_shape_names_its_part():
    p = problem(T=5, dtype=torch.float32)
    state = state_of(p)._replace(angle=torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match=r"initial_state.angle: expected shape \(2, 2, 3\)"):
        mamba3_attention(*(p[n] for n in TOKENS), initial_state=state)
