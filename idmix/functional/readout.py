"""Readout Gram: the full complex readout C enters the layer only through Ĝ (docs/design.md §2)."""

from __future__ import annotations

import torch

READOUTS = ("conj", "product")


def readout_gram(C: torch.Tensor, readout: str = "conj") -> torch.Tensor:
    """C: (H, M, M) complex -> Ĝ: (H, 2M, 2M) real (C's real dtype), interleaved: row and
    column 2m + {0, 1} hold (Re, Im) of mode m, the layout of the real state.

    With p = Xᵏ q ∈ Cᴹ in real form p̂ = (Re p₀, Im p₀, Re p₁, …), w̃ = Ĝ p̂ gives the output
    o = X̂ᵥᵀ w̃ (X̂ᵥ: Xᵥ's rows interleaved the same way) for both readouts:
      conj    (o = Re(Γᴴ a), G = Cᴴ C): each 2×2 block of Ĝ is [[G_r, -G_i], [ G_i,  G_r]]
      product (o = Re(Γᵀ a), G = Cᵀ C): each 2×2 block of Ĝ is [[G_r, -G_i], [-G_i, -G_r]]
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
    H, M, _ = C_re.shape
    # Ĉ: C as a real 2M×2M map, entry (m, n) the 2×2 block [[C_r, -C_i], [C_i, C_r]];
    # conj: Ĝ = ĈᵀĈ (G = CᴴC); product: Ĝ = Ĉᵀ S Ĉ (G = CᵀC), S negating the imaginary rows.
    # One batched GEMM either way.
    re_row = torch.stack([C_re, -C_im], -1)  # (H, M, M, 2): block row 0
    im_row = torch.stack([C_im, C_re], -1)  # block row 1
    C_hat = torch.stack([re_row, im_row], -3).reshape(H, 2 * M, 2 * M)
    if readout == "conj":
        return C_hat.mT @ C_hat
    signed = torch.stack([re_row, -im_row], -3).reshape(H, 2 * M, 2 * M)
    return C_hat.mT @ signed
