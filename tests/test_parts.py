"""Mixers from parts: the part contracts, the mixer registry, how decoder() takes a mixer, and
the attribute names (each the constructor argument of its name)."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from idmix import models
from idmix.modules import (
    MIXERS,
    Core,
    InputBranch,
    InterdomainAttention,
    LinearReadout,
    Readout,
    S4DCore,
    SSMMixer,
    ablation_cell,
    register_mixer,
    ssm_mixer,
)

D, H, M = 16, 2, 4
TOY = dict(vocab_size=32, num_layers=2, num_heads=H, embed_dim=D, max_seq_len=32)


def test_the_library_parts_follow_their_contracts():
    layer = InterdomainAttention(D, H, num_modes=M)
    assert isinstance(layer.core, Core) and isinstance(layer.readout, Readout)
    assert all(isinstance(b, InputBranch) for b in (layer.query, layer.key_branch))
    assert isinstance(LinearReadout(H, M), Readout) and isinstance(S4DCore(H, M), Core)


def test_attributes_are_the_constructor_arguments():
    layer = ablation_cell("s4d_only", D, H, num_modes=M, output_norm=True)
    names = [
        p for p in inspect.signature(SSMMixer).parameters if p not in ("embed_dim", "num_heads")
    ]
    parts = {n: getattr(layer, n) for n in names}
    assert isinstance(parts["head_mix"], nn.Linear) and isinstance(parts["output_norm"], nn.RMSNorm)
    rebuilt = SSMMixer(D, H, **parts)  # the mixer's own attributes rebuild it
    assert list(rebuilt.state_dict()) == list(layer.state_dict())
    assert not hasattr(layer, "ssm") and not hasattr(layer, "branch_a")  # old names are gone


def test_a_part_that_breaks_its_contract_is_named():
    parts = dict(InterdomainAttention(D, H, num_modes=M).named_children())
    with pytest.raises(TypeError, match="readout: Linear does not follow the Readout contract"):
        SSMMixer(D, H, **{**parts, "readout": nn.Linear(2, 2)})
    with pytest.raises(TypeError, match=r"ssm_mixer: unknown options \['dt_mn'\]"):
        ssm_mixer(D, H, dt_mn=1e-2)
    with pytest.raises(ValueError, match="use_rope: set by the cell 'full'"):
        ablation_cell("full", D, H, use_rope=False)
    with pytest.raises(ValueError, match="backend: the linear readout runs on PyTorch only"):
        models.decoder(**TOY, mixer="s4d", backend="torch")


def test_every_registered_mixer_builds_with_its_options():
    assert {"interdomain", "softmax", "s4d", "selective_interdomain", "full"} <= set(MIXERS)
    for name in MIXERS:
        m = models.decoder(**{**TOY, "num_layers": 1}, mixer=name, num_modes=M, chunk_size=8)
        assert m(torch.arange(9)[None]).shape == (1, 9, 32), name


def test_a_registered_mixer_is_selected_by_name():
    def gated(embed_dim, num_heads, **options):
        return InterdomainAttention(embed_dim, num_heads, gate=True, **options)

    try:
        register_mixer("gated", gated)
        model = models.interdomain_tiny(mixer="gated", num_layers=1)
        assert model.layers[0].attn.gate is not None and model.layers[0].attn.num_modes == 16
        with pytest.raises(ValueError, match="name: mixer 'gated' is already registered"):
            register_mixer("gated", InterdomainAttention)
        register_mixer("gated", gated)  # the same builder again (a module imported twice)
    finally:
        MIXERS.pop("gated", None)


def test_a_config_node_names_a_mixer_builder_and_gets_the_options():
    node = {"_component_": "examples.relu_feature_map.relu_interdomain", "num_modes": 8}
    model = models.decoder(**TOY, mixer=node, chunk_size=8)
    attn = model.layers[1].attn
    assert attn.key_branch.feature_map.__name__ == "relu_l2" and attn.num_modes == 8
    torch.manual_seed(0)
    by_name = models.interdomain_tiny(mixer="s4d")  # a registered name, the scale's options
    torch.manual_seed(0)
    assert by_name.state_dict().keys() == models.s4d_tiny().state_dict().keys()
    for bad, match in [
        ({"_component_": "examples.nowhere.mixer"}, "mixer._component_: cannot import"),
        ({"num_modes": 8}, "mixer._component_: expected the dotted path"),
        ("examples.nowhere.mixer", "mixer._component_: cannot import"),  # dotted: a builder
        ("relu_interdomain", "mixer: expected one of"),
    ]:
        with pytest.raises(ValueError, match=match):
            models.decoder(**TOY, mixer=bad)


def test_mixer_kwargs_with_a_callable_mixer_are_refused_by_name():
    """They used to be dropped silently: a callable builds its layers itself."""
    with pytest.raises(ValueError, match=r"mixer_kwargs: \['dt_min'\] given with a callable"):
        models.decoder(**TOY, mixer=lambda i: InterdomainAttention(D, H), dt_min=1e-2)
    # a named builder's own defaults (num_modes, dt_min, …) do not count as given
    model = models.interdomain_tiny(mixer=lambda i: s4d_layer(), num_layers=1)
    assert isinstance(model.layers[0].attn, SSMMixer)


def s4d_layer():
    return ablation_cell("s4d_only", 128, 4, num_modes=M)
