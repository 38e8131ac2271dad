"""Argument checks and dtype handling shared by both forms of gated linear attention."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..chunking import (
    IMPLS,
    check_chunk_size,
    check_gate,
    check_impl,
    check_log_decay,
    check_qkv,
    initial_state_and_scale,
)

__all__ = ["IMPLS", "Inputs", "check_chunk_size", "check_impl", "prepare"]


class Inputs(NamedTuple):
    """The op's inputs, checked and cast to the compute dtype (fp32 for half/bf16 inputs)."""

    q: torch.Tensor  # (B, T, H, K)
    k: torch.Tensor  # (B, T, H, K)
    v: torch.Tensor  # (B, T, H, V)
    log_decay: torch.Tensor  # (B, T, H, K) per channel, or (B, T, H) per head
    state: torch.Tensor  # (B, H, K, V): the initial state, zeros when none was given
    reset: torch.Tensor | None  # (B, T) bool
    scale: float
    out_dtype: torch.dtype


def prepare(q, k, v, log_decay, scale, initial_state, reset) -> Inputs:
    """Check every argument (errors name it) and cast the tensors to the compute dtype."""
    B, T, H, K, _ = check_qkv(q, k, v)
    shapes = ((B, T, H, K), (B, T, H))
    layout = f"(B, T, H, K) = {shapes[0]} (per channel) or (B, T, H) = {shapes[1]} (per head)"
    check_gate("log_decay", log_decay, shapes, layout)
    dtype, state, scale = initial_state_and_scale(
        q, v, scale, initial_state, reset, k=k, log_decay=log_decay
    )
    check_log_decay(log_decay)
    cast = (x.to(dtype) for x in (q, k, v, log_decay))
    return Inputs(*cast, state, reset, scale, q.dtype)
