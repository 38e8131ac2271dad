"""Readout Gram: the full complex readout C enters the layer only through Ĝ (DESIGN.md §2)."""

from __future__ import annotations

import torch

READOUTS = ("conj", "product")


def readout_gram(C: torch.Tensor, readout: str = "conj") -> torch.Tensor:
    """C: (H, M, M) complex -> Ĝ: (H, 2M, 2M) real (C's real dtype).

    With p = Xᵏ q ∈ Cᴹ in real form p̂ = [Re p; Im p], w̃ = Ĝ p̂ is such that the output is
    o = Xᵥ,rᵀ w̃[:M] + Xᵥ,iᵀ w̃[M:] for both readouts:
      conj    (o = Re(Γᴴ a), G = Cᴴ C): Ĝ = [[G_r, -G_i], [ G_i,  G_r]]
      product (o = Re(Γᵀ a), G = Cᵀ C): Ĝ = [[G_r, -G_i], [-G_i, -G_r]]
    """
    if not C.is_complex():
        raise TypeError(f"C: expected a complex tensor, got {C.dtype}")
    if C.dim() != 3 or C.shape[-1] != C.shape[-2]:
        raise ValueError(f"C: expected (H, M, M), got shape {tuple(C.shape)}")
    if readout == "conj":
        G = C.mH @ C
        Gr, Gi = G.real, G.imag
        return torch.cat([torch.cat([Gr, -Gi], -1), torch.cat([Gi, Gr], -1)], -2)
    if readout == "product":
        G = C.mT @ C
        Gr, Gi = G.real, G.imag
        return torch.cat([torch.cat([Gr, -Gi], -1), torch.cat([-Gi, -Gr], -1)], -2)
    raise ValueError(f"readout: expected one of {READOUTS}, got {readout!r}")
