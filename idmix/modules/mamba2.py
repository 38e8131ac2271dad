"""Mamba-2's SSD block (Dao & Gu 2024): one scalar decay per head and token.

    Δ_t = softplus(W_Δ x_t + b_Δ),  log α_t = −exp(A_log) Δ_t,
    S_t = α_t S_{t−1} + B_t (Δ_t x_t)ᵀ,   y_t = S_tᵀ C_t + D ⊙ x_t,

with x, B, C from a short causal conv and SiLU (B and C shared by all heads: one group), then
the gated norm RMSNorm(y ⊙ SiLU(z)) -> W_O. The state of a head is N × P (P = expand·d/H).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..functional.gated_linear import gated_linear_attention
from .gated_norm import GatedHeadNorm
from .linear_state import (
    LinearStateMixer,
    at_least_fp32,
    branch,
    check_dims,
    inverse_softplus_steps,
)


class Mamba2(LinearStateMixer):
    """Mamba-2 mixer: H heads of P = expand·d/H channels, state width N = ``state_dim`` (one
    B/C group), a short conv of ``conv_size`` with SiLU on x, B and C. Init as in the paper:
    A = −U[1, 16], softplus(b_Δ) log-uniform in [dt_min, dt_max], D = 1. State per layer:
    H·N·P floats."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        expand: int = 2,
        state_dim: int = 64,
        conv_size: int = 4,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        chunk_size: int = 64,
        norm_eps: float = 1e-6,
    ):
        check_dims(num_heads=num_heads, expand=expand, state_dim=state_dim)
        if expand * embed_dim % num_heads:
            raise ValueError(
                f"expand: expand·embed_dim = {expand * embed_dim} is not divisible by "
                f"num_heads={num_heads}"
            )
        head_dim = expand * embed_dim // num_heads
        super().__init__(
            embed_dim,
            num_heads,
            query=branch(embed_dim, 1, state_dim, conv_size, F.silu),  # C
            key=branch(embed_dim, 1, state_dim, conv_size, F.silu),  # B
            value=branch(embed_dim, num_heads, head_dim, conv_size, F.silu),  # x
            output_gate=GatedHeadNorm(
                embed_dim, num_heads, head_dim, gate_first=True, eps=norm_eps
            ),
            chunk_size=chunk_size,
        )
        self.dt_proj = nn.Linear(embed_dim, num_heads, bias=True)
        self.A_log = nn.Parameter(torch.empty(num_heads).uniform_(1, 16).log())
        self.D = nn.Parameter(torch.ones(num_heads))
        with torch.no_grad():
            self.dt_proj.bias.copy_(inverse_softplus_steps(num_heads, dt_min, dt_max))

    def gates(self, x):
        dt = F.softplus(at_least_fp32(self.dt_proj(x)))  # (B, T, H)
        return {"dt": dt, "log_decay": -at_least_fp32(self.A_log).exp() * dt}

    def recurrence(self, q, k, v, gates, state, reset, impl):
        v = v * gates["dt"][..., None].to(v.dtype)
        return gated_linear_attention(
            q, k, v, gates["log_decay"], scale=1.0, initial_state=state, reset=reset,
            chunk_size=self.chunk_size, impl=impl,
        )  # fmt: skip

    def skip(self, o, v):
        return o + self.D.to(v.dtype)[:, None] * v
