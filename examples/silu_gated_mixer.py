"""Interdomain Attention with a SiLU output gate (o ← o ⊙ SiLU(W_z x), the gate of Mamba's
block) instead of the library's sigmoid gate: one new part (a module), no library edit:

    tune run recipes/pretrain_interdomain.py --config recipes/configs/tiny_interdomain.yaml \\
        model.mixer._component_=examples.silu_gated_mixer.silu_gated_interdomain
"""

from __future__ import annotations

import torch
from torch import nn

from idmix.modules import SSMArgs, SSMMixer, ssm_mixer


class SiLUGate(nn.Module):
    """gate(x, o) = o ⊙ SiLU(W_z x); x, o: (..., d)."""

    def __init__(self, embed_dim: int):
        super().__init__()
        self.proj = nn.Linear(embed_dim, embed_dim, bias=False)

    def forward(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return o * nn.functional.silu(self.proj(x))


def silu_gate(args: SSMArgs) -> SiLUGate:
    """The gate part's factory: ssm_mixer calls it with the mixer's settings."""
    return SiLUGate(args.embed_dim)


def silu_gated_interdomain(embed_dim: int, num_heads: int, **options) -> SSMMixer:
    """Interdomain Attention (``ssm_mixer``'s default parts) with the SiLU gate."""
    return ssm_mixer(embed_dim, num_heads, gate=silu_gate, **options)
