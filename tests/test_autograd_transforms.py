"""Autograd transforms on each implementation of the op: correct against the naive reference or
finite differences, else (the chunked path: jvp, forward-mode AD, vmap, grad, double backward)
a named NotImplementedError, never a silent zero. Bad arguments: tests/test_bad_inputs.py."""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import grad, jvp, vmap

from idmix.functional import (
    interdomain_attention,
    readout_gram,
)
from idmix.functional.interdomain.layout import state_to_interleaved
from tests.helpers import assert_rel, make_problem, selective_problem

B, T, H, R, D, M = 1, 6, 1, 2, 2, 2


def problem(selective: bool, seed: int = 0) -> dict:
    make = selective_problem if selective else make_problem
    return make(B=B, T=T, H=H, R=R, D=D, M=M, seed=seed)  # float64


@pytest.fixture(scope="module", params=["shared", "selective"])
def p(request):
    return problem(request.param == "selective")


# 1. Autograd transforms --------------------------------------------------------------------------


def _real_form(p):
    G = readout_gram(p["C"], "conj")
    return torch.view_as_real(p["lam"]), torch.view_as_real(p["beta"]), G


# Every form of call that runs the chunked path, as a function of q (the input transformed);
# B = 1, so packed calls take the problem as one packed row (per-token decays (1, S, H, M))
def _complex_call(p, **kw):
    return lambda q: interdomain_attention(q, p["k"], p["v"], p["lam"], p["beta"], p["C"], **kw)[0]


def _real_call(p, **kw):
    return lambda q: interdomain_attention(q, p["k"], p["v"], *_real_form(p), **kw)[0]


CHUNKED = {
    "complex": lambda p: _complex_call(p, initial_state=p["initial_state"]),
    "real": lambda p: _real_call(p, initial_state=state_to_interleaved(*p["initial_state"])),
    "complex packed": lambda p: _complex_call(p, cu_seqlens=torch.tensor([0, 2, T])),
    "real packed": lambda p: _real_call(p, cu_seqlens=torch.tensor([0, 2, T])),
}


def _jvp(f, q):
    return jvp(f, (q,), (torch.ones_like(q),))[1]


def _forward_ad(f, q):
    with fwAD.dual_level():
        return fwAD.unpack_dual(f(fwAD.make_dual(q, torch.ones_like(q)))).tangent


def _vmap(f, q):
    return vmap(f)(torch.stack([q, 2 * q]))


def _grad(f, q):
    return grad(lambda x: f(x).square().sum())(q)


def _double_backward(f, q, allow_unused=False):
    q = q.clone().requires_grad_()
    (g,) = torch.autograd.grad(f(q).square().sum(), q, create_graph=True)
    return torch.autograd.grad(g.sum(), q, allow_unused=allow_unused)


TRANSFORMS = {
    "jvp": (_jvp, r"forward-mode AD \(torch.func.jvp, jacfwd\)"),
    "forward_ad": (_forward_ad, r"forward-mode AD \(torch.autograd.forward_ad dual tensors\)"),
    "vmap": (_vmap, r"torch.func.vmap"),
    "grad": (_grad, r"torch.func.grad \(vjp, jacrev, hessian\)"),
}


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("entry", CHUNKED)
def test_chunked_path_refuses_transforms_by_name(p, entry, transform):
    """Was: jvp and forward_ad returned a zero (or no) tangent silently on the shared path, the
    rest failed deep inside with torch's messages."""
    run, what = TRANSFORMS[transform]
    message = rf"interdomain_attention: {what} is not supported .*'naive'"
    with pytest.raises(NotImplementedError, match=message):
        run(CHUNKED[entry](p), p["q"])


@pytest.mark.parametrize("allow_unused", [False, True])
@pytest.mark.parametrize("entry", CHUNKED)
def test_chunked_path_refuses_double_backward_by_name(p, entry, allow_unused):
    """Was: an op without autograd (shared), or "not used in the graph" / None (selective)."""
    pattern = r"double backward \(backward through a gradient taken with create_graph=True\) is"
    with pytest.raises(NotImplementedError, match=pattern + r" not supported .*impl='naive'"):
        _double_backward(CHUNKED[entry](p), p["q"], allow_unused)


