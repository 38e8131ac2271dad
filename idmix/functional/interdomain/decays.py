"""Data-independent decay tensors of one chunk length L, built from (λ, β).

Real form used by the chunked path: a complex vector over M modes is stored as 2M reals,
interleaved (re₀, im₀, re₁, im₁, …), so that ``torch.view_as_complex`` gives the complex
view for free while every contraction stays a real GEMM.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..powers import polar, powers


class ChunkDecays(NamedTuple):
    """start: (H, L, 2M)  λ^{i+1}: decay of the chunk-start state to position i
    end: (H, L, 2M)    β λ^{L-1-s}: weight of input s in the chunk-end state; read backwards it
                       is also the intra-chunk kernel β λ^{t-s} by lag t - s
    chunk: (H, 2M)     λ^L
    """

    start: torch.Tensor
    end: torch.Tensor
    chunk: torch.Tensor


def chunk_decays(lam_ri: torch.Tensor, beta_ri: torch.Tensor, L: int) -> ChunkDecays:
    """lam_ri, beta_ri: (H, M, 2) real views of λ and β. Every exponent used is >= 0."""
    log_mag, theta = polar(lam_ri)
    br, bi = beta_ri[..., 0][:, None, :], beta_ri[..., 1][:, None, :]  # (H, 1, M)
    pr, pi = powers(log_mag, theta, torch.arange(L + 1, device=lam_ri.device))  # λ^0..λ^L

    def interleave(re, im):
        return torch.stack([re, im], dim=-1).flatten(-2)

    by_lag = interleave(br * pr[:, :L] - bi * pi[:, :L], br * pi[:, :L] + bi * pr[:, :L])
    return ChunkDecays(
        interleave(pr[:, 1:], pi[:, 1:]), by_lag.flip(1), interleave(pr[:, -1], pi[:, -1])
    )
