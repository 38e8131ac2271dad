"""Feature map of Interdomain Attention: ξ(x) = SiLU(x) / ||SiLU(x)||₂ over the last dim."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_l2_feature_map(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """ξ(x) = SiLU(x) / max(||SiLU(x)||₂, eps) over the last dim (one feature vector per head).

    x: (..., R) real, any float dtype; returns the same shape and dtype.
    An all-zero (or all-negative-saturated) vector maps to zeros, never to NaN.
    """
    y = F.silu(x)
    return y / torch.linalg.vector_norm(y, dim=-1, keepdim=True).clamp_min(eps)


def silu_l2_feature_map_naive(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Reference for :func:`silu_l2_feature_map`, written out from the definition."""
    y = x * torch.sigmoid(x)
    norm = torch.sqrt((y * y).sum(dim=-1, keepdim=True))
    return y / torch.where(norm > eps, norm, torch.full_like(norm, eps))
