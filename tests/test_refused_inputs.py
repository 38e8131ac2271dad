# ruff: noqa: E501
# (parametrised tables of cases read best one case per line, as in tests/test_bad_inputs.py)
"""Input the op- and module-level API must refuse by name, or handle correctly: autograd
transforms on each implementation (correct against the naive reference or finite differences,
else a named NotImplementedError, never a silent zero), a non-tensor reset, a complex state
given to the real op, mixed dtypes and low-precision states in the decode steps, a decoding
batch or length the cache does not hold, and the short-conv step and reset variants."""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import grad, jvp, vmap

from idmix.functional import (
    interdomain_attention,
    interdomain_decode_step,
    readout_gram,
    short_conv,
    short_conv_step,
    short_conv_with_resets,
)
from idmix.functional.interdomain import empty_state
from idmix.functional.interdomain.layout import state_to_interleaved
from idmix.modules import InterdomainAttention, SoftmaxAttention
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
            q,
            k,
            v,
            lam,
            beta,
            C,
            initial_state=(Xk, Xv),
            impl=impl,
            reset=reset,
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


# 2.-6. Bad arguments -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s():
    """A shared-decay fp32 problem of two rows, with its real-form parameters."""
    q = make_problem(B=2, T=5, H=2, R=3, D=4, M=3, dtype=torch.float32)
    q["lam_ri"], q["beta_ri"] = (torch.view_as_real(q[n]).contiguous() for n in ("lam", "beta"))
    q["G"] = readout_gram(q["C"], "conj").float()
    return q


def _core(s, **over):
    a = {**s, **over}
    return interdomain_attention(
        a["q"],
        a["k"],
        a["v"],
        a["lam"],
        a["beta"],
        a["C"],
        reset=a.get("reset"),
    )[0]  # fmt: skip


def _real(s, **over):
    a = {**s, **over}
    return interdomain_attention(
        a["q"],
        a["k"],
        a["v"],
        a["lam_ri"],
        a["beta_ri"],
        a["G"],
        initial_state=a.get("Z0"),
        reset=a.get("reset"),
        output_final_state=True,
    )  # fmt: skip


def _step(s, **over):
    a = {"q": s["q"][:, 0], "k": s["k"][:, 0], "v": s["v"][:, 0],
         "state": empty_state(2, 2, 3, 3, 4), **over}  # fmt: skip
    return interdomain_decode_step(a["q"], a["k"], a["v"], s["lam"], s["beta"], s["G"], a["state"])


def _step_real(s, **over):
    a = {"q": s["q"][:, 0], "k": s["k"][:, 0], "v": s["v"][:, 0],
         "state": torch.zeros(2, 2, 7, 6), **over}  # fmt: skip
    return interdomain_decode_step(
        a["q"],
        a["k"],
        a["v"],
        s["lam_ri"],
        s["beta_ri"],
        s["G"],
        a["state"],
        inplace=True,
    )[0]  # fmt: skip


def _varlen_real(s, Z0):
    args = (s["q"][:1], s["k"][:1], s["v"][:1], s["lam_ri"], s["beta_ri"], s["G"])
    return interdomain_attention(*args, cu_seqlens=torch.tensor([0, 2, 5]), initial_state=Z0)[0]


RESET = r"reset: expected a bool tensor of shape \(B, T\) = \(2, 5\) or None, got"
REAL_STATE = r"initial_state: expected the interleaved real state, a real floating tensor"
COMPLEX_Z0 = torch.zeros(2, 2, 7, 6, dtype=torch.complex64)
MIXED = r"q, k, v: expected one dtype, got torch.float64, torch.float32, torch.float16"
STATE_DTYPE = r"state: expected a decode state in one of \('torch.float32', 'torch.float64'\)"

