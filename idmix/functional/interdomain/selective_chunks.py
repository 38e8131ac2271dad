"""The per-token path's chunk layout and the decays it implies (``selective``): a piece of
the sequence as chunks (B, H, n, L, ...), with the magnitude and phase of the decays kept apart
(every exponent ≤ 0), and the real-GEMM forms of its complex contractions."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .precision import matmul
from .realform import as_complex as _complex
from .realform import as_interleaved as _real


def chunks(x: torch.Tensor, n: int, L: int) -> torch.Tensor:
    """(B, T, H, ...) -> (B, H, n, L, ...), zero-padded at the end to n·L positions."""
    pad = n * L - x.shape[1]
    if pad:
        x = torch.cat([x, x.new_zeros(x.shape[0], pad, *x.shape[2:])], 1)
    return x.unflatten(1, (n, L)).movedim(3, 1)


def unchunk(x: torch.Tensor, T: int) -> torch.Tensor:
    """(B, H, n, L, ...) -> (B, T, H, ...): the inverse of :func:`chunks`."""
    return x.movedim(1, 3).flatten(1, 2)[:, :T]


class Chunked(NamedTuple):
    """One call's inputs cut into chunks (B, H, n, L, ...) and the decays they imply.

    q, k, v: the tokens; beta, lam (.., L, M) complex; starts (B, 1, n, L) bool (document
    starts) or None; doc (B, 1, n, L) document index within the chunk (float) or None;
    rho (.., L, M): the cumulative sum of log|λ| over the chunk (≤ 0, non-increasing);
    u (.., L, M): the running product of λ/|λ| (unit phasors); scores A[t, s] = q_t·k_s
    (.., L, L), not masked (the pair kernel is exactly 0 on every pair that does not count);
    F[t] = exp(ρ_t) u_t where no document starts in [0, t], else 0; De[s] = exp(ρ_{L−1} − ρ_s)
    u_{L−1} conj(u_s) where s is in the chunk's last document, else 0 (.., L, M) each;
    c: the cumulative sum of log λ with wrapped phases, for the Triton kernels only (else None).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    beta: torch.Tensor
    lam: torch.Tensor
    starts: torch.Tensor | None
    doc: torch.Tensor | None
    rho: torch.Tensor
    u: torch.Tensor
    scores: torch.Tensor
    F: torch.Tensor
    De: torch.Tensor
    c: torch.Tensor | None


def prepare(q, k, v, lam_ri, beta_ri, reset, L: int, with_c: bool = False) -> Chunked:
    B, T = q.shape[:2]
    n = -(-T // L)
    # padding: λ = 1 (log|λ| = 0, phasor 1), β = 0, z = 0 leaves the state unchanged past T
    lam = torch.view_as_complex(lam_ri.contiguous())
    sq = lam_ri.square().sum(-1)
    tiny = torch.finfo(sq.dtype).tiny
    rho = chunks(0.5 * torch.log(sq.clamp_min(tiny)), n, L).cumsum(3)  # (B, H, n, L, M)
    phasor = torch.where(sq > tiny, lam * torch.rsqrt(sq.clamp_min(tiny)), 1)
    u = (chunks(phasor - 1, n, L) + 1).cumprod(3)
    qc, kc, vc = (chunks(x, n, L) for x in (q, k, v))
    F = u * torch.exp(rho)
    # to the chunk end: the exponent rho_{L-1} - rho_s is never > 0
    De = (u[..., -1:, :] * u.conj_physical()) * torch.exp(rho[..., -1:, :] - rho)
    starts = doc = None
    if reset is not None:
        starts = chunks(reset[..., None], n, L)  # (B, 1, n, L)
        doc = starts.cumsum(3, dtype=rho.dtype)
        F = torch.where((doc == 0)[..., None], F, 0)
        # s in the chunk's last document
        De = torch.where((doc == doc[..., -1:])[..., None], De, 0)
    beta = chunks(torch.view_as_complex(beta_ri.contiguous()), n, L)
    c = None
    if with_c:  # ρ is its real part; the phases are wrapped per step (atan2) before the sum
        theta = torch.atan2(lam_ri[..., 1], lam_ri[..., 0])
        c = torch.complex(rho, chunks(theta, n, L).cumsum(3))
    return Chunked(qc, kc, vc, beta, chunks(lam, n, L), starts, doc, rho, u, qc @ kc.mT, F, De, c)


def mm_rc(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    """a @ b for real a (.., I, K) and complex b (.., K, N), as one real GEMM on b's
    interleaved view (operands at precision): complex (.., I, N)."""
    return _complex(matmul(a, _real(b.resolve_conj()), precision))


def mm_re(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    """Re Σ_m a[i, m] conj(b[j, m]) for complex a (.., I, M), b (.., J, M), as one real GEMM of
    the interleaved views (operands at precision): (.., I, J)."""
    return matmul(_real(a.resolve_conj()), _real(b.resolve_conj()).mT, precision)


def parts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(re, im) of a complex tensor, each contiguous."""
    return x.real.contiguous(), x.imag.contiguous()


def from_start(ch: Chunked, Xk: torch.Tensor, precision: str) -> torch.Tensor:
    """Xᵏ q_t from the chunk start: (B, H, n, L, M)."""
    return mm_rc(ch.q, Xk, precision)


def gram(x: torch.Tensor, G: torch.Tensor, precision: str) -> torch.Tensor:
    """x̂ G per position, one GEMM per (row, head): x (B, H, n, L, M) complex, G (H, 2M, 2M)
    real interleaved -> (B, H, n, L, M) complex (G is not copied per chunk)."""
    out = matmul(_real(x).flatten(2, 3), G, precision)  # (B, H, n·L, 2M)
    return _complex(out).view(x.shape)
