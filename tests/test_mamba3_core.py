"""Interdomain Attention on a Mamba-3 core (idmix.modules.mamba3_core) as a layer and a model: it
starts with the S4D core's decays and the plain trapezoid, every parameter learns, decoding
token by token equals the forward pass across document starts (the carried z included), it
compiles whole, its builders match interdomain's parameters, and what it cannot do is refused.
The op under it: tests/test_trapezoid.py."""

from __future__ import annotations

import pytest
import torch

from idmix import models
from idmix.models.state_size import recurrent_state_floats
from idmix.modules import Mamba3CoreInterdomainAttention, resolve_mixer
from tests.helpers import layer_decoding

D, H, M = 64, 2, 8


def layer(dtype=torch.float32):
    torch.manual_seed(0)
    m = Mamba3CoreInterdomainAttention(D, H, num_modes=M, chunk_size=8).to(dtype)
    with torch.no_grad():  # away from the init's zeros, so every path carries signal
        for name, p in m.named_parameters():
            if "readout" in name:
                p.add_(0.1 * torch.randn_like(p))
    return m


def test_it_starts_with_the_s4d_core_decays_and_the_plain_trapezoid():
    torch.manual_seed(0)
    m = Mamba3CoreInterdomainAttention(D, H, num_modes=M)
    a, b = torch.randn(2, 5, H, D // H), torch.randn(2, 5, H, D // H)
    lam, g, b_old = m.readout.decays(a, b, m.core)
    lam_core, _ = m.core.discretized_real()
    # measured: max |Δ| 1.5e-8 (fp32 exp and sincos of the same Δ·A in two orders)
    torch.testing.assert_close(lam, lam_core.expand_as(lam), rtol=1e-6, atol=1e-7)
    dt = m.core.log_dt.exp()
    torch.testing.assert_close(g, (dt / 2).expand_as(g))
    torch.testing.assert_close(b_old, (dt / 2).expand_as(b_old))


def test_every_parameter_learns():
    m = layer()
    pos = torch.cat([torch.arange(9), torch.arange(12)]).expand(2, 21)
    m(torch.randn(2, 21, D), input_pos=pos).square().sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}: no gradient"


@pytest.mark.parametrize("packed", [False, True])
def test_token_by_token_decoding_equals_the_forward(packed):
    """fp32, measured against the chunked forward: outputs max |Δ| 2.6e-8 (steps) and 7.5e-9
    (prefill in two pieces) at outputs up to 0.05, the cached state max |Δ| 9.5e-7."""
    full, steps, prefill, state_steps, state_prefill = layer_decoding(layer(), D, packed)
    assert state_steps.shape == (2, H, 2 * (D // H), 2 * M + 2)  # X and the carried z
    torch.testing.assert_close(steps, full, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(prefill, full, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(state_steps, state_prefill, atol=1e-5, rtol=1e-5)


def test_the_layer_compiles_whole():
    m = layer()
    x = torch.randn(2, 19, D)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    # measured: max |Δ| 9.3e-9 at outputs up to 0.05
    torch.testing.assert_close(compiled(x), m(x), atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("scale", ["tiny", "small"])
def test_builders_match_interdomain_in_parameters_and_state(scale):
    model = getattr(models, f"interdomain_mamba3_{scale}")()
    ref = getattr(models, f"interdomain_{scale}")()
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert abs(count(model) / count(ref) - 1) <= 0.01
    R_plus_D = 2 * ref.layers[0].attn.head_dim
    for got, want in zip(recurrent_state_floats(model), recurrent_state_floats(ref), strict=True):
        assert got == want + 2 * ref.layers[0].attn.num_state_groups * R_plus_D  # + the z carry
    logits = model(torch.randint(0, 4096, (1, 9)))
    assert logits.shape == (1, 9, 4096) and torch.isfinite(logits).all()


def test_what_it_cannot_do_is_refused_by_name():
    build, kw = resolve_mixer("interdomain_mamba3", {"num_state_groups": 1})
    with pytest.raises(ValueError, match="num_state_groups: the Mamba-3 core keeps one state"):
        build(D, H, **kw)
