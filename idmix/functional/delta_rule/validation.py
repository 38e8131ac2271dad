"""Argument checks and dtype handling shared by both implementations of the gated delta rule."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...debug import check_values
from ..interdomain.validation import check_devices, check_reset

IMPLS = ("chunked", "naive")
_HALF = (torch.float16, torch.bfloat16)


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


def _floating(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a real floating tensor, got {x.dtype}")


def check_impl(impl) -> None:
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")


def check_chunk_size(chunk_size) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected a positive int, got {chunk_size!r}")


def prepare(q, k, v, beta, log_decay, scale, initial_state, reset) -> Inputs:
    """Check every argument (errors name it) and cast the tensors to the compute dtype."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _floating(name, x)
        if x.dim() != 4:
            last = "V" if name == "v" else "K"
            raise ValueError(
                f"{name}: expected 4 dims (B, T, H, {last}), got shape {tuple(x.shape)}"
            )
    B, T, H, K = q.shape
    V = v.shape[3]
    if k.shape != q.shape:
        raise ValueError(f"k: expected the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:3] != (B, T, H):
        raise ValueError(
            f"v: expected (B, T, H, V) with (B, T, H) = {(B, T, H)}, got {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v: expected one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if T < 1:
        raise ValueError("q: expected at least one time step (T >= 1), got T = 0")
    if 0 in (B, H, K, V):
        raise ValueError(
            f"q, v: expected non-zero B, H, K and V, got q {tuple(q.shape)}, v {tuple(v.shape)}"
        )
    for name, x in (("beta", beta), ("log_decay", log_decay)):
        _floating(name, x)
        if tuple(x.shape) != (B, T, H):
            raise ValueError(
                f"{name}: expected shape (B, T, H) = {(B, T, H)}, got {tuple(x.shape)}"
            )
    if initial_state is not None:
        _floating("initial_state", initial_state)
        if tuple(initial_state.shape) != (B, H, K, V):
            raise ValueError(
                f"initial_state: expected shape (B, H, K, V) = {(B, H, K, V)}, "
                f"got {tuple(initial_state.shape)}"
            )
    check_reset(reset, B, T)
    if scale is None:
        scale = K**-0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale: expected a real number or None, got {type(scale).__name__}")
    check_devices(
        "q", q, k=k, v=v, beta=beta, log_decay=log_decay, initial_state=initial_state, reset=reset
    )
    if check_values(log_decay) and bool((log_decay > 0).any()):
        raise ValueError(
            f"log_decay: expected entries <= 0 (a decay exp(log_decay) <= 1), got a maximum of "
            f"{log_decay.max().item():.3g}"
        )
    dtype = torch.float32 if q.dtype in _HALF else q.dtype
    if initial_state is None:
        state = q.new_zeros(B, H, K, V, dtype=dtype)
    else:
        state = initial_state.to(dtype)
    return Inputs(
        q.to(dtype),
        k.to(dtype),
        v.to(dtype),
        beta.to(dtype),
        log_decay.to(dtype),
        state,
        reset,
        float(scale),
        q.dtype,
    )