def test_forward_ad_on_any_input_is_refused(p):
    """A dual decay alone (not q) is refused too: its tangent would be dropped as well."""
    lam_ri, beta_ri, G = _real_form(p)
    with fwAD.dual_level(), pytest.raises(NotImplementedError, match=r"forward-mode AD"):
        dual = fwAD.make_dual(lam_ri, torch.ones_like(lam_ri))
        interdomain_attention(p["q"], p["k"], p["v"], dual, beta_ri, G, output_final_state=True)


def test_first_order_gradients_with_create_graph_are_unchanged(p):
    """create_graph=True alone (no second backward) still gives the right gradients."""
    f = CHUNKED["complex"](p)
    q = p["q"].clone().requires_grad_()
    (g1,) = torch.autograd.grad(f(q).square().sum(), q, create_graph=True)
    (g0,) = torch.autograd.grad(f(q).square().sum(), q)
    assert g1.requires_grad
    assert_rel(g1.detach(), g0, 1e-12, "create_graph gradient")


def _plain(p, impl):
    """The op of impl on every differentiable input (the initial state included)."""

    def f(q, k, v, lam, beta, Xk, Xv):
        return interdomain_attention(q, k, v, lam, beta, p["C"], initial_state=(Xk, Xv), impl=impl)[
            0
        ]

    return f


def _inputs(p):
    return (p["q"], p["k"], p["v"], p["lam"], p["beta"], *p["initial_state"])


def _tangents(p):
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randn(x.shape, dtype=x.dtype, generator=g) for x in _inputs(p))


def _finite_difference(f, xs, ts, eps=1e-6):
    plus = f(*(x + eps * t for x, t in zip(xs, ts, strict=True)))
    minus = f(*(x - eps * t for x, t in zip(xs, ts, strict=True)))
    return (plus - minus) / (2 * eps)


PLAIN = ["naive", "closed_form", "recurrent"]


@pytest.mark.parametrize("impl", PLAIN)
def test_plain_impls_forward_ad_is_right(p, impl):
    f, xs, ts = _plain(p, impl), _inputs(p), _tangents(p)
    fd = _finite_difference(_plain(p, "naive"), xs, ts)
    assert_rel(jvp(f, xs, ts)[1], fd, 1e-7, f"{impl} jvp")
    with fwAD.dual_level():
        duals = [fwAD.make_dual(x, t) for x, t in zip(xs, ts, strict=True)]
        assert_rel(fwAD.unpack_dual(f(*duals)).tangent, fd, 1e-7, f"{impl} forward_ad")


@pytest.mark.parametrize("impl", PLAIN)
def test_plain_impls_vmap_is_right(impl):
    """Batched over every input (reset and initial state included). Was: a data-dependent
    branch (the finite-input shortcut) failed under vmap for closed_form and recurrent."""
    ps = [problem(selective=True, seed=s) for s in range(2)]
    stack = [torch.stack(x) for x in zip(*(_inputs(q) for q in ps), strict=True)]
    reset = torch.zeros(2, B, T, dtype=torch.bool)
    reset[0, 0, 3] = True

    def f(q, k, v, lam, beta, Xk, Xv, reset):
        C = ps[0]["C"]
        return interdomain_attention(
            q, k, v, lam, beta, C, initial_state=(Xk, Xv), impl=impl, reset=reset
        )[0]

    got = vmap(f)(*stack, reset)
    ref = torch.stack([f(*(x[i] for x in stack), reset[i]) for i in range(2)])
    assert_rel(got, ref, 1e-12, f"{impl} vmap")


@pytest.mark.parametrize("impl", PLAIN)
def test_plain_impls_grad_and_double_backward_are_right(p, impl):
    xs = [x.clone().requires_grad_() for x in _inputs(p)]

    def second_order(fn):
        gs = torch.autograd.grad(fn(*xs).square().sum(), xs, create_graph=True)
        return torch.autograd.grad(sum(g.abs().square().sum() for g in gs), xs)

    ref = second_order(_plain(p, "naive"))
    for got, want in zip(second_order(_plain(p, impl)), ref, strict=True):
        assert_rel(got, want, 1e-10, f"{impl} double backward")
    f = _plain(p, impl)
    g_func = grad(lambda *a: f(*a).square().sum(), argnums=(0, 3))(*_inputs(p))
    g_ref = torch.autograd.grad(_plain(p, "naive")(*xs).square().sum(), (xs[0], xs[3]))
    for got, want in zip(g_func, g_ref, strict=True):
        assert_rel(got, want, 1e-10, f"{impl} torch.func.grad")
