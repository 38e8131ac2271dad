"""Mixers: options, ablation cells, grouped state, validation."""

from __future__ import annotations

import pytest
import torch

from idmix.modules import (
    ABLATION_CELLS,
    Branch,
    InterdomainAttention,
    LinearReadout,
    QueryReadout,
    S4DMixer,
    SoftmaxAttention,
    SSMMixer,
    ablation_cell,
)

D, H, M = 32, 4, 8


def literal_forward(layer, x, readout: str):
    """The layer through the literal per-step fp64 recurrence with the given readout (o =
    Re(Γᴴ U ξ(q)) for "conj", Re(Γᵀ U ξ(q)) for "product"): an independent reference."""
    from idmix.functional import interdomain_attention
    from idmix.modules.documents import positions_and_resets

    pos, reset = positions_and_resets(None, *x.shape[:2], x.device)
    (q, a, b), _ = layer._inputs(x, pos, reset)
    lam, beta, C = (t.to(torch.complex128) for t in layer.core.discretized())
    o = interdomain_attention(
        q.double(), a.double(), b.double(), lam, beta, C, readout=readout, impl="naive"
    )[0]
    return layer._output(x, o.float())


def params(m):
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("cell", sorted(ABLATION_CELLS))
def test_every_cell_trains_every_parameter(cell):
    m = ablation_cell(cell, D, H, num_modes=M, chunk_size=8)
    x = torch.randn(2, 21, D)
    out = m(x)
    assert out.shape == x.shape and torch.isfinite(out).all()
    out.square().mean().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"{name} gets no gradient"


def test_options_change_the_layer():
    torch.manual_seed(0)
    base = InterdomainAttention(D, H, num_modes=M)
    gated = InterdomainAttention(D, H, num_modes=M, gate=True)
    assert params(gated) == params(base) + D * D
    prod = InterdomainAttention(D, H, num_modes=M, readout_convention="product")
    prod.load_state_dict(base.state_dict())
    x = torch.randn(1, 17, D)
    # measured: fp32 layer vs the fp64 recurrence differ by <= 6e-7 (outputs ~0.1-0.4)
    for layer, convention in ((base, "conj"), (prod, "product")):
        torch.testing.assert_close(
            layer(x), literal_forward(layer, x, convention), rtol=1e-4, atol=1e-5
        )
    assert (prod(x) - base(x)).abs().max() > 0.1 * base(x).abs().max()  # the two really differ
    assert params(S4DMixer(D, H, num_modes=M)) == params(base) + H * M
    assert params(SoftmaxAttention(D, H)) == 4 * D * D
    normed = InterdomainAttention(D, H, num_modes=M, output_norm=True)
    assert params(normed) == params(base) + D // H
    assert params(InterdomainAttention(D, H, num_modes=M, value_conv=True)) == params(base) + 5 * D


