"""Per-token (selective) decays on the chunked path: λ_t, β_t of shape (B, T, H, M).

    X_t = λ_t ⊙ X_{t-1} + β_t ⊗ z_t,   o_t = X̂ᵛ(t)ᵀ Ĝ X̂ᵏ(t) q_t  (docs/design.md §1–2)

Inside a chunk of L positions the decay from s to t is Π_{s<r≤t} λ_r. Numerics:
- between positions of a chunk it is a running product down t (``_pair_decays``): factors
  |λ| ≤ 1, so nothing overflows and the phase rides on unit factors, with no angle to wrap
  (a deviation from GLA's cumulative log-decay here: the product is exact to ~L ulps, while
  exp(c_t − c_s) loses the phase's absolute error of the cumulative sum);
- from the chunk start and to the chunk end it is GLA-style, exp of the cumulative sum c of
  log λ = log|λ| + iθ with every real exponent ≤ 0 (c_t; c_{L−1} − c_s, selected before exp),
  and the phase wrapped per step (θ = atan2 ∈ (−π, π]) before the sum, so it stays below L·π
  and fp32 keeps ~1e-5 rad of resolution however large Δ·Im A grows (unwrapped, Δ_t = 10 with
  M = 64 reaches ~1e5 rad in a few steps);
- a reset (document start) at r zeroes the state before r: pairs across it are cut by a select
  in the running product, the chunk start state and the chunk-end contributions by selects on
  the exponent; nothing non-finite is ever multiplied by 0.
The shared-decay op (``chunked.py``) is not routed through this code.

The intra-chunk work is O(L²M) elementwise per chunk (a decay per pair and mode), so chunks
are short (``SELECTIVE_CHUNK``); chunk start states come from a scan over chunks. The backward
is written out by hand (``_SelectiveChunked``): the forward keeps only its inputs and the chunk
start states; the backward recomputes the pairwise decays once and takes every contraction
over them as one batched matmul (two passes), plus one product for β's gradient. With
``kernels`` (Triton: CUDA, or the interpreter) the work over pairs, forward and backward, runs
in ``idmix_kernels.selective_*`` instead, the pair decays held in registers.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from ..powers import polar
from .realform import as_complex as _complex
from .realform import as_interleaved as _real

SELECTIVE_CHUNK = 16


def _chunks(x: torch.Tensor, n: int, L: int) -> torch.Tensor:
    """(B, T, H, ...) -> (B, H, n, L, ...), zero-padded at the end to n·L positions."""
    pad = n * L - x.shape[1]
    if pad:
        x = torch.cat([x, x.new_zeros(x.shape[0], pad, *x.shape[2:])], 1)
    return x.unflatten(1, (n, L)).movedim(3, 1)


def _unchunk(x: torch.Tensor, T: int) -> torch.Tensor:
    """(B, H, n, L, ...) -> (B, T, H, ...): the inverse of :func:`_chunks`."""
    return x.movedim(1, 3).flatten(1, 2)[:, :T]


class _Chunked(NamedTuple):
    """One call's inputs cut into chunks (B, H, n, L, ...) and the decays they imply.

    q, k, v: the tokens; beta, lam (.., L, M) complex; starts (B, 1, n, L) bool (document
    starts) or None; c (.., L, M): the cumulative sum of log λ (wrapped phases) over the chunk;
    scores A[t, s] = q_t·k_s (.., L, L), not masked: the pair decays (``_pair_decays``) are
    exactly 0 on every pair that does not count; F[t] = exp(c_t) where no document starts in
    [0, t] (.., L, M), else 0; De[s] = exp(c_{L−1} − c_s) where s is in the chunk's last document
    (.., L, M), else 0.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    beta: torch.Tensor
    lam: torch.Tensor
    starts: torch.Tensor | None
    c: torch.Tensor
    scores: torch.Tensor
    F: torch.Tensor
    De: torch.Tensor


def _pair_decays(lam: torch.Tensor, starts: torch.Tensor | None) -> torch.Tensor:
    """D[t, s] = Π_{s<r≤t} λ_r (1 on the diagonal, 0 for s > t or across a document start) by
    running products down t: lam (.., L, M) complex; starts (B, 1, n, L) bool or None.
    Returns (.., L, L, M). Products of |λ| ≤ 1 need no exponent at all (no overflow, and the
    phase is carried by unit factors, with no angle to wrap)."""
    L = lam.shape[-2]
    D = lam.new_zeros(*lam.shape[:-1], L, lam.shape[-1])
    D[..., 0, 0, :] = 1
    for t in range(1, L):
        row = D[..., t - 1, :t, :] * lam[..., t, None, :]
        if starts is not None:  # a document starting at t cuts every pair (t, s < t)
            row = torch.where(starts[..., t, None, None], 0, row)
        D[..., t, :t, :] = row
        D[..., t, t, :] = 1
    return D


