"""Causal depthwise short convolution ("SC" in the paper) with a streaming step.

Layout is channels-last: x is (B, T, C); weight is (C, W) (W = kernel size, 4 in the paper);
bias is (C,). Output y_t = bias + Σ_{j<W} weight[:, j] · x_{t-W+1+j}, with x_{<0} taken from
the conv cache (the last W-1 inputs of an earlier call, (B, W-1, C)) or zeros.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .interdomain.validation import check_reset


def _check(x, weight, bias, cache=None, step: bool = False) -> None:
    """x: (B, T, C), or a step's x_t: (B, C); weight (C, W); bias (C,) or None; cache
    (B, W-1, C) or None. Python metadata only: the checks of every short-conv entry point."""
    name, layout = ("x_t", "(B, C)") if step else ("x", "(B, T, C)")
    for arg, t in ((name, x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{arg}: expected a torch.Tensor, got {type(t).__name__}")
    if x.dim() != (2 if step else 3):
        raise ValueError(f"{name}: expected {layout}, got shape {tuple(x.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"weight: expected (C, W), got shape {tuple(weight.shape)}")
    if x.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"{name}: last dim {x.shape[-1]} does not match weight channels {weight.shape[0]}"
        )
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias: expected a torch.Tensor or None, got {type(bias).__name__}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias: expected ({weight.shape[0]},), got {tuple(bias.shape)}")
    if cache is not None:
        expected = (x.shape[0], weight.shape[1] - 1, x.shape[-1])
        if not isinstance(cache, torch.Tensor):
            raise TypeError(f"cache: expected a {expected} tensor, got {type(cache).__name__}")
        if tuple(cache.shape) != expected:
            raise ValueError(f"cache: expected {expected} = (B, W-1, C), got {tuple(cache.shape)}")


def short_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    cache: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv over time.

    x: (B, T, C); weight: (C, W); bias: (C,) or None; cache: (B, W-1, C) or None (zeros).
    Returns (y: (B, T, C), new_cache: (B, W-1, C)), the cache holding the last W-1 inputs.
    """
    _check(x, weight, bias, cache)
    B, T, C = x.shape
    W = weight.shape[1]
    if cache is None:
        cache = x.new_zeros(B, W - 1, C)
    padded = torch.cat([cache.to(x.dtype), x], dim=1)  # (B, T+W-1, C)
    if torch.compiler.is_compiling():
        # W shifted multiply-adds: pointwise, so Inductor fuses them with what follows
        # (bias, RoPE, ξ, the head norm) instead of calling out to a convolution
        y = sum(weight[:, j].to(x.dtype) * padded[:, j : j + T] for j in range(W))
    else:
        y = F.conv1d(padded.transpose(1, 2), weight.unsqueeze(1).to(x.dtype), groups=C)
        y = y.transpose(1, 2)
    if bias is not None:
        y = y + bias.to(x.dtype)
    return y, padded[:, T:].contiguous() if W > 1 else padded[:, :0]


def short_conv_naive(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    cache: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference for :func:`short_conv`: an explicit sum over taps. Returns y only."""
    B, T, C = x.shape
    W = weight.shape[1]
    hist = torch.cat([x.new_zeros(B, W - 1, C) if cache is None else cache, x], dim=1)
    y = torch.zeros_like(x) if bias is None else bias.expand(B, T, C).clone()
    for j in range(W):
        y = y + weight[:, j] * hist[:, j : j + T]
    return y


def short_conv_step(
    x_t: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step. x_t: (B, C); cache: (B, W-1, C). Returns (y_t: (B, C), new_cache)."""
    if cache is None:
        raise TypeError("cache: expected the (B, W-1, C) history of the earlier steps, got None")
    _check(x_t, weight, bias, cache, step=True)
    window = torch.cat([cache.to(x_t.dtype), x_t.unsqueeze(1)], dim=1)  # (B, W, C)
    y = (window * weight.t().to(x_t.dtype)).sum(dim=1)
    if bias is not None:
        y = y + bias.to(x_t.dtype)
    return y, window[:, 1:]


def short_conv_with_resets(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    reset: torch.Tensor,
    cache: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv that never mixes across document boundaries.

    reset: (B, T) bool, True where a document starts (history before it, the cache included,
    is treated as zeros). Otherwise as :func:`short_conv`: returns (y, new_cache), the new cache
    holding zeros for positions before the last reset.
    """
    _check(x, weight, bias, cache)
    B, T, C = x.shape
    W = weight.shape[1]
    check_reset(reset, B, T)
    if reset is None:
        raise TypeError(f"reset: expected a bool tensor of shape (B, T) = {(B, T)}, got None")
    hist = x.new_zeros(B, W - 1, C) if cache is None else cache.to(x.dtype)
    ext = torch.cat([hist, x], dim=1)  # (B, T+W-1, C); position t of x is ext[t + W - 1]
    idx = torch.arange(T, device=x.device)
    # first valid ext index for output t: W-1 + (last reset <= t), or 0 when none (cache valid)
    last = torch.where(reset, idx, torch.full_like(idx, -1)).cummax(dim=1).values
    start = torch.where(last >= 0, last + W - 1, torch.zeros_like(last))  # (B, T)
    y = torch.zeros_like(x) if bias is None else bias.to(x.dtype).expand(B, T, C).clone()
    w = weight.to(x.dtype)
    for j in range(W):
        valid = (idx + j >= start)[..., None]
        y = y + torch.where(valid, ext[:, j : j + T] * w[:, j], torch.zeros((), dtype=x.dtype))
    # new cache: the last W-1 ext entries, zeroed if they precede the final document start
    tail = torch.arange(T, T + W - 1, device=x.device)
    keep = (tail[None] >= start[:, -1:])[..., None]
    new_cache = torch.where(keep, ext[:, T:], torch.zeros((), dtype=x.dtype))
    return y, new_cache
