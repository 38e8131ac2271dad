"""Per-token (selective) decays on the chunked path: λ_t, β_t of shape (B, T, H, M).

    X_t = λ_t ⊙ X_{t-1} + β_t ⊗ z_t,   o_t = X̂ᵛ(t)ᵀ Ĝ X̂ᵏ(t) q_t  (docs/design.md §1–2)

Inside a chunk of L positions the decay from s to t is D[t, s] = Π_{s<r≤t} λ_r. Numerics:
- magnitude and phase are kept apart: ρ_t = Σ_{r≤t} log|λ_r| (a cumulative sum, ≤ 0 and
  non-increasing) and u_t = Π_{r≤t} λ_r/|λ_r| (a running product of unit phasors: no angle is
  ever formed, so nothing needs wrapping however large Δ·Im A grows; the product is exact to
  ~L ulps). D[t, s] = exp(ρ_t − ρ_s) u_t conj(u_s), with the exp taken per pair
  (``selective_pairs``), so every real exponent is ≤ 0 and nothing overflows;
- from the chunk start, F_t = exp(ρ_t) u_t, and to the chunk end, exp(ρ_{L−1} − ρ_s)
  u_{L−1} conj(u_s): again exponents ≤ 0 (GLA-style);
- a reset (document start) at r zeroes the state before r: pairs across it are cut by a select
  on the exponent (−inf), the chunk start state and the chunk-end contributions by selects on
  F and on the chunk-end weights; nothing non-finite is ever multiplied by 0.
The shared-decay op (``chunked.py``) is not routed through this code.

The intra-chunk work is O(L²M) per chunk (a decay per pair and mode), so chunks are short
(``SELECTIVE_CHUNK``); chunk start states come from a scan over chunks. Every contraction with
a state is one real GEMM on interleaved views (no complex GEMMs, no real→complex copies). The
sequence runs in segments of ``SELECTIVE_SEGMENT`` positions (memory bounded by one segment,
and its working set stays in cache). The backward is written out by hand
(``_SelectiveChunked``): the forward keeps only its inputs and each segment's start state; the
backward recomputes a segment's chunk states and pair sums from it. On CPU the pair sums run
fused through Inductor; with ``kernels`` (Triton: CUDA, or the interpreter) the work over pairs,
forward and backward, runs in ``idmix_kernels.selective_*`` instead, the pair decays held in
registers (from the cumulative log-decay c, which only that path builds).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .precision import matmul
from .realform import as_complex as _complex
from .realform import as_interleaved as _real
from .selective_pairs import fused, pair_dots, pair_sums, pair_tsums
from .validation import refuse_double_backward

SELECTIVE_CHUNK = 16
SELECTIVE_SEGMENT = 256


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


def _prepare(q, k, v, lam_ri, beta_ri, reset, L: int, with_c: bool = False) -> _Chunked:
    B, T = q.shape[:2]
    n = -(-T // L)
    # padding: λ = 1 (log|λ| = 0, phasor 1), β = 0, z = 0 leaves the state unchanged past T
    lam = torch.view_as_complex(lam_ri.contiguous())
    sq = lam_ri.square().sum(-1)
    tiny = torch.finfo(sq.dtype).tiny
    rho = _chunks(0.5 * torch.log(sq.clamp_min(tiny)), n, L).cumsum(3)  # (B, H, n, L, M)
    phasor = torch.where(sq > tiny, lam * torch.rsqrt(sq.clamp_min(tiny)), 1)
    u = (_chunks(phasor - 1, n, L) + 1).cumprod(3)
    qc, kc, vc = (_chunks(x, n, L) for x in (q, k, v))
    F = u * torch.exp(rho)
    # to the chunk end: the exponent rho_{L-1} - rho_s is never > 0
    De = (u[..., -1:, :] * u.conj()) * torch.exp(rho[..., -1:, :] - rho)
    starts = doc = None
    if reset is not None:
        starts = _chunks(reset[..., None], n, L)  # (B, 1, n, L)
        doc = starts.cumsum(3, dtype=rho.dtype)
        F = torch.where((doc == 0)[..., None], F, 0)
        # s in the chunk's last document
        De = torch.where((doc == doc[..., -1:])[..., None], De, 0)
    beta = _chunks(torch.view_as_complex(beta_ri.contiguous()), n, L)
    c = None
    if with_c:  # ρ is its real part; the phases are wrapped per step (atan2) before the sum
        theta = torch.atan2(lam_ri[..., 1], lam_ri[..., 0])
        c = torch.complex(rho, _chunks(theta, n, L).cumsum(3))
    return _Chunked(qc, kc, vc, beta, _chunks(lam, n, L), starts, doc, rho, u, qc @ kc.mT, F, De, c)


def _starts(ch: _Chunked, X0: torch.Tensor, precision: str):
    """Chunk start states (B, H, n, R+D, M) and the final state, from X0 (B, H, R+D, M) by the
    scan X ← carry ⊙ X + ΔX over chunks (ΔX: the chunk's contribution from a zero start)."""
    z = torch.cat([ch.k, ch.v], -1)  # (B, H, n, L, R+D)
    delta = _mm_rc(z.mT, ch.De * ch.beta, precision)  # (B, H, n, R+D, M)
    carry = ch.F[..., -1, :].unsqueeze(3)  # (B, H, n, 1, M); 0 where the chunk holds a reset
    return _scan(delta, carry, X0, reverse=False)


def _scan(inc: torch.Tensor, carry: torch.Tensor, first: torch.Tensor, reverse: bool):
    """X_0 = first, X_{j+1} = carry_j ⊙ X_j + inc_j over dim 2 (from the end when reverse).
    inc (B, H, n, C, M), carry (B, H, n, 1, M) complex. Returns (X_0..X_{n−1} stacked in the
    order of inc, and X_n). Eager writes each step in place (no stack copy); a compiled region
    stacks (Dynamo does not trace out= into a strided slice)."""
    n = inc.shape[2]
    order = range(n - 1, -1, -1) if reverse else range(n)
    if torch.compiler.is_compiling():
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


def _mm_rc(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    """a @ b for real a (.., I, K) and complex b (.., K, N), as one real GEMM on b's
    interleaved view (operands at precision): complex (.., I, N)."""
    return _complex(matmul(a, _real(b.resolve_conj()), precision))


def _mm_re(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    """Re Σ_m a[i, m] conj(b[j, m]) for complex a (.., I, M), b (.., J, M), as one real GEMM of
    the interleaved views (operands at precision): (.., I, J)."""
    return matmul(_real(a.resolve_conj()), _real(b.resolve_conj()).mT, precision)


def _parts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(re, im) of a complex tensor, each contiguous."""
    return x.real.contiguous(), x.imag.contiguous()


class _Pairs:
    """The work over the (t, s) pairs of every chunk (``selective_pairs``): D = K u_t conj(u_s)
    with only the real K per pair, the phasors folded into the vectors (β̃ = conj(u) β)."""

    def __init__(self, ch: _Chunked):
        self.rho, self.doc, self.u = ch.rho, ch.doc, ch.u
        # contiguous real parts: strided views of complex tensors would keep Inductor from
        # vectorising over modes
        self.br, self.bi = _parts(ch.u.conj() * ch.beta)

    def _folded(self, x) -> tuple[torch.Tensor, torch.Tensor]:
        """conj(u) ⊙ x for each complex x (.., L, M), stacked at dim −3, as (re, im)."""
        return _parts(torch.stack(x, -3) * self.u.conj()[..., None, :, :])

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


def _y(ch: _Chunked, Xk: torch.Tensor, precision: str) -> torch.Tensor:
    """Xᵏ q_t from the chunk start: (B, H, n, L, M)."""
    return _mm_rc(ch.q, Xk, precision)


def _gram(x: torch.Tensor, G: torch.Tensor, precision: str) -> torch.Tensor:
    """x̂ G per position, one GEMM per (row, head): x (B, H, n, L, M) complex, G (H, 2M, 2M)
    real interleaved -> (B, H, n, L, M) complex (G is not copied per chunk)."""
    out = matmul(_real(x).flatten(2, 3), G, precision)  # (B, H, n·L, 2M)
    return _complex(out).view(x.shape)


class _TorchPairs:
    """The backward's work over the (t, s) pairs of every chunk in PyTorch (``_Pairs``)."""

    def __init__(self, ch: _Chunked, go: torch.Tensor):
        self.ch, self.pairs = ch, _Pairs(ch)
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


def _segment_forward(q, k, v, lam_ri, beta_ri, G_hat, X0, L, reset, kernels, precision):
    """One segment: (o (B, T, H, D), X_end complex (B, H, R+D, M)) from X0 (complex).
    precision: of the contractions with a state or Ĝ (the pair work stays fp32)."""
    R = q.shape[-1]
    ch = _prepare(q, k, v, lam_ri, beta_ri, reset, L, kernels is not None)
    Xs, X = _starts(ch, X0, precision)
    if kernels is not None:
        o = _intra_kernels(kernels, ch, Xs, G_hat, R, precision)
    else:
        pairs = _Pairs(ch)
        y = _y(ch, Xs[..., :R, :], precision)
        p = ch.F * y + pairs.sums(ch.scores)[0]
        w = _gram(p, G_hat.mT, precision)
        S = pairs.dots(w)[0]
        u = ch.F.conj() * w
        o = _mm_re(u, Xs[..., R:, :], precision) + S @ ch.v
    return _unchunk(o, q.shape[1]), X


def _segment_backward(q, k, v, lam_ri, beta_ri, G_hat, X0, L, reset, kernels, precision, g_o, g_X):
    """One segment's gradients, recomputing its chunk start states from X0 (complex); g_X:
    the gradient of its end state (complex). Returns (g_q, g_k, g_v, g_lam_ri, g_beta_ri, g_G,
    g_X0 complex)."""
    T, R = q.shape[1], q.shape[-1]
    ch = _prepare(q, k, v, lam_ri, beta_ri, reset, L, kernels is not None)
    Xs, _ = _starts(ch, X0, precision)
    n = Xs.shape[2]
    Xk, Xv = Xs[..., :R, :], Xs[..., R:, :]
    go = _chunks(g_o, n, L)  # (B, H, n, L, D)
    pairs = _TorchPairs(ch, go) if kernels is None else _KernelPairs(kernels, ch, go)
    # Σ_s A P (the forward's p) and Σ_s g_S P (w's gradient), with g_S = go vᵀ
    p_pair, gsP = pairs.sums()
    y = _y(ch, Xk, precision)
    p = ch.F * y + p_pair
    w = _gram(p, G_hat.mT, precision)
    # pass 2: o = Re Σ_m u conj(Xᵛ) + S v, with u = conj(F) w
    g_u = _mm_rc(go, Xv, precision)  # (B, H, n, L, M)
    g_Xv = _mm_rc(go.mT, ch.F.conj() * w, precision)  # (B, H, n, D, M)
    g_w = g_u * ch.F + gsP
    g_F = g_u.conj() * w
    # w = Ĝ p̂ (real, interleaved): Ĝ's gradient Σ over (b, n, l) of g_w p̂ᵀ, per head
    g_G = matmul(
        _real(g_w).movedim(1, 0).flatten(1, 3).mT, _real(p).movedim(1, 0).flatten(1, 3), precision
    )
    g_p = _gram(g_w, G_hat, precision)
    # pass 1: p = F ⊙ y + Σ_s A[t, s] P[t, s], y = Xᵏ q, A = q kᵀ; the pairs give q, k and
    # v their parts and β_s its Σ_t K[t, s] (K = ∂ℓ/∂P ⊙ conj(D))
    g_q, g_k, g_v, g_beta = pairs.grads(w, g_p)
    g_F = g_F + g_p * y.conj()
    g_y = g_p * ch.F.conj()
    g_Xk = _mm_rc(ch.q.mT, g_y, precision)  # (B, H, n, R, M)
    g_q = g_q + _mm_re(g_y, Xk, precision)
    # P = D ⊙ β_s with D = exp(c_t − c_s): c_t gets Σ_s K[t, s] conj(β_s) =
    # w conj(Σ_s g_S P) + g_p conj(Σ_s A P), and c_s minus conj(β_s) Σ_t K[t, s]
    g_c = w * gsP.conj() + g_p * p_pair.conj() - g_beta * ch.beta.conj()
    # the scan over chunks, backwards: X_{j+1} = carry_j X_j + ΔX_j
    g_starts = torch.cat([g_Xk, g_Xv], 3)  # (B, H, n, R+D, M)
    carry = ch.F[..., -1, :].unsqueeze(3).conj()
    # G_n = g_Z, G_j = g_starts_j + conj(carry_j) G_{j+1}; ΔX_j's gradient is G_{j+1}
    g_delta, G = _scan(g_starts, carry, g_X, reverse=True)
    g_F[..., -1, :] += (g_delta * Xs.conj()).sum(3)
    # ΔX = Σ_s E_s ⊗ z_s with E = De ⊙ β (De = exp(c_{L−1} − c_s))
    z = torch.cat([ch.k, ch.v], -1)
    E = ch.De * ch.beta
    g_z = _mm_re(E, g_delta, precision)  # (B, H, n, L, R+D)
    g_E = _mm_rc(z, g_delta, precision)
    g_beta = g_beta + g_E * ch.De.conj()
    g_Ue = g_E * E.conj()
    g_c = g_c - g_Ue
    g_c[..., -1, :] += g_Ue.sum(3)
    g_c = g_c + g_F * ch.F.conj()  # F = exp(c)
    # c = cumsum(log λ): log λ's gradient is the reverse cumsum; λ's is that / conj(λ)
    g_log = g_c.flip(3).cumsum(3).flip(3)
    tiny = torch.finfo(ch.rho.dtype).tiny
    inv_conj = ch.lam / (ch.lam.real.square() + ch.lam.imag.square()).clamp_min(tiny)
    return (
        _unchunk(g_q, T), _unchunk(g_k + g_z[..., :R], T), _unchunk(g_v + g_z[..., R:], T),
        torch.view_as_real(_unchunk(g_log * inv_conj, T)),
        torch.view_as_real(_unchunk(g_beta, T)), g_G, G,
    )  # fmt: skip


class _SelectiveChunked(torch.autograd.Function):
    """(q, k, v, lam_ri, beta_ri, G_hat, Z0) -> (o, Z_end); see :func:`selective_chunked`.

    Per chunk, with P[t, s] = D[t, s] ⊙ β_s: p(t) = F ⊙ (Xᵏ q_t) + Σ_s A[t, s] P[t, s];
    w = Ĝ p̂; S[t, s] = Re Σ_m conj(P[t, s, m]) w[t, m]; o_t = Re Σ_m conj(F[t] ⊙ Xᵛ) w_t +
    Σ_s S[t, s] v_s. The sequence runs in segments of ``SELECTIVE_SEGMENT`` positions; the
    forward keeps only each segment's start state, and the backward recomputes one segment
    at a time from it, so memory is bounded by a segment whatever T."""

    @staticmethod
    def forward(ctx, q, k, v, lam_ri, beta_ri, G_hat, Z0, L, reset, kernels, precision):
        X, outs, firsts = _complex(Z0), [], []
        for t0, t1 in _segments(q.shape[1], L):
            firsts.append(X)
            seg = _slices(t0, t1, q, k, v, lam_ri, beta_ri, reset)
            o, X = _segment_forward(*seg[:5], G_hat, X, L, seg[5], kernels, precision)
            outs.append(o)
        ctx.save_for_backward(q, k, v, lam_ri, beta_ri, G_hat, _real(torch.stack(firsts)), reset)
        ctx.L, ctx.kernels, ctx.precision = L, kernels, precision
        return torch.cat(outs, 1), _real(X)

    @staticmethod
    def backward(ctx, g_o, g_Z):
        q, k, v, lam_ri, beta_ri, G_hat, firsts, reset = ctx.saved_tensors
        with torch.no_grad():  # once differentiable: see refuse_double_backward below
            g_X, g_G, grads = _complex(g_Z), 0, []
            segments = _segments(q.shape[1], ctx.L)
            for i in range(len(segments) - 1, -1, -1):
                t0, t1 = segments[i]
                seg = _slices(t0, t1, q, k, v, lam_ri, beta_ri, reset)
                X0 = _complex(firsts[i])
                *g, g_G_seg, g_X = _segment_backward(
                    *seg[:5], G_hat, X0, ctx.L, seg[5], ctx.kernels, ctx.precision,
                    g_o[:, t0:t1], g_X,
                )  # fmt: skip
                grads.append(g)
                g_G = g_G + g_G_seg
            g_q, g_k, g_v, g_lam, g_beta = (torch.cat(x[::-1], 1) for x in zip(*grads, strict=True))
            out = (g_q, g_k, g_v, g_lam, g_beta, g_G, _real(g_X))
        # create_graph=True: a backward through these gradients raises a named error
        out = refuse_double_backward(out, (g_o, g_Z, q, k, v, lam_ri, beta_ri, G_hat))
        return *out, None, None, None, None


def _segments(T: int, L: int) -> list[tuple[int, int]]:
    """[t0, t1) bounds of the segments: SELECTIVE_SEGMENT positions (a multiple of L) each."""
    S = max(L, SELECTIVE_SEGMENT // L * L)
    return [(t0, min(t0 + S, T)) for t0 in range(0, T, S)]


def _slices(t0, t1, *xs):
    """Each (B, T, ...) tensor of xs (or None) restricted to positions [t0, t1)."""
    return tuple(None if x is None else x[:, t0:t1] for x in xs)


def _intra_kernels(kernels, ch: _Chunked, Xs, G_hat, R: int, precision: str) -> torch.Tensor:
    """The two intra-chunk passes in Triton (``idmix_kernels.selective_pass1/2``): o (.., L, D)."""
    starts = None if ch.starts is None else ch.starts[:, 0]
    c, beta, Xs_ri = _real(ch.c), _real(ch.beta), _real(Xs)
    p = kernels.selective_pass1(ch.q, ch.k, c, beta, Xs_ri, starts, precision)
    w = _real(_gram(_complex(p), G_hat.mT, precision))
    return kernels.selective_pass2(w, c, beta, ch.v, Xs_ri, R, starts, precision)


def selective_chunked(
    q,
    k,
    v,
    lam_ri,
    beta_ri,
    G_hat,
    Z0,
    chunk_size=SELECTIVE_CHUNK,
    reset=None,
    kernels=None,
    precision="ieee",
):
    """q, k: (B, T, H, R); v: (B, T, H, D); lam_ri, beta_ri: (B, T, H, M, 2); G_hat: (H, 2M, 2M)
    interleaved; Z0: (B, H, R+D, 2M) interleaved real; reset: (B, T) bool or None; kernels:
    idmix_kernels for the intra-chunk passes (forward and backward) in Triton, or None;
    precision: of the contractions with a state or Ĝ ("ieee", "tf32", "bf16"; the pair work is
    fp32). One real dtype throughout.
    Returns (o (B, T, H, D), final state (B, H, R+D, 2M))."""
    return _SelectiveChunked.apply(
        q, k, v, lam_ri, beta_ri, G_hat, Z0, chunk_size, reset, kernels, precision
    )
