"""The per-token path's work over (t, s) pairs in PyTorch (``selective_pairs``, fused by
Inductor on CPU) and its intra-chunk forward: the interface ``selective_triton`` supplies on
the Triton kernels. Shapes as in ``selective_chunks``."""

from __future__ import annotations

import torch

from .selective_chunks import Chunked, from_start, gram, mm_re, parts
from .selective_pairs import fused, pair_dots, pair_sums, pair_tsums


class Pairs:
    """The work over the (t, s) pairs of every chunk (``selective_pairs``): D = K u_t conj(u_s)
    with only the real K per pair, the phasors folded into the vectors (β̃ = conj(u) β)."""

    def __init__(self, ch: Chunked):
        self.rho, self.doc, self.u = ch.rho, ch.doc, ch.u
        # contiguous real parts: strided views of complex tensors would keep Inductor from
        # vectorising over modes
        self.br, self.bi = parts(ch.u.conj_physical() * ch.beta)

    def _folded(self, x) -> tuple[torch.Tensor, torch.Tensor]:
        """conj(u) ⊙ x for each complex x (.., L, M), stacked at dim −3, as (re, im)."""
        return parts(torch.stack(x, -3) * self.u.conj_physical()[..., None, :, :])

    def sums(self, *W):
        """Σ_s W[t, s] P[t, s] for each W (.., L, L): complex (.., L, M) each."""
        re, im = fused(pair_sums, self.rho)(
            torch.stack(W, -3), self.rho, self.doc, self.br, self.bi
        )
        return (self.u[..., None, :, :] * torch.complex(re, im)).unbind(-3)

    def dots(self, *x):
        """Re Σ_m conj(P[t, s, m]) x[t, m] for each complex x (.., L, M): (.., L, L) each."""
        fn = fused(pair_dots, self.rho)
        return fn(self.rho, self.doc, self.br, self.bi, *self._folded(x)).unbind(-3)

    def tsums(self, W, x):
        """Σ_i Σ_t conj(D[t, s]) W_i[t, s] x_i[t] (W, x lists): complex (.., L, M)."""
        fn = fused(pair_tsums, self.rho)
        re, im = fn(torch.stack(W, -3), self.rho, self.doc, *self._folded(x))
        return self.u * torch.complex(re, im)


class TorchPairs:
    """The backward's work over the pairs of every chunk, given go (.., L, D), o's gradient."""

    def __init__(self, ch: Chunked, go: torch.Tensor):
        self.ch, self.pairs = ch, Pairs(ch)
        self.go, self.g_S = go, go @ ch.v.mT  # (B, H, n, L, L)

    def sums(self):
        """(Σ_s A[t, s] P[t, s], Σ_s g_S[t, s] P[t, s]) in one pass over the pairs."""
        return self.pairs.sums(self.ch.scores, self.g_S)

    def grads(self, w, g_p):
        """(g_q, g_k, g_v, g_β) through the pairs: S = Re conj(P)·w and ∂ℓ/∂A = Re conj(P)·g_p
        in one pass; g_β_s = Σ_t conj(D[t, s]) (g_S[t, s] w_t + A[t, s] g_p(t)) in another."""
        ch = self.ch
        S, g_A = self.pairs.dots(w, g_p)
        g_beta = self.pairs.tsums([self.g_S, ch.scores], [w, g_p])
        return g_A @ ch.k, g_A.mT @ ch.q, S.mT @ self.go, g_beta


class SelectiveTorchOps:
    """The per-token primitives in PyTorch; needs_log_decay: whether ``prepare`` must build
    the cumulative log-decay c (only the kernels read it)."""

    needs_log_decay = False

    @staticmethod
    def pairs(ch: Chunked, go: torch.Tensor) -> TorchPairs:
        return TorchPairs(ch, go)

    @staticmethod
    def intra_forward(ch: Chunked, Xs, G_hat, R: int, precision: str) -> torch.Tensor:
        """The two intra-chunk passes from the chunk start states Xs (.., R+D, M) complex:
        o (B, H, n, L, D)."""
        pairs = Pairs(ch)
        y = from_start(ch, Xs[..., :R, :], precision)
        p = ch.F * y + pairs.sums(ch.scores)[0]
        w = gram(p, G_hat.mT, precision)
        S = pairs.dots(w)[0]
        u = ch.F.conj_physical() * w
        return mm_re(u, Xs[..., R:, :], precision) + S @ ch.v
