"""Gated Linear Attention (Yang, Wang, Shen, Panda & Kim 2023): per-channel data-dependent decay.

    S_t = diag(α_t) S_{t−1} + k_t v_tᵀ,   o_t = K^-½ S_tᵀ q_t,
    log α_t = logsigmoid(W_α2 W_α1 x_t + b_α) / 16   (one decay per key channel and head),

then o -> RMSNorm per head ⊙ SiLU(W_g x) -> W_O, as in the paper's GLA block.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from ..functional.gated_linear import gated_linear_attention
from .gated_norm import GatedHeadNorm
from .linear_state import LinearStateMixer, at_least_fp32, branch, check_dims

GATE_LOGIT_NORMALIZER = 16  # the paper's temperature: decays start near 1 (slow forgetting)


class GatedLinearAttention(LinearStateMixer):
    """GLA: H heads, keys of ``key_dim`` and values of ``value_dim`` per head (defaults d/H
    and 2·d/H, the paper's expansion 0.5 / 1 relative to a d/H head), a rank-``gate_rank``
    decay projection (d·r + r·H·K + H·K parameters), an optional short conv (``conv_size`` > 0)
    on q, k, v. State per layer: H·K·V floats."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        key_dim: int | None = None,
        value_dim: int | None = None,
        gate_rank: int = 16,
        conv_size: int = 0,
        chunk_size: int = 64,
        norm_eps: float = 1e-6,
    ):
        key_dim = embed_dim // num_heads if key_dim is None else key_dim
        value_dim = 2 * embed_dim // num_heads if value_dim is None else value_dim
        check_dims(num_heads=num_heads, key_dim=key_dim, value_dim=value_dim, gate_rank=gate_rank)
        super().__init__(
            embed_dim,
            num_heads,
            query=branch(embed_dim, num_heads, key_dim, conv_size),
            key=branch(embed_dim, num_heads, key_dim, conv_size),
            value=branch(embed_dim, num_heads, value_dim, conv_size),
            output_gate=GatedHeadNorm(embed_dim, num_heads, value_dim, eps=norm_eps),
            chunk_size=chunk_size,
        )
        self.decay_proj = nn.Sequential(
            nn.Linear(embed_dim, gate_rank, bias=False),
            nn.Linear(gate_rank, num_heads * key_dim, bias=True),
        )

    def gates(self, x):
        logit = self.decay_proj(x).unflatten(-1, (self.num_heads, self.key_dim))
        return {"log_decay": F.logsigmoid(at_least_fp32(logit)) / GATE_LOGIT_NORMALIZER}

    def recurrence(self, q, k, v, gates, state, reset, impl):
        return gated_linear_attention(
            q, k, v, gates["log_decay"], initial_state=state, reset=reset,
            chunk_size=self.chunk_size, impl=impl,
        )  # fmt: skip
