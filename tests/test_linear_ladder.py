"""The linear baselines' ops up one reference ladder, parametrised by op: the gated delta rule
(idmix.functional.delta_rule) and gated linear attention (idmix.functional.gated_linear) with
one decay per key channel (GLA) and one per head (Mamba-2 / SSD). For each: the chunked form
against the per-step recurrence (float64: outputs, final states and the gradients of every
input), finite differences, extreme decays, fp32 against fp64, invariants by hypothesis, decode
steps, compile, dtypes and bad input. What only one op has (the delta rule's erase, GLA's
sub-chunks, fla's oracles) stays in tests/test_delta_rule.py and tests/test_gated_linear.py."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from idmix.functional.delta_rule import gated_delta_rule
from idmix.functional.gated_linear import chunked as gl_chunked
from idmix.functional.gated_linear import gated_linear_attention
from tests.helpers import (
    assert_outputs_and_grads_match,
    assert_rel,
    outputs_and_grads,
    random_resets,
    reset_mask,
    run_in_two_parts,
)
from tests.test_delta_rule import BAD as DELTA_BAD
from tests.test_delta_rule import LADDER as DELTA_LADDER
from tests.test_delta_rule import problem as delta_problem
from tests.test_gated_linear import BAD as GLA_BAD
from tests.test_gated_linear import LADDER as GLA_LADDER
from tests.test_gated_linear import problem as gla_problem


@pytest.fixture(autouse=True)
def _poisoned(request):
    """NaN-poisoned fresh allocations for every test here but the compile one (Dynamo does not
    trace under a user dispatch mode)."""
    if request.node.originalname != "test_fullgraph_compile_matches_eager":
        request.getfixturevalue("poison")


@dataclass(frozen=True)
class Op:
    """One op on the ladder. tokens: its per-token inputs in call order (initial_state follows
    by keyword); problem(**kw) -> inputs by name (float64 unless dtype=); fixed: what problem
    always gets for this op; tol64/tol32: (relative RMSE, worst position) bounds, from the
    errors measured in the op's own test file; the rest: each test's sizes for this op."""

    fn: Callable
    problem: Callable
    tokens: tuple[str, ...]
    ladder: list
    bad: list
    tol64: tuple[float, float]
    tol32: tuple[float, float]
    fp32_cases: dict[str, dict]
    fixed: dict = field(default_factory=dict)
    gradcheck: dict = field(default_factory=dict)
    sub_chunk: int | None = None  # GLA's per-channel scores split, set small for gradcheck
    extreme: tuple[int, int] = (37, 8)  # (T, chunk)
    decode: tuple[int, int, tuple] = (23, 8, ((0, 7), (1, 8), (1, 9)))  # (T, chunk, resets)
    compile: tuple[int, int, tuple] = (21, 8, ((0, 0), (1, 8), (1, 13)))
    half_chunk: int = 16
    fp32_gate: bool = False  # the half test keeps log_decay in fp32 (a gate beside activations)
    carry_chunk: int = 8
    any_chunk_decay: tuple[float, float] | None = None
    variant: str | None = None  # a boolean option of problem the invariants draw (the delta
    # rule's L2-normalised keys)

    def make(self, variant: bool = False, **kw):
        """problem(**kw) with this op's fixed options; variant: turn on ``self.variant``."""
        extra = {self.variant: variant} if self.variant else {}
        return self.problem(**{**self.fixed, **extra, **kw})

    def run(self, p, **kw):
        args = [p[n] for n in self.tokens]
        return self.fn(*args, initial_state=p["initial_state"], **kw)