CASES = {
    # 2. reset that is not a tensor (was: AttributeError 'list' object has no attribute 'dtype')
    "core reset list": (lambda s: _core(s, reset=[[False] * 5] * 2), TypeError, RESET + r" list"),
    "core reset ndarray": (lambda s: _core(s, reset=torch.zeros(2, 5, dtype=torch.bool).numpy()), TypeError, RESET + r" ndarray"),
    "real reset list": (lambda s: _real(s, reset=[[False] * 5] * 2), TypeError, RESET + r" list"),
    # 3. a complex initial state given to the real ops (was: its imaginary part dropped)
    "real complex initial_state": (lambda s: _real(s, Z0=COMPLEX_Z0), TypeError, REAL_STATE + r".*got torch.complex64"),
    "real list initial_state": (lambda s: _real(s, Z0=[0.0]), TypeError, REAL_STATE + r".*got list"),
    "varlen_real complex initial_state": (lambda s: _varlen_real(s, COMPLEX_Z0), TypeError, REAL_STATE),
    # 4. the decode steps: one dtype for q, k, v; an fp32/fp64 state (was: accepted, or
    # view_as_complex failing on bf16)
    "step mixed dtypes": (lambda s: _step(s, q=s["q"][:, 0].double(), v=s["v"][:, 0].half()), TypeError, MIXED),
    "step_real mixed dtypes": (lambda s: _step_real(s, q=s["q"][:, 0].double(), v=s["v"][:, 0].half()), TypeError, MIXED),
    "step_real bf16 state": (lambda s: _step_real(s, state=torch.zeros(2, 2, 7, 6, dtype=torch.bfloat16)), TypeError, STATE_DTYPE + r".*got torch.bfloat16"),
    "step_real fp16 state": (lambda s: _step_real(s, state=torch.zeros(2, 2, 7, 6, dtype=torch.float16)), TypeError, STATE_DTYPE + r".*got torch.float16"),
    "step complex32 state": (lambda s: _step(s, state=tuple(x.to(torch.complex32) for x in empty_state(2, 2, 3, 3, 4))), TypeError, r"state\[0\]: expected a decode state in one of \('torch.complex64', 'torch.complex128'\)"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_bad_argument_is_named(s, case):
    call, exc, pattern = CASES[case]
    with pytest.raises(exc, match=pattern):
        call(s)


def test_bf16_inputs_with_an_fp32_state_still_decode(s):
    """The state contract is on the state: q, k, v of one lower precision are fine."""
    lo = {n: s[n][:, 0].bfloat16() for n in ("q", "k", "v")}
    o = _step_real(s, **lo)
    assert o.dtype == torch.bfloat16 and torch.isfinite(o).all()


# 5. Decoding against the cache: batch size, and the softmax cache's length


@pytest.fixture(params=["ssm", "softmax"])
def layer(request):
    torch.manual_seed(0)
    if request.param == "ssm":
        mixer = InterdomainAttention(16, 2, num_modes=4)
    else:
        mixer = SoftmaxAttention(16, 2)
    mixer.setup_cache(2, torch.float32, 4)
    return mixer


@pytest.mark.parametrize("rows, T_in", [(3, 1), (1, 1), (3, 3)])
def test_decoding_a_batch_the_cache_does_not_hold_is_named(layer, rows, T_in):
    """Was: torch.cat / index_copy_ size errors, or the short conv's cache shape."""
    pattern = rf"x: batch size {rows} does not match the decoding cache's batch size 2"
    with pytest.raises(ValueError, match=pattern):
        layer(torch.randn(rows, T_in, 16))


def test_softmax_decoding_past_its_cache_length_is_named():
    """Was: IndexError from index_copy_ (a device assert on CUDA). Filling it exactly is fine;
    the recurrent cache has no length, so the SSM mixer decodes on."""
    torch.manual_seed(0)
    attn = SoftmaxAttention(16, 2)
    attn.setup_cache(2, torch.float32, 4)
    attn(torch.randn(2, 3, 16))
    attn(torch.randn(2, 1, 16))  # 4 of 4
    with pytest.raises(ValueError, match=r"x: 1 more position\(s\) would go past the KV cache's max_seq_len = 4 \(4 filled\)"):  # fmt: skip
        attn(torch.randn(2, 1, 16))
    attn.reset_cache()
    with pytest.raises(ValueError, match=r"x: 6 positions do not fit the KV cache's max_seq_len = 4"):  # fmt: skip
        attn(torch.randn(2, 6, 16))


# 6. The short-conv step and reset variants check what the full short conv checks

C_, W_ = 3, 4


def _full(x, w, b, cache):
    return short_conv(x, w, b, cache)


def _resets(x, w, b, cache):
    return short_conv_with_resets(x, w, b, torch.zeros(*x.shape[:2], dtype=torch.bool), cache)


def _step_conv(x, w, b, cache):
    return short_conv_step(x[:, 0], w, b, cache)


CONV_ENTRIES = {
    "short_conv": _full,
    "short_conv_with_resets": _resets,
    "short_conv_step": _step_conv,
}
GOOD = dict(
    x=torch.randn(2, 5, C_),
    w=torch.randn(C_, W_),
    b=torch.randn(C_),
    cache=torch.randn(2, W_ - 1, C_),
)
CONV_CASES = {
    "x wrong rank": (dict(x=torch.randn(2, 5, 1, C_)), ValueError, r"x(_t)?: expected \(B, (T, )?C\), got shape"),
    "weight 1-d": (dict(w=torch.randn(C_)), ValueError, r"weight: expected \(C, W\), got shape \(3,\)"),
    "channels": (dict(w=torch.randn(C_ + 1, W_), b=None), ValueError, r"x(_t)?: last dim 3 does not match weight channels 4"),
    "bias shape": (dict(b=torch.randn(C_ + 1)), ValueError, r"bias: expected \(3,\), got \(4,\)"),
    "cache window": (dict(cache=torch.randn(2, W_ - 2, C_)), ValueError, r"cache: expected \(2, 3, 3\) = \(B, W-1, C\), got \(2, 2, 3\)"),
    "cache batch": (dict(cache=torch.randn(1, W_ - 1, C_)), ValueError, r"cache: expected \(2, 3, 3\) = \(B, W-1, C\), got \(1, 3, 3\)"),
    "cache not a tensor": (dict(cache=[0.0]), TypeError, r"cache: expected a \(2, 3, 3\) tensor, got list"),
}  # fmt: skip


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("entry", CONV_ENTRIES)
def test_short_conv_entries_share_their_checks(entry, case):
    """Was: the step and reset variants skipped these (raw size errors deep inside)."""
    over, exc, pattern = CONV_CASES[case]
    a = {**GOOD, **over}  # the step takes x[:, 0]: (B, C), or 3 dims for "x wrong rank"
    with pytest.raises(exc, match=pattern):
        CONV_ENTRIES[entry](a["x"], a["w"], a["b"], a["cache"])


@pytest.mark.parametrize(
    "reset, exc, pattern",
    [
        ([[False] * 5] * 2, TypeError, r"reset: expected a bool tensor of shape \(B, T\) = \(2, 5\) or None, got list"),
        (torch.zeros(2, 5), ValueError, r"reset: expected a bool tensor of shape \(B, T\) = \(2, 5\), got torch.float32"),
        (torch.zeros(2, 4, dtype=torch.bool), ValueError, r"reset: expected a bool tensor of shape \(B, T\) = \(2, 5\)"),
        (None, TypeError, r"reset: expected a bool tensor of shape \(B, T\) = \(2, 5\), got None"),
    ],
)  # fmt: skip
def test_short_conv_with_resets_names_a_bad_reset(reset, exc, pattern):
    with pytest.raises(exc, match=pattern):
        short_conv_with_resets(GOOD["x"], GOOD["w"], GOOD["b"], reset, GOOD["cache"])


def test_short_conv_step_without_a_cache_is_named():
    with pytest.raises(TypeError, match=r"cache: expected the \(B, W-1, C\) history"):
        short_conv_step(GOOD["x"][:, 0], GOOD["w"], GOOD["b"], None)
