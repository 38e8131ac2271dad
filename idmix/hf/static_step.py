"""``IdmixForCausalLM``'s one-token step on a static ``IdmixCache``: compiled, and on CUDA
replayed as a CUDA graph. transformers' ``generate`` asks ``get_compiled_call`` for it once the
cache says it is compileable; per token the host then copies the token, its position and its
mask column into fixed buffers and replays (``idmix.static_decode`` holds the step itself)."""

from __future__ import annotations

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from idmix.static_decode import GraphReplay, compiled, step_logits

from .positions import token_keys, token_positions

GRAPHED_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that use CUDA graphs
# arguments that send a call to the model's own forward: given (not None), or asked for (true)
GIVEN_EAGER_ONLY = ("labels", "inputs_embeds", "past_key_values")
ASKED_EAGER_ONLY = ("output_attentions", "output_hidden_states")


class StaticStep:
    """The fixed buffers of one (model, static cache): token, pos (B, 1); column (); columns (S,);
    logits (B, V), the last step's. graphed: the compiled step replayed as a CUDA graph
    (``GraphReplay``). steps: how many steps so far."""

    def __init__(self, model, cache, graphed: bool):
        B, S = cache.keys.shape
        device = cache.keys.device
        self.model, self.cache = model, cache
        self.token = torch.zeros(B, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(B, 1, dtype=torch.long, device=device)
        self.column = torch.zeros((), dtype=torch.long, device=device)
        self.columns = torch.arange(S, device=device)
        self.logits, self.steps = None, 0
        self.replay = GraphReplay(self._run) if graphed else None

    def __call__(self, token, pos, column: int) -> torch.Tensor:
        self.token.copy_(token)
        self.pos.copy_(pos)
        self.column.fill_(column)
        (self.replay or self._run)()
        self.steps += 1
        return self.logits

    def _run(self) -> None:
        with self.cache.installed(self.model):
            self.logits = compiled(step_logits)(
                self.model, self.token, self.pos, self.cache.keys, self.columns, self.column
            )


class StaticDecodeCall:
    """Called as the model is (``generate``'s compiled forward): one new token per row on a
    static cache takes the StaticStep; anything else (a prompt, labels, a dynamic cache) the
    model's own forward. compile_config: transformers' ``CompileConfig``; its mode decides
    whether CUDA replays a graph (``GRAPHED_MODES``, the default "reduce-overhead")."""

    def __init__(self, hf_model, compile_config=None):
        self.hf_model = hf_model
        self.graph_mode = getattr(compile_config, "mode", "reduce-overhead") in GRAPHED_MODES

    def __call__(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                 **kwargs):  # fmt: skip
        static = getattr(cache, "static", False) and input_ids is not None
        eager_only = any(kwargs.get(k) is not None for k in GIVEN_EAGER_ONLY) or any(
            kwargs.get(k) for k in ASKED_EAGER_ONLY
        )
        if not static or input_ids.shape[1] != 1 or eager_only:
            return self.hf_model(input_ids=input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids, cache=cache, **kwargs)  # fmt: skip
        cache.check_rows(input_ids.shape[0])
        past = cache.seen
        cache.make_room(1)
        cache.keys[:, past] = token_keys(attention_mask, input_ids, past, only_new=True)[:, 0]
        pos = token_positions(position_ids, cache.keys[:, : past + 1], 1)  # keys as recorded
        logits = self._step(cache)(input_ids, pos, past)
        cache.seen += 1
        out = CausalLMOutputWithPast(logits=logits[:, None].clone(), cache=cache)
        return out if kwargs.get("return_dict") is not False else out.to_tuple()

    def _step(self, cache) -> StaticStep:
        """The cache's StaticStep for this model (made on its first step)."""
        model = self.hf_model.model
        if cache.step is None or cache.step.model is not model:
            graphed = self.graph_mode and cache.keys.device.type == "cuda"
            cache.step = StaticStep(model, cache, graphed)
        return cache.step