GLA = dict(
    fn=gated_linear_attention,
    problem=gla_problem,
    tokens=("q", "k", "v", "log_decay"),
    ladder=GLA_LADDER,
    bad=GLA_BAD,
    # measured (test_gated_linear.py): ≤ 4.0e-16 / 1.2e-14 in fp64; ≤ 1.0e-7 / 1.4e-6 in fp32
    tol64=(2e-14, 2e-13),
    tol32=(2e-6, 2e-5),
    fp32_cases={
        "decay (0, 1)": dict(decay=(0.0, 1.0)),
        "decay (0, 20)": dict(decay=(0.0, 20.0)),
        "decay (15, 20)": dict(decay=(15.0, 20.0)),
    },
    gradcheck=dict(T=7, chunk_size=4, reset=(0, 5)),
    sub_chunk=2,
    extreme=(70, 32),
    decode=(40, 32, ((0, 7), (1, 17), (1, 18))),
    compile=(45, 32, ((0, 0), (1, 9), (1, 40))),
    half_chunk=32,
    fp32_gate=True,
    carry_chunk=20,
    any_chunk_decay=(0.0, 5.0),
)
OPS = {
    "delta rule": Op(
        fn=gated_delta_rule,
        problem=delta_problem,
        tokens=("q", "k", "v", "beta", "log_decay"),
        ladder=DELTA_LADDER,
        bad=DELTA_BAD,
        # measured (test_delta_rule.py): ≤ 9e-16 / 5.2e-15 in fp64; ≤ 2.4e-7 / 1.9e-6 in fp32
        tol64=(2e-14, 2e-13),
        tol32=(1e-5, 5e-5),
        fp32_cases={
            "generic": dict(),
            "L2 keys, β near 1": dict(l2=True, beta=(0.99, 1.0), K=4, V=8),
            "strong decays": dict(decay=(4.5, 5.5)),
        },
        gradcheck=dict(T=5, chunk_size=3, reset=(0, 4), beta=(0.2, 0.9)),
        variant="l2",
    ),
    "GLA per channel": Op(**GLA, fixed=dict(per_head=False)),
    "Mamba-2 per head": Op(**GLA, fixed=dict(per_head=True)),
}


def assert_matches(op: Op, got, ref):
    """Two outputs_and_grads results agree: o, S_T and every gradient, within op.tol64."""
    assert_outputs_and_grads_match(got, ref, *op.tol64)


LADDER_CASES = [
    pytest.param(name, *case[1:], id=f"{name}: {case[0]}")
    for name, op in OPS.items()
    for case in op.ladder
]


@pytest.mark.parametrize("name, kw, chunk_size, reset_at", LADDER_CASES)
def test_chunked_matches_naive_fp64(name, kw, chunk_size, reset_at):
    op = OPS[name]
    p = op.make(**kw)
    reset = reset_mask(2, kw["T"], *reset_at) if reset_at else None
    ref = outputs_and_grads(op.run, p, reset=reset, impl="naive")
    got = outputs_and_grads(op.run, p, reset=reset, chunk_size=chunk_size)
    assert got[0].dtype == got[1].dtype == torch.float64
    for x in (got[0], got[1], *got[2].values()):
        assert torch.isfinite(x).all()
    assert_matches(op, got, ref)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("impl", ["chunked", "naive"])
def test_gradcheck(monkeypatch, name, impl):
    """Autograd through both forms against finite differences (tiny, float64: two chunks, a
    reset inside the second; GLA's chunks split in two sub-chunks)."""
    op = OPS[name]
    if op.sub_chunk is not None:
        monkeypatch.setattr(gl_chunked, "SUB_CHUNK", op.sub_chunk)
    g = op.gradcheck
    extra = {k: v for k, v in g.items() if k not in ("T", "chunk_size", "reset")}
    p = op.make(B=1, T=g["T"], H=1, K=2, V=2, decay=(0.2, 1.0), **extra)
    reset = reset_mask(1, g["T"], g["reset"])
    names = [*op.tokens, "initial_state"]
    leaves = [p[n].clone().requires_grad_() for n in names]

    def f(*xs):
        kw = dict(initial_state=xs[-1], reset=reset, chunk_size=g["chunk_size"], impl=impl)
        return op.fn(*xs[:-1], **kw)

    assert torch.autograd.gradcheck(f, leaves)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("log_decay", [-1e4, -math.inf])
