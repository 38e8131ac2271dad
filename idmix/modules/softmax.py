"""Llama-style multi-head softmax attention (the paper's baseline): RoPE, SDPA, a KV cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..functional import rope
from .base import CachedMixer
from .cache import KVCache
from .documents import check_layer_input, positions_and_resets


class SoftmaxAttention(CachedMixer):
    """4d² parameters (q, k, v, o projections, no biases); torchtune's attention contract.

    Without a mask: causal, or block-causal when input_pos restarts at 0 inside a row (packed
    documents). With a cache: keys/values are appended; ``mask`` (B, T, S_max), True = attend,
    as torchtune's generation utilities build it, or causal over the filled cache if None.
    context_parallel: None, or the ``ContextParallel`` the input is a slice of (every rank's keys
    and values are all-gathered).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        rope_base: float = 10000.0,
        use_rope: bool = True,
        context_parallel=None,
    ):
        super().__init__()
        self.context_parallel = context_parallel
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim: {embed_dim} is not divisible by num_heads={num_heads}")
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.output_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.rope_base, self.use_rope = rope_base, use_rope

    def setup_cache(self, batch_size: int, dtype: torch.dtype, max_seq_len: int) -> None:
        self.kv_cache = KVCache.empty(
            batch_size,
            self.num_heads,
            max_seq_len,
            self.head_dim,
            dtype,
            device=self.q_proj.weight.device,
        )
        self.cache_enabled = True

    def forward(self, x, y=None, *, mask=None, input_pos=None):
        B, T = check_layer_input(x, self.num_heads * self.head_dim, input_pos)
        d = x.shape[-1]
        pos, reset = positions_and_resets(input_pos, B, T, x.device)
        cp = self.context_parallel
        cache = self.kv_cache if self.cache_enabled else None
        self.check_context_parallel(cache)
        if cp is not None:
            pos = cp.positions(input_pos, B, T, x.device)
        q, k, v = (
            p(x).unflatten(-1, (self.num_heads, self.head_dim))
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        if self.use_rope:
            q, k = rope(q, pos, self.rope_base), rope(k, pos, self.rope_base)
        if cp is not None:
            o = self._context_parallel(cp, q, k, v, pos, reset)
            return self.output_proj(o.transpose(1, 2).reshape(B, T, d))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, d_h)
        if cache is not None:
            cache.check_room(B, T)
            # positions written from the length tensor (no host sync: decoding compiles whole)
            rows = cache.length[:1] + torch.arange(T, device=x.device)  # (T,)
            cache.k.index_copy_(2, rows, k.to(cache.k.dtype))
            cache.v.index_copy_(2, rows, v.to(cache.v.dtype))
            cache.length += T
            k, v = cache.k.to(q.dtype), cache.v.to(q.dtype)
            if mask is None:
                cols = torch.arange(k.shape[2], device=x.device)
                mask = (cols[None, :] <= rows[:, None]).expand(B, T, -1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, :, : k.shape[2]])
        elif mask is not None:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        elif reset is not None:  # packed documents: block-causal (branch-free, so it compiles)
            doc = reset.long().cumsum(dim=1)  # document id per position
            same = doc[:, :, None] == doc[:, None, :]
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=(same & causal)[:, None])
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.output_proj(o.transpose(1, 2).reshape(B, T, d))

    @staticmethod
    def _context_parallel(cp, q, k, v, pos, reset):
        """This rank's queries against every rank's keys and values (all-gathered, equal slices):
        the global causal mask, block-diagonal over documents when positions restart. q, k, v:
        (B, T_r, H, d_h) -> (B, H, T_r, d_h)."""
        B, T = q.shape[:2]
        start = cp.start(T, q.device)
        k, v = cp.gather_sequence(k, "softmax_k"), cp.gather_sequence(v, "softmax_v")
        cols = torch.arange(k.shape[1], device=q.device)
        mask = cols[None, :] <= (start + torch.arange(T, device=q.device))[:, None]  # (T, S)
        mask = mask.expand(B, T, -1)
        if reset is not None:  # same document: equal counts of document starts so far
            doc = cp.gather_sequence(reset.int(), "softmax_resets").cumsum(1)  # (B, S)
            mask = mask & (doc[:, start : start + T, None] == doc[:, None, :])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
