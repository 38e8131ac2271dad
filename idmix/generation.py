"""Autoregressive generation with the decoding caches: prefill once, then one token per step.

Works with any torchtune ``TransformerDecoder`` built by ``idmix.models`` (Interdomain and
S4D-only keep a constant-size recurrent state; softmax keeps a KV cache).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch

from .sampling import check_sampling, sample_next
from .static_decode import DecodeBuffers, StepRunner, emit

__all__ = ["cache_nbytes", "generate", "prefill_logits", "release_caches", "sample_next"]
STOP_CHECK_EVERY = 16  # steps between the host's looks at the done flags on a GPU


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


def prefill_logits(model, tokens, mask, input_pos) -> torch.Tensor:
    """The prompt through the model (its caches filled), unembedded at the last position only:
    tokens, input_pos (B, P); mask (B, P, S) -> logits (B, V) fp32. The (B, P, V) logits of the
    whole prompt are never formed."""
    h = model.tok_embeddings(tokens)
    for layer in model.layers:
        h = layer(h, mask=mask, input_pos=input_pos)
    logits = model.unembed(h[:, -1:])
    return (torch.cat(logits, 1) if isinstance(logits, list) else logits)[:, -1]


def prefill(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    stop_tokens=(),
    pad_id: int = 0,
    chunk: int | None = None,
) -> tuple[DecodeBuffers, torch.Tensor]:
    """Set up and fill the model's caches with the prompts (checked, as ``generate`` takes them),
    left-padded to P tokens with positions restarting at each row's first real token; in
    pieces of ``chunk`` positions if given (bounding the (B, chunk, S) attention mask). Returns
    the buffers of the decode steps to come (mask columns S = P + max_new_tokens) and the
    logits (B, V) of each row's last prompt token."""
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"chunk: expected None or an int >= 1, got {chunk!r}")
    device = next(model.parameters()).device
    B, P = len(prompts), max(len(p) for p in prompts)
    if P > model.max_seq_len:  # what TransformerDecoder.forward refuses, which this bypasses
        raise ValueError(
            f"prompts: the longest has {P} tokens, over the model's max_seq_len = "
            f"{model.max_seq_len}"
        )
    S = P + max_new_tokens
    tokens = torch.full((B, P), pad_id, dtype=torch.long, device=device)
    real = torch.zeros(B, P, dtype=torch.bool, device=device)
    for i, p in enumerate(prompts):
        tokens[i, P - len(p) :] = torch.as_tensor(list(p), device=device)
        real[i, P - len(p) :] = True
    pos = (real.long().cumsum(1) - 1).clamp_min(0)
    keys = torch.cat([real, torch.ones(B, max_new_tokens, dtype=torch.bool, device=device)], 1)
    columns = torch.arange(S, device=device)
    dtype = next(model.parameters()).dtype
    model.setup_caches(batch_size=B, dtype=dtype, decoder_max_seq_len=S)
    model.reset_caches()
    piece = chunk or P
    for start in range(0, P, piece):
        rows = torch.arange(start, min(start + piece, P), device=device)
        mask = (columns[None, :] <= rows[:, None])[None] & keys[:, None]  # (B, rows, S)
        logits = prefill_logits(model, tokens[:, rows], mask, pos[:, rows])
    return DecodeBuffers.create(keys, pos[:, -1] + 1, max_new_tokens, stop_tokens, pad_id), logits


def _decode_mode(compile: bool, device: torch.device) -> str:
    if not compile:
        return "eager"
    return "graphed" if device.type == "cuda" else "compiled"


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

    compile: the one-token step (model, sampling and bookkeeping, ``idmix.static_decode``) runs
    through ``torch.compile(fullgraph=True)``, compiled once per (model, batch size, sampling
    settings); on CUDA it is then captured as a CUDA graph and replayed per token. A generator
    then seeds the device's generator for the call (restored afterwards), which the compiled
    step draws from. Without a callback, the host reads the tokens only every
    ``STOP_CHECK_EVERY`` steps on CUDA (to stop early) and at the end.
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
    mode = _decode_mode(compile, device)
    sampling = (temperature, top_k, top_p)
    rng = _seeded_device_rng(None if mode == "eager" else generator, device)
    check_every = 1 if device.type == "cpu" or callback is not None else STOP_CHECK_EVERY
    try:
        with rng:
            buf, logits = prefill(model, prompts, max_new_tokens, stop_tokens, pad_id)
            emit(buf, logits, *sampling, generator if mode == "eager" else None)
            step = StepRunner(model, buf, sampling, mode, generator)
            for i in range(1, max_new_tokens + 1):
                if callback is not None:
                    callback(i - 1, buf.token[:, 0].clone())
                if i == max_new_tokens or (i % check_every == 0 and bool(buf.done.all())):
                    break
                step()
        rows, counts = buf.out.tolist(), buf.count.tolist()
    finally:
        release_caches(model)
    return [row[:n] for row, n in zip(rows, counts, strict=True)]


def _seeded_device_rng(generator, device: torch.device):
    """A context in which the device's default generator is seeded from generator (if given)
    and restored afterwards; the compiled step cannot take a generator argument."""
    if generator is None:
        return contextlib.nullcontext()
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    rng = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
    return _then_seed(rng, seed, device)


@contextlib.contextmanager
def _then_seed(rng, seed: int, device: torch.device):
    """Inside rng (which restores the CPU's and device's generators), seed exactly those."""
    with rng:
        torch.random.default_generator.manual_seed(seed)
        if device.type == "cuda":
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        yield
