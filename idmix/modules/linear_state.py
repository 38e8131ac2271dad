"""What the linear baselines share: q/k/v branches, a (H, K, V) matrix state, a gated output.

    x -> query, key, value branches (projection, [short conv], feature map) ─┐
    x -> the mixer's own gates (decays, writing strengths) ──────────────────┴─> recurrence
      -> o (B, T, H, V) -> [skip] -> GatedHeadNorm(x, o) -> output_proj

A subclass says how it gates (``gates``), which recurrence it runs (``recurrence``) and, if
any, a skip term; the torchtune attention contract, the decoding cache (decode = forward at
T = 1, through the same recurrence) and document resets live here.
"""

from __future__ import annotations

import abc
import math

import torch
from torch import nn

from .base import CachedMixer
from .branches import Branch
from .cache import MatrixStateCache
from .documents import check_layer_input, positions_and_resets
from .gated_norm import GatedHeadNorm


def check_dims(**dims) -> None:
    """Each named size a positive int (the error names it)."""
    for name, n in dims.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name}: expected a positive int, got {n!r}")


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """x in fp32 if it is half or bfloat16 (gates and norms), else as it is (fp64 stays)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def branch(embed_dim, num_heads, head_dim, conv_size, feature_map=None) -> Branch:
    """A q/k/v Branch: projection to num_heads × head_dim, a short conv of kernel conv_size
    (0: none), then feature_map per head (None: identity)."""
    return Branch(
        embed_dim, num_heads, head_dim=head_dim, conv=conv_size > 0, conv_size=conv_size or 4,
        feature_map=feature_map,
    )  # fmt: skip


def inverse_softplus_steps(num: int, dt_min: float, dt_max: float) -> torch.Tensor:
    """(num,) biases b with softplus(b) log-uniform in [dt_min, dt_max] (Mamba's Δ init)."""
    if not 0 < dt_min <= dt_max:
        raise ValueError(f"dt_min, dt_max: expected 0 < dt_min <= dt_max, got {dt_min}, {dt_max}")
    u = torch.rand(num)
    dt = torch.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    return inverse_softplus(dt)


def inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    """b with softplus(b) = y (y > 0)."""
    return y + torch.log(-torch.expm1(-y))


class LinearStateMixer(CachedMixer, abc.ABC):
    """Base of the mixers whose state is one (K, V) matrix per head.

    query, key: Branches of H_qk heads of K (H_qk divides H: Mamba-2 shares one across all
    heads); value: a Branch of H heads of V; output_gate: GatedHeadNorm; output_proj: H·V × d.
    Subclasses implement ``gates(x) -> dict`` and ``recurrence(q, k, v, gates, state, reset)
    -> (o, S_T)``, and may override ``skip(o, v, x)``.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        query: Branch,
        key: Branch,
        value: Branch,
        output_gate: GatedHeadNorm,
        chunk_size: int,
    ):
        super().__init__()
        check_dims(chunk_size=chunk_size)
        if num_heads % key.num_heads or value.num_heads != num_heads:
            raise ValueError(
                f"num_heads: {num_heads} value heads and {key.num_heads} key heads (a divisor)"
                f" expected, got {value.num_heads} value heads"
            )
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.key_dim, self.value_dim = key.head_dim, value.head_dim
        self.query, self.key, self.value, self.output_gate = query, key, value, output_gate
        self.output_proj = nn.Linear(num_heads * self.value_dim, embed_dim, bias=False)
        self.chunk_size = chunk_size

    # what a subclass defines ------------------------------------------------------------------
    @abc.abstractmethod
    def gates(self, x: torch.Tensor) -> dict:
        """x: (B, T, d) -> the recurrence's per-token gates."""

    @abc.abstractmethod
    def recurrence(self, q, k, v, gates: dict, state, reset, impl: str):
        """q, k: (B, T, H, K); v: (B, T, H, V) -> (o (B, T, H, V), S_T (B, H, K, V))."""

    def skip(self, o: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """o, v: (B, T, H, V) -> o plus any direct path from the values (none here)."""
        return o

    # torchtune attention contract -------------------------------------------------------------
    def setup_cache(self, batch_size: int, dtype: torch.dtype, max_seq_len: int = 0) -> None:
        """Allocate the decoding state; its size does not depend on max_seq_len."""
        shapes = [
            (b.conv_size - 1, b.out_dim) if b.conv_size else (0, 0)
            for b in (self.query, self.key, self.value)
        ]
        self.kv_cache = MatrixStateCache.empty(
            batch_size,
            self.num_heads,
            self.key_dim,
            self.value_dim,
            shapes,
            dtype,
            device=self.output_proj.weight.device,
        )
        self.cache_enabled = True

    def forward(self, x, y=None, *, mask=None, input_pos=None, impl: str = "chunked"):
        """x: (B, T, d) -> (B, T, d). mask is ignored (causality is in the recurrence);
        input_pos (B, T): positions restarting at 0 mark document starts (state and conv
        history reset there). impl: the recurrence's "chunked" or "naive" form."""
        B, T = check_layer_input(x, self.embed_dim, input_pos)
        pos, reset = positions_and_resets(input_pos, B, T, x.device)
        cache = self.kv_cache if self.cache_enabled else None
        convs = (None, None, None)
        if cache is not None:
            cache.check_batch(B)
            if reset is not None:  # rows whose first position starts a document (branch-free)
                cache.reset_rows(reset[:, 0])
            convs = (cache.conv_q, cache.conv_k, cache.conv_v)
        (q, cq), (k, ck), (v, cv) = (
            branch(x, pos, reset, conv)
            for branch, conv in zip((self.query, self.key, self.value), convs, strict=True)
        )
        repeat = self.num_heads // self.key.num_heads
        q, k = q.repeat_interleave(repeat, 2), k.repeat_interleave(repeat, 2)
        state = None if cache is None else cache.state
        o, S = self.recurrence(q, k, v, self.gates(x), state, reset, impl)
        if cache is not None:
            self._store(cache, S, cq, ck, cv)
        o = self.skip(o.to(v.dtype), v)
        return self.output_proj(self.output_gate(x, o))

    @staticmethod
    @torch.no_grad()
    def _store(cache: MatrixStateCache, S, cq, ck, cv) -> None:
        """Write the new state into the cache (inference state: never part of a graph)."""
        cache.state.copy_(S)
        for dst, src in zip((cache.conv_q, cache.conv_k, cache.conv_v), (cq, ck, cv), strict=True):
            if src is not None:
                dst.copy_(src)