def test_extreme_decays_stay_finite_and_exact(name, log_decay):
    """α = exp(−1e4) or exactly 0 at every third token (a reset in all but name): no inf − inf,
    no exp of a positive sum, in the forward or the backward."""
    op = OPS[name]
    T, chunk = op.extreme
    p = op.make(T=T)
    p["log_decay"][:, ::3] = log_decay
    ref = outputs_and_grads(op.run, p, impl="naive")
    got = outputs_and_grads(op.run, p, chunk_size=chunk)
    for x in (got[0], got[1], *got[2].values()):
        assert torch.isfinite(x).all()
    assert_matches(op, got, ref)


FP32_CASES = [
    pytest.param(name, kw, id=f"{name}: {case}")
    for name, op in OPS.items()
    for case, kw in op.fp32_cases.items()
]


@pytest.mark.parametrize("name, kw", FP32_CASES)
def test_fp32_chunked_against_fp64_naive(name, kw):
    op = OPS[name]
    p = op.make(**{"T": 300, "K": 16, "V": 16, **kw})
    o_ref, S_ref = op.run(p, impl="naive")
    o, S = op.run({n: x.float() for n, x in p.items()}, chunk_size=64)
    assert o.dtype == S.dtype == torch.float32
    assert_rel(o, o_ref, op.tol32[0], "o", op.tol32[1])
    assert_rel(S, S_ref, op.tol32[0], "final state", op.tol32[1])


# Invariants, on random shapes, chunk sizes and document resets (float64).
dims = st.fixed_dictionaries(
    dict(
        B=st.integers(1, 2),
        T=st.integers(1, 50),
        H=st.integers(1, 2),
        K=st.integers(1, 5),
        V=st.integers(1, 4),
        seed=st.integers(0, 2**16),
        variant=st.booleans(),
    )
)
SETTINGS = settings(max_examples=15, deadline=None)


@pytest.mark.parametrize("name", OPS)
@SETTINGS
@given(d=dims, chunk_size=st.integers(1, 48), with_resets=st.booleans())
def test_any_chunk_size_gives_the_same_result(name, d, chunk_size, with_resets):
    op = OPS[name]
    decay = {} if op.any_chunk_decay is None else {"decay": op.any_chunk_decay}
    p = op.make(**d, **decay)
    reset = random_resets(d["B"], d["T"], d["seed"]) if with_resets else None
    o1, S1 = op.run(p, reset=reset, chunk_size=chunk_size)
    o2, S2 = op.run(p, reset=reset, chunk_size=16)
    assert_rel(o1, o2, 1e-12, "o")
    assert_rel(S1, S2, 1e-12, "final state")


@pytest.mark.parametrize("name", OPS)
@SETTINGS
@given(d=dims, frac=st.floats(0, 1), with_resets=st.booleans())
def test_split_and_carry_equals_one_pass(name, d, frac, with_resets):
    """[0, t) then [t, T) from the carried state equals the whole, outputs and final state."""
    op = OPS[name]
    p = op.make(**d)
    T, cut = d["T"], int(frac * d["T"])
    reset = random_resets(d["B"], T, d["seed"]) if with_resets else None
    o_full, S_full = op.run(p, reset=reset, chunk_size=op.carry_chunk)
    o, state = run_in_two_parts(op.run, p, op.tokens, cut, reset, chunk_size=op.carry_chunk)
    assert_rel(o, o_full, 1e-12, "o")
    assert_rel(state, S_full, 1e-12, "final state")


@pytest.mark.parametrize("name", OPS)
def test_decode_steps_equal_the_chunked_forward(name):
    """T = 1 steps of the naive form (the decode path), carrying the state, equal one pass."""
    op = OPS[name]
    T, chunk, resets = op.decode
    p = op.make(T=T)
    reset = reset_mask(2, T, *resets)
    o_full, S_full = op.run(p, reset=reset, chunk_size=chunk)
    state, outs = p["initial_state"], []
    for t in range(T):
        step = {n: p[n][:, t : t + 1] for n in op.tokens}
        o, state = op.run(dict(step, initial_state=state), reset=reset[:, t : t + 1], impl="naive")
        outs.append(o)
    assert_rel(torch.cat(outs, 1), o_full, op.tol64[0], "o", op.tol64[1])
    assert_rel(state, S_full, op.tol64[0], "final state", op.tol64[1])


