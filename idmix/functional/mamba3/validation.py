"""Argument checks and dtype handling shared by both forms of the Mamba-3 recurrence."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..chunking import IMPLS, check_chunk_size, check_gate, check_impl, check_qkv
from ..interdomain.validation import check_devices, check_reset

__all__ = ["IMPLS", "Inputs", "Mamba3State", "check_chunk_size", "check_impl", "prepare"]

_HALF = (torch.float16, torch.bfloat16)


class Mamba3State(NamedTuple):
    """What the recurrence carries from one token to the next, per row and head: h (B, H, N, P)
    the state; k (B, H, N) the previous token's rotated key and x (B, H, P) its value (the
    trapezoid's second term reads them); angle (B, H, S) the cumulative rotation angles."""

    h: torch.Tensor
    k: torch.Tensor
    x: torch.Tensor
    angle: torch.Tensor


class Inputs(NamedTuple):
    """The op's inputs, checked and cast to the compute dtype (fp32 for half/bf16 inputs)."""

    q: torch.Tensor  # (B, T, H, N)
    k: torch.Tensor  # (B, T, H, N)
    x: torch.Tensor  # (B, T, H, P)
    dt: torch.Tensor  # (B, T, H)
    A: torch.Tensor  # (B, T, H)
    trap: torch.Tensor  # (B, T, H)
    angles: torch.Tensor  # (B, T, H, S)
    state: Mamba3State  # zeros when none was given
    reset: torch.Tensor | None  # (B, T) bool
    out_dtype: torch.dtype


def empty_state(B: int, H: int, N: int, P: int, S: int, like: torch.Tensor) -> Mamba3State:
    """The zero state (a sequence's start) in like's dtype and device."""
    zeros = lambda *shape: like.new_zeros(shape)  # noqa: E731
    return Mamba3State(zeros(B, H, N, P), zeros(B, H, N), zeros(B, H, P), zeros(B, H, S))


def _check_state(state, B: int, H: int, N: int, P: int, S: int) -> None:
    if not isinstance(state, tuple) or len(state) != 4:
        raise TypeError(
            "initial_state: expected a Mamba3State (h, k, x, angle) or None, got "
            f"{type(state).__name__}"
        )
    want = Mamba3State((B, H, N, P), (B, H, N), (B, H, P), (B, H, S))
    for name, x, shape in zip(Mamba3State._fields, state, want, strict=True):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"initial_state.{name}: expected a floating tensor")
        if tuple(x.shape) != shape:
            raise ValueError(f"initial_state.{name}: expected shape {shape}, got {tuple(x.shape)}")


def prepare(q, k, x, dt, A, trap, angles, initial_state, reset) -> Inputs:
    """Check every argument (errors name it) and cast the tensors to the compute dtype."""
    B, T, H, N, P = check_qkv(q, k, x)
    for name, gate in (("dt", dt), ("A", A), ("trap", trap)):
        check_gate(name, gate, ((B, T, H),), f"(B, T, H) = {(B, T, H)}")
    if not isinstance(angles, torch.Tensor) or angles.dim() != 4 or angles.shape[:3] != (B, T, H):
        shape = tuple(angles.shape) if isinstance(angles, torch.Tensor) else type(angles).__name__
        raise ValueError(f"angles: expected (B, T, H, S) with (B, T, H) = {(B, T, H)}, got {shape}")
    S = angles.shape[-1]
    if 2 * S > N:
        raise ValueError(f"angles: S = {S} angles rotate 2S = {2 * S} > N = {N} key channels")
    check_gate("angles", angles, ((B, T, H, S),), "(B, T, H, S)")
    if initial_state is not None:
        _check_state(initial_state, B, H, N, P, S)
    check_reset(reset, B, T)
    check_devices(
        "q", q, x=x, dt=dt, A=A, trap=trap, angles=angles, reset=reset,
        initial_state=None if initial_state is None else initial_state.h,
    )  # fmt: skip
    dtype = torch.float32 if q.dtype in _HALF else q.dtype
    cast = [t.to(dtype) for t in (q, k, x, dt, A, trap, angles)]
    if initial_state is None:
        state = empty_state(B, H, N, P, S, cast[0])
    else:
        state = Mamba3State(*(s.to(dtype) for s in initial_state))
    return Inputs(*cast, state, reset, q.dtype)
