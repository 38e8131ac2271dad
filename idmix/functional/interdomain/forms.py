"""The compiled-vs-eager forms of the chunked paths' complex arithmetic: the only module that
asks whether it is being traced.

Eager, one complex kernel on views of the interleaved reals (…, 2M) is fastest, and the scans
write each step in place. Under torch.compile the complex views do not trace (Dynamo rejects
``view_as_complex`` of fake tensors) and ``out=`` into a strided slice does not either, so the
traced form is real arithmetic on the (re, im) pairs and functional loops, which Inductor fuses
with their neighbours. Both forms compute the same values (tested).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .realform import as_complex as _c
from .realform import as_interleaved as _r


def _tracing() -> bool:
    return torch.compiler.is_compiling()


def _pairs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.unflatten(-1, (-1, 2)).unbind(-1)


def _interleave(re: torch.Tensor, im: torch.Tensor) -> torch.Tensor:
    return torch.stack([re, im], dim=-1).flatten(-2)


def cmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a ⊙ b on interleaved reals (…, 2M), broadcasting like their complex views."""
    if _tracing():
        (ar, ai), (br, bi) = _pairs(a), _pairs(b)
        return _interleave(ar * br - ai * bi, ar * bi + ai * br)
    return _r(_c(a) * _c(b))


def cmul_conj(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """conj(a) ⊙ b on interleaved reals."""
    if _tracing():
        (ar, ai), (br, bi) = _pairs(a), _pairs(b)
        return _interleave(ar * br + ai * bi, ar * bi - ai * br)
    return _r(_c(a).conj_physical() * _c(b))


def dot_conj(x: torch.Tensor, g: torch.Tensor, dim) -> torch.Tensor:
    """Σ_dim g ⊙ conj(x) (the gradient of a ⊙ x with respect to a); dim counts as in the complex
    view (the last dimension is the mode).

    An explicit conj_physical, not linalg.vecdot's lazy conjugate: a custom op's body run
    under a TorchDispatchMode (FlopCounterMode, a debug or poison mode) is dispatched with the
    conjugate fallback excluded, and vecdot then silently drops the conjugation."""
    return cmul_conj(x, g).sum(dim)


def shear_in(A: torch.Tensor) -> torch.Tensor:
    """(t, s) -> (t, j) with Y[t, j] = A[t, t + j + 1 - L] (0 where that s < 0); A: (..., L, L).

    Lines the causal part of each row up with ``end[j] = β λ^{L-1-j}``, so that
    Σ_{s<=t} A[t, s] β λ^{t-s} = (Y @ end)[t]: the intra-chunk decay becomes one shared matrix.
    Eager: a zero-padded copy read through a strided view; traced: pads and reshapes, which
    Inductor fuses. The adjoint of :func:`shear_out`.
    """
    L = A.shape[-1]
    if _tracing():
        flat = F.pad(F.pad(A, (L, 1)).flatten(-2), (0, L + 1))  # rows [0_L, A, 0]
        return flat[..., 1 : 1 + L * (2 * L + 2)].unflatten(-1, (L, 2 * L + 2))[..., :L]
    padded = torch.cat([A.new_zeros(*A.shape[:-1], L), A], dim=-1)  # (..., L, 2L)
    strides = (*padded.stride()[:-2], 2 * L + 1, 1)
    return padded.as_strided(A.shape, strides, padded.storage_offset() + 1).contiguous()


def shear_out(Y: torch.Tensor) -> torch.Tensor:
    """(t, j) -> (t, s) with A[t, s] = Y[t, L - 1 - t + s] for s <= t, else 0 (see shear_in)."""
    L = Y.shape[-1]
    if _tracing():
        flat = F.pad(Y, (0, L)).flatten(-2)  # rows [Y, 0_L]
        return flat[..., L - 1 : L - 1 + L * (2 * L - 1)].unflatten(-1, (L, 2 * L - 1))[..., :L]
    padded = torch.cat([Y, Y.new_zeros(*Y.shape[:-1], L)], dim=-1)  # (..., L, 2L)
    strides = (*padded.stride()[:-2], 2 * L - 1, 1)
    return padded.as_strided(Y.shape, strides, padded.storage_offset() + L - 1).contiguous()


def scan_interleaved(inc, Z0, carry):
    """S_0 = Z0, S_{j+1} = carry_j ⊙ S_j + inc_j over chunks, on interleaved reals.

    inc: (B, H, N, C, 2M); Z0: (B, H, C, 2M); carry(j): the multiplier of chunk j, (.., 1, 2M)
    broadcasting against Z0. Returns (S_0..S_{N-1}: (B, H, N, C, 2M), contiguous; S_N)."""
    N = inc.shape[2]
    if _tracing():
        S = [Z0]
        for j in range(N):
            S.append(cmul(carry(j), S[-1]) + inc[:, :, j])
        return torch.stack(S[:-1], 2), S[-1]
    inc = _c(inc)
    starts = torch.empty_like(inc)
    starts[:, :, 0] = _c(Z0)
    for j in range(N - 1):
        torch.addcmul(inc[:, :, j], _c(carry(j)), starts[:, :, j], out=starts[:, :, j + 1])
    end = torch.addcmul(inc[:, :, N - 1], _c(carry(N - 1)), starts[:, :, N - 1])
    return _r(starts), _r(end)


def scan_adjoint_interleaved(g_S, g_end, carry):
    """Adjoint of :func:`scan_interleaved`: G_N = g_end, G_j = g_S_j + conj(carry_j) ⊙ G_{j+1}.

    Returns (G_1..G_N: (B, H, N, C, 2M), the gradients of the increments; G_0 = grad of Z0)."""
    N = g_S.shape[2]
    if _tracing():
        G = [g_end]
        for j in range(N - 1, 0, -1):
            G.append(g_S[:, :, j] + cmul_conj(carry(j), G[-1]))
        return torch.stack(G[::-1], 2), g_S[:, :, 0] + cmul_conj(carry(0), G[-1])
    g_S = _c(g_S)
    g_inc = torch.empty_like(g_S)
    g_inc[:, :, N - 1] = _c(g_end)
    for j in range(N - 1, 0, -1):
        c = _c(carry(j)).conj_physical()
        torch.addcmul(g_S[:, :, j], c, g_inc[:, :, j], out=g_inc[:, :, j - 1])
    g_0 = torch.addcmul(g_S[:, :, 0], _c(carry(0)).conj_physical(), g_inc[:, :, 0])
    return _r(g_inc), _r(g_0)


def scan_complex(inc: torch.Tensor, carry: torch.Tensor, first: torch.Tensor, reverse: bool):
    """X_0 = first, X_{j+1} = carry_j ⊙ X_j + inc_j over dim 2 (from the end when reverse), on
    complex tensors: inc (B, H, n, C, M), carry (B, H, n, 1, M). Returns (X_0..X_{n−1} stacked
    in the order of inc, and X_n). Eager writes each step in place (no stack copy)."""
    n = inc.shape[2]
    order = range(n - 1, -1, -1) if reverse else range(n)
    if _tracing():
        xs, X = [None] * n, first
        for j in order:
            xs[j], X = X, torch.addcmul(inc[:, :, j], carry[:, :, j], X)
        return torch.stack(xs, 2), X
    xs = torch.empty_like(inc)
    prev = None
    for j in order:
        if prev is None:
            xs[:, :, j] = first
        else:
            torch.addcmul(inc[:, :, prev], carry[:, :, prev], xs[:, :, prev], out=xs[:, :, j])
        prev = j
    return xs, torch.addcmul(inc[:, :, prev], carry[:, :, prev], xs[:, :, prev])
