"""The gated delta rule (idmix.functional.delta_rule): its inputs (``problem``), ladder cases and
bad-input table, which tests/test_linear_ladder.py runs up the reference ladder with the other
linear ops; here what only the delta rule has: β = 0 is pure decay, unit writes on orthonormal
keys store v exactly, the default scale, and fla's naive recurrence as an optional oracle."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from idmix.functional.delta_rule import gated_delta_rule
from tests.helpers import (
    assert_rel,
    random_resets,
)

pytestmark = pytest.mark.usefixtures("poison")  # NaN-poisoned fresh allocations


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
