"""The gated delta rule (idmix.functional.delta_rule) up the reference ladder: the chunked form
against the per-step recurrence (float64, outputs, final states and the gradients of every
input), fp32 against fp64, invariants by hypothesis, compile, dtypes and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from idmix.functional.delta_rule import gated_delta_rule
from tests.helpers import (
    assert_rel,
    outputs_and_grads,
    random_resets,
    reset_mask,
    run_in_two_parts,
)


@pytest.fixture(autouse=True)
def _poisoned(request):
    """NaN-poisoned fresh allocations for every test here but the compile one (Dynamo does not
    trace under a user dispatch mode)."""
    if request.node.originalname != "test_fullgraph_compile_matches_eager":
        request.getfixturevalue("poison")


# Measured (the LADDER cases below, float64, chunked vs naive): relative RMSE ≤ 9e-16 for o,
# S_T and all six gradients, worst single position ≤ 5.2e-15 of the reference's RMS.
# Tolerances ~20× / ~40× that.
TOL64, MAX64 = 2e-14, 2e-13
# Measured fp32 chunked vs fp64 naive (T = 300, K = V = 16, generic / β≈1 L2 keys / strong
# decays): relative RMSE ≤ 2.4e-7, worst position ≤ 1.9e-6 (o and S_T). Bounds ~40× / ~25×.
TOL32, MAX32 = 1e-5, 5e-5
NAMES = ("q", "k", "v", "beta", "log_decay", "initial_state")


def problem(
    B=2,
    T=37,
    H=2,
    K=5,
    V=3,
    *,
    seed=0,
    decay=(0.0, 0.5),
    beta=(0.0, 1.0),
    l2=False,
    with_state=True,
    dtype=torch.float64,
):
    """Random inputs: -log_decay uniform in `decay`, beta uniform in `beta`; keys of norm ≈ 1
    (exactly 1 when l2), so that every step's transition I − β k kᵀ is near a contraction."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    def uniform(lo, hi, *shape):
        return lo + (hi - lo) * torch.rand(*shape, generator=g, dtype=torch.float64)

    k = randn(B, T, H, K)
    k = torch.nn.functional.normalize(k, dim=-1) if l2 else k * K**-0.5
    p = dict(
        q=randn(B, T, H, K),
        k=k,
        v=randn(B, T, H, V),
        beta=uniform(*beta, B, T, H),
        log_decay=-uniform(*decay, B, T, H),
        initial_state=randn(B, H, K, V) if with_state else None,
    )
    return {n: (x if x is None else x.to(dtype)) for n, x in p.items()}


def run(p, **kw):
    return gated_delta_rule(
        p["q"], p["k"], p["v"], p["beta"], p["log_decay"], initial_state=p["initial_state"], **kw
    )


def run_with_grads(p, **kw):
    return outputs_and_grads(run, p, **kw)


# (name, problem kwargs, chunk_size, reset positions)
LADDER = [
    ("ragged T", dict(T=37), 8, ()),
    ("T = 1", dict(T=1), 8, ()),
    ("T < chunk", dict(T=5), 16, ()),
    ("T a multiple of the chunk", dict(T=32, K=4, V=6), 8, ()),
    ("one chunk exactly", dict(T=16), 16, ()),
    ("chunk of one token", dict(T=9), 1, ()),
    ("strong decays", dict(T=37, decay=(4.5, 5.5)), 16, ()),
    ("no initial state", dict(T=21, with_state=False), 8, ()),
    # resets: at t = 0, exactly at a chunk boundary, inside a chunk, two in a row, the last token
    ("resets", dict(T=40), 8, ((0, 0), (0, 8), (1, 3), (1, 13), (1, 14), (0, 39))),
    ("resets, strong decays", dict(T=40, decay=(4.5, 5.5)), 16, ((0, 16), (1, 5), (1, 6))),
    ("L2 keys, β near 1", dict(T=37, K=4, l2=True, beta=(0.99, 1.0)), 16, ()),
    ("L2 keys, β = 1, no decay", dict(T=37, K=3, l2=True, beta=(1.0, 1.0), decay=(0, 0)), 8, ()),
    ("L2 keys, β near 1, resets", dict(T=30, l2=True, beta=(0.99, 1.0)), 8, ((0, 0), (1, 11))),
]


