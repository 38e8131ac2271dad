"""Gated linear attention (idmix.functional.gated_linear), one decay per key channel (GLA) or
per head (Mamba-2 / SSD): its inputs (``problem``), ladder cases and bad-input table, which
tests/test_linear_ladder.py runs up the reference ladder with the other linear ops; here what
only GLA has: the sub-chunk split of the per-channel scores, per-head decays as a per-channel
one, zero decays and a reset at every token, its three entry points, and fla's naive
recurrences as an optional oracle."""

from __future__ import annotations

import pytest
import torch

from idmix.functional.gated_linear import chunked as gl_chunked
from idmix.functional.gated_linear import (
    gated_linear_attention,
    gated_linear_attention_chunked,
    gated_linear_attention_naive,
)
from tests.helpers import (
    assert_outputs_and_grads_match,
    assert_rel,
    outputs_and_grads,
    reset_mask,
)

pytestmark = pytest.mark.usefixtures("poison")  # NaN-poisoned fresh allocations


# Measured (the LADDER cases below, float64, chunked vs naive, both decay shapes): relative
# RMSE ≤ 4.0e-16 for o, S_T and all five gradients, worst single position ≤ 1.2e-14 of the
# reference's RMS. Tolerances ~50× / ~17× that.
TOL64, MAX64 = 2e-14, 2e-13
NAMES = ("q", "k", "v", "log_decay", "initial_state")


