"""The output gate of the linear baselines: a per-head RMSNorm and a SiLU gate from the input."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GatedHeadNorm(nn.Module):
    """o -> RMSNorm_per_head(o) ⊙ SiLU(W_g x) (GLA, Gated DeltaNet), or with ``gate_first``
    RMSNorm_per_head(o ⊙ SiLU(W_g x)) (Mamba-2's gated norm, one group per head).

    gate_proj: d × H·V, no bias; the norm's weight is H·V wide (one per channel); computed in
    fp32 at least.
    forward(x (B, T, d), o (B, T, H, V)) -> (B, T, H·V).
    """

    def __init__(self, embed_dim, num_heads, value_dim, *, gate_first=False, eps=1e-6):
        super().__init__()
        self.num_heads, self.value_dim, self.gate_first, self.eps = (
            num_heads,
            value_dim,
            gate_first,
            eps,
        )
        self.gate_proj = nn.Linear(embed_dim, num_heads * value_dim, bias=False)
        self.weight = nn.Parameter(torch.ones(num_heads * value_dim))

    def forward(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(o.dtype, torch.float32)  # fp32 for half inputs
        z = F.silu(self.gate_proj(x).to(dtype)).unflatten(-1, (self.num_heads, self.value_dim))
        h = o.to(dtype) * z if self.gate_first else o.to(dtype)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = h if self.gate_first else h * z
        return (h.flatten(-2) * self.weight.to(dtype)).to(o.dtype)
