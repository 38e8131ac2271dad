"""``IdmixCache``: the decoding state of an idmix model as a transformers ``Cache``.

Each layer keeps the cache its own mixer allocates in ``setup_cache`` (no second
implementation): an SSM mixer's ``RecurrentCache`` (state (B, G, 2·d_h, 2M) fp32 and the
short-conv histories (B, W-1, d), fixed in size whatever the context) or softmax's ``KVCache``
(k, v (B, H, S, d_h), grown on demand). The model installs them into its mixers for one forward
(``installed``) and takes them out again, so several caches can share one model.

What does not apply to a recurrent state, and is refused with an error saying so: rolling
back by tokens (``crop``: assisted / speculative decoding, prompt-lookup rollback), per-layer
key/value surgery (``update``, editing ``past_key_values`` tensors), offloading and quantised
caches. Beam search works (``reorder_cache`` selects rows).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers.cache_utils import Cache

from idmix.generation import release_caches
from idmix.modules.cache import KVCache

NO_ROLLBACK = (
    "IdmixCache: idmix's SSM layers keep one fixed-size recurrent state per row, not one entry "
    "per token, so it cannot be {what}; assisted/speculative decoding and cache surgery do not "
    "apply (start again from the prompt instead)"
)


class IdmixCache(Cache):
    """The state of batch_size rows of ``model`` (an idmix ``TransformerDecoder``) after
    ``seen`` positions (padding included; equal across rows). capacity: positions the softmax
    layers' KV caches hold before they grow (they double, copying what they hold).

    static=True: nothing is ever reallocated (the KV caches hold capacity positions and refuse
    more; beams reorder rows in place), and ``keys`` (B, capacity) bool records which positions
    hold tokens. ``generate`` then compiles the one-token step and, on CUDA, replays it as a CUDA
    graph (``idmix.hf.static_step``): ``model.generate(ids, cache=IdmixCache(model.model, B,
    prompt_len + max_new_tokens, static=True))``."""

    def __init__(self, model, batch_size: int, capacity: int = 1, *, static: bool = False):
        super().__init__(layers=[])
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity: expected an int >= 1, got {capacity!r}")
        param = next(model.parameters())
        model.setup_caches(batch_size=batch_size, dtype=param.dtype, decoder_max_seq_len=capacity)
        self.layers = [layer.attn.kv_cache for layer in model.layers]
        release_caches(model)
        self.rows, self.seen, self.capacity = batch_size, 0, capacity
        self.keys = (
            torch.zeros(batch_size, capacity, dtype=torch.bool, device=param.device)
            if static
            else None
        )
        self.step = None  # the static decode step bound to this cache (idmix.hf.static_step)

    @property
    def static(self) -> bool:
        """Made with static=True (it then records which positions hold tokens)."""
        return self.keys is not None

    # what the model calls ------------------------------------------------------------------
    def make_room(self, new: int) -> None:
        """Grow the KV caches so that ``new`` more positions fit."""
        need = self.seen + new
        if need <= self.capacity:
            return
        if self.static:
            raise ValueError(
                f"cache: a static IdmixCache holds {self.capacity} positions; {self.seen} seen "
                f"and {new} new do not fit (make it with capacity >= the prompt's length plus "
                "max_new_tokens)"
            )
        size = max(need, 2 * self.capacity)
        for i, old in enumerate(self.layers):
            if isinstance(old, KVCache):
                B, H, _, d = old.k.shape
                grown = KVCache.empty(B, H, size, d, old.k.dtype, device=old.k.device)
                grown.k[:, :, : self.seen] = old.k[:, :, : self.seen]
                grown.v[:, :, : self.seen] = old.v[:, :, : self.seen]
                grown.length.copy_(old.length)
                self.layers[i] = grown
        self.capacity = size

    def check_rows(self, B: int) -> None:
        """A forward's B input rows are the cache's rows."""
        if B != self.rows:
            raise ValueError(
                f"input_ids: {B} rows, but the cache holds {self.rows} (generate's num_beams "
                "and num_return_sequences multiply the prompts' rows: make the cache with "
                "batch_size = rows x beams x sequences)"
            )

    @contextmanager
    def installed(self, model):
        """The layers' caches inside model's mixers for the duration of one forward."""
        if len(model.layers) != len(self.layers):
            raise ValueError(
                f"cache: holds {len(self.layers)} layers, the model has {len(model.layers)}"
            )
        try:
            for layer, state in zip(model.layers, self.layers, strict=True):
                layer.attn.kv_cache, layer.attn.cache_enabled = state, True
            yield
        finally:
            release_caches(model)

    # transformers' Cache interface ----------------------------------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1  # no limit: the KV caches grow, the recurrent states do not depend on it

    @property
    def batch_size(self) -> int:
        return self.rows

    @property
    def is_compileable(self) -> bool:
        return self.static

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return True

    @property
    def is_linear(self) -> list[bool]:
        # False: this cache counts its positions (get_seq_length), so generate slices a
        # continued prompt to its new tokens
        return [False] * len(self.layers)

    @property
    def is_sliding(self) -> list[bool]:
        return [False] * len(self.layers)

    def reset(self) -> None:
        for state in self.layers:
            state.zero_()
        if self.static:
            self.keys.zero_()
        self.seen = 0

    def _rows(self, index: torch.Tensor) -> None:
        if not self.static:
            self.layers = [state[index.to(state.device)] for state in self.layers]
            self.rows = int(index.numel())
            return
        if index.numel() != self.rows:
            raise ValueError(
                f"cache: a static IdmixCache keeps its {self.rows} rows at fixed addresses, so "
                f"it cannot become {index.numel()} rows (num_beams or num_return_sequences > 1 "
                "expand the batch): make it with batch_size = the expanded batch, or use "
                "static=False"
            )
        for state in self.layers:
            state.update_(state[index.to(state.device)])
        self.keys.copy_(self.keys[index.to(self.keys.device)])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._rows(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._rows(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._rows(torch.arange(self.rows).repeat_interleave(repeats))

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove != 0:
            raise NotImplementedError(NO_ROLLBACK.format(what="cropped by tokens"))

    def activate_past_recording(self) -> None:
        raise NotImplementedError(NO_ROLLBACK.format(what="recorded for a rollback"))

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        raise NotImplementedError(NO_ROLLBACK.format(what="updated with keys and values"))

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        raise NotImplementedError("IdmixCache: the model builds its own masks")

    def offload(self, layer_idx: int, only_non_sliding: bool = True):
        raise NotImplementedError("IdmixCache: offloading is not supported")