@pytest.mark.parametrize(
    "kw, chunk_size, reset_at", [c[1:] for c in LADDER], ids=[c[0] for c in LADDER]
)
def test_chunked_matches_naive_fp64(kw, chunk_size, reset_at):
    p = problem(**kw)
    reset = reset_mask(2, kw["T"], *reset_at) if reset_at else None
    o_ref, S_ref, g_ref = run_with_grads(p, reset=reset, impl="naive")
    o, S, g = run_with_grads(p, reset=reset, chunk_size=chunk_size)
    assert o.dtype == S.dtype == torch.float64
    assert_rel(o, o_ref, TOL64, "o", MAX64)
    assert_rel(S, S_ref, TOL64, "final state", MAX64)
    for name in g_ref:
        assert_rel(g[name], g_ref[name], TOL64, f"d{name}", MAX64)


@pytest.mark.parametrize("impl", ["chunked", "naive"])
def test_gradcheck(impl):
    """Autograd through both forms against finite differences (tiny, float64, two chunks and a
    reset inside the second)."""
    p = problem(B=1, T=5, H=1, K=2, V=2, decay=(0.2, 1.0), beta=(0.2, 0.9))
    reset = reset_mask(1, 5, (0, 4))
    leaves = [p[n].clone().requires_grad_() for n in NAMES]

    def f(q, k, v, beta, log_decay, state):
        kw = dict(initial_state=state, reset=reset, chunk_size=3, impl=impl)
        return gated_delta_rule(q, k, v, beta, log_decay, **kw)

    assert torch.autograd.gradcheck(f, leaves)


@pytest.mark.parametrize("log_decay", [-1e4, -math.inf])
def test_extreme_decays_stay_finite_and_exact(log_decay):
    """α = exp(-1e4) or exactly 0 at every third token (a reset in all but name): no inf − inf,
    no exp of a positive sum, in the forward or the backward."""
    p = problem(T=37)
    p["log_decay"][:, ::3] = log_decay
    o_ref, S_ref, g_ref = run_with_grads(p, impl="naive")
    o, S, g = run_with_grads(p, chunk_size=8)
    for x in (o, S, *g.values()):
        assert torch.isfinite(x).all()
    assert_rel(o, o_ref, TOL64, "o", MAX64)
    assert_rel(S, S_ref, TOL64, "final state", MAX64)
    for name in g_ref:
        assert_rel(g[name], g_ref[name], TOL64, f"d{name}", MAX64)


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(l2=True, beta=(0.99, 1.0), K=4, V=8), dict(decay=(4.5, 5.5))],
    ids=["generic", "L2 keys, β near 1", "strong decays"],
)
def test_fp32_chunked_against_fp64_naive(kw):
    p = problem(**{"T": 300, "K": 16, "V": 16, **kw})
    o_ref, S_ref = run(p, impl="naive")
    o, S = run({n: x.float() for n, x in p.items()}, chunk_size=64)
    assert o.dtype == S.dtype == torch.float32
    assert_rel(o, o_ref, TOL32, "o", MAX32)
    assert_rel(S, S_ref, TOL32, "final state", MAX32)


# Invariants, on random shapes, chunk sizes and document resets (float64).
dims = st.fixed_dictionaries(
    dict(
        B=st.integers(1, 2),
        T=st.integers(1, 40),
        H=st.integers(1, 2),
        K=st.integers(1, 5),
        V=st.integers(1, 4),
        seed=st.integers(0, 2**16),
        l2=st.booleans(),
    )
)
SETTINGS = settings(max_examples=20, deadline=None)


@SETTINGS
@given(d=dims, chunk_size=st.integers(1, 48), with_resets=st.booleans())
def test_any_chunk_size_gives_the_same_result(d, chunk_size, with_resets):
    p = problem(**d)
    reset = random_resets(d["B"], d["T"], d["seed"]) if with_resets else None
    o1, S1 = run(p, reset=reset, chunk_size=chunk_size)
    o2, S2 = run(p, reset=reset, chunk_size=16)
    assert_rel(o1, o2, 1e-12, "o")
    assert_rel(S1, S2, 1e-12, "final state")


