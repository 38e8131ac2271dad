"""The decays an op call runs with, as typed values: shared per head, or one per token.

Real form (interleaved [re, im] in the last dimension, ``discretize_real``): the op's
implementations take one of these, and each path is chosen by type, never by rank.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class SharedDecays(NamedTuple):
    """λ and β shared by every position: lam_ri, beta_ri (H, M, 2)."""

    lam_ri: torch.Tensor
    beta_ri: torch.Tensor

    def at(self, t: int) -> SharedDecays:
        """The decays of position t: the same at every position."""
        return self


class TokenDecays(NamedTuple):
    """Per-token (selective) λ_t and β_t: lam_ri, beta_ri (B, T, H, M, 2)."""

    lam_ri: torch.Tensor
    beta_ri: torch.Tensor

    def at(self, t: int) -> TokenDecays:
        """The decays of position t, (B, H, M, 2) each (per row)."""
        return TokenDecays(self.lam_ri[:, t], self.beta_ri[:, t])


Decays = SharedDecays | TokenDecays


def decays_of(lam_ri: torch.Tensor, beta_ri: torch.Tensor) -> Decays:
    """The typed decays of checked real-form tensors: (H, M, 2) shared, (B, T, H, M, 2) per
    token (``validation.check_real_params`` has checked the shapes)."""
    return (TokenDecays if lam_ri.dim() == 5 else SharedDecays)(lam_ri, beta_ri)
