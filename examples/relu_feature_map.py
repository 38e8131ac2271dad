"""Interdomain Attention with a ReLU feature map instead of ξ = SiLU + L2.

    φ(x) = ReLU(x) / ||ReLU(x)||₂ per head (unit norm, like ξ, so the readout scale is the same)

The feature map is one injected callable: ``ssm_mixer`` gives it to the query and key branches.
Train it: tune run recipes/pretrain_interdomain.py --config examples/configs/relu_feature_map.yaml
"""

from __future__ import annotations

import torch

from idmix.models import CPU_SCALES, CPU_SSM_DEFAULTS, decoder
from idmix.modules import SSMMixer, ssm_mixer


def relu_l2(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(..., d_h) -> (..., d_h): ReLU, then unit L2 norm (an all-negative vector maps to 0)."""
    y = torch.relu(x)
    return y / torch.linalg.vector_norm(y, dim=-1, keepdim=True).clamp_min(eps)


def relu_interdomain(embed_dim: int, num_heads: int, **options) -> SSMMixer:
    """Interdomain Attention (dual KV input, query readout) with φ = relu_l2."""
    return ssm_mixer(
        embed_dim, num_heads, dual_kv=True, query_readout=True, feature_map=relu_l2, **options
    )


def relu_interdomain_tiny(**overrides):
    """A model builder for configs: the tiny CPU size with the ReLU mixer in every block."""
    d, layers, heads, modes = CPU_SCALES["tiny"]
    options = {"num_modes": modes, **CPU_SSM_DEFAULTS}
    kwargs = dict(vocab_size=4096, num_layers=layers, num_heads=heads, embed_dim=d)
    kwargs.update(max_seq_len=2048, **overrides)
    return decoder(mixer=lambda _: relu_interdomain(d, heads, **options), **kwargs)
