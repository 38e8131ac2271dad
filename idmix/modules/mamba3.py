"""Mamba-3 (arXiv 2603.15569; mamba-ssm's ``modules/mamba3.py``), SISO: a baseline mixer.

    [z, x, B, C, Δ̂, Â, λ̂, θ̂] = W_in u        (one projection, no short convolution)
    Δ = softplus(Δ̂ + b_Δ),  A = −max(f(Â), A_floor),  λ = σ(λ̂),  θ = π tanh(θ̂)
    k = RMSNorm(B) + b_B,h,  q = RMSNorm(C) + b_C,h     (biases per head, init 1)
    y = mamba3(q, k, x; Δ, A, λ, θ) + D ⊙ x,   out = W_out (y ⊙ SiLU(z))

with f the heavy-tailed activation (1 + u for u ≥ 0, 1/(1 − u) below; upstream's since
c69aaab), A data-dependent (no A parameter) and the recurrence of ``idmix.functional.mamba3``
(rotations by running angles, exponential-trapezoidal). B, C and θ are shared by the heads
(one group); each head has P = expand·d/H channels and an N × P state. Kept: SISO (MIMO's
rank-R update needs its own chunked form; the paper's +1.2 points for it are at 1.5B, and a
SISO state of the same size keeps the comparison with the other baselines one of recurrences),
rope_fraction 0.5 and upstream's defaults otherwise; the output gate is upstream's default
(SiLU(z), no norm). docs/research/mamba3.md has the sources.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..functional.mamba3 import Mamba3State, mamba3_attention
from .base import CachedMixer
from .cache import Mamba3Cache
from .documents import check_layer_input, positions_and_resets
from .linear_state import at_least_fp32, check_dims, inverse_softplus_steps


def heavy_tail(u: torch.Tensor) -> torch.Tensor:
    """1 + u for u ≥ 0, 1 / (1 − u) below: positive, 1 at 0, continuous slope."""
    return torch.where(u >= 0, 1 + u, 1 / (1 - u.clamp_max(0)))


def num_angles(state_dim: int, rope_fraction: float) -> int:
    """Rotated channel pairs S: ⌊N·rope_fraction⌋ rounded down to even, halved (upstream's)."""
    if rope_fraction not in (0.5, 1.0):
        raise ValueError(f"rope_fraction: expected 0.5 or 1.0, got {rope_fraction!r}")
    return int(state_dim * rope_fraction) // 2 * 2 // 2


class Mamba3(CachedMixer):
    """Mamba-3 SISO mixer: H heads of P = expand·d/H channels, state width N = ``state_dim``.
    State per layer: H·N·P floats (plus the previous token's key and value and the angles)."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        expand: int = 2,
        state_dim: int = 64,
        rope_fraction: float = 0.5,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        a_floor: float = 1e-4,
        chunk_size: int = 64,
        norm_eps: float = 1e-5,
    ):
        super().__init__()
        check_dims(num_heads=num_heads, expand=expand, state_dim=state_dim, chunk_size=chunk_size)
        inner = expand * embed_dim
        if inner % num_heads:
            raise ValueError(
                f"expand: expand·embed_dim = {inner} is not divisible by num_heads={num_heads}"
            )
        H, N, S = num_heads, state_dim, num_angles(state_dim, rope_fraction)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, H, inner // H
        self.state_dim, self.num_angles, self.inner = N, S, inner
        self.a_floor, self.chunk_size = a_floor, chunk_size
        self.in_proj = nn.Linear(embed_dim, 2 * inner + 2 * N + 3 * H + S, bias=False)
        self.key_norm = nn.RMSNorm(N, eps=norm_eps)
        self.query_norm = nn.RMSNorm(N, eps=norm_eps)
        self.key_bias = nn.Parameter(torch.ones(H, N))
        self.query_bias = nn.Parameter(torch.ones(H, N))
        self.dt_bias = nn.Parameter(inverse_softplus_steps(H, dt_min, dt_max))
        self.D = nn.Parameter(torch.ones(H))
        self.output_proj = nn.Linear(inner, embed_dim, bias=False)

    def setup_cache(self, batch_size: int, dtype: torch.dtype, max_seq_len: int = 0) -> None:
        """Allocate the decoding state; its size does not depend on max_seq_len."""
        self.kv_cache = Mamba3Cache.empty(
            batch_size, self.num_heads, self.state_dim, self.head_dim, self.num_angles,
            device=self.output_proj.weight.device,
        )  # fmt: skip
        self.cache_enabled = True

    def _inputs(self, u: torch.Tensor):
        """u (B, T, d) -> z, x (B, T, H, P); q, k (B, T, H, N); Δ, A, λ (B, T, H) and θ
        (B, T, H, S), the gates in at least fp32."""
        B, T, _ = u.shape
        H, N, S = self.num_heads, self.state_dim, self.num_angles
        sizes = [self.inner, self.inner, N, N, H, H, H, S]
        z, x, b, c, dt, a, trap, theta = self.in_proj(u).split(sizes, -1)
        z, x = (t.unflatten(-1, (H, self.head_dim)) for t in (z, x))
        k = self.key_norm(b)[:, :, None] + self.key_bias.to(b.dtype)
        q = self.query_norm(c)[:, :, None] + self.query_bias.to(c.dtype)
        dt = F.softplus(at_least_fp32(dt) + self.dt_bias.float())
        A = -heavy_tail(at_least_fp32(a)).clamp_min(self.a_floor)
        theta = (math.pi * torch.tanh(at_least_fp32(theta)))[:, :, None].expand(B, T, H, S)
        return z, x, q, k, dt, A, torch.sigmoid(at_least_fp32(trap)), theta

    def forward(self, x, y=None, *, mask=None, input_pos=None, impl: str = "chunked"):
        """x: (B, T, d) -> (B, T, d). mask is ignored (causality is in the recurrence);
        input_pos (B, T): positions restarting at 0 mark document starts (every part of the
        state restarts there). impl: the recurrence's "chunked" or "naive" form."""
        B, T = check_layer_input(x, self.embed_dim, input_pos)
        _, reset = positions_and_resets(input_pos, B, T, x.device)
        cache = self.kv_cache if self.cache_enabled else None
        state = None
        if cache is not None:
            cache.check_batch(B)
            if reset is not None:  # rows whose first position starts a document (branch-free)
                cache.reset_rows(reset[:, 0])
            state = Mamba3State(cache.state, cache.k, cache.x, cache.angle)
        z, v, q, k, dt, A, trap, theta = self._inputs(x)
        o, new = mamba3_attention(
            q, k, v, dt, A, trap, theta, initial_state=state, reset=reset,
            chunk_size=self.chunk_size, impl="naive" if T == 1 else impl,  # a decode step: one
        )  # fmt: skip
        if cache is not None:
            self._store(cache, new)
        o = o.to(v.dtype) + self.D.to(v.dtype)[:, None] * v
        return self.output_proj((o * F.silu(z)).flatten(-2))

    @staticmethod
    @torch.no_grad()
    def _store(cache: Mamba3Cache, state: Mamba3State) -> None:
        """Write the new state into the cache (inference state: never part of a graph)."""
        for dst, src in zip((cache.state, cache.k, cache.x, cache.angle), state, strict=True):
            dst.copy_(src)
