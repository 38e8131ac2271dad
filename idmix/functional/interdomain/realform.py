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


# Complex arithmetic on interleaved real tensors (..., 2M), broadcasting like their complex
# views. Eager, one complex kernel on the views is fastest; under torch.compile the complex
# views do not trace (Dynamo rejects view_as_complex of fake tensors), so the traced form is
# real arithmetic on the (re, im) pairs, which Inductor fuses with its neighbours.


def _pairs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.unflatten(-1, (-1, 2)).unbind(-1)


def _interleave(re: torch.Tensor, im: torch.Tensor) -> torch.Tensor:
    return torch.stack([re, im], dim=-1).flatten(-2)


def cmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a ⊙ b."""
    if torch.compiler.is_compiling():
        (ar, ai), (br, bi) = _pairs(a), _pairs(b)
        return _interleave(ar * br - ai * bi, ar * bi + ai * br)
    return as_interleaved(as_complex(a) * as_complex(b))


def cmul_conj(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """conj(a) ⊙ b."""
    if torch.compiler.is_compiling():
        (ar, ai), (br, bi) = _pairs(a), _pairs(b)
        return _interleave(ar * br + ai * bi, ar * bi - ai * br)
    return as_interleaved(as_complex(a).conj_physical() * as_complex(b))


def dot_conj(x: torch.Tensor, g: torch.Tensor, dim) -> torch.Tensor:
    """Σ_dim g ⊙ conj(x) (the gradient of a ⊙ x with respect to a); dim counts as in the complex
    view (the last dimension is the mode).

    An explicit conj_physical, not linalg.vecdot's lazy conjugate: a custom op's body run
    under a TorchDispatchMode (FlopCounterMode, a debug or poison mode) is dispatched with the
    conjugate fallback excluded, and vecdot then silently drops the conjugation."""
    return cmul_conj(x, g).sum(dim)
