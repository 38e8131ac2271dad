"""Interdomain Attention with a ReLU feature map instead of ξ = SiLU + L2: one new part (a
function), selected from the command line with no library edit:

    φ(x) = ReLU(x) / ||ReLU(x)||₂ per head (unit norm, like ξ, so the readout scale is the same)

    tune run recipes/pretrain_interdomain.py --config recipes/configs/tiny_interdomain.yaml \\
        model.mixer._component_=examples.relu_feature_map.relu_interdomain

The model builder (``interdomain_tiny``) keeps its sizes and passes its mixer options
(num_modes, dt_min, …) to ``relu_interdomain``, which gives them to ``ssm_mixer``.
"""

from __future__ import annotations

import torch

from idmix.modules import SSMMixer, ssm_mixer


def relu_l2(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(..., d_h) -> (..., d_h): ReLU, then unit L2 norm (an all-negative vector maps to 0)."""
    y = torch.relu(x)
    return y / torch.linalg.vector_norm(y, dim=-1, keepdim=True).clamp_min(eps)


def relu_interdomain(embed_dim: int, num_heads: int, **options) -> SSMMixer:
    """Interdomain Attention (``ssm_mixer``'s default parts) with φ = relu_l2."""
    return ssm_mixer(embed_dim, num_heads, feature_map=relu_l2, **options)
