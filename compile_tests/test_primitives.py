"""Every functional primitive compiles whole with Inductor and matches eager (outputs, grads).

The layers use the real-form primitives; the complex-API ones (``interdomain_attention``,
``discretize``, ``readout_gram``, ``s4d_*``, ``interdomain_decode_step``) compile too, with
Inductor falling back to eager kernels for the complex operations (it has no complex codegen).
"""

from __future__ import annotations

import pytest
import torch

from compile_tests.common import assert_matches
from compile_tests.golden import check, compiled, counter
from idmix.functional import (
    complex_A,
    discretize,
    discretize_real,
    interdomain_attention,
    interdomain_decode_step,
    readout_gram,
    readout_gram_real,
    rope,
    short_conv,
    short_conv_step,
    short_conv_with_resets,
    silu_l2_feature_map,
)
from idmix.functional.interdomain.layout import state_to_interleaved
from idmix.functional.s4d_readout import s4d_linear_readout, s4d_linear_step
from tests.helpers import make_problem

B, T, H, R, D, M = 2, 75, 2, 8, 8, 6  # T ragged against the chunk (16) and segment


def leaf(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).requires_grad_()


def _problem():
    p = make_problem(B=B, T=T, H=H, R=R, D=D, M=M, dtype=torch.float32)
    Z0 = state_to_interleaved(*p["initial_state"])
    lam, beta = torch.view_as_real(p["lam"]), torch.view_as_real(p["beta"])
    C = p["C"]
    G = readout_gram_real(C.real.contiguous(), C.imag.contiguous())
    reset = torch.zeros(B, T, dtype=torch.bool)
    reset[0, [0, 30]] = True
    return p, Z0, lam, beta, G, reset


def _attention_real_args():
    p, Z0, lam, beta, G, reset = _problem()
    req = [t.clone().requires_grad_() for t in (p["q"], p["k"], p["v"], lam, beta, G, Z0)]
    return [*req, reset]


def _attention_real(q, k, v, lam, beta, G, Z0, reset):
    return interdomain_attention(
        q, k, v, lam, beta, G, initial_state=Z0, chunk_size=16, reset=reset, output_final_state=True
    )


def _attention_complex_args():
    p, *_ = _problem()
    return [p[n].clone().requires_grad_() for n in ("q", "k", "v", "lam", "beta", "C")]


def _attention_complex(q, k, v, lam, beta, C):
    return interdomain_attention(q, k, v, lam, beta, C, chunk_size=16, output_final_state=True)


def _decode_args():
    p, Z0, lam, beta, G, _ = _problem()
    return [p["q"][:, 0], p["k"][:, 0], p["v"][:, 0], lam, beta, G, Z0]


def _decode(q, k, v, lam, beta, G, Z):
    Z = Z.clone()  # the step updates its state in place
    return interdomain_decode_step(q, k, v, lam, beta, G, Z, inplace=True)[0], Z


def _decode_complex_args():
    p, *_ = _problem()
    G = readout_gram(p["C"])
    return [p["q"][:, 0], p["k"][:, 0], p["v"][:, 0], p["lam"], p["beta"], G, p["initial_state"]]


def _discretize(dt, log_A_real, A_imag):
    return discretize(dt, complex_A(log_A_real, A_imag))


def _discretize_args():
    return [leaf(H, scale=0.1).abs(), leaf(H, M), leaf(H, M, scale=5.0)]


def _s4d_args():
    p, *_ = _problem()
    c = torch.randn(H, M, dtype=torch.complex64)
    return [p["k"].clone().requires_grad_(), p["lam"], p["beta"], c]


def _s4d_readout(z, lam, beta, c):
    return s4d_linear_readout(z, lam, beta, c, None, True)


def _s4d_step_args():
    z, lam, beta, c = _s4d_args()
    return [z[:, 0].detach(), lam, beta, c, torch.randn(B, H, M, R, dtype=torch.complex64)]


def _conv_args():
    return [leaf(B, T, 24), leaf(24, 4), leaf(24), leaf(B, 3, 24)]


def _conv_resets_args():
    reset = torch.zeros(B, T, dtype=torch.bool)
    reset[1, [0, 9, 10]] = True
    return [*_conv_args(), reset]


def _conv_resets(x, w, b, cache, reset):
    return short_conv_with_resets(x, w, b, reset, cache)


CASES = {
    "short_conv": (short_conv, _conv_args, True),
    "short_conv_with_resets": (_conv_resets, _conv_resets_args, True),
    "short_conv_step": (
        short_conv_step,
        lambda: [leaf(B, 24), leaf(24, 4), leaf(24), leaf(B, 3, 24)],
        True,
    ),
    "feature_map": (silu_l2_feature_map, lambda: [leaf(B, T, H, R)], True),
    "rope": (rope, lambda: [leaf(B, T, H, R), torch.arange(T).expand(B, T)], True),
    "discretize_real": (discretize_real, _discretize_args, True),
    "discretize": (_discretize, _discretize_args, True),
    "readout_gram_real": (readout_gram_real, lambda: [leaf(H, M, M), leaf(H, M, M)], True),
    "readout_gram": (
        readout_gram,
        lambda: [torch.randn(H, M, M, dtype=torch.complex64, requires_grad=True)],
        True,
    ),
    "s4d_linear_readout": (_s4d_readout, _s4d_args, True),
    "s4d_linear_step": (s4d_linear_step, _s4d_step_args, False),
    "interdomain_decode_step": (interdomain_decode_step, _decode_complex_args, False),
    "interdomain_attention.real_form": (_attention_real, _attention_real_args, True),
    "interdomain_attention": (_attention_complex, _attention_complex_args, True),
    "interdomain_decode_step.real_state": (_decode, _decode_args, False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_primitive_compiles_whole(name):
    fn, make_args, grads = CASES[name]
    cnt = counter()
    assert_matches(compiled(fn, cnt), fn, make_args, grads)
    check(f"primitive/{name}", {"frames": cnt.frame_count, "ops": cnt.op_count})
