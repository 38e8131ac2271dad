"""Building blocks of the SSM mixers' input and query paths."""

from __future__ import annotations

import torch
from torch import nn

from ..functional import rope, short_conv, short_conv_step, short_conv_with_resets
from .parts import FeatureMap


class Branch(nn.Module):
    """x -> W x -> [short conv] -> [RoPE] -> [feature map per head], at width H·d_h before the
    head split.

    proj: d × H·d_h, no bias (d_h defaults to d/H); conv: depthwise, kernel ``conv_size``, with
    bias (5·H·d_h parameters at kernel 4). RoPE and the feature map act per head.
    feature_map: None (identity) or a callable (..., d_h) -> (..., d_h), e.g.
    ``idmix.functional.silu_l2_feature_map`` (ξ) or a user's; an ``nn.Module`` is registered as
    a submodule (its parameters train with the branch). Output (B, T, H, d_h).
    """

    def __init__(
        self,
        embed_dim,
        num_heads,
        *,
        head_dim=None,
        conv=True,
        use_rope=False,
        feature_map: FeatureMap | None = None,
        conv_size=4,
        rope_base=10000.0,
    ):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim or embed_dim // num_heads
        width = self.out_dim = num_heads * self.head_dim
        self.proj = nn.Linear(embed_dim, width, bias=False)
        self.conv_size = conv_size if conv else 0
        if conv:
            self.conv_weight = nn.Parameter(torch.empty(width, conv_size))
            self.conv_bias = nn.Parameter(torch.zeros(width))
            self._reset_conv()
        if feature_map is not None and not callable(feature_map):
            raise TypeError(
                f"feature_map: expected None or a callable, got {type(feature_map).__name__}"
            )
        self.use_rope, self.feature_map, self.rope_base = use_rope, feature_map, rope_base

    @torch.no_grad()
    def _reset_conv(self):
        if not self.conv_weight.is_meta:
            nn.init.uniform_(self.conv_weight, -(self.conv_size**-0.5), self.conv_size**-0.5)
            self.conv_bias.zero_()

    def forward(self, x, positions, reset, conv_cache=None, context_parallel=None):
        """x: (B, T, d); positions (B, T); reset (B, T) bool or None (no document starts);
        context_parallel: None, or the ``ContextParallel`` x is a slice of (the conv history
        then comes from the previous rank). Returns (y: (B, T, H, d_h), new conv cache)."""
        h = self.proj(x)
        new_cache = None
        if self.conv_size and context_parallel is not None:
            conv_cache = context_parallel.conv_halo(h, reset, self.conv_weight)
        if self.conv_size and reset is None:
            h, new_cache = short_conv(h, self.conv_weight, self.conv_bias, conv_cache)
        elif self.conv_size:
            h, new_cache = short_conv_with_resets(
                h, self.conv_weight, self.conv_bias, reset, conv_cache
            )
        return self._per_head(h, positions), new_cache

    def step(self, x_t, positions, conv_cache):
        """One token. x_t: (B, d); positions: (B,). Returns (y: (B, H, d_h), new conv cache)."""
        h = self.proj(x_t)
        new_cache = None
        if self.conv_size:
            h, new_cache = short_conv_step(h, self.conv_weight, self.conv_bias, conv_cache)
        return self._per_head(h[:, None], positions[:, None])[:, 0], new_cache

    def _per_head(self, h, positions):
        h = h.unflatten(-1, (self.num_heads, self.head_dim))
        if self.use_rope:
            h = rope(h, positions, self.rope_base)
        return h if self.feature_map is None else self.feature_map(h)


class HeadNorm(nn.Module):
    """RMSNorm over d_h with one weight vector shared by all heads, plus a per-head bias
    (paper eq. 12, "N+b"): d_h + H·d_h parameters. In the SSM optimiser group (paper §5)."""

    param_group = "ssm"

    def __init__(self, num_heads, head_dim, eps=1e-6):
        super().__init__()
        self.norm = nn.RMSNorm(head_dim, eps=eps)
        self.bias = nn.Parameter(torch.zeros(num_heads, head_dim))

    def forward(self, x):
        """x: (..., H, d_h) -> same shape."""
        return self.norm(x) + self.bias.to(x.dtype)
