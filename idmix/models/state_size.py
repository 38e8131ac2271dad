"""What a model carries from token to token: the recurrent state of each layer, in floats."""

from __future__ import annotations

import torch
from torch import nn


def recurrent_state_floats(model: nn.Module) -> list[int | None]:
    """Per layer, the floats of its fixed-size recurrent state for one sequence (the cache's
    ``state``: the interdomain and S4D (G, R+D, 2M) state, the linear baselines' (H, K, V)
    matrix); None for a softmax layer, whose KV cache grows with the context. Short-conv
    histories are not counted (``conv_history_floats``)."""
    return [_cache_floats(layer.attn, "state") for layer in model.layers]


def conv_history_floats(model: nn.Module) -> list[int | None]:
    """Per layer, the floats of its short-conv histories for one sequence (None: softmax)."""
    return [_cache_floats(layer.attn, "conv") for layer in model.layers]


def _cache_floats(mixer: nn.Module, part: str) -> int | None:
    """The floats of one sequence's decoding cache of mixer: its ``state`` tensor, or the sum
    of its conv histories (the fields named conv*); None for a cache without a state."""
    had = mixer.kv_cache, mixer.cache_enabled
    mixer.setup_cache(1, torch.float32, 1)
    try:
        cache = mixer.kv_cache
        if not hasattr(cache, "state"):
            return None
        if part == "state":
            return cache.state.numel()
        return sum(v.numel() for k, v in cache.items() if k.startswith("conv"))
    finally:
        mixer.kv_cache, mixer.cache_enabled = had