def _prepare(q, k, v, lam_ri, beta_ri, reset, L: int) -> _Chunked:
    B, T = q.shape[:2]
    n = -(-T // L)
    # padding: log λ = 0 (λ = 1), β = 0, z = 0 leaves the state unchanged past T
    log_mag, theta = polar(lam_ri)  # (B, T, H, M) each
    c = torch.complex(_chunks(log_mag, n, L), _chunks(theta, n, L)).cumsum(3)  # (B,H,n,L,M)
    lam = _chunks(torch.view_as_complex(lam_ri.contiguous()), n, L)
    qc, kc, vc = (_chunks(x, n, L) for x in (q, k, v))
    starts = None if reset is None else _chunks(reset[..., None], n, L)  # (B, 1, n, L)
    doc = (
        torch.zeros_like(c.real[:1, :1, ..., 0], dtype=torch.long)
        if reset is None
        else starts.long().cumsum(3)
    )
    F = torch.where((doc == 0)[..., None], torch.exp(c), 0)
    # to the chunk end: the real exponent is selected before exp, so it is never > 0
    end_ok = (doc == doc[..., -1:])[..., None]  # (B, 1, n, L, 1): s in the last document
    end = c[..., -1:, :] - c
    neg_inf = torch.full((), float("-inf"), dtype=c.real.dtype, device=q.device)
    De = torch.polar(torch.exp(torch.where(end_ok, end.real, neg_inf)), end.imag)
    beta = _chunks(torch.view_as_complex(beta_ri.contiguous()), n, L)
    return _Chunked(qc, kc, vc, beta, lam, starts, c, qc @ kc.mT, F, De)


def _starts(ch: _Chunked, X0: torch.Tensor):
    """Chunk start states (B, H, n, R+D, M) and the final state, from X0 (B, H, R+D, M) by the
    scan X ← carry ⊙ X + ΔX over chunks (ΔX: the chunk's contribution from a zero start)."""
    z = torch.cat([ch.k, ch.v], -1).to(ch.De.dtype)  # (B, H, n, L, R+D)
    delta = torch.einsum("bhnsm,bhnsc->bhncm", ch.De * ch.beta, z)
    carry = ch.F[..., -1, :].unsqueeze(3)  # (B, H, n, 1, M); 0 where the chunk holds a reset
    starts, X = [], X0
    # unbind once: indexing chunk j inside the loop would make each step's backward allocate
    # and fill a gradient of the whole tensor (O(n²) work)
    for c, d in zip(carry.unbind(2), delta.unbind(2), strict=True):
        starts.append(X)
        X = c * X + d
    return torch.stack(starts, 2), X


def _pair_sums(rows: torch.Tensor, P_ri: torch.Tensor) -> torch.Tensor:
    """Σ_s rows[t, i, s] P[t, s] for every t and row i, one pass over P: rows (.., L, I, L) real,
    P_ri (.., L, L, 2M) -> (.., L, I, M) complex."""
    return _complex(rows @ P_ri)


def _pair_dots(P_ri: torch.Tensor, cols: list[torch.Tensor]) -> torch.Tensor:
    """Re Σ_m conj(P[t, s, m]) x[t, m] for every (t, s) and each x in cols, one pass over P:
    P_ri (.., L, L, 2M), cols: complex (.., L, M) -> (.., L, L, len(cols)) real."""
    return P_ri @ torch.stack([_real(x) for x in cols], -1)


def _y(ch: _Chunked, Xk: torch.Tensor) -> torch.Tensor:
    """Xᵏ q_t from the chunk start: (B, H, n, L, M)."""
    return torch.einsum("bhnlr,bhnrm->bhnlm", ch.q.to(Xk.dtype), Xk)


def _gram(x: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """x̂ G per position, one GEMM per (row, head): x (B, H, n, L, M) complex, G (H, 2M, 2M)
    real interleaved -> (B, H, n, L, M) complex (G is not copied per chunk)."""
    out = torch.matmul(_real(x).flatten(2, 3), G)  # (B, H, n·L, 2M)
    return _complex(out).view(x.shape)


class _TorchPairs:
    """The backward's work over the (t, s) pairs of every chunk in PyTorch: the pair decays
    formed once (running products), each contraction one batched matmul over them."""

    def __init__(self, ch: _Chunked, go: torch.Tensor):
        self.ch, self.go = ch, go
        self.D = _pair_decays(ch.lam, ch.starts)
        self.P_ri = _real(self.D * ch.beta[..., None, :, :])
        self.g_S = go @ ch.v.mT  # (B, H, n, L, L)

    def sums(self):
        """(Σ_s A[t, s] P[t, s], Σ_s g_S[t, s] P[t, s]): one pass over P."""
        return _pair_sums(torch.stack([self.ch.scores, self.g_S], -2), self.P_ri).unbind(-2)

    def grads(self, w, g_p):
        """(g_q, g_k, g_v, g_β) through the pairs: S = Re conj(P)·w and ∂ℓ/∂A = Re conj(P)·g_p
        in one pass over P; g_β_s = Σ_t conj(D[t, s]) (g_S[t, s] w_t + A[t, s] g_p(t))."""
        ch, cdt = self.ch, w.dtype
        S, g_A = _pair_dots(self.P_ri, [w, g_p]).unbind(-1)
        K = self.g_S.to(cdt)[..., None] * w[..., :, None, :]
        K += ch.scores.to(cdt)[..., None] * g_p[..., :, None, :]
        g_beta = (K * self.D.conj()).sum(3)  # (B, H, n, L, M)
        return g_A @ ch.k, g_A.mT @ ch.q, S.mT @ self.go, g_beta


class _KernelPairs:
    """The same work in Triton (``idmix_kernels.selective_pair_sums/grads``): the pair decays
    live in registers, one source position per loop step, and are never stored."""

    def __init__(self, kernels, ch: _Chunked, go: torch.Tensor):
        self.kernels, self.ch, self.go = kernels, ch, go
        self.starts = None if ch.starts is None else ch.starts[:, 0]
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


class _SelectiveChunked(torch.autograd.Function):
    """(q, k, v, lam_ri, beta_ri, G_hat, Z0) -> (o, Z_end); see :func:`selective_chunked`.

    Per chunk, with P[t, s] = D[t, s] ⊙ β_s: p(t) = F ⊙ (Xᵏ q_t) + Σ_s A[t, s] P[t, s];
    w = Ĝ p̂; S[t, s] = Re Σ_m conj(P[t, s, m]) w[t, m]; o_t = Re Σ_m conj(F[t] ⊙ Xᵛ) w_t +
    Σ_s S[t, s] v_s. Each pass over the (L, L, M) tensors is one batched matmul."""

    @staticmethod
    def forward(ctx, q, k, v, lam_ri, beta_ri, G_hat, Z0, L, reset, kernels):
        R = q.shape[-1]
        ch = _prepare(q, k, v, lam_ri, beta_ri, reset, L)
        Xs, X = _starts(ch, _complex(Z0))
        if kernels is not None:
            o = _intra_kernels(kernels, ch, Xs, G_hat, R)
        else:
            P_ri = _real(_pair_decays(ch.lam, ch.starts) * ch.beta[..., None, :, :])
            y = _y(ch, Xs[..., :R, :])
            p = ch.F * y + _pair_sums(ch.scores[..., None, :], P_ri)[..., 0, :]
            w = _gram(p, G_hat.mT)
            S = _pair_dots(P_ri, [w])[..., 0]
            u = ch.F.conj() * w
            o = torch.einsum("bhnlm,bhndm->bhnld", u, Xs[..., R:, :].conj()).real + S @ ch.v
        ctx.save_for_backward(q, k, v, lam_ri, beta_ri, G_hat, _real(Xs), reset)
        ctx.L, ctx.kernels = L, kernels
        return _unchunk(o, q.shape[1]), _real(X)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_o, g_Z):
        q, k, v, lam_ri, beta_ri, G_hat, Xs_ri, reset = ctx.saved_tensors
        T, R = q.shape[1], q.shape[-1]
        n, L = Xs_ri.shape[2], ctx.L
        ch = _prepare(q, k, v, lam_ri, beta_ri, reset, L)
        Xs = _complex(Xs_ri)
        Xk, Xv = Xs[..., :R, :], Xs[..., R:, :]
        go = _chunks(g_o, n, L)  # (B, H, n, L, D)
        pairs = _TorchPairs(ch, go) if ctx.kernels is None else _KernelPairs(ctx.kernels, ch, go)
        # Σ_s A P (the forward's p) and Σ_s g_S P (w's gradient), with g_S = go vᵀ
        p_pair, gsP = pairs.sums()
        y = _y(ch, Xk)
        p = ch.F * y + p_pair
        w = _gram(p, G_hat.mT)
        cdt = w.dtype
        # pass 2: o = Re Σ_m u conj(Xᵛ) + S v, with u = conj(F) w
        g_u = go.to(cdt) @ Xv  # (B, H, n, L, M)
        g_Xv = go.mT.to(cdt) @ (ch.F.conj() * w)  # (B, H, n, D, M)
        g_w = g_u * ch.F + gsP
        g_F = g_u.conj() * w
        # w = Ĝ p̂ (real, interleaved)
        g_G = torch.einsum("bhnli,bhnlj->hij", _real(g_w), _real(p))
        g_p = _gram(g_w, G_hat)
        # pass 1: p = F ⊙ y + Σ_s A[t, s] P[t, s], y = Xᵏ q, A = q kᵀ; the pairs give q, k and
        # v their parts and β_s its Σ_t K[t, s] (K = ∂ℓ/∂P ⊙ conj(D))
        g_q, g_k, g_v, g_beta = pairs.grads(w, g_p)
        g_F = g_F + g_p * y.conj()
        g_y = g_p * ch.F.conj()
        g_Xk = ch.q.mT.to(cdt) @ g_y  # (B, H, n, R, M)
        g_q = g_q + (g_y @ Xk.conj().mT).real
        # P = D ⊙ β_s with D = exp(c_t − c_s): c_t gets Σ_s K[t, s] conj(β_s) =
        # w conj(Σ_s g_S P) + g_p conj(Σ_s A P), and c_s minus conj(β_s) Σ_t K[t, s]
        g_c = w * gsP.conj() + g_p * p_pair.conj() - g_beta * ch.beta.conj()
        # the scan over chunks, backwards: X_{j+1} = carry_j X_j + ΔX_j
        g_starts = torch.cat([g_Xk, g_Xv], 3)  # (B, H, n, R+D, M)
        carry = ch.F[..., -1, :].unsqueeze(3)
        G = _complex(g_Z)
        g_delta, g_carry = [], []
        for j in range(n - 1, -1, -1):
            g_delta.append(G)
            g_carry.append((G * Xs[:, :, j].conj()).sum(2))
            G = g_starts[:, :, j] + carry[:, :, j].conj() * G
        g_delta = torch.stack(g_delta[::-1], 2)  # (B, H, n, R+D, M)
        g_F[..., -1, :] += torch.stack(g_carry[::-1], 2)
        # ΔX = Σ_s E_s ⊗ z_s with E = De ⊙ β (De = exp(c_{L−1} − c_s))
        z = torch.cat([ch.k, ch.v], -1)
        E = ch.De * ch.beta
        g_z = torch.einsum("bhncm,bhnsm->bhnsc", g_delta, E.conj()).real
        g_E = torch.einsum("bhncm,bhnsc->bhnsm", g_delta, z.to(cdt))
        g_beta = g_beta + g_E * ch.De.conj()
        g_Ue = g_E * E.conj()
        g_c = g_c - g_Ue
        g_c[..., -1, :] += g_Ue.sum(3)
        g_c = g_c + g_F * ch.F.conj()  # F = exp(c)
        # c = cumsum(log λ): log λ's gradient is the reverse cumsum; λ's is that / conj(λ)
        g_log = g_c.flip(3).cumsum(3).flip(3)
        tiny = torch.finfo(ch.c.real.dtype).tiny
        inv_conj = ch.lam / (ch.lam.real.square() + ch.lam.imag.square()).clamp_min(tiny)
        return (
            _unchunk(g_q, T), _unchunk(g_k + g_z[..., :R], T), _unchunk(g_v + g_z[..., R:], T),
            torch.view_as_real(_unchunk(g_log * inv_conj, T)),
            torch.view_as_real(_unchunk(g_beta, T)), g_G, _real(G), None, None, None,
        )  # fmt: skip


def _intra_kernels(kernels, ch: _Chunked, Xs, G_hat, R: int) -> torch.Tensor:
    """The two intra-chunk passes in Triton (``idmix_kernels.selective_pass1/2``): o (.., L, D)."""
    starts = None if ch.starts is None else ch.starts[:, 0]
    c, beta, Xs_ri = _real(ch.c), _real(ch.beta), _real(Xs)
    p = kernels.selective_pass1(ch.q, ch.k, c, beta, Xs_ri, starts)
    w = _real(_gram(_complex(p), G_hat.mT))
    return kernels.selective_pass2(w, c, beta, ch.v, Xs_ri, R, starts)


def selective_chunked(
    q, k, v, lam_ri, beta_ri, G_hat, Z0, chunk_size=SELECTIVE_CHUNK, reset=None, kernels=None
):
    """q, k: (B, T, H, R); v: (B, T, H, D); lam_ri, beta_ri: (B, T, H, M, 2); G_hat: (H, 2M, 2M)
    interleaved; Z0: (B, H, R+D, 2M) interleaved real; reset: (B, T) bool or None; kernels:
    idmix_kernels for the intra-chunk passes (forward and backward) in Triton, or None. One
    real dtype throughout.
    Returns (o (B, T, H, D), final state (B, H, R+D, 2M))."""
    return _SelectiveChunked.apply(q, k, v, lam_ri, beta_ri, G_hat, Z0, chunk_size, reset, kernels)
