"""torch.autograd.gradcheck in float64 on every primitive."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck

from idmix.functional import (
    complex_A,
    discretize,
    interdomain_attention,
    interdomain_decode_step,
    readout_gram,
    short_conv,
    short_conv_step,
    silu_l2_feature_map,
)
from tests.helpers import make_problem


def leaf(x):
    return x.detach().clone().requires_grad_()


def test_feature_map():
    assert gradcheck(silu_l2_feature_map, (leaf(torch.randn(3, 2, 5, dtype=torch.float64)),))


def test_short_conv_with_cache():
    x, w, b = torch.randn(2, 6, 3), torch.randn(3, 4), torch.randn(3)
    cache = torch.randn(2, 3, 3)
    args = tuple(leaf(t.double()) for t in (x, w, b, cache))
    assert gradcheck(lambda *a: short_conv(*a)[0], args)
    assert gradcheck(lambda x, w, b, c: short_conv_step(x[:, 0], w, b, c), args)


@pytest.mark.parametrize("method", ["zoh", "bilinear"])
def test_discretize(method):
    dt = leaf(torch.rand(2, dtype=torch.float64) * 0.1 + 0.01)
    log_re, im = (
        leaf(torch.randn(2, 3, dtype=torch.float64)),
        leaf(torch.randn(2, 3, dtype=torch.float64)),
    )
    assert gradcheck(lambda d, a, b: discretize(d, complex_A(a, b), method), (dt, log_re, im))


@pytest.mark.parametrize("readout", ["conj", "product"])
def test_readout_gram(readout):
    C = leaf(torch.randn(2, 3, 3, dtype=torch.complex128))
    assert gradcheck(lambda c: readout_gram(c, readout), (C,))


@pytest.mark.parametrize("impl", ["chunked", "recurrent"])
@pytest.mark.parametrize("readout", ["conj", "product"])
@pytest.mark.parametrize("with_reset", [False, True])
def test_interdomain_op(impl, readout, with_reset, small_segments):
    p = make_problem(B=2, T=19 if impl == "chunked" else 6, H=1, R=2, D=2, M=2)
    args = [leaf(p[n]) for n in ("q", "k", "v", "lam", "beta", "C")] + [
        leaf(s) for s in p["initial_state"]
    ]

    T = p["q"].shape[1]
    reset = torch.zeros(2, T, dtype=torch.bool)
    reset[0, [0, T // 2]] = True  # row 0: drops its initial state, then restarts mid-way

    def f(q, k, v, lam, beta, C, Xk, Xv):
        o, (Xk1, Xv1) = interdomain_attention(
            q,
            k,
            v,
            lam,
            beta,
            C,
            readout=readout,
            impl=impl,
            initial_state=(Xk, Xv),
            chunk_size=4,
            reset=reset if with_reset else None,
            output_final_state=True,
        )
        return o, torch.view_as_real(Xk1), torch.view_as_real(Xv1)

    assert gradcheck(f, args)


def test_decode_step():
    p = make_problem(B=2, T=1, H=2, R=3, D=2, M=3)
    args = [
        leaf(p["q"][:, 0]),
        leaf(p["k"][:, 0]),
        leaf(p["v"][:, 0]),
        leaf(p["lam"]),
        leaf(p["beta"]),
        leaf(readout_gram(p["C"])),
    ] + [leaf(s) for s in p["initial_state"]]

    def f(q, k, v, lam, beta, G, Xk, Xv):
        o, (Xk1, Xv1) = interdomain_decode_step(q, k, v, lam, beta, G, (Xk, Xv))
        return o, torch.view_as_real(Xk1), torch.view_as_real(Xv1)

    assert gradcheck(f, args)
