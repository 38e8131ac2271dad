"""Next-token sampling on the device: temperature, top-k, top-p, with no host sync.

The draw is the exponential race (argmax of p / E with E ~ Exp(1) per token), which picks a
token with probability p exactly as a multinomial draw does, in ops a CUDA graph can capture.
"""

from __future__ import annotations

import math

import torch

from .debug import check_values


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


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """logits: (B, V) -> next tokens (B,) int64, on logits' device. temperature 0 is greedy.
    generator: the source of the draw (None: the device's default generator). NaN or +inf logits
    are refused where ``idmix.debug.check_values`` allows a host read (eager on CPU, or
    IDMIX_DEBUG=1); elsewhere the draw does not look."""
    check_sampling(temperature, top_k, top_p)
    if check_values(logits) and bool((logits.isnan() | logits.isposinf()).any()):
        raise ValueError("logits: NaN or +inf (-inf, a banned token, is allowed)")
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
    probs = logits.softmax(-1)
    race = torch.empty_like(probs).exponential_(generator=generator)
    race = race.clamp_min(torch.finfo(race.dtype).tiny)  # an exact 0 would make 0/0 = NaN win
    return (probs / race).argmax(dim=-1)
