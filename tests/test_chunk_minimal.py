"""The minimal chunked listing (interdomain/chunk_minimal.py) vs the per-step complex reference
in float64: outputs, final states and the gradients of every input, on ragged lengths."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from idmix.functional import interdomain_attention_naive
from idmix.functional.interdomain import chunk_minimal
from tests.helpers import make_problem, max_rel_error

# Measured (worst position relative to the reference's RMS, over every case below): outputs
# ≤ 1.0e-14, final states ≤ 6.1e-15, gradients ≤ 7.7e-15. The bound leaves four orders of
# margin; a wrong term (e.g. the padding let into the last state) shows at 1e-2 and up.
TOL = 1e-10
PARAMS = ("q", "k", "v", "lam", "beta", "C")


def forward_backward(fn, p, with_state, **kw):
    """(o, Xk, Xv, grads of q, k, v, lam, beta, C and the initial state if any) under a fixed
    random real functional of the output and the final state."""
    leaves = {n: p[n].detach().clone().requires_grad_() for n in PARAMS}
    state = None
    if with_state:
        state = tuple(s.detach().clone().requires_grad_() for s in p["initial_state"])
    o, (Xk, Xv) = fn(*leaves.values(), initial_state=state, **kw)
    g = torch.Generator().manual_seed(1)
    loss = (o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum()
    loss = loss + (Xk * torch.randn(Xk.shape, generator=g, dtype=Xk.dtype)).real.sum()
    loss = loss + (Xv * torch.randn(Xv.shape, generator=g, dtype=Xv.dtype)).imag.sum()
    names = [*PARAMS, *(("Xk0", "Xv0") if with_state else ())]
    grads = torch.autograd.grad(loss, [*leaves.values(), *(state or ())])
    return {"o": o, "Xk": Xk, "Xv": Xv, **{f"d{n}": x for n, x in zip(names, grads, strict=True)}}


@pytest.mark.parametrize("readout", ["conj", "product"])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("chunk_size", [8, 16])
@pytest.mark.parametrize("T", [1, 7, 33, 64])
def test_matches_naive(T, chunk_size, with_state, readout):
    # dt up to 1: decays far from 1, so a wrong power of λ shows
    p = make_problem(B=2, T=T, H=2, R=3, D=4, M=5, dt_range=(1e-3, 1.0), seed=T + chunk_size)
    ref = forward_backward(interdomain_attention_naive, p, with_state, readout=readout)
    got = forward_backward(
        chunk_minimal.interdomain_attention_chunk_minimal,
        p,
        with_state,
        readout=readout,
        chunk_size=chunk_size,
    )
    assert got.keys() == ref.keys()
    for name, r in ref.items():
        assert got[name].dtype == r.dtype and got[name].shape == r.shape, name
        err = max_rel_error(got[name], r)
        assert err <= TOL, f"{name}: worst position {err:.2e} > {TOL:.0e} (of the ref's RMS)"


def test_listing_is_short():
    assert len(Path(chunk_minimal.__file__).read_text().splitlines()) <= 80
