"""The per-token path's pair work and intra-chunk forward on the Triton kernels
(``idmix_kernels.selective_*``): the pair decays live in registers, one source position per
loop step, and are never stored. The interface of ``selective_torch``."""

from __future__ import annotations

import torch

from .realform import as_complex as _complex
from .realform import as_interleaved as _real
from .selective_chunks import Chunked, gram


def _starts(ch: Chunked):
    """(B, n, L) document starts, or None."""
    return None if ch.starts is None else ch.starts[:, 0]


class KernelPairs:
    """The backward's work over the pairs, given go (.., L, D), o's gradient."""

    def __init__(self, kernels, ch: Chunked, go: torch.Tensor):
        self.kernels, self.ch, self.go = kernels, ch, go
        self.starts = _starts(ch)
        self.c, self.beta = _real(ch.c), _real(ch.beta)

    def sums(self):
        ch = self.ch
        sums = self.kernels.selective_pair_sums(
            ch.q, ch.k, ch.v, self.go, self.c, self.beta, self.starts
        )
        return tuple(_complex(x) for x in sums)

    def grads(self, w, g_p):
        ch = self.ch
        g_q, g_k, g_v, g_beta = self.kernels.selective_pair_grads(
            ch.q, ch.k, ch.v, self.go, self.c, self.beta, _real(w), _real(g_p), self.starts
        )
        return g_q, g_k, g_v, _complex(g_beta)


class SelectiveTritonOps:
    """The per-token primitives as kernel launches; kernels: the idmix_kernels module."""

    needs_log_decay = True

    def __init__(self, kernels):
        self.kernels = kernels

    def pairs(self, ch: Chunked, go: torch.Tensor) -> KernelPairs:
        return KernelPairs(self.kernels, ch, go)

    def intra_forward(self, ch: Chunked, Xs, G_hat, R: int, precision: str) -> torch.Tensor:
        """``selective_pass1``, Ĝ, ``selective_pass2``: o (B, H, n, L, D)."""
        starts = _starts(ch)
        c, beta, Xs_ri = _real(ch.c), _real(ch.beta), _real(Xs)
        p = self.kernels.selective_pass1(ch.q, ch.k, c, beta, Xs_ri, starts, precision)
        w = _real(gram(_complex(p), G_hat.mT, precision))
        return self.kernels.selective_pass2(w, c, beta, ch.v, Xs_ri, R, starts, precision)
