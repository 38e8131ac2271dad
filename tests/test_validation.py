"""Bad input gets a clear error naming the argument and what was expected."""

from __future__ import annotations

import pytest
import torch

from idmix.functional import discretize, interdomain_attention, readout_gram, short_conv
from tests.helpers import make_problem


@pytest.fixture
def p():
    return make_problem(B=2, T=5, H=2, R=3, D=4, M=3)


def call(p, **over):
    args = dict(p)
    args.update(over)
    return interdomain_attention(
        args["q"],
        args["k"],
        args["v"],
        args["lam"],
        args["beta"],
        args["C"],
        initial_state=args["initial_state"],
        **{k: v for k, v in over.items() if k in ("readout", "chunk_size", "impl", "reset")},
    )[0]


@pytest.mark.parametrize(
    "over, exc, pattern",
    [
        (lambda p: dict(q=p["q"][0]), ValueError, r"q: expected 4 dims \(B, T, H, R\)"),
        (lambda p: dict(k=p["k"][..., :2]), ValueError, r"k: expected the shape of q"),
        (lambda p: dict(v=p["v"][:, :4]), ValueError, r"v: expected \(B, T, H, D\)"),
        (lambda p: dict(q=p["q"].float()), TypeError, r"q, k, v: expected one dtype"),
        (lambda p: dict(q=p["q"].long()), TypeError, r"q: expected a real floating tensor"),
        (lambda p: dict(q=p["q"][:, :0], k=p["k"][:, :0], v=p["v"][:, :0]), ValueError, r"T >= 1"),
        (lambda p: dict(lam=p["lam"].real), TypeError, r"lam: expected a complex tensor"),
        (lambda p: dict(lam=p["lam"][:1]), ValueError, r"lam: expected shape \(H, M\)"),
        (lambda p: dict(beta=p["beta"][:, :2]), ValueError, r"beta: expected shape \(H, M\)"),
        (lambda p: dict(C=p["C"][:, :2]), ValueError, r"C: expected shape \(H, M, M\)"),
        (
            lambda p: dict(initial_state=p["initial_state"][0]),
            TypeError,
            r"initial_state: expected a tuple",
        ),
        (
            lambda p: dict(initial_state=(p["initial_state"][0][:1], p["initial_state"][1])),
            ValueError,
            r"initial_state\[0\] \(Xk\): expected shape \(B, H, M, R\)",
        ),
        (
            lambda p: dict(initial_state=(p["initial_state"][0], p["initial_state"][1].real)),
            TypeError,
            r"initial_state\[1\] \(Xv\): expected a complex tensor",
        ),
        (
            lambda p: dict(chunk_size=48),
            ValueError,
            r"chunk_size: expected a positive power of two",
        ),
        (lambda p: dict(chunk_size=0), ValueError, r"chunk_size"),
        (lambda p: dict(chunk_size=True), ValueError, r"chunk_size"),
        (lambda p: dict(readout="hermitian"), ValueError, r"readout: expected one of"),
        (lambda p: dict(impl="fast"), ValueError, r"impl: expected one of"),
        (
            lambda p: dict(reset=torch.zeros(2, 4, dtype=torch.bool)),
            ValueError,
            r"reset: expected a bool tensor of shape \(B, T\) = \(2, 5\)",
        ),
        (lambda p: dict(reset=torch.zeros(2, 5)), ValueError, r"reset: expected a bool tensor"),
    ],
)
def test_interdomain_errors(p, over, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(p, **over(p))


def test_primitive_errors():
    with pytest.raises(ValueError, match=r"x: expected \(B, T, C\)"):
        short_conv(torch.randn(4, 3), torch.randn(3, 4))
    with pytest.raises(ValueError, match=r"cache: expected \(2, 3, 3\)"):
        short_conv(torch.randn(2, 5, 3), torch.randn(3, 4), cache=torch.randn(2, 2, 3))
    with pytest.raises(ValueError, match=r"x: last dim 3 does not match weight channels 5"):
        short_conv(torch.randn(2, 5, 3), torch.randn(5, 4))
    with pytest.raises(TypeError, match=r"A: expected a complex tensor"):
        discretize(torch.ones(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"method: expected 'zoh' or 'bilinear'"):
        discretize(torch.ones(2), torch.ones(2, 3, dtype=torch.complex64), "euler")
    with pytest.raises(ValueError, match=r"C: expected \(H, M, M\)"):
        readout_gram(torch.ones(2, 3, 4, dtype=torch.complex64))
