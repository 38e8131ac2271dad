"""Model builders: the paper's exact parameter counts, and torchtune's utilities on our blocks."""

from __future__ import annotations

import pytest
import torch

from idmix import models
from idmix.modules import (
    ABLATION_CELLS,
    LinearReadout,
    QueryReadout,
    S4DMixer,
    SoftmaxAttention,
)

PAPER = {  # docs/design.md §1 / paper Table 3
    "125m": (134_105_856, 135_416_208, 12, 12),
    "350m": (373_867_520, 377_360_768, 24, 16),
    "760m": (777_856_512, 781_498_752, 24, 16),
    "1_3b": (1_345_423_360, 1_352_406_784, 24, 32),
}


def count(model):
    return sum(p.numel() for p in model.parameters())


def on_meta(builder, *args, **kwargs):
    with torch.device("meta"):
        return builder(*args, **kwargs)


@pytest.mark.parametrize("scale", PAPER)
def test_paper_parameter_counts(scale):
    softmax, interdomain, layers, heads = PAPER[scale]
    assert count(on_meta(getattr(models, f"softmax_{scale}"))) == softmax
    assert count(on_meta(getattr(models, f"interdomain_{scale}"))) == interdomain
    s4d = count(on_meta(getattr(models, f"s4d_{scale}")))
    assert s4d == interdomain + layers * heads * 64  # + one (H, M) mode contraction per layer


@pytest.mark.parametrize("cell", sorted(ABLATION_CELLS))
def test_ablation_cells_in_paper_range(cell):
    n = count(on_meta(models.ablation_125m, cell))
    assert 135_379_344 <= n <= 135_462_288, n


def test_named_builders_exist_and_build_tiny():
    for name in models.MODEL_BUILDERS:
        assert callable(getattr(models, name)), name
    m = models.interdomain_tiny()
    assert isinstance(m.layers[0].attn.readout, QueryReadout)
    assert isinstance(models.s4d_tiny().layers[0].attn.readout, LinearReadout)
    assert isinstance(models.softmax_tiny().layers[0].attn, SoftmaxAttention)
    logits = m(torch.randint(0, 4096, (2, 33)))
    assert logits.shape == (2, 33, 4096) and torch.isfinite(logits).all()


def test_init_rules():
    m = models.interdomain_small()
    L = len(m.layers)
    w_o = m.layers[0].attn.output_proj.weight
    assert abs(w_o.std().item() - 0.02 / (2 * L) ** 0.5) < 0.2 * 0.02 / (2 * L) ** 0.5
    assert abs(m.tok_embeddings.weight.std().item() - 0.02) < 0.002
    # C calibrated: the core output has unit RMS on unit-variance input at init
    torch.testing.assert_close(m.layers[0].attn.calibrate_(), torch.ones(4), atol=1e-3, rtol=0)
    ssm = m.layers[0].attn.core
    assert torch.allclose(-torch.exp(ssm.log_A_real), torch.full_like(ssm.log_A_real, -0.5))
    dt = torch.exp(ssm.log_dt)
    assert (dt >= 1e-3 - 1e-9).all() and (dt <= 1e-1 + 1e-9).all()


def test_builder_errors():
    with pytest.raises(ValueError, match="mixer: expected"):
        models.decoder(
            vocab_size=10, num_layers=1, num_heads=2, embed_dim=8, max_seq_len=8, mixer="mamba"
        )
    with pytest.raises(ValueError, match="embed_dim: 10 is not divisible by num_heads=4"):
        models.decoder(vocab_size=10, num_layers=1, num_heads=4, embed_dim=10, max_seq_len=8)
    with pytest.raises(ValueError, match="num_layers: expected a positive int"):
        models.decoder(vocab_size=10, num_layers=0, num_heads=2, embed_dim=8, max_seq_len=8)


def test_mixer_injection():
    m = models.decoder(
        vocab_size=50,
        num_layers=2,
        num_heads=2,
        embed_dim=16,
        max_seq_len=64,
        mixer=lambda i: SoftmaxAttention(16, 2) if i == 0 else S4DMixer(16, 2, num_modes=4),
    )
    assert isinstance(m.layers[0].attn, SoftmaxAttention)
    assert isinstance(m.layers[1].attn.readout, LinearReadout)
    assert m(torch.randint(0, 50, (1, 9))).shape == (1, 9, 50)


def test_torchtune_activation_checkpointing_wraps_our_blocks():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torchtune.modules import TransformerSelfAttentionLayer
    from torchtune.training import set_activation_checkpointing

    m = models.interdomain_tiny()
    x = torch.randint(0, 4096, (1, 40))
    ref = m(x)
    set_activation_checkpointing(m, auto_wrap_policy={TransformerSelfAttentionLayer})
    assert all(isinstance(layer, CheckpointWrapper) for layer in m.layers)
    out = m(x)
    out.sum().backward()
    assert torch.allclose(out, ref, atol=1e-5)
    assert m.layers[0].attn.core.C_re.grad is not None  # gradients reach the SSM through AC


def test_torchtune_compile_compiles_our_blocks():
    from torchtune.training import compile_model

    torch._dynamo.reset()
    m = models.s4d_tiny()
    x = torch.randint(0, 4096, (1, 24))
    ref = m(x)
    compile_model(m, verbose=False)
    assert all(layer._compiled_call_impl is not None for layer in m.layers)
    out = m(x)
    assert torch.allclose(out, ref, atol=1e-4)
    torch._dynamo.reset()


def test_torchtune_fsdp2_shards_our_blocks(tmp_path):
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    from torchtune.training import shard_model

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        m = models.interdomain_tiny()
        x = torch.randint(0, 4096, (1, 20))
        ref = m(x)
        shard_model(
            m,
            [lambda name, module: name.startswith("layers.") and name.count(".") == 1],
            cpu_offload=False,
        )
        assert all(isinstance(layer, FSDPModule) for layer in m.layers)
        assert isinstance(m, FSDPModule)
        out = m(x)
        out.sum().backward()
        assert torch.allclose(out, ref, atol=1e-5)
    finally:
        dist.destroy_process_group()


def test_unknown_mixer_option_names_the_key():
    with pytest.raises(ValueError, match=r"unknown \['mixer_kwargs'\] for mixer 'interdomain'"):
        models.interdomain_tiny(mixer_kwargs={"dt_min": 0.01})
    with pytest.raises(ValueError, match=r"unknown \['readout'\]"):
        models.s4d_tiny(readout="query")


def test_cpu_builders_carry_the_study_defaults_and_the_paper_stays_one_argument_away():
    layer = models.interdomain_tiny().layers[0].attn
    assert layer.core.dt_min == 1e-2 and layer.rope_last_base == 10000.0
    assert models.s4d_small().layers[0].attn.core.dt_min == 1e-2
    paper = models.interdomain_tiny(dt_min=1e-3, rope_position="before_feature_map")
    assert paper.layers[0].attn.core.dt_min == 1e-3
    assert paper.layers[0].attn.rope_last_base is None
    with torch.device("meta"):  # the paper's sizes keep the paper's choices
        assert models.interdomain_125m().layers[0].attn.rope_last_base is None
