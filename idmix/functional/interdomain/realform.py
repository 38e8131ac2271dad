"""Real-form helpers. Complex dtypes never reach the GEMM paths: a complex vector over M modes
becomes 2M interleaved reals (re₀, im₀, re₁, …), the one layout of the runtime contract: the
state (B, H, R+D, 2M) and Ĝ (H, 2M, 2M) (``view_as_complex`` of it is then free).
"""

from __future__ import annotations

import torch


def state_to_interleaved(Xk: torch.Tensor, Xv: torch.Tensor) -> torch.Tensor:
    """(Xk: (B, H, M, R), Xv: (B, H, M, D)) complex -> (B, H, R+D, 2M) interleaved real."""
    Z = torch.cat([Xk, Xv], dim=-1).transpose(-1, -2)  # (B, H, R+D, M)
    return torch.view_as_real(Z).flatten(-2).contiguous()


def interleaved_to_state(Z: torch.Tensor, R: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`state_to_interleaved` (R is the key width), as views of Z's storage:
    mode-last, the layout the decode step reads without copying."""
    Zc = torch.view_as_complex(Z.unflatten(-1, (-1, 2))).mT  # (B, H, M, R+D)
    return Zc[..., :R], Zc[..., R:]


def as_complex(x: torch.Tensor) -> torch.Tensor:
    """(..., 2M) interleaved real -> (..., M) complex view (no copy)."""
    return torch.view_as_complex(x.unflatten(-1, (-1, 2)))


def as_interleaved(x: torch.Tensor) -> torch.Tensor:
    """(..., M) complex -> (..., 2M) interleaved real view (no copy)."""
    return torch.view_as_real(x).flatten(-2)
