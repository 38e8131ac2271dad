"""Data-independent decay tensors of one chunk length L, built from (λ, β) in real form."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .realform import polar, powers


class ChunkDecays(NamedTuple):
    """All (re | im) pairs are stacked along the last (or row) dim as 2M reals.

    intra: (H, L, L, 2M)  β λ^{t-s} for s <= t, exactly 0 above the diagonal
    start_re, start_im: (H, L, M)  λ^{i+1}: decay of the chunk-start state to position i
    end: (H, 2M, L)  β λ^{L-1-s}: weight of input s in the chunk-end state (rows [Re; Im])
    chunk_re, chunk_im: (H, M)  λ^L
    """

    intra: torch.Tensor
    start_re: torch.Tensor
    start_im: torch.Tensor
    end: torch.Tensor
    chunk_re: torch.Tensor
    chunk_im: torch.Tensor


def chunk_decays(lam_ri: torch.Tensor, beta_ri: torch.Tensor, L: int) -> ChunkDecays:
    """lam_ri, beta_ri: (H, M, 2) real views of λ and β. Every exponent used is >= 0."""
    log_mag, theta = polar(lam_ri)
    br, bi = beta_ri[..., 0], beta_ri[..., 1]  # (H, M)
    idx = torch.arange(L, device=lam_ri.device)
    lag = idx[:, None] - idx[None, :]
    causal = (lag >= 0)[None, :, :, None]
    pr, pi = powers(log_mag, theta, lag.clamp_min(0))  # (H, L, L, M)
    b_r, b_i = br[:, None, None, :], bi[:, None, None, :]
    intra = torch.cat([b_r * pr - b_i * pi, b_r * pi + b_i * pr], dim=-1)
    intra = torch.where(causal, intra, torch.zeros_like(intra))
    start_re, start_im = powers(log_mag, theta, idx + 1)  # (H, L, M)
    er, ei = powers(log_mag, theta, L - 1 - idx)  # (H, L, M)
    b_r, b_i = br[:, None, :], bi[:, None, :]
    end = torch.cat([b_r * er - b_i * ei, b_r * ei + b_i * er], dim=-1).transpose(1, 2)
    cr, ci = powers(log_mag, theta, torch.tensor(float(L), device=lam_ri.device))
    return ChunkDecays(intra, start_re, start_im, end.contiguous(), cr, ci)