@pytest.mark.parametrize("name", OPS)
def test_fullgraph_compile_matches_eager(name):
    """torch.compile(fullgraph=True) traces the whole op, forward and backward (AOTAutograd;
    backend aot_eager to spare CI Inductor's C++ compile), ragged T, resets."""
    op = OPS[name]
    T, chunk, resets = op.compile
    torch._dynamo.reset()
    compiled = torch.compile(op.fn, fullgraph=True, backend="aot_eager")
    p = op.make(T=T, dtype=torch.float32)
    reset = reset_mask(2, T, *resets)
    leaves = {n: x.clone().requires_grad_() for n, x in p.items()}
    args = [leaves[n] for n in op.tokens]
    kw = dict(initial_state=leaves["initial_state"], reset=reset, chunk_size=chunk)
    o_e, S_e = op.fn(*args, **kw)
    o_c, S_c = compiled(*args, **kw)
    assert_rel(o_c, o_e, 1e-6, "o")
    assert_rel(S_c, S_e, 1e-6, "final state")
    w = torch.randn(o_e.shape)
    g_e = torch.autograd.grad((o_e * w).sum() + S_e.sum(), list(leaves.values()))
    g_c = torch.autograd.grad((o_c * w).sum() + S_c.sum(), list(leaves.values()))
    for leaf, a, b in zip(leaves, g_c, g_e, strict=True):
        assert_rel(a, b, 1e-6, f"d{leaf}")


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_are_computed_in_fp32(name, dtype):
    op = OPS[name]
    p = op.make(T=40, K=8, V=8)
    half = {n: x.to(dtype) for n, x in p.items()}
    if op.fp32_gate:
        half["log_decay"] = p["log_decay"].float()
    o, S = op.run(half, chunk_size=op.half_chunk)
    assert o.dtype == dtype and S.dtype == torch.float32
    # The reference on the same rounded inputs, in fp64: only the output's rounding remains.
    o_ref, S_ref = op.run({n: x.double() for n, x in half.items()}, impl="naive")
    assert_rel(o, o_ref, 1e-2, "o")  # bf16 rounding of o: ~2e-3 relative
    assert_rel(S, S_ref, 1e-5, "final state")  # fp32 throughout
    o_n, S_n = op.run(half, impl="naive")
    assert o_n.dtype == dtype and S_n.dtype == torch.float32


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fp32_and_fp64_stay_as_they_are(name, dtype):
    op = OPS[name]
    p = op.make(T=9, dtype=dtype)
    for impl in ("chunked", "naive"):
        o, S = op.run(p, chunk_size=4, impl=impl)
        assert o.dtype == S.dtype == dtype


def z(*shape, dtype=torch.float64, **kw):
    return torch.zeros(*shape, dtype=dtype, **kw)


BAD_CASES = [
    pytest.param(name, *case[1:], id=f"{name}: {case[0]}")
    for name in ("delta rule", "GLA per channel")
    for case in OPS[name].bad
]


@pytest.mark.parametrize("name, over, error, match", BAD_CASES)
@pytest.mark.parametrize("impl", ["chunked", "naive"])
def test_bad_input_names_the_argument(name, over, error, match, impl):
    """Valid arguments (B, T, H, K, V) = (2, T, 2, 3, 4) with one overridden: every message
    begins with the argument's name."""
    T = over["q"].shape[1] if isinstance(over.get("q"), torch.Tensor) else 6
    args = dict(q=z(2, T, 2, 3), k=z(2, T, 2, 3), v=z(2, T, 2, 4), impl=impl)
    if name == "delta rule":
        args.update(beta=z(2, T, 2), log_decay=z(2, T, 2))
    else:
        args.update(log_decay=z(2, T, 2, 3))
    args.update(over)
    with pytest.raises(error, match="^" + match):
        OPS[name].fn(**args)
