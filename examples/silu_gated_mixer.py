"""A new mixer wired from parts by hand: Interdomain Attention with a SiLU output gate
(o ← o ⊙ SiLU(W_z x), the gate of Mamba's block) instead of the library's sigmoid gate.

Every part is injected into ``SSMMixer``: the branches, the N+b norms, the S4D core, the
query readout and the gate module, which is the one new piece.
Train it: tune run recipes/pretrain_interdomain.py --config examples/configs/silu_gated_mixer.yaml
"""

from __future__ import annotations

import torch
from torch import nn

from idmix.functional import silu_l2_feature_map
from idmix.models import CPU_SCALES, decoder
from idmix.modules import Branch, HeadNorm, QueryReadout, S4DCore, SSMMixer


class SiLUGate(nn.Module):
    """gate(x, o) = o ⊙ SiLU(W_z x); x, o: (..., d)."""

    def __init__(self, embed_dim: int):
        super().__init__()
        self.proj = nn.Linear(embed_dim, embed_dim, bias=False)

    def forward(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return o * nn.functional.silu(self.proj(x))


def silu_gated_interdomain(embed_dim: int, num_heads: int, num_modes: int = 64) -> SSMMixer:
    d_h = embed_dim // num_heads
    xi = silu_l2_feature_map
    return SSMMixer(
        embed_dim,
        num_heads,
        query=Branch(embed_dim, num_heads, feature_map=xi),  # ξ(SC(W_Q x))
        key_branch=Branch(embed_dim, num_heads, feature_map=xi),  # ξ(SC(W_K x))
        value_branch=Branch(embed_dim, num_heads, conv=False),  # W_V x
        key_norm=HeadNorm(num_heads, d_h),
        value_norm=HeadNorm(num_heads, d_h),
        core=S4DCore(num_heads, num_modes, dt_min=1e-2, dt_max=1e-1),
        readout=QueryReadout(num_heads, num_heads, "conj", chunk_size=64),
        gate=SiLUGate(embed_dim),
        output_proj=nn.Linear(embed_dim, embed_dim, bias=False),
        rope_last_base=10000.0,  # RoPE on ξ(q) and the normalised keys: relative scores
    )


def silu_gated_tiny(**overrides):
    """A model builder for configs: the tiny CPU size with this mixer in every block."""
    d, layers, heads, modes = CPU_SCALES["tiny"]
    kwargs = dict(vocab_size=4096, num_layers=layers, num_heads=heads, embed_dim=d)
    kwargs.update(max_seq_len=2048, **overrides)
    return decoder(mixer=lambda _: silu_gated_interdomain(d, heads, modes), **kwargs)
