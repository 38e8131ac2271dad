"""idmix models in lm-evaluation-harness: ``@register_model("idmix")``.

    from idmix.evaluation.lm_eval_model import IdmixLM   # registers "idmix"
    lm_eval.simple_evaluate(model="idmix", model_args="checkpoint=runs/x/model_final.pt", …)

Scores with our own forward pass and decodes with our caches (``idmix.generate``): no
transformers, no download. The tokenizer is any object with ``encode(text, add_bos, add_eos)``,
``decode(ids)`` and ``eos_id`` (ours or a torchtune tokenizer).
"""

from __future__ import annotations

import importlib
from itertools import groupby

# lm-eval adds its own models ("hf", ...) only to an empty registry: before ours is registered
import lm_eval.models  # noqa: F401
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string
from tqdm import tqdm

from ..generation import generate
from ..io.checkpoint import load_exported_model
from .scoring import continuation_logprobs

DEFAULT_TOKENIZER = "idmix.io.tokenizer.shakespeare_bpe"


def _resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    if not module:
        raise ValueError(f"tokenizer: expected a dotted path like {DEFAULT_TOKENIZER!r}")
    return getattr(importlib.import_module(module), name)


@register_model("idmix")
class IdmixLM(LM):
    """model: an idmix decoder (eval mode is set here); tokenizer: see the module docstring;
    max_length: tokens the model sees at once (default: the model's max_seq_len);
    batch_size: rows per forward pass when scoring and per generate() call."""

    def __init__(self, model, tokenizer, batch_size: int = 8, max_length: int | None = None):
        super().__init__()
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length or model.max_seq_len
        if not 1 < self.max_length <= model.max_seq_len:
            raise ValueError(
                f"max_length: expected in (1, {model.max_seq_len}] (the model's max_seq_len), "
                f"got {self.max_length}"
            )

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        """checkpoint=PATH (a model_final.pt export), tokenizer=DOTTED.BUILDER (default: the
        embedded corpus's BPE), tokenizer_<name>=value (builder keyword arguments),
        device=, batch_size=, max_length=."""
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """The keys of :meth:`create_from_arg_string` as a dict (how lm-eval's command line
        passes ``--model_args``: ``idmix-lm-eval --model idmix --model_args checkpoint=…``)."""
        args = dict(arg_dict)
        args.update({k: v for k, v in (additional_config or {}).items() if v is not None})
        if "checkpoint" not in args:
            raise ValueError("model_args: expected checkpoint=PATH to a model_final.pt export")
        builder = _resolve(args.pop("tokenizer", DEFAULT_TOKENIZER))
        prefix = "tokenizer_"
        tok_kwargs = {k[len(prefix) :]: args.pop(k) for k in list(args) if k.startswith(prefix)}
        model = load_exported_model(args.pop("checkpoint"), args.pop("device", None) or "cpu")
        batch_size = args.pop("batch_size", 8)
        batch_size = 8 if batch_size in (None, "auto") else int(batch_size)
        args.pop("max_batch_size", None)
        max_length = args.pop("max_length", None)
        if args:
            raise ValueError(f"model_args: unknown keys {sorted(args)}")
        return cls(model, builder(**tok_kwargs), batch_size, max_length and int(max_length))

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_id

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_bos=False, add_eos=False)

    def _pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Whitespace at the end of the context moves to the continuation (lm-eval's rule, so
        that BPE merges "␣word" the way it saw it in training); an empty context is the EOT."""
        stripped = context.rstrip()
        continuation = context[len(stripped) :] + continuation
        ctx = self._encode(stripped) if stripped else [self.eot_token_id]
        return ctx, self._encode(continuation)

    def _prompt(self, context: str, keep: int) -> list[int]:
        return (self._encode(context) or [self.eot_token_id])[-keep:]

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self._pair(*req.args) for req in requests]
        out = []
        for start in tqdm(range(0, len(pairs), 64), disable=disable_tqdm, desc="loglikelihood"):
            out += continuation_logprobs(
                self.model, pairs[start : start + 64], self.max_length, self.batch_size
            )
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Σ log p over every token of each text, the first predicted from the EOT token, in
        disjoint windows of max_length tokens (lm-eval's rolling scheme)."""
        out = []
        for req in tqdm(requests, disable=disable_tqdm, desc="loglikelihood_rolling"):
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    self._encode(req.args[0]), self.eot_token_id, self.max_length, 1
                )
            ]
            scores = continuation_logprobs(self.model, windows, self.max_length, self.batch_size)
            out.append(sum(s for s, _ in scores))
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy unless do_sample (then temperature, top_k, top_p); stops at the EOT or, in
        the returned text, at the first of ``until``; at most max_gen_toks new tokens."""
        results: list[str | None] = [None] * len(requests)
        indexed = sorted(enumerate(requests), key=lambda x: repr(sorted(x[1].args[1].items())))
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="generate_until")
        for _, group in groupby(indexed, key=lambda x: repr(sorted(x[1].args[1].items()))):
            group = list(group)
            kwargs = dict(group[0][1].args[1])
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.pop("max_gen_toks", 256))
            sample = bool(kwargs.pop("do_sample", False))
            temperature = float(kwargs.pop("temperature", 1.0 if sample else 0.0))
            top_k, top_p = kwargs.pop("top_k", None), kwargs.pop("top_p", None)
            if not sample:
                temperature = 0.0
            keep = self.max_length - max_new
            if keep < 1:
                raise ValueError(f"max_gen_toks={max_new} leaves no room under max_length")
            for start in range(0, len(group), self.batch_size):
                chunk = group[start : start + self.batch_size]
                prompts = [self._prompt(r.args[0], keep) for _, r in chunk]
                new = generate(
                    self.model,
                    prompts,
                    max_new,
                    temperature=temperature,
                    top_k=top_k,
                    top_p=top_p,
                    stop_tokens=[self.eot_token_id],
                )
                for (i, _), ids in zip(chunk, new, strict=True):
                    ids = [t for t in ids if t != self.eot_token_id]
                    results[i] = _cut(self.tokenizer.decode(ids), until)
                bar.update(len(chunk))
        bar.close()
        return results


def _cut(text: str, until: list[str]) -> str:
    """text up to the first occurrence of any stop string."""
    ends = [text.find(s) for s in until if s and s in text]
    return text[: min(ends)] if ends else text
