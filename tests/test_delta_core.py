"""Interdomain Attention with a delta-rule erase (idmix.modules.delta_core) as a layer and a
model: it starts near Interdomain Attention (η = 0.1) and is it exactly at η = 0, every
parameter learns, decoding token by token equals the forward pass across document starts, it
compiles whole, its builders match interdomain's parameters and state, and what it cannot do is
refused. The op under it: tests/test_interdomain_delta.py."""

from __future__ import annotations

import pytest
import torch

from idmix import models
from idmix.models.state_size import recurrent_state_floats
from idmix.modules import DeltaInterdomainAttention, InterdomainAttention, resolve_mixer
from tests.helpers import layer_decoding

D, H, M = 64, 2, 8


def layer(dtype=torch.float32):
    torch.manual_seed(0)
    m = DeltaInterdomainAttention(D, H, num_modes=M, chunk_size=8).to(dtype)
    with torch.no_grad():  # away from the init's zeros, so every path carries signal
        m.readout.erase_weight.add_(0.3 * torch.randn_like(m.readout.erase_weight))
    return m


def test_it_starts_near_interdomain_and_is_it_without_the_erase():
    torch.manual_seed(0)
    m = DeltaInterdomainAttention(D, H, num_modes=M, chunk_size=8).double()
    a, b = torch.randn(2, 5, H, D // H), torch.randn(2, 5, H, D // H)
    torch.testing.assert_close(m.readout.erase(a, b), torch.full((2, 5, H), 0.1).double())
    ref = InterdomainAttention(D, H, num_modes=M, chunk_size=8).double()
    loaded = ref.load_state_dict(m.state_dict(), strict=False)
    assert not loaded.missing_keys and set(loaded.unexpected_keys) == {
        "readout.erase_weight",
        "readout.erase_bias",
    }
    with torch.no_grad():
        m.readout.erase_bias.fill_(-torch.inf)  # η = 0
    x = torch.randn(2, 19, D).double()
    # measured: max |Δ| 1.7e-17 at outputs up to 0.047 (fp64)
    torch.testing.assert_close(m(x), ref(x), rtol=1e-14, atol=1e-15)


def test_every_parameter_learns():
    m = layer()
    pos = torch.cat([torch.arange(9), torch.arange(12)]).expand(2, 21)
    m(torch.randn(2, 21, D), input_pos=pos).square().sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}: no gradient"


@pytest.mark.parametrize("packed", [False, True])
def test_token_by_token_decoding_equals_the_forward(packed):
    """fp32, measured against the chunked forward: outputs max |Δ| 1.2e-8 (steps) and 5.6e-9
    (prefill in two pieces) at outputs up to 0.03, the cached state max |Δ| 5.2e-8 at up to 0.16."""
    full, steps, prefill, state_steps, state_prefill = layer_decoding(layer(), D, packed)
    assert state_steps.shape == (2, H, 2 * (D // H), 2 * M)  # Interdomain's state
    torch.testing.assert_close(steps, full, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(prefill, full, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(state_steps, state_prefill, atol=1e-6, rtol=1e-5)


def test_the_layer_compiles_whole():
    m = layer()
    x = torch.randn(2, 19, D)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    # measured: max |Δ| 5.6e-9 at outputs up to 0.03
    torch.testing.assert_close(compiled(x), m(x), atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("scale", ["tiny", "small"])
def test_builders_match_interdomain_in_parameters_and_state(scale):
    model = getattr(models, f"interdomain_delta_{scale}")()
    ref = getattr(models, f"interdomain_{scale}")()
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert abs(count(model) / count(ref) - 1) <= 0.01
    assert recurrent_state_floats(model) == recurrent_state_floats(ref)
    logits = model(torch.randint(0, 4096, (1, 9)))
    assert logits.shape == (1, 9, 4096) and torch.isfinite(logits).all()


@pytest.mark.parametrize(
    "options, match",
    [
        ({"num_state_groups": 1}, "num_state_groups: the delta-rule readout keeps one state"),
        ({"backend": "triton"}, "backend: the delta-rule op runs on PyTorch only"),
        ({"precision": "bf16"}, "precision: the delta-rule op computes in fp32"),
    ],
)
def test_what_it_cannot_do_is_refused_by_name(options, match):
    build, kw = resolve_mixer("interdomain_delta", options)
    with pytest.raises(ValueError, match=match):
        build(D, H, **kw)