@SETTINGS
@given(d=dims, frac=st.floats(0, 1), with_resets=st.booleans())
def test_split_and_carry_equals_one_pass(d, frac, with_resets):
    """[0, t) then [t, T) from the carried state equals the whole, outputs and final state."""
    p = problem(**d)
    T, cut = d["T"], int(frac * d["T"])
    reset = random_resets(d["B"], T, d["seed"]) if with_resets else None
    o_full, S_full = run(p, reset=reset, chunk_size=8)
    o, state = run_in_two_parts(run, p, NAMES[:5], cut, reset, chunk_size=8)
    assert_rel(o, o_full, 1e-12, "o")
    assert_rel(state, S_full, 1e-12, "final state")


def test_decode_steps_equal_the_chunked_forward():
    """T = 1 steps of the naive form (the decode path), carrying the state, equal one pass."""
    p = problem(T=23)
    reset = reset_mask(2, 23, (0, 7), (1, 8), (1, 9))
    o_full, S_full = run(p, reset=reset, chunk_size=8)
    state, outs = p["initial_state"], []
    for t in range(23):
        step = {n: p[n][:, t : t + 1] for n in NAMES[:5]}
        o, state = run(dict(step, initial_state=state), reset=reset[:, t : t + 1], impl="naive")
        outs.append(o)
    assert_rel(torch.cat(outs, 1), o_full, TOL64, "o", MAX64)
    assert_rel(state, S_full, TOL64, "final state", MAX64)


@SETTINGS
@given(d=dims, impl=st.sampled_from(["chunked", "naive"]), with_resets=st.booleans())
def test_beta_zero_is_pure_decay(d, impl, with_resets):
    """β = 0 writes nothing: S_t = γ_t S_0 with γ_t = Π_{r≤t} α_r (0 from a document's start
    on), so o_t = scale · γ_t S_0ᵀ q_t whatever k and v are."""
    p = problem(**d, decay=(0.0, 2.0))
    p["beta"] = torch.zeros_like(p["beta"])
    reset = random_resets(d["B"], d["T"], d["seed"], p=0.05) if with_resets else None
    o, S = run(p, reset=reset, chunk_size=8, impl=impl)
    gamma = p["log_decay"].cumsum(1).exp()  # (B, T, H)
    if reset is not None:
        gamma = gamma * (reset.cumsum(1) == 0)[..., None]
    S0 = p["initial_state"]
    expected = torch.einsum("bth,bthk,bhkv->bthv", gamma, p["q"], S0) * d["K"] ** -0.5
    assert_rel(o, expected, 1e-13, "o")
    assert_rel(S, gamma[:, -1, :, None, None] * S0, 1e-13, "final state")


@SETTINGS
@given(
    K=st.integers(1, 6),
    V=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    chunk_size=st.integers(1, 8),
    impl=st.sampled_from(["chunked", "naive"]),
)
def test_unit_writes_on_orthonormal_keys_store_v_exactly(K, V, seed, chunk_size, impl):
    """α = 1, β = 1 and orthonormal keys k_1..k_T (T ≤ K): the delta rule overwrites what the
    state holds along each key, so S_Tᵀ k_s = v_s for every s whatever S_0 was, S_0 is kept
    on the keys' orthogonal complement, and a query q_t = k_s (s ≤ t) reads back scale · v_s."""
    g = torch.Generator().manual_seed(seed)
    T = 1 + seed % K
    basis = torch.linalg.qr(torch.randn(K, K, generator=g, dtype=torch.float64))[0]
    keys = basis[:, :T].T  # (T, K), orthonormal rows
    p = problem(B=1, T=T, H=1, K=K, V=V, seed=seed)
    p["k"] = keys[None, :, None, :].clone()
    p["beta"] = torch.ones_like(p["beta"])
    p["log_decay"] = torch.zeros_like(p["log_decay"])
    reads = torch.randint(0, T, (T,), generator=g)
    reads = torch.minimum(reads, torch.arange(T))  # each q_t is some k_s with s ≤ t
    p["q"] = keys[reads][None, :, None, :].clone()
    o, S = run(p, chunk_size=chunk_size, impl=impl)
    S0, v = p["initial_state"][0, 0], p["v"][0, :, 0]
    assert_rel(keys @ S[0, 0], v, 1e-13, "S_Tᵀ k_s")
    outside = torch.eye(K, dtype=torch.float64) - keys.T @ keys
    off = (outside @ (S[0, 0] - S0)).norm()  # 0 = 0 when T = K: an absolute bound
    assert off <= 1e-13 * S0.norm(), f"S_T off the keys moved by {off:.2e}"
    assert_rel(o[0, :, 0], K**-0.5 * v[reads], 1e-13, "o_t = scale · v_s")


