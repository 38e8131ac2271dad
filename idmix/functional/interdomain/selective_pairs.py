"""The work over (t, s) pairs of the per-token path, factored so that only a real kernel is
per pair: D[t, s] = K[t, s] · u_t · conj(u_s), with

    K[t, s] = exp(ρ_t − ρ_s) for s ≤ t in one document, else 0   (ρ: cumulative log|λ|),
    u_t = Π_{r≤t} λ_r / |λ_r|                                     (unit phasors, a cumprod).

Every exponent is ≤ 0 (nothing overflows; the exp is taken per pair, never split into a
product exp(ρ_t)·exp(−ρ_s), which would overflow at Δ_t·|Re A| ≳ 88/L), and the phase rides on
products of unit factors with no angle to wrap. The phasors fold into the vectors outside the
pair sums (β̃ = conj(u) ⊙ β, w̃ = conj(u) ⊙ w), so each sum below is one real kernel times
real vectors, over modes kept innermost.

Each function is elementwise-then-reduce over an (L, L, M) product. Eager PyTorch would
materialise it; on CPU the functions run through Inductor (``torch.compile``), which fuses the
exp, the products and the reduction into one loop nest and never stores a pair tensor (the
first call per function and dtype compiles, with dynamic shapes so new lengths do not
recompile; ``benchmarks/bench_selective_cpu.py`` measures the path). Inside a region already being
compiled, and where no
C++ compiler is found, the plain functions run (same code, same numbers up to rounding).
Shapes: (.., L, M) per position and mode, (.., L, L) per pair; `doc` (.., L) document index
within the chunk (pairs in different documents are cut), or None.
"""

from __future__ import annotations

import torch

from .compiled import compiled, have_cxx


def _kernel(rho: torch.Tensor, doc: torch.Tensor | None) -> torch.Tensor:
    """K[t, s, m] = exp(ρ_t − ρ_s) on the causal pairs of one document, else 0: (.., L, L, M)."""
    L = rho.shape[-2]
    i = torch.arange(L, device=rho.device)
    keep = (i[:, None] >= i[None, :])[..., None]  # (L, L, 1)
    if doc is not None:
        keep = keep & (doc[..., :, None] == doc[..., None, :])[..., None]
    exponent = rho[..., :, None, :] - rho[..., None, :, :]
    return torch.exp(torch.where(keep, exponent, float("-inf")))


def pair_sums(W, rho, doc, xr, xi):
    """Σ_s W[i, t, s] K[t, s] x_s for each weight matrix i: W (.., I, L, L); x = xr + i·xi
    (.., L, M). Returns (re, im), each (.., I, L, M)."""
    KW = W[..., None] * _kernel(rho, doc)[..., None, :, :, :]  # (.., I, L, L, M)
    return (KW * xr[..., None, None, :, :]).sum(-2), (KW * xi[..., None, None, :, :]).sum(-2)


def pair_dots(rho, doc, br, bi, xr, xi):
    """Σ_m K[t, s, m] Re(conj(b_s) x_{i,t}) for each i: b = br + i·bi (.., L, M); x (.., I, L, M).
    Returns (.., I, L, L)."""
    K = _kernel(rho, doc)[..., None, :, :, :]  # (.., 1, L, L, M)
    prod = (
        xr[..., :, None, :] * br[..., None, None, :, :]
        + xi[..., :, None, :] * bi[..., None, None, :, :]
    )
    return (K * prod).sum(-1)


def pair_tsums(W, rho, doc, xr, xi):
    """Σ_i Σ_t W[i, t, s] K[t, s] x_{i,t} (the transposed sum): W (.., I, L, L); x (.., I, L, M).
    Returns (re, im), each (.., L, M)."""
    KW = W[..., None] * _kernel(rho, doc)[..., None, :, :, :]  # (.., I, L, L, M)
    return (KW * xr[..., :, None, :]).sum((-4, -3)), (KW * xi[..., :, None, :]).sum((-4, -3))


def fused(fn, x: torch.Tensor):
    """fn through Inductor for CPU tensors outside a compiled region (where a C++ compiler is
    found), else fn itself."""
    if x.is_cuda or torch.compiler.is_compiling() or not have_cxx():
        return fn
    return compiled(fn, dynamic=True)
