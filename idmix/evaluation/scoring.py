"""Log-likelihoods of token sequences under a decoder (no sampling, no caches).

Rows of a batch are right-padded: the models are causal, so padding after a row's last real
token never changes the logits at its real positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def _device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def continuation_logprobs(
    model,
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    max_len: int,
    batch_size: int = 8,
    pad_id: int = 0,
) -> list[tuple[float, bool]]:
    """pairs: (context, continuation) token lists, len(context) ≥ 1, len(continuation) ≥ 1.
    Returns, per pair, (Σ log p(continuation | context), whether greedy decoding would produce
    the continuation). The model sees at most the last max_len tokens of context+continuation
    (left truncation). Pairs are scored longest first in batches of batch_size."""
    for i, (ctx, cont) in enumerate(pairs):
        if len(ctx) < 1 or len(cont) < 1:
            raise ValueError(f"pairs[{i}]: expected a non-empty context and continuation")
        if len(cont) > max_len:
            raise ValueError(f"pairs[{i}]: continuation of {len(cont)} tokens > max_len={max_len}")
    device = _device(model)
    inputs = [(list(ctx) + list(cont))[-(max_len + 1) :] for ctx, cont in pairs]
    order = sorted(range(len(pairs)), key=lambda i: -len(inputs[i]))
    results: list[tuple[float, bool]] = [(0.0, False)] * len(pairs)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        T = max(len(inputs[i]) for i in rows) - 1
        tokens = torch.full((len(rows), T), pad_id, dtype=torch.long, device=device)
        for b, i in enumerate(rows):
            tokens[b, : len(inputs[i]) - 1] = torch.as_tensor(inputs[i][:-1])
        logprobs = F.log_softmax(model(tokens).float(), dim=-1)
        for b, i in enumerate(rows):
            n, c = len(inputs[i]) - 1, len(pairs[i][1])
            target = torch.as_tensor(inputs[i][-c:], device=device)
            lp = logprobs[b, n - c : n]
            score = lp.gather(-1, target[:, None]).sum().item()
            results[i] = (score, bool((lp.argmax(-1) == target).all()))
    return results


@torch.no_grad()
def sequence_nll(model, tokens: torch.Tensor, window: int, batch_size: int = 8) -> torch.Tensor:
    """tokens: (N,) with N - 1 a multiple of window. Splits the stream into (N-1)/window
    non-overlapping windows, each predicting its window tokens from within the window only;
    returns the per-token negative log-likelihoods (N - 1,) in stream order (fp32)."""
    if tokens.dim() != 1 or (tokens.numel() - 1) % window:
        raise ValueError(
            f"tokens: expected a 1-d stream of k·window + 1 tokens (window={window}), "
            f"got shape {tuple(tokens.shape)}"
        )
    device = _device(model)
    inputs = tokens[:-1].view(-1, window)
    targets = tokens[1:].view(-1, window)
    out = []
    for start in range(0, inputs.shape[0], batch_size):
        x = inputs[start : start + batch_size].to(device)
        y = targets[start : start + batch_size].to(device)
        logits = model(x).float()
        out.append(F.cross_entropy(logits.transpose(1, 2), y, reduction="none").flatten().cpu())
    return torch.cat(out)