def test_grouped_state_equals_tied_heads():
    """G groups of r query heads == an ungrouped layer whose k/v/SSM weights repeat per group."""
    torch.manual_seed(0)
    G, r = 2, 2
    grouped = InterdomainAttention(D, H, num_modes=M, num_state_groups=G, chunk_size=8)
    full = InterdomainAttention(D, H, num_modes=M, chunk_size=8)
    sd = {}
    for name, t in grouped.state_dict().items():
        if name.startswith(("key_branch", "value_branch")) and t.dim() >= 1:
            t = t.view(G, D // H, *t.shape[1:]).repeat_interleave(r, 0).flatten(0, 1)
        elif name.startswith(("key_norm.bias", "value_norm.bias", "core.")):
            t = t.repeat_interleave(r, 0)
        sd[name] = t
    full.load_state_dict(sd)
    x = torch.randn(2, 29, D)
    torch.testing.assert_close(grouped(x), full(x), atol=1e-5, rtol=1e-5)
    grouped.setup_cache(2, torch.float32)
    assert grouped.kv_cache.state.shape[1] == G  # the state shrinks H/G times


@pytest.mark.parametrize("calibration", ["global", "per_head"])
def test_calibration_gives_unit_rms(calibration):
    m = InterdomainAttention(D, H, num_modes=M, calibration=calibration)
    first = m.calibrate_()
    assert first.shape == (H,) and (first != 1).all()
    if calibration == "global":
        assert torch.allclose(first, first[:1].expand(H))
    else:  # heads with different step sizes need different scales
        assert first.max() / first.min() > 1.5
    # calibrated already: a second pass finds unit RMS (per head or overall) and changes nothing
    torch.testing.assert_close(m.calibrate_(), torch.ones(H), atol=1e-4, rtol=0)


def test_mixer_errors():
    parts = dict(InterdomainAttention(D, H, num_modes=M).named_children())
    wiring = parts  # the attributes are the constructor's arguments
    assert isinstance(SSMMixer(D, H, **wiring), SSMMixer)
    with pytest.raises(ValueError, match="query: QueryReadout needs query branch"):
        SSMMixer(D, H, **{**wiring, "query": None})
    with pytest.raises(ValueError, match="query: LinearReadout takes no query branch"):
        SSMMixer(D, H, **{**wiring, "readout": LinearReadout(H, M)})
    with pytest.raises(ValueError, match="key_branch: expected 4 heads of 8"):
        SSMMixer(D, H, **{**wiring, "key_branch": Branch(D, 2, head_dim=8)})
    with pytest.raises(ValueError, match="calibration: expected one of"):
        SSMMixer(D, H, **wiring, calibration="twice")
    with pytest.raises(TypeError, match="feature_map: expected None or a callable"):
        Branch(D, H, feature_map="relu")
    with pytest.raises(ValueError, match="readout_convention: expected one of"):
        QueryReadout(H, H, "transpose")
    with pytest.raises(ValueError, match="num_state_groups: expected a divisor of num_heads=4"):
        InterdomainAttention(D, H, num_state_groups=3)
    with pytest.raises(ValueError, match="num_state_groups"):
        S4DMixer(D, H, num_state_groups=2)
    with pytest.raises(ValueError, match="embed_dim: 30 is not divisible by num_heads=4"):
        InterdomainAttention(30, H)
    with pytest.raises(ValueError, match="name: expected one of"):
        ablation_cell("full_rope", D, H)
    m = InterdomainAttention(D, H, num_modes=M)
    with pytest.raises(RuntimeError, match="reset_cache: no cache"):
        m.reset_cache()
    with pytest.raises(ValueError, match=r"input_pos: expected \(1, 5\)"):
        m(torch.randn(1, 5, D), input_pos=torch.zeros(2, 5, dtype=torch.long))


@pytest.mark.parametrize("cell", ["full", "single_input_query"])
def test_rope_last_makes_the_layer_shift_invariant(cell):
    """RoPE applied last (after ξ and the SSM input norm) rotates the stored keys and the query
    by their own positions, so every score depends on t - s only: shifting all positions
    changes nothing (query readouts only). RoPE before the feature map (the paper's figure) is an
    absolute code."""
    torch.manual_seed(0)
    x = torch.randn(2, 23, D)
    pos = torch.arange(23).expand(2, 23)
    last = ablation_cell(cell, D, H, num_modes=M, chunk_size=8, rope_position="last")
    torch.testing.assert_close(last(x, input_pos=pos + 1000), last(x, input_pos=pos))
    first = ablation_cell(cell, D, H, num_modes=M, chunk_size=8)
    shifted, plain = first(x, input_pos=pos + 1000), first(x, input_pos=pos)
    assert (shifted - plain).abs().max() > 0.05 * plain.abs().max()  # a real change, not noise


def test_new_options_are_checked():
    for kwargs, name in [
        ({"rope_position": "middle"}, "rope_position"),
        ({"calibration": "twice"}, "calibration"),
        ({"a_init": "hippo"}, "a_init"),
    ]:
        with pytest.raises(ValueError, match=name):
            InterdomainAttention(D, H, num_modes=M, **kwargs)


def test_backend_reaches_the_op_and_the_decode_step(dynamo_only):
    """InterdomainAttention(backend="inductor") trains through the compiled pieces (here traced
    only) with the default layer's outputs and gradients, and decodes on the torch step."""
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    layers = {
        b: InterdomainAttention(32, 2, num_modes=4, chunk_size=8, backend=b).double()
        for b in ("auto", "inductor")
    }
    layers["inductor"].load_state_dict(layers["auto"].state_dict())
    results = {}
    for b, layer in layers.items():
        out = layer(x, x)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        results[b] = [out, *(p.grad for p in layer.parameters())]
    assert dynamo_only == ["forward_piece", "backward_piece"]
    for got, ref in zip(results["inductor"], results["auto"], strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-13)  # measured: 1.8e-15 at most
    layer = layers["inductor"].eval()
    layer.setup_cache(2, torch.float64, 8)
    with torch.no_grad():
        steps = [layer(x[:, t : t + 1], input_pos=torch.full((2, 1), t)) for t in range(8)]
    torch.testing.assert_close(torch.cat(steps, dim=1), results["auto"][0][:, :8])
