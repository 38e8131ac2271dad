"""Packed variable-length sequences (cu_seqlens): each sequence runs as if alone, with its own
initial and final state; outputs, states and gradients equal separate calls."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from idmix.functional import interdomain_attention
from tests.helpers import assert_rel, make_problem

# every op here runs with fresh allocations poisoned to NaN (tests/helpers.PoisonEmpty)
pytestmark = pytest.mark.usefixtures("poison")


def packed_problem(lengths, H=2, R=3, D=4, M=5, dtype=torch.float64, seed=0):
    S, N = sum(lengths), len(lengths)
    p = make_problem(B=N, T=1, H=H, R=R, D=D, M=M, dtype=dtype, seed=seed)  # params + states
    g = torch.Generator().manual_seed(seed + 1)
    for name, F in (("q", R), ("k", R), ("v", D)):
        p[name] = torch.randn(1, S, H, F, generator=g, dtype=torch.float64).to(dtype)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    return p, offsets


def separately(p, cu, init, readout="conj"):
    """Each sequence through interdomain_attention on its own."""
    outs, xks, xvs = [], [], []
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        state = None if init is None else (init[0][i : i + 1], init[1][i : i + 1])
        o, (xk, xv) = interdomain_attention(
            *(p[n][:, a:b] for n in ("q", "k", "v")),
            p["lam"],
            p["beta"],
            p["C"],
            readout=readout,
            initial_state=state,
            chunk_size=4,
            output_final_state=True,
        )
        outs.append(o)
        xks.append(xk)
        xvs.append(xv)
    return torch.cat(outs, 1), (torch.cat(xks), torch.cat(xvs))


@pytest.mark.parametrize("readout", ["conj", "product"])
@pytest.mark.parametrize("with_init", [False, True])
def test_varlen_equals_separate_calls_with_gradients(readout, with_init):
    lengths = [1, 7, 16, 3, 7, 40, 1]
    p, cu = packed_problem(lengths)
    leaves = {n: p[n].clone().requires_grad_() for n in ("q", "k", "v", "lam", "beta", "C")}
    init = tuple(s.clone().requires_grad_() for s in p["initial_state"]) if with_init else None
    o, (xk, xv) = interdomain_attention(
        *(leaves[n] for n in ("q", "k", "v", "lam", "beta", "C")),
        cu_seqlens=cu,
        readout=readout,
        initial_state=init,
        chunk_size=4,
        output_final_state=True,
    )
    ref_o, (ref_xk, ref_xv) = separately(leaves, cu, init, readout)
    for got, ref, what in ((o, ref_o, "o"), (xk, ref_xk, "Xk"), (xv, ref_xv, "Xv")):
        assert_rel(got, ref, 1e-12, what)
    g = torch.Generator().manual_seed(3)
    weights = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (o,)]

    def loss(o_, xk_, xv_):
        return (o_ * weights[0]).sum() + (xk_.abs() ** 2).sum() + xv_.real.sum()

    wrt = [*leaves.values(), *(init or ())]
    got = torch.autograd.grad(loss(o, xk, xv), wrt)
    ref = torch.autograd.grad(loss(ref_o, ref_xk, ref_xv), wrt)
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert_rel(a, b, 1e-11, f"grad {i}")


@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(1, 20), min_size=1, max_size=6), seed=st.integers(0, 99))
def test_packed_fast_path_equals_grouped_path(lengths, seed):
    """Without states, the one-call packed path (resets) equals the per-length batched path."""
    p, cu = packed_problem(lengths, seed=seed)
    args = [p[n] for n in ("q", "k", "v", "lam", "beta", "C")]
    fast, _ = interdomain_attention(*args, cu_seqlens=cu, chunk_size=8)
    grouped, _ = interdomain_attention(*args, cu_seqlens=cu, chunk_size=8, output_final_state=True)
    assert_rel(fast, grouped, 1e-12, "fast vs grouped")


def test_bad_cu_seqlens_are_named():
    p, cu = packed_problem([3, 4])
    args = [p[n] for n in ("q", "k", "v", "lam", "beta", "C")]
    for bad in (torch.tensor([0, 3, 3, 7]), torch.tensor([0, 3, 6]), torch.tensor([1, 7])):
        with pytest.raises(ValueError, match="cu_seqlens: expected strictly increasing"):
            interdomain_attention(*args, cu_seqlens=bad)[0]
    with pytest.raises(ValueError, match="cu_seqlens: expected a 1-d int"):
        interdomain_attention(*args, cu_seqlens=torch.tensor([0.0, 7.0]))[0]
    with pytest.raises(ValueError, match="initial_state"):
        interdomain_attention(
            *args, cu_seqlens=cu, initial_state=tuple(s[:1] for s in p["initial_state"])
        )[0]
    q2 = p["q"].expand(2, -1, -1, -1)
    with pytest.raises(ValueError, match="packed batch of 1 row"):
        interdomain_attention(q2, q2, p["v"].expand(2, -1, -1, -1), *args[3:], cu_seqlens=cu)[0]


@pytest.mark.parametrize("with_state", [False, True])
def test_real_form_equals_the_complex_api(with_state):
    """cu_seqlens in the real form, on the runtime contract ((N, H, R+D, 2M) interleaved
    states, interleaved Ĝ) equals the complex API it backs, outputs and final states."""
    from idmix.functional import interdomain_attention, readout_gram, state_to_interleaved

    p, cu = packed_problem([5, 1, 9, 5])
    init = p["initial_state"] if with_state else None
    o, (xk, xv) = interdomain_attention(
        p["q"],
        p["k"],
        p["v"],
        p["lam"],
        p["beta"],
        p["C"],
        cu_seqlens=cu,
        initial_state=init,
        chunk_size=4,
        output_final_state=True,
    )
    o_r, Z = interdomain_attention(
        p["q"],
        p["k"],
        p["v"],
        torch.view_as_real(p["lam"]),
        torch.view_as_real(p["beta"]),
        readout_gram(p["C"]),
        cu_seqlens=cu,
        initial_state=None if init is None else state_to_interleaved(*init),
        chunk_size=4,
        output_final_state=True,
    )
    assert_rel(o_r, o, 1e-13, "output")
    assert_rel(Z, state_to_interleaved(xk, xv), 1e-13, "final states")
