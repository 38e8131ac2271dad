"""Invariants of the interdomain op, checked by hypothesis on random shapes (float64)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from idmix.functional import interdomain_attention, interdomain_decode_step, readout_gram
from tests.helpers import assert_rel, make_problem

dims = st.fixed_dictionaries(
    dict(
        B=st.integers(1, 2),
        T=st.integers(1, 80),
        H=st.integers(1, 2),
        R=st.integers(1, 5),
        D=st.integers(1, 5),
        M=st.integers(1, 5),
        seed=st.integers(0, 2**16),
        readout=st.sampled_from(["conj", "product"]),
    )
)
SETTINGS = settings(max_examples=25, deadline=None)


def op(p, readout, **kw):
    """o, or (o, final state) with output_final_state=True."""
    args = (p[n] for n in ("q", "k", "v", "lam", "beta", "C"))
    o, state = interdomain_attention(*args, readout=readout, **kw)
    return (o, state) if kw.get("output_final_state") else o


def problem(d, with_state=True):
    return make_problem(
        **{k: d[k] for k in ("B", "T", "H", "R", "D", "M", "seed")}, with_state=with_state
    )


@SETTINGS
@given(d=dims, log_chunk=st.integers(0, 7))
def test_any_chunk_size_gives_the_same_result(d, log_chunk):
    p = problem(d)
    kw = dict(initial_state=p["initial_state"], output_final_state=True)
    o1, s1 = op(p, d["readout"], chunk_size=2**log_chunk, **kw)
    o2, s2 = op(p, d["readout"], chunk_size=64, **kw)
    assert_rel(o1, o2, 1e-10, "o")
    assert_rel(s1[0], s2[0], 1e-10, "Xk")
    assert_rel(s1[1], s2[1], 1e-10, "Xv")


@SETTINGS
@given(d=dims, frac=st.floats(0, 1))
def test_split_and_carry_equals_one_pass(d, frac):
    p = problem(d)
    cut = int(frac * d["T"])
    o_full, s_full = op(
        p, d["readout"], initial_state=p["initial_state"], output_final_state=True, chunk_size=8
    )
    state = p["initial_state"]
    outs = []
    for lo, hi in ((0, cut), (cut, d["T"])):
        if hi > lo:
            part = dict(p, q=p["q"][:, lo:hi], k=p["k"][:, lo:hi], v=p["v"][:, lo:hi])
            o, state = op(
                part, d["readout"], initial_state=state, output_final_state=True, chunk_size=8
            )
            outs.append(o)
    assert_rel(torch.cat(outs, 1), o_full, 1e-10, "o")
    assert_rel(state[0], s_full[0], 1e-10, "Xk")
    assert_rel(state[1], s_full[1], 1e-10, "Xv")


@SETTINGS
@given(d=dims)
def test_decode_steps_equal_the_full_forward(d):
    p = problem(d)
    o_full, s_full = op(p, d["readout"], initial_state=p["initial_state"], output_final_state=True)
    G_hat = readout_gram(p["C"], d["readout"])
    state = p["initial_state"]
    outs = []
    for t in range(d["T"]):
        o, state = interdomain_decode_step(
            p["q"][:, t], p["k"][:, t], p["v"][:, t], p["lam"], p["beta"], G_hat, state
        )
        outs.append(o)
    assert_rel(torch.stack(outs, 1), o_full, 1e-10, "o")
    assert_rel(state[0], s_full[0], 1e-10, "Xk")


@SETTINGS
@given(d=dims, a=st.floats(-3, 3))
def test_linear_in_v_and_in_q(d, a):
    p, p2 = problem(d, with_state=False), problem(dict(d, seed=d["seed"] + 1), with_state=False)
    mixed_v = dict(p, v=p["v"] + a * p2["v"])
    assert_rel(
        op(mixed_v, d["readout"]),
        op(p, d["readout"]) + a * op(dict(p, v=p2["v"]), d["readout"]),
        1e-9,
        "v",
    )
    mixed_q = dict(p, q=p["q"] + a * p2["q"])
    assert_rel(
        op(mixed_q, d["readout"]),
        op(p, d["readout"]) + a * op(dict(p, q=p2["q"]), d["readout"]),
        1e-9,
        "q",
    )


@SETTINGS
@given(d=dims, t=st.integers(0, 79))
def test_causal(d, t):
    """Changing inputs after position t leaves outputs up to t unchanged."""
    p = problem(d)
    t = min(t, d["T"] - 1)
    noise = {n: p[n].clone() for n in ("q", "k", "v")}
    for x in noise.values():
        x[:, t + 1 :] += torch.randn_like(x[:, t + 1 :])
    o1 = op(p, d["readout"], initial_state=p["initial_state"])
    o2 = op(dict(p, **noise), d["readout"], initial_state=p["initial_state"])
    assert_rel(o2[:, : t + 1], o1[:, : t + 1], 1e-12, "prefix")


@SETTINGS
@given(d=dims)
def test_zero_keys_and_state_give_zero_output(d):
    p = problem(d, with_state=False)
    o = op(dict(p, k=torch.zeros_like(p["k"])), d["readout"])
    assert o.abs().max() == 0


@SETTINGS
@given(d=dims, phase=st.floats(-3.14, 3.14))
def test_conj_readout_ignores_a_global_phase_of_C(d, phase):
    """o = Re(Γᴴ a) depends on C only through CᴴC, so C → e^{iφ}C changes nothing."""
    p = problem(d)
    rotated = dict(p, C=p["C"] * torch.exp(torch.tensor(1j * phase, dtype=p["C"].dtype)))
    kw = dict(initial_state=p["initial_state"])
    assert_rel(op(rotated, "conj", **kw), op(p, "conj", **kw), 1e-10, "phase")


@SETTINGS
@given(d=dims, cuts=st.lists(st.integers(1, 79), max_size=4, unique=True))
def test_packed_sequences_equal_separate(d, cuts):
    """reset masks turn one row into independent sequences, whatever the chunking."""
    p = problem(dict(d, B=1), with_state=False)
    T = d["T"]
    cuts = sorted(c for c in cuts if c < T)
    reset = torch.zeros(1, T, dtype=torch.bool)
    reset[0, cuts] = True
    packed = op(p, d["readout"], reset=reset, chunk_size=8)
    bounds = [0, *cuts, T]
    separate = [
        op(dict(p, q=p["q"][:, a:b], k=p["k"][:, a:b], v=p["v"][:, a:b]), d["readout"])
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    assert_rel(packed, torch.cat(separate, 1), 1e-10, "packed")
