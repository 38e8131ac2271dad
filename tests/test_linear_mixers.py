"""The linear baselines as layers (GLA, Mamba-2, Gated DeltaNet, Mamba-3): the chunked layer
equals the per-step one (outputs and every parameter's gradient, fp64), T = 1, document resets,
the cache contract, compile, the registry and bad options. Decoding through whole models, packed
documents and ragged generation are in tests/test_decoding.py."""

from __future__ import annotations

import pytest
import torch

from idmix.modules import (
    MIXERS,
    GatedDeltaNet,
    GatedLinearAttention,
    Mamba2,
    Mamba3,
    Mamba3Cache,
    MatrixStateCache,
    resolve_mixer,
)

D, H = 32, 4
# Measured: fp64 chunked vs per-step layer, worst |Δ| ≤ 1.5e-13 of each tensor's largest entry
# (outputs, input and every parameter gradient, T in {1, 7, 21}; Mamba-3's 6.8e-16): held to
# atol 1e-12 + rtol 1e-10. fp32 decoding vs forward: worst |Δ| ≤ 7.7e-7 at outputs up to 2.3,
# every cache part after the steps vs after the prefill ≤ 2.8e-6 (Mamba-3's angles, up to 2π;
# the others ≤ 1.2e-6): held to 1e-5.
LAYERS = {
    "gla": lambda: GatedLinearAttention(D, H, chunk_size=8),
    "gla_conv": lambda: GatedLinearAttention(D, H, conv_size=4, chunk_size=8),
    "mamba2": lambda: Mamba2(D, H, state_dim=16, chunk_size=8),
    "gated_deltanet": lambda: GatedDeltaNet(D, H, chunk_size=8),
    "mamba3": lambda: Mamba3(D, H, state_dim=16, chunk_size=8),
}


def layer(name, dtype=torch.float64):
    torch.manual_seed(0)
    m = LAYERS[name]().to(dtype)
    with torch.no_grad():  # away from the init's zeros, so every path carries signal
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


def grads(m, x, **kw):
    m.zero_grad()
    x = x.clone().requires_grad_()
    out = m(x, **kw)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return out.detach(), x.grad, {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("T", [1, 7, 21])
@pytest.mark.parametrize("name", list(LAYERS))
def test_chunked_layer_equals_the_per_step_layer_with_gradients(name, T):
    m = layer(name)
    x = torch.randn(2, T, D, dtype=torch.float64)
    pos = torch.cat([torch.arange(3), torch.arange(T)])[:T].expand(2, T)  # a reset at t = 3
    fast, slow = grads(m, x, input_pos=pos), grads(m, x, input_pos=pos, impl="naive")
    torch.testing.assert_close(fast[0], slow[0], atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(fast[1], slow[1], atol=1e-12, rtol=1e-10)
    assert fast[2].keys() == slow[2].keys()
    for n in fast[2]:
        torch.testing.assert_close(fast[2][n], slow[2][n], atol=1e-12, rtol=1e-10, msg=n)
        # at T = 1 from a zero state the decays meet nothing to decay
        assert T == 1 or fast[2][n].abs().sum() > 0, f"{n}: no gradient"


@pytest.mark.parametrize("name", list(LAYERS))
def test_token_by_token_decoding_equals_the_forward_state_included(name):
    m = layer(name, torch.float32)
    x = torch.randn(2, 13, D)
    full = m(x)
    m.setup_cache(2, torch.float32)
    mamba3 = name == "mamba3"
    assert isinstance(m.kv_cache, Mamba3Cache if mamba3 else MatrixStateCache)
    K, V = (m.state_dim, m.head_dim) if mamba3 else (m.key_dim, m.value_dim)
    assert m.kv_cache.state.shape == (2, H, K, V)
    steps = torch.cat([m(x[:, t : t + 1], input_pos=torch.full((2, 1), t)) for t in range(13)], 1)
    cache_steps = m.kv_cache.to_tensordict().clone()  # every part (Mamba-3's carries too)
    m.reset_cache()
    assert all(t.abs().sum() == 0 for t in m.kv_cache.to_tensordict().values())
    prefill = torch.cat([m(x[:, :9]), m(x[:, 9:])], 1)  # chunked prefill, then the rest
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(prefill, full, atol=1e-5, rtol=1e-5)
    for key, part in cache_steps.items():
        torch.testing.assert_close(part, m.kv_cache.to_tensordict()[key], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(LAYERS))
def test_a_document_start_in_the_cache_forgets_the_previous_one(name):
    m = layer(name, torch.float32)
    x = torch.randn(1, 10, D)
    m.setup_cache(1, torch.float32)
    m(torch.randn(1, 6, D))
    fresh = m(x, input_pos=torch.arange(10)[None])  # position 0: a new document
    m.kv_cache = None
    m.cache_enabled = False
    torch.testing.assert_close(fresh, m(x), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", ["gla", "mamba2", "gated_deltanet", "mamba3"])
def test_the_layer_compiles_whole(name):
    m = layer(name, torch.float32)
    x = torch.randn(2, 19, D)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), m(x), atol=1e-5, rtol=1e-5)


def test_bf16_inputs_keep_an_fp32_state():
    m = layer("gated_deltanet", torch.float32)
    x = torch.randn(1, 12, D)
    ref = m(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(x)
    assert torch.isfinite(out).all()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 5e-2


@pytest.mark.parametrize(
    "name, options",
    [
        ("gla", {"key_dim": 16, "value_dim": 24}),
        ("mamba2", {"expand": 1, "state_dim": 8}),
        ("mamba3", {"expand": 1, "state_dim": 8}),
    ],
)
def test_state_shape_follows_the_options(name, options):
    build, kept = resolve_mixer(name, {**options, "num_modes": 16, "rope_position": "last"})
    assert "num_modes" not in kept and kept.items() >= options.items()
    m = build(D, H, **kept)
    m.setup_cache(1, torch.float32)
    K = options.get("key_dim", options.get("state_dim"))
    V = options.get("value_dim", options.get("expand", 0) * D // H)
    assert m.kv_cache.state.shape == (1, H, K, V)


@pytest.mark.parametrize(
    "name, options, field",
    [
        ("gla", {"key_dim": 0}, "key_dim"),
        ("gla", {"gate_rank": -1}, "gate_rank"),
        ("mamba2", {"expand": 1, "embed_dim": 30}, "expand"),
        ("mamba2", {"dt_min": 0.5, "dt_max": 0.1}, "dt_min"),
        ("gated_deltanet", {"chunk_size": 0}, "chunk_size"),
        ("gated_deltanet", {"value_dim": 2.5}, "value_dim"),
        ("mamba3", {"rope_fraction": 0.3}, "rope_fraction"),
        ("mamba3", {"dt_min": 0.5, "dt_max": 0.1}, "dt_min"),
        ("mamba3", {"expand": 1, "embed_dim": 30}, "expand"),
    ],
)
def test_bad_options_are_named(name, options, field):
    embed_dim = options.pop("embed_dim", D)
    with pytest.raises(ValueError, match=field):
        MIXERS[name].build(embed_dim, H, **options)


def test_unknown_option_is_named_by_the_registry():
    with pytest.raises(ValueError, match="state_dimension"):
        resolve_mixer("mamba2", {"state_dimension": 8})
