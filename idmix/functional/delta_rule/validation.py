"""Argument checks and dtype handling shared by both implementations of the gated delta rule."""

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
    beta: torch.Tensor  # (B, T, H)
    log_decay: torch.Tensor  # (B, T, H)
    state: torch.Tensor  # (B, H, K, V): the initial state, zeros when none was given
    reset: torch.Tensor | None  # (B, T) bool
    scale: float
    out_dtype: torch.dtype


def prepare(q, k, v, beta, log_decay, scale, initial_state, reset) -> Inputs:
    """Check every argument (errors name it) and cast the tensors to the compute dtype."""
    B, T, H, _, _ = check_qkv(q, k, v)
    for name, x in (("beta", beta), ("log_decay", log_decay)):
        check_gate(name, x, ((B, T, H),), f"(B, T, H) = {(B, T, H)}")
    dtype, state, scale = initial_state_and_scale(
        q, v, scale, initial_state, reset, k=k, beta=beta, log_decay=log_decay
    )
    check_log_decay(log_decay)
    return Inputs(
        q.to(dtype),
        k.to(dtype),
        v.to(dtype),
        beta.to(dtype),
        log_decay.to(dtype),
        state,
        reset,
        scale,
        q.dtype,
    )
