"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024): the gated delta rule with a scalar decay.

    S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,   o_t = K^-½ S_tᵀ q_t,
    β_t = σ(W_β x_t),   log α_t = −exp(A_log) · softplus(W_α x_t + b_Δ),

q, k, v from a short causal conv and SiLU, q and k L2-normalised per head (the interdomain
feature map ξ), then o -> RMSNorm per head ⊙ SiLU(W_g x) -> W_O.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..functional import silu_l2_feature_map
from ..functional.delta_rule import gated_delta_rule
from .gated_norm import GatedHeadNorm
from .linear_state import (
    LinearStateMixer,
    at_least_fp32,
    branch,
    check_dims,
    inverse_softplus_steps,
)


class GatedDeltaNet(LinearStateMixer):
    """Gated DeltaNet mixer: H heads, keys of ``key_dim`` and values of ``value_dim`` per head
    (defaults d/H and 2·d/H, the paper's value expansion 2), a short conv of ``conv_size`` on q,
    k, v. Init as in the paper: A = U[0, 16] (log decay −A·Δ), softplus(b_Δ) log-uniform in
    [dt_min, dt_max]. State per layer: H·K·V floats."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        key_dim: int | None = None,
        value_dim: int | None = None,
        conv_size: int = 4,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        chunk_size: int = 64,
        norm_eps: float = 1e-6,
    ):
        key_dim = embed_dim // num_heads if key_dim is None else key_dim
        value_dim = 2 * embed_dim // num_heads if value_dim is None else value_dim
        check_dims(num_heads=num_heads, key_dim=key_dim, value_dim=value_dim)
        super().__init__(
            embed_dim,
            num_heads,
            query=branch(embed_dim, num_heads, key_dim, conv_size, silu_l2_feature_map),
            key=branch(embed_dim, num_heads, key_dim, conv_size, silu_l2_feature_map),
            value=branch(embed_dim, num_heads, value_dim, conv_size, F.silu),
            output_gate=GatedHeadNorm(embed_dim, num_heads, value_dim, eps=norm_eps),
            chunk_size=chunk_size,
        )
        self.beta_proj = nn.Linear(embed_dim, num_heads, bias=False)
        self.decay_proj = nn.Linear(embed_dim, num_heads, bias=True)
        # A = U(0, 16] (log A well defined: kept away from 0)
        self.A_log = nn.Parameter(torch.empty(num_heads).uniform_(1e-4, 16).log())
        with torch.no_grad():
            self.decay_proj.bias.copy_(inverse_softplus_steps(num_heads, dt_min, dt_max))

    def gates(self, x):
        beta = torch.sigmoid(at_least_fp32(self.beta_proj(x)))
        dt = F.softplus(at_least_fp32(self.decay_proj(x)))
        return {"beta": beta, "log_decay": -at_least_fp32(self.A_log).exp() * dt}

    def recurrence(self, q, k, v, gates, state, reset, impl):
        return gated_delta_rule(
            q, k, v, gates["beta"], gates["log_decay"], initial_state=state, reset=reset,
            chunk_size=self.chunk_size, impl=impl,
        )  # fmt: skip