def test_fullgraph_compile_matches_eager():
    """torch.compile(fullgraph=True) traces the whole op, forward and backward (AOTAutograd;
    backend aot_eager to spare CI Inductor's ~25 s of C++ compile here), ragged T, resets."""
    torch._dynamo.reset()
    compiled = torch.compile(gated_delta_rule, fullgraph=True, backend="aot_eager")
    p = problem(T=21, dtype=torch.float32)
    reset = reset_mask(2, 21, (0, 0), (1, 8), (1, 13))
    leaves = {n: x.clone().requires_grad_() for n, x in p.items()}
    args = [leaves[n] for n in NAMES[:5]]
    kw = dict(initial_state=leaves["initial_state"], reset=reset, chunk_size=8)
    o_e, S_e = gated_delta_rule(*args, **kw)
    o_c, S_c = compiled(*args, **kw)
    assert_rel(o_c, o_e, 1e-6, "o")
    assert_rel(S_c, S_e, 1e-6, "final state")
    w = torch.randn(o_e.shape)
    g_e = torch.autograd.grad((o_e * w).sum() + S_e.sum(), list(leaves.values()))
    g_c = torch.autograd.grad((o_c * w).sum() + S_c.sum(), list(leaves.values()))
    for name, a, b in zip(leaves, g_c, g_e, strict=True):
        assert_rel(a, b, 1e-6, f"d{name}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_are_computed_in_fp32(dtype):
    p = problem(T=40, K=8, V=8)
    half = {n: x.to(dtype) for n, x in p.items()}
    o, S = run(half, chunk_size=16)
    assert o.dtype == dtype and S.dtype == torch.float32
    # The reference on the same rounded inputs, in fp64: only the output's rounding remains.
    o_ref, S_ref = run({n: x.double() for n, x in half.items()}, impl="naive")
    assert_rel(o, o_ref, 1e-2, "o")  # bf16 rounding of o: ~2e-3 relative
    assert_rel(S, S_ref, 1e-5, "final state")  # fp32 throughout
    o_n, S_n = run(half, impl="naive")
    assert o_n.dtype == dtype and S_n.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fp32_and_fp64_stay_as_they_are(dtype):
    p = problem(T=9, dtype=dtype)
    for impl in ("chunked", "naive"):
        o, S = run(p, chunk_size=4, impl=impl)
        assert o.dtype == S.dtype == dtype


def test_default_scale_is_inverse_sqrt_k():
    p = problem(T=11, K=5)
    o, _ = run(p)
    o1, _ = run(p, scale=1.0)
    assert_rel(o, o1 * 5**-0.5, 1e-14, "o")


def z(*shape, dtype=torch.float64, **kw):
    return torch.zeros(*shape, dtype=dtype, **kw)


# (case, overrides of valid arguments (B, T, H, K, V) = (2, 6, 2, 3, 4), error, the message's
# start: every message begins with the argument's name)
BAD = [
    ("q not a tensor", dict(q=[1.0]), TypeError, "q: expected a torch.Tensor"),
    ("q integer", dict(q=z(2, 6, 2, 3, dtype=torch.long)), TypeError, "q: expected a real floa"),
    ("q 3 dims", dict(q=z(2, 6, 2)), ValueError, "q: expected 4 dims"),
    ("k shape", dict(k=z(2, 6, 2, 4)), ValueError, "k: expected the shape of q"),
    ("v shape", dict(v=z(2, 7, 2, 4)), ValueError, r"v: expected \(B, T, H, V\)"),
    ("v dtype", dict(v=z(2, 6, 2, 4, dtype=torch.float32)), TypeError, "q, k, v: expected one"),
    ("T = 0", dict(q=z(2, 0, 2, 3), k=z(2, 0, 2, 3), v=z(2, 0, 2, 4)), ValueError, "q: .*T >= 1"),
    ("beta not a tensor", dict(beta=0.5), TypeError, "beta: expected a torch.Tensor"),
    ("beta shape", dict(beta=z(2, 6, 2, 1)), ValueError, r"beta: expected shape \(B, T, H\)"),
    ("log_decay shape", dict(log_decay=z(2, 6)), ValueError, "log_decay: expected shape"),
    ("log_decay > 0", dict(log_decay=z(2, 6, 2) + 0.1), ValueError, "log_decay: expected entries"),
    ("state shape", dict(initial_state=z(2, 2, 4, 3)), ValueError, "initial_state: expected shape"),
    ("state complex", dict(initial_state=z(2, 2, 3, 4) * 1j), TypeError, "initial_state: expected"),
    ("reset not a tensor", dict(reset=[True]), TypeError, "reset: expected a bool tensor"),
    ("reset dtype", dict(reset=z(2, 6)), ValueError, "reset: expected a bool tensor"),
    ("reset shape", dict(reset=z(2, 7, dtype=torch.bool)), ValueError, "reset: expected a bool"),
    ("reset on meta", dict(reset=z(2, 6, dtype=torch.bool, device="meta")), ValueError, "reset: "),
    ("scale a tensor", dict(scale=torch.tensor(1.0)), TypeError, "scale: expected a real number"),
    ("impl", dict(impl="fast"), ValueError, "impl: expected one of"),
    ("chunk_size 0", dict(chunk_size=0), ValueError, "chunk_size: expected a positive int"),
    ("chunk_size float", dict(chunk_size=8.0), ValueError, "chunk_size: expected a positive int"),
    ("chunk_size bool", dict(chunk_size=True), ValueError, "chunk_size: expected a positive int"),
]


@pytest.mark.parametrize("over, error, match", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
@pytest.mark.parametrize("impl", ["chunked", "naive"])
def test_bad_input_names_the_argument(over, error, match, impl):
    T = over["q"].shape[1] if isinstance(over.get("q"), torch.Tensor) else 6
    args = dict(q=z(2, T, 2, 3), k=z(2, T, 2, 3), v=z(2, T, 2, 4), beta=z(2, T, 2))
    args.update(log_decay=z(2, T, 2), impl=impl)
    args.update(over)
    with pytest.raises(error, match="^" + match):
        gated_delta_rule(**args)


def test_against_fla_naive_recurrence():
    """An independent oracle, where flash-linear-attention is installed (not a dependency):
    fla's pure-PyTorch naive_recurrent_gated_delta_rule (same recurrence, g = log α). It
    computes in fp32 whatever the input dtype; measured against our fp64 naive form: relative
    RMSE 1.0e-7, worst position 5.7e-7 (o), 5.3e-8 (S_T). Bounds ~100×."""
    fla = pytest.importorskip("fla.ops.gated_delta_rule.naive")
    p = problem(T=50, K=8, V=4, l2=True, decay=(0.0, 1.0))
    o_ref, S_ref = run(p, impl="naive")
    o_fla, S_fla = fla.naive_recurrent_gated_delta_rule(
        p["q"], p["k"], p["v"], p["beta"], p["log_decay"],
        initial_state=p["initial_state"], output_final_state=True,
    )  # fmt: skip
    assert_rel(o_fla, o_ref, 1e-5, "o (fla)", 5e-5)
    assert_rel(S_fla, S_ref, 1e-5, "final state (fla)", 5e-5)
    o, S = run(p, chunk_size=16)
    assert_rel(o_fla, o, 1e-5, "o (fla vs chunked)", 5e-5)
