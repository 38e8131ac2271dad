"""Argument checks and the compute dtype of the delta-rule Interdomain op (both impls)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..chunking import IMPLS, check_chunk_size, check_gate, check_impl, check_qkv
from ..interdomain.validation import check_devices, check_real_params, check_reset

__all__ = ["IMPLS", "Inputs", "check_chunk_size", "check_impl", "prepare"]


class Inputs(NamedTuple):
    """The op's inputs, checked and cast to the compute dtype (fp64 for fp64 inputs, else
    fp32)."""

    q: torch.Tensor  # (B, T, H, R)
    k: torch.Tensor  # (B, T, H, R)
    v: torch.Tensor  # (B, T, H, D)
    eta: torch.Tensor  # (B, T, H): the erase strength
    lam_ri: torch.Tensor  # (H, M, 2)
    beta_ri: torch.Tensor  # (H, M, 2)
    G_hat: torch.Tensor  # (H, 2M, 2M)
    state: torch.Tensor  # (B, H, R+D, 2M): the initial state, zeros when none was given
    reset: torch.Tensor | None  # (B, T) bool
    out_dtype: torch.dtype


def prepare(q, k, v, eta, lam_ri, beta_ri, G_hat, initial_state, reset) -> Inputs:
    """Check every argument (errors name it) and cast the tensors to the compute dtype."""
    B, T, H, R, D = check_qkv(q, k, v)
    check_gate("eta", eta, ((B, T, H),), f"(B, T, H) = {(B, T, H)}")
    M = check_real_params(lam_ri, beta_ri, G_hat, H)
    shape = (B, H, R + D, 2 * M)
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor) or not initial_state.is_floating_point():
            raise TypeError("initial_state: expected a real floating tensor or None")
        if tuple(initial_state.shape) != shape:
            raise ValueError(
                f"initial_state: expected (B, H, R+D, 2M) = {shape}, "
                f"got {tuple(initial_state.shape)}"
            )
    check_reset(reset, B, T)
    check_devices(
        "q", q, k=k, v=v, eta=eta, lam_ri=lam_ri, beta_ri=beta_ri, G_hat=G_hat,
        initial_state=initial_state, reset=reset,
    )  # fmt: skip
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    state = q.new_zeros(shape, dtype=dtype) if initial_state is None else initial_state.to(dtype)
    cast = (x.to(dtype) for x in (q, k, v, eta, lam_ri, beta_ri, G_hat))
    return Inputs(*cast, state, reset, q.dtype)
