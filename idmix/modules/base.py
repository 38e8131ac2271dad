"""What every mixer shares: torchtune's cache attributes and reset."""

from __future__ import annotations

from torch import nn


class CachedMixer(nn.Module):
    """Holds ``kv_cache`` (None until ``setup_cache``) and ``cache_enabled``, as torchtune's
    ``TransformerSelfAttentionLayer`` expects of its ``attn``, and ``context_parallel`` (None,
    or the ``idmix.parallel.ContextParallel`` its input is a slice of)."""

    def __init__(self):
        super().__init__()
        self.kv_cache = None
        self.cache_enabled = False
        self.context_parallel = None

    def check_context_parallel(self, cache) -> None:
        """Context parallelism splits one training (or prefill) pass: no decoding cache."""
        if self.context_parallel is not None and cache is not None:
            raise RuntimeError(
                "setup_cache: a context-parallel layer has no decoding cache; decode on one "
                "process (the state of a split prefill is the last rank's)"
            )

    def reset_cache(self) -> None:
        if self.kv_cache is None:
            raise RuntimeError("reset_cache: no cache; call setup_cache first")
        self.kv_cache.zero_()
