"""Perplexity against evaluation context length (the paper's Table 2 shape): the same tokens
are scored at every length, cut into non-overlapping windows of that length."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .scoring import sequence_nll


def token_stream(dataset, tokenizer) -> torch.Tensor:
    """All documents' tokens (dataset["text"]), each followed by EOS, as one (N,) tensor."""
    ids: list[int] = []
    for text in dataset["text"]:
        ids += tokenizer.encode(text, add_bos=False, add_eos=True)
    return torch.tensor(ids, dtype=torch.long)


def perplexity_by_context(
    model,
    stream: torch.Tensor,
    lengths: Sequence[int],
    num_tokens: int,
    batch_size: int = 4,
) -> dict[int, float]:
    """stream: (N,) token ids (documents joined by EOS). Scores its first num_tokens predicted
    tokens at each context length L in lengths (num_tokens must be a multiple of every L);
    returns {L: perplexity}. L may not exceed the model's max_seq_len."""
    if not lengths:
        raise ValueError("lengths: expected at least one context length")
    for L in lengths:
        if not 1 <= L <= model.max_seq_len:
            raise ValueError(f"lengths: {L} is outside [1, {model.max_seq_len}] (max_seq_len)")
        if num_tokens % L:
            raise ValueError(f"num_tokens: {num_tokens} is not a multiple of the length {L}")
    if stream.numel() < num_tokens + 1:
        raise ValueError(
            f"stream: {stream.numel()} tokens, fewer than num_tokens + 1 = {num_tokens + 1}"
        )
    tokens = stream[: num_tokens + 1]
    return {
        L: math.exp(sequence_nll(model, tokens, L, batch_size).double().mean().item())
        for L in lengths
    }
