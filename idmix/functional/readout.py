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
    return readout_gram_real(C.real, C.imag, readout)


def readout_gram_real(C_re: torch.Tensor, C_im: torch.Tensor, readout: str = "conj"):
    """:func:`readout_gram` from the real and imaginary parts of C, (H, M, M) each, in real
    GEMMs only (the layers' path: it compiles with Inductor, which has no complex codegen)."""
    if C_re.dim() != 3 or C_re.shape[-1] != C_re.shape[-2] or C_im.shape != C_re.shape:
        raise ValueError(
            f"C: expected (H, M, M), got shapes {tuple(C_re.shape)} and {tuple(C_im.shape)}"
        )
    if readout not in READOUTS:
        raise ValueError(f"readout: expected one of {READOUTS}, got {readout!r}")
    # Ĉ = [[C_r, -C_i], [C_i, C_r]] is C as a real 2M×2M map; conj: Ĝ = ĈᵀĈ (G = CᴴC);
    # product: Ĝ = Ĉᵀ diag(I, -I) Ĉ (G = CᵀC). One batched GEMM either way.
    top, bottom = torch.cat([C_re, -C_im], -1), torch.cat([C_im, C_re], -1)
    C_hat = torch.cat([top, bottom], -2)
    right = C_hat if readout == "conj" else torch.cat([top, -bottom], -2)
    return C_hat.mT @ right