def problem(
    B=2,
    T=37,
    H=2,
    K=5,
    V=3,
    *,
    per_head=False,
    decay=(0.0, 0.5),
    seed=0,
    with_state=True,
    dtype=torch.float64,
):
    """Random inputs: −log_decay uniform in `decay`, (B, T, H) when per_head else (B, T, H, K);
    keys of norm ≈ 1."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    lo, hi = decay
    gate = (B, T, H) if per_head else (B, T, H, K)
    p = dict(
        q=randn(B, T, H, K),
        k=randn(B, T, H, K) * K**-0.5,
        v=randn(B, T, H, V),
        log_decay=-(lo + (hi - lo) * torch.rand(*gate, generator=g, dtype=torch.float64)),
        initial_state=randn(B, H, K, V) if with_state else None,
    )
    return {n: (x if x is None else x.to(dtype)) for n, x in p.items()}


def run(p, **kw):
    return gated_linear_attention(
        p["q"], p["k"], p["v"], p["log_decay"], initial_state=p["initial_state"], **kw
    )


def run_with_grads(p, **kw):
    return outputs_and_grads(run, p, **kw)


def assert_matches(a, b, tol=TOL64, max_tol=MAX64):
    """Two run_with_grads results agree: o, S_T and every gradient."""
    assert_outputs_and_grads_match(a, b, tol, max_tol)


# (name, problem kwargs, chunk_size, reset positions). Chunks of more than 16 tokens split into
# 16-token sub-chunks for the per-channel scores (chunked.SUB_CHUNK); 40 pads the last one.
LADDER = [
    ("ragged T", dict(T=37), 8, ()),
    ("T = 1", dict(T=1), 64, ()),
    ("T < chunk", dict(T=7), 64, ()),
    ("one chunk of 4 sub-chunks", dict(T=64), 64, ()),
    ("T = 130, chunk 64", dict(T=130), 64, ()),
    ("T = 130, chunk 40", dict(T=130, K=4, V=6), 40, ()),
    ("T a multiple of the chunk", dict(T=32, K=4, V=6), 8, ()),
    ("chunk of one token", dict(T=9), 1, ()),
    ("strong decays", dict(T=130, decay=(15.0, 20.0)), 64, ()),
    ("decays from 0 to -20", dict(T=130, decay=(0.0, 20.0)), 64, ()),
    ("no initial state", dict(T=21, with_state=False), 8, ()),
    # resets: at t = 0, at a chunk boundary, at a sub-chunk boundary, inside one, two in a row,
    # the last token
    (
        "resets",
        dict(T=130),
        64,
        ((0, 0), (0, 16), (0, 64), (1, 3), (1, 40), (1, 41), (1, 100), (0, 129)),
    ),
    ("resets, chunk 8", dict(T=40), 8, ((0, 0), (0, 8), (1, 3), (1, 13), (1, 14), (0, 39))),
    ("resets, strong decays", dict(T=90, decay=(0.0, 20.0)), 40, ((0, 40), (1, 5), (1, 6))),
]


@pytest.mark.parametrize("sub_chunk", [1, 3, 5])
def test_any_sub_chunk_gives_the_same_scores(monkeypatch, sub_chunk):
    """The per-channel scores' split (chunked.SUB_CHUNK) with sub-chunks that do or do not
    divide the chunk, strong decays and resets: the same results as the per-step form."""
    monkeypatch.setattr(gl_chunked, "SUB_CHUNK", sub_chunk)
    p = problem(T=29, decay=(0.0, 20.0))
    reset = reset_mask(2, 29, (0, 0), (0, 11), (1, 6), (1, 7))
    assert_matches(
        run_with_grads(p, reset=reset, chunk_size=13),
        run_with_grads(p, reset=reset, impl="naive"),
    )


@pytest.mark.parametrize("impl", ["chunked", "naive"])
def test_per_head_decay_equals_the_same_decay_on_every_channel(impl):
    p = problem(T=45, per_head=True, decay=(0.0, 3.0))
    wide = {**p, "log_decay": p["log_decay"][..., None].expand(p["q"].shape).contiguous()}
    reset = reset_mask(2, 45, (0, 20), (1, 0))
    a = run_with_grads(p, reset=reset, chunk_size=32, impl=impl)
    b = run_with_grads(wide, reset=reset, chunk_size=32, impl=impl)
    assert_rel(a[0], b[0], TOL64, "o", MAX64)
    assert_rel(a[1], b[1], TOL64, "final state", MAX64)
    for n in ("q", "k", "v", "initial_state"):
        assert_rel(a[2][n], b[2][n], TOL64, f"d{n}", MAX64)
    # the per-head gradient is the per-channel one summed over the channels
    assert_rel(a[2]["log_decay"], b[2]["log_decay"].sum(-1), TOL64, "dlog_decay", MAX64)


@pytest.mark.parametrize("impl", ["chunked", "naive"])
def test_zero_decay_and_a_reset_at_every_token_are_exact(impl):
    """log α = 0 everywhere: plain causal linear attention, S_T = S_0 + Σ k vᵀ. A reset at
    every token: o_t = scale (q_t·k_t) v_t and S_T = k_T v_Tᵀ."""
    p = problem(T=40, decay=(0.0, 0.0))
    o, S = run(p, chunk_size=32, impl=impl)
    want = p["initial_state"] + torch.einsum("bthk,bthv->bhkv", p["k"], p["v"])
    assert_rel(S, want, TOL64, "S_T", MAX64)
    every = torch.ones(2, 40, dtype=torch.bool)
    o, S = run(p, chunk_size=32, reset=every, impl=impl)
    scale = p["q"].shape[-1] ** -0.5
    assert_rel(o, scale * (p["q"] * p["k"]).sum(-1, keepdim=True) * p["v"], TOL64, "o", MAX64)
    assert_rel(S, p["k"][:, -1, :, :, None] * p["v"][:, -1, :, None, :], TOL64, "S_T", MAX64)


def test_default_scale_is_inverse_sqrt_k_and_the_entry_points_agree():
    p = problem(T=11, K=5)
    o, S = run(p)
    o1, _ = run(p, scale=1.0)
    assert_rel(o, o1 * 5**-0.5, 1e-14, "o")
    args = [p[n] for n in NAMES[:4]]
    o_c, S_c = gated_linear_attention_chunked(*args, initial_state=p["initial_state"])
    o_n, S_n = gated_linear_attention_naive(*args, initial_state=p["initial_state"])
    assert torch.equal(o_c, o) and torch.equal(S_c, S)
    assert_rel(o_n, o, TOL64, "o (naive)", MAX64)
    assert_rel(S_n, S, TOL64, "final state (naive)", MAX64)


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
    ("log_decay a float", dict(log_decay=-0.5), TypeError, "log_decay: expected a torch.Tensor"),
    ("log_decay integer", dict(log_decay=z(2, 6, 2, dtype=torch.long)), TypeError, "log_decay:"),
    ("log_decay (B, T)", dict(log_decay=z(2, 6)), ValueError, "log_decay: expected shape"),
    ("log_decay K", dict(log_decay=z(2, 6, 2, 4)), ValueError, "log_decay: expected shape"),
    ("log_decay (B, T, 1)", dict(log_decay=z(2, 6, 1)), ValueError, "log_decay: expected shape"),
    ("log_decay > 0", dict(log_decay=z(2, 6, 2, 3) + 0.1), ValueError, "log_decay: expected ent"),
    ("log_decay > 0 per head", dict(log_decay=z(2, 6, 2) + 1), ValueError, "log_decay: expected"),
    ("state shape", dict(initial_state=z(2, 2, 4, 3)), ValueError, "initial_state: expected shape"),
    ("state complex", dict(initial_state=z(2, 2, 3, 4) * 1j), TypeError, "initial_state: expected"),
    ("reset not a tensor", dict(reset=[True]), TypeError, "reset: expected a bool tensor"),
    ("reset dtype", dict(reset=z(2, 6)), ValueError, "reset: expected a bool tensor"),
    ("reset shape", dict(reset=z(2, 7, dtype=torch.bool)), ValueError, "reset: expected a bool"),
    ("reset on meta", dict(reset=z(2, 6, dtype=torch.bool, device="meta")), ValueError, "reset: "),
    ("scale a tensor", dict(scale=torch.tensor(1.0)), TypeError, "scale: expected a real number"),
    ("scale a string", dict(scale="1"), TypeError, "scale: expected a real number"),
    ("impl", dict(impl="fast"), ValueError, "impl: expected one of"),
    ("chunk_size 0", dict(chunk_size=0), ValueError, "chunk_size: expected a positive int"),
    ("chunk_size -1", dict(chunk_size=-1), ValueError, "chunk_size: expected a positive int"),
    ("chunk_size float", dict(chunk_size=8.0), ValueError, "chunk_size: expected a positive int"),
    ("chunk_size bool", dict(chunk_size=True), ValueError, "chunk_size: expected a positive int"),
]


def test_the_entry_points_check_their_arguments():
    args = [z(2, 6, 2, 3), z(2, 6, 2, 3), z(2, 6, 2, 4), z(2, 6, 2) + 1]
    with pytest.raises(ValueError, match="^log_decay: expected entries"):
        gated_linear_attention_naive(*args)
    with pytest.raises(ValueError, match="^log_decay: expected entries"):
        gated_linear_attention_chunked(*args)
    with pytest.raises(ValueError, match="^chunk_size: expected a positive int"):
        gated_linear_attention_chunked(*args[:3], z(2, 6, 2), chunk_size=0)


@pytest.mark.parametrize("per_head", [False, True], ids=["per channel", "per head"])
def test_against_fla_naive_recurrences(per_head):
    """An independent oracle, where flash-linear-attention is installed (not a dependency):
    fla's pure-PyTorch naive_recurrent_gla (per-channel gk = log α, (B, T, H, K)) and
    naive_recurrent_simple_gla (per-head g = log α, (B, T, H)); both take (B, T, H, ·), use
    scale K**-0.5 and compute in fp32 whatever the input dtype (fla 0.6.0; its Triton kernels
    do not run on CPU). Measured against our fp64 naive form (T = 130, −log α in (0, 20)):
    relative RMSE ≤ 8.9e-8, worst position ≤ 7.4e-7 (o); ≤ 5.3e-8 / 2.2e-7 (S_T); fla vs
    our fp32 chunked form: ≤ 1.0e-7 / 1.4e-6 (o). Bounds ~100× / ~35×."""
    if per_head:
        fn = pytest.importorskip("fla.ops.simple_gla.naive").naive_recurrent_simple_gla
    else:
        fn = pytest.importorskip("fla.ops.gla.naive").naive_recurrent_gla
    p = problem(T=130, K=8, V=4, per_head=per_head, decay=(0.0, 20.0))
    o_ref, S_ref = run(p, impl="naive")
    o_fla, S_fla = fn(
        p["q"], p["k"], p["v"], p["log_decay"],
        initial_state=p["initial_state"], output_final_state=True,
    )  # fmt: skip
    assert_rel(o_fla, o_ref, 1e-5, "o (fla)", 5e-5)
    assert_rel(S_fla, S_ref, 1e-5, "final state (fla)", 5e-5)
    o, _ = run({n: x.float() for n, x in p.items()}, chunk_size=64)
    assert_rel(o_fla, o, 1e-5, "o (fla vs chunked fp32)", 5e-5)
