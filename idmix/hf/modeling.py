"""``IdmixForCausalLM``: an idmix decoder as a transformers causal LM (``generate``,
``save_pretrained`` / ``from_pretrained`` in safetensors, the Auto classes).

``self.model`` is the ``TransformerDecoder`` that ``idmix.models`` builds (the same modules,
the same state-dict keys under ``model.``); ``forward`` calls it. Importing ``idmix.hf``
registers it with the Auto classes (no ``trust_remote_code``: a saved directory holds no Python).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .cache import IdmixCache
from .configuration import IdmixConfig
from .positions import token_keys, token_positions
from .static_step import StaticDecodeCall
from .weights import check_weights


def _unsupported(name: str, why: str) -> ValueError:
    return ValueError(f"{name}: not supported by idmix models ({why})")


class IdmixForCausalLM(PreTrainedModel, GenerationMixin):
    """forward(input_ids (B, T), attention_mask (B, past + T) 1 = token / 0 = padding,
    position_ids (B, T), cache, use_cache, labels (B, T)) -> logits (B, T, V) fp32, loss,
    cache. Padding goes on the left (``generate``'s convention): positions restart at 0 on
    each row's first token, so the SSM state resets there and padding never reaches it, and
    the softmax layers never attend to padding. A cache is made only when use_cache=True (as
    ``generate`` passes) or one is given; without one and without a mask the call is
    exactly ``model(input_ids)``."""

    config_class = IdmixConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _is_stateful = True  # transformers then refuses assisted generation itself
    _no_split_modules = ["TransformerSelfAttentionLayer"]
    supports_gradient_checkpointing = False

    def __init__(self, config: IdmixConfig):
        super().__init__(config)
        self.model = config.build()
        config.fill_from(self.model)
        self.post_init()

    def _init_weights(self, module) -> None:
        """Nothing: the idmix builder initialised the weights (``idmix.models.init_weights_``:
        the paper's init and the SSM calibration); from_pretrained loads every one."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # forward makes its own IdmixCache

    def get_input_embeddings(self):
        return self.model.tok_embeddings

    def set_input_embeddings(self, value) -> None:
        self.model.tok_embeddings = value

    def get_output_embeddings(self):
        return self.model.output

    def set_output_embeddings(self, value) -> None:
        self.model.output = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: IdmixCache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values=None,
        **loss_kwargs,
    ):
        if past_key_values is not None:
            raise _unsupported(
                "past_key_values",
                "the layers' state is the IdmixCache a forward returns: pass it as cache",
            )
        self._refuse(input_ids, cache, inputs_embeds, output_attentions, output_hidden_states)
        if cache is None and use_cache:
            cache = IdmixCache(self.model, input_ids.shape[0], capacity=input_ids.shape[1])
        if cache is None:
            logits = self._forward(input_ids, attention_mask, position_ids)
        else:
            logits = self._forward_cached(input_ids, attention_mask, position_ids, cache)
        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits=logits, labels=labels, vocab_size=self.config.vocab_size, **loss_kwargs
            )
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        out = CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)
        return out if return_dict is not False else out.to_tuple()

    @staticmethod
    def _refuse(input_ids, cache, inputs_embeds, output_attentions, output_hidden_states):
        if inputs_embeds is not None:
            raise _unsupported("inputs_embeds", "the decoder embeds its own input_ids")
        if input_ids is None:
            raise ValueError("input_ids: expected a (B, T) tensor of token ids")
        if output_attentions:
            raise _unsupported("output_attentions", "SSM mixers form no attention matrix")
        if output_hidden_states:
            raise _unsupported("output_hidden_states", "the decoder returns logits only")
        if cache is not None and not isinstance(cache, IdmixCache):
            raise _unsupported(
                f"cache of type {type(cache).__name__}",
                "the layers keep fixed-size recurrent states, not per-token keys and values: "
                "give the IdmixCache an earlier forward or generate returned, or none",
            )

    def _forward(self, input_ids, attention_mask, position_ids):
        if attention_mask is None and position_ids is None:
            return self.model(input_ids)
        T = input_ids.shape[1]
        keys = token_keys(attention_mask, input_ids, 0)
        pos = token_positions(position_ids, keys, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=input_ids.device).tril()
        mask = None if attention_mask is None else causal[None] & keys[:, None, :]
        return self.model(input_ids, mask=mask, input_pos=pos)

    def _forward_cached(self, input_ids, attention_mask, position_ids, cache: IdmixCache):
        B, T = input_ids.shape
        cache.check_rows(B)
        past = cache.seen
        keys = token_keys(attention_mask, input_ids, past)
        pos = token_positions(position_ids, keys, T)
        cache.make_room(T)
        if cache.static:
            cache.keys[:, : past + T] = keys
        S = cache.capacity
        cols = torch.arange(S, device=input_ids.device)
        rows = past + torch.arange(T, device=input_ids.device)
        keys = F.pad(keys, (0, S - past - T), value=False)
        mask = (cols[None, :] <= rows[:, None])[None] & keys[:, None, :]  # (B, T, S)
        with cache.installed(self.model):
            logits = self.model(input_ids, mask=mask, input_pos=pos)
        cache.seen += T
        return logits

    def create_masks_for_generate(self, attention_mask=None, **_):
        """The (B, past + T) mask as given: forward builds its own masks (transformers would
        build 4-d ones for a compileable cache)."""
        return attention_mask

    def get_compiled_call(self, compile_config=None):
        """What ``generate`` calls per token when the cache is compileable (a static
        ``IdmixCache``): the compiled, on CUDA graphed, one-token step (``static_step``)."""
        return StaticDecodeCall(self, compile_config)

    # saving and loading ---------------------------------------------------------------------
    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """transformers' save (config.json, model.safetensors, generation_config.json), in
        safetensors only and with no ``auto_map`` (one read from an older directory is
        dropped): the directory names no code to run."""
        if kwargs.get("safe_serialization") is False:
            raise _unsupported("safe_serialization=False", "idmix saves safetensors only")
        if "auto_map" in self.config:
            del self.config.auto_map
        super().save_pretrained(save_directory, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' load, from safetensors only (``use_safetensors=False``, ``variant``
        and ``gguf_file`` are refused); a local directory is checked first (``weights``): its
        weight files resolved inside it, pickles refused unread, and every tensor present with
        the shape and dtype the config builds, or an error naming the file or config field
        (``embed_dim``, ``vocab_size``, ``mixer``, ``dtype``, ...)."""
        if kwargs.get("use_safetensors") is False:
            raise _unsupported("use_safetensors=False", "pickled weights can run code when loaded")
        for name in ("variant", "gguf_file"):
            if kwargs.get(name) is not None:
                raise _unsupported(name, "a directory holds model.safetensors or its index")
        kwargs["use_safetensors"] = True
        path = Path(str(pretrained_model_name_or_path)) / kwargs.get("subfolder", "")
        if path.is_dir():
            config = kwargs.get("config")
            if not isinstance(config, IdmixConfig):
                config = IdmixConfig.from_pretrained(path)
            check_weights(path, config)
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
