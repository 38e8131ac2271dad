"""What every mixer shares: torchtune's cache attributes and reset."""

from __future__ import annotations

from torch import nn


class CachedMixer(nn.Module):
    """Holds ``kv_cache`` (None until ``setup_cache``) and ``cache_enabled``, as torchtune's
    ``TransformerSelfAttentionLayer`` expects of its ``attn``."""

    def __init__(self):
        super().__init__()
        self.kv_cache = None
        self.cache_enabled = False

    def reset_cache(self) -> None:
        if self.kv_cache is None:
            raise RuntimeError("reset_cache: no cache; call setup_cache first")
        self.kv_cache.zero_()
