"""Autoregressive generation with the decoding caches: prefill once, then one token per step.

Works with any torchtune ``TransformerDecoder`` built by ``idmix.models`` (Interdomain and
S4D-only keep a constant-size recurrent state; softmax keeps a KV cache).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch


def release_caches(model) -> None:
    """Drop every layer's decoding cache (torchtune's ``delete_kv_caches`` only recognises its
    own callable KVCache modules, not the tensordict caches of idmix's mixers)."""
    for layer in model.layers:
        layer.attn.kv_cache, layer.attn.cache_enabled = None, False


def cache_nbytes(model) -> int:
    """Bytes held by the decoding caches of all layers (0 when none are set up)."""
    return sum(
        t.numel() * t.element_size()
        for layer in model.layers
        if layer.attn.kv_cache is not None
        for t in layer.attn.kv_cache.to_tensordict().values(include_nested=True, leaves_only=True)
    )


def check_sampling(temperature, top_k, top_p) -> None:
    """temperature a finite number >= 0; top_k None or an int >= 1; top_p None or in (0, 1]."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature: expected a number, got {type(temperature).__name__}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature: expected a finite number >= 0, got {temperature}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k: expected None or an int >= 1, got {top_k!r}")
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1
    ):
        raise ValueError(f"top_p: expected None or a number in (0, 1], got {top_p!r}")


def _check_prompts(prompts, vocab_size: int) -> list[list[int]]:
    """prompts: a non-empty list of non-empty lists of token ids in [0, vocab_size)."""
    if isinstance(prompts, (torch.Tensor, str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(
            f"prompts: expected a list of token-id lists, got {type(prompts).__name__} (for a "
            "(B, T) tensor pass tensor.tolist())"
        )
    rows = []
    for i, p in enumerate(prompts):
        if isinstance(p, torch.Tensor):
            p = p.tolist()
        if isinstance(p, (str, bytes)) or not isinstance(p, Sequence) or len(p) == 0:
            raise ValueError(f"prompts[{i}]: expected a non-empty list of token ids, got {p!r}")
        if any(isinstance(t, bool) or not isinstance(t, int) for t in p):
            raise TypeError(f"prompts[{i}]: expected int token ids, got {p!r}")
        bad = [t for t in p if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"prompts[{i}]: token id {bad[0]} is outside the vocabulary [0, {vocab_size})"
            )
        rows.append(list(p))
    if not rows:
        raise ValueError("prompts: expected a non-empty list of non-empty token lists")
    return rows


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
):
    """logits: (B, V) -> next tokens (B,). temperature 0 is greedy."""
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix reaching top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_tokens: Sequence[int] = (),
    pad_id: int = 0,
    callback: Callable[[int, torch.Tensor], None] | None = None,
    generator: torch.Generator | None = None,
    compile: bool = False,
) -> list[list[int]]:
    """Generate up to max_new_tokens per prompt; returns the new tokens of each row (a row stops
    after its first stop token, which is kept). Prompts of different lengths are left-padded;
    positions restart at 0 on each row's first real token, so the SSM mixers reset their state
    there and padding never leaks in. callback(step, tokens (B,)) streams each new token.
    compile: run the one-token step through ``torch.compile(fullgraph=True)``; it compiles once
    per (model, batch size) and never again across steps (the caches are updated in place).
    """
    prompts = _check_prompts(prompts, model.tok_embeddings.num_embeddings)
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or max_new_tokens < 1
    ):
        raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
    check_sampling(temperature, top_k, top_p)
    device = next(model.parameters()).device
    B, P = len(prompts), max(len(p) for p in prompts)
    total = P + max_new_tokens
    tokens = torch.full((B, P), pad_id, dtype=torch.long, device=device)
    real = torch.zeros(B, P, dtype=torch.bool, device=device)
    for i, p in enumerate(prompts):
        tokens[i, P - len(p) :] = torch.as_tensor(list(p), device=device)
        real[i, P - len(p) :] = True
    pos = (real.long().cumsum(1) - 1).clamp_min(0)
    keys = torch.cat([real, torch.ones(B, max_new_tokens, dtype=torch.bool, device=device)], 1)
    causal = torch.ones(total, total, dtype=torch.bool, device=device).tril()
    mask = causal[None] & keys[:, None, :]  # (B, total, total): causal, never to padding

    dtype = next(model.parameters()).dtype
    model.setup_caches(batch_size=B, dtype=dtype, decoder_max_seq_len=total)
    model.reset_caches()
    try:
        logits = model(tokens, mask=mask[:, :P], input_pos=pos)[:, -1]
        out = [[] for _ in range(B)]
        done = torch.zeros(B, dtype=torch.bool, device=device)
        stop = torch.as_tensor(list(stop_tokens), dtype=torch.long, device=device)
        next_pos = pos[:, -1] + 1
        # Dynamo caches the compiled forward on the model's code: a second call does not recompile
        one_token = torch.compile(model, fullgraph=True, dynamic=False) if compile else model
        for step in range(max_new_tokens):
            nxt = sample_next(logits, temperature, top_k, top_p, generator)
            nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
            for i in range(B):
                if not done[i]:
                    out[i].append(int(nxt[i]))
            if callback is not None:
                callback(step, nxt)
            done |= torch.isin(nxt, stop)
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            row = mask[:, P + step : P + step + 1].clone()  # same strides every step
            logits = one_token(nxt[:, None], mask=row, input_pos=next_pos[:, None])[:, -1]
            next_pos = next_pos + 1
    finally:
        release_caches(model)
    return out
