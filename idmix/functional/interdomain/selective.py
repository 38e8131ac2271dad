"""Per-token (selective) decays on the chunked path: λ_t, β_t of shape (B, T, H, M).

    X_t = λ_t ⊙ X_{t-1} + β_t ⊗ z_t,   o_t = X̂ᵛ(t)ᵀ Ĝ X̂ᵏ(t) q_t  (docs/design.md §1–2)

Inside a chunk of L positions the decay from s to t is D[t, s] = Π_{s<r≤t} λ_r. Numerics:
- magnitude and phase are kept apart: ρ_t = Σ_{r≤t} log|λ_r| (a cumulative sum, ≤ 0 and
  non-increasing) and u_t = Π_{r≤t} λ_r/|λ_r| (a running product of unit phasors: no angle is
  ever formed, so nothing needs wrapping however large Δ·Im A grows; the product is exact to
  ~L ulps). D[t, s] = exp(ρ_t − ρ_s) u_t conj(u_s), with the exp taken per pair
  (the pair work below), so every real exponent is ≤ 0 and nothing overflows;
- from the chunk start, F_t = exp(ρ_t) u_t, and to the chunk end, exp(ρ_{L−1} − ρ_s)
  u_{L−1} conj(u_s): again exponents ≤ 0 (GLA-style);
- a reset (document start) at r zeroes the state before r: pairs across it are cut by a select
  on the exponent (−inf), the chunk start state and the chunk-end contributions by selects on
  F and on the chunk-end weights; nothing non-finite is ever multiplied by 0.
The shared-decay math (``shared.py``) is not routed through this code. Conjugates are
physical (``conj_physical``): the body runs inside a custom op, where a lazy conjugate is
dropped when the op is dispatched with the conjugate fallback excluded (AOTAutograd does).

The intra-chunk work is O(L²M) per chunk (a decay per pair and mode), so chunks are short
(``SELECTIVE_CHUNK``); chunk start states come from a scan over chunks. Every contraction with
a state is one real GEMM on interleaved views (no complex GEMMs, no real→complex copies). The
sequence runs in segments of ``SELECTIVE_SEGMENT`` positions (memory bounded by one segment,
and its working set stays in cache). The segments run through the one segment
driver, as its custom ops (``driver``): the forward keeps only its inputs
and each segment's start state; the hand-written backward recomputes a segment's chunk states and
pair sums from it. On CPU the pair sums run
fused through Inductor (``SelectiveTorchOps``); on the triton backend (CUDA, or the interpreter)
the work over pairs, forward and backward, runs in ``idmix_kernels.selective_*`` instead
(``triton_engine``), the pair decays held in
registers (from the cumulative log-decay c, which only that path builds).
"""

from __future__ import annotations

from typing import Protocol

import torch

from .layout import Chunked, Piece, chunks, parts, prepare, unchunk_tokens
from .layout import as_complex as _complex
from .layout import as_interleaved as _real
from .numerics import compiled, have_cxx, matmul, scan_complex


def mm_rc(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    """a @ b for real a (.., I, K) and complex b (.., K, N), as one real GEMM on b's
    interleaved view (operands at precision): complex (.., I, N)."""
    return _complex(matmul(a, _real(b.resolve_conj()), precision))


def mm_re(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    """Re Σ_m a[i, m] conj(b[j, m]) for complex a (.., I, M), b (.., J, M), as one real GEMM of
    the interleaved views (operands at precision): (.., I, J)."""
    return matmul(_real(a.resolve_conj()), _real(b.resolve_conj()).mT, precision)


def from_start(ch: Chunked, Xk: torch.Tensor, precision: str) -> torch.Tensor:
    """Xᵏ q_t from the chunk start: (B, H, n, L, M)."""
    return mm_rc(ch.q, Xk, precision)


def gram(x: torch.Tensor, G: torch.Tensor, precision: str) -> torch.Tensor:
    """x̂ G per position, one GEMM per (row, head): x (B, H, n, L, M) complex, G (H, 2M, 2M)
    real interleaved -> (B, H, n, L, M) complex (G is not copied per chunk)."""
    out = matmul(_real(x).flatten(2, 3), G, precision)  # (B, H, n·L, 2M)
    return _complex(out).view(x.shape)


SELECTIVE_CHUNK = 16


SELECTIVE_SEGMENT = 256


def _segment_len(L: int) -> int:
    return max(L, SELECTIVE_SEGMENT // L * L)


def selective_plan(T: int, L: int) -> list[Piece]:
    """Segments of SELECTIVE_SEGMENT positions (a multiple of L) each; the last one ragged (its
    chunks zero-padded inside the piece)."""
    S = _segment_len(L)
    return [Piece(t0, min(t0 + S, T), L) for t0 in range(0, T, S)]


def num_segments(T, L: int):
    """len(selective_plan(T, L)) in arithmetic only, so that a symbolic T adds no guard."""
    S = _segment_len(L)
    return (T + S - 1) // S


def chunk_starts(ch: Chunked, X0: torch.Tensor, precision: str):
    """Chunk start states (B, H, n, R+D, M) and the final state, from X0 (B, H, R+D, M) by the
    scan X ← carry ⊙ X + ΔX over chunks (ΔX: the chunk's contribution from a zero start)."""
    z = torch.cat([ch.k, ch.v], -1)  # (B, H, n, L, R+D)
    delta = mm_rc(z.mT, ch.De * ch.beta, precision)  # (B, H, n, R+D, M)
    carry = ch.F[..., -1, :].unsqueeze(3)  # (B, H, n, 1, M); 0 where the chunk holds a reset
    return scan_complex(delta, carry, X0, reverse=False)


def segment_forward(q, k, v, lam_ri, beta_ri, G_hat, X0, L, reset, ops: PairOps):
    """One segment: (o (B, T, H, D), X_end complex (B, H, R+D, M)) from X0 (complex); ops: the
    backend's per-token primitives, whose precision is that of the contractions with a state or
    Ĝ (the pair work stays fp32)."""
    ch = prepare(q, k, v, lam_ri, beta_ri, reset, L, ops.needs_log_decay)
    Xs, X = chunk_starts(ch, X0, ops.precision)
    o = ops.intra_forward(ch, Xs, G_hat, q.shape[-1])
    return unchunk_tokens(o, q.shape[1]), X


def segment_backward(q, k, v, lam_ri, beta_ri, G_hat, X0, L, reset, ops: PairOps, g_o, g_X):
    """One segment's gradients, recomputing its chunk start states from X0 (complex); g_X:
    the gradient of its end state (complex). Returns (g_q, g_k, g_v, g_lam_ri, g_beta_ri, g_G,
    g_X0 complex)."""
    T, R, precision = q.shape[1], q.shape[-1], ops.precision
    ch = prepare(q, k, v, lam_ri, beta_ri, reset, L, ops.needs_log_decay)
    Xs, _ = chunk_starts(ch, X0, precision)
    n = Xs.shape[2]
    Xk, Xv = Xs[..., :R, :], Xs[..., R:, :]
    go = chunks(g_o, n, L)  # (B, H, n, L, D)
    pairs = ops.pairs(ch, go)
    # Σ_s A P (the forward's p) and Σ_s g_S P (w's gradient), with g_S = go vᵀ
    p_pair, gsP = pairs.sums()
    y = from_start(ch, Xk, precision)
    p = ch.F * y + p_pair
    w = gram(p, G_hat.mT, precision)
    # pass 2: o = Re Σ_m u conj(Xᵛ) + S v, with u = conj(F) w
    g_u = mm_rc(go, Xv, precision)  # (B, H, n, L, M)
    g_Xv = mm_rc(go.mT, ch.F.conj_physical() * w, precision)  # (B, H, n, D, M)
    g_w = g_u * ch.F + gsP
    g_F = g_u.conj_physical() * w
    # w = Ĝ p̂ (real, interleaved): Ĝ's gradient Σ over (b, n, l) of g_w p̂ᵀ, per head
    g_G = matmul(
        _real(g_w).movedim(1, 0).flatten(1, 3).mT, _real(p).movedim(1, 0).flatten(1, 3), precision
    )
    g_p = gram(g_w, G_hat, precision)
    # pass 1: p = F ⊙ y + Σ_s A[t, s] P[t, s], y = Xᵏ q, A = q kᵀ; the pairs give q, k and
    # v their parts and β_s its Σ_t K[t, s] (K = ∂ℓ/∂P ⊙ conj(D))
    g_q, g_k, g_v, g_beta = pairs.grads(w, g_p)
    g_F = g_F + g_p * y.conj_physical()
    g_y = g_p * ch.F.conj_physical()
    g_Xk = mm_rc(ch.q.mT, g_y, precision)  # (B, H, n, R, M)
    g_q = g_q + mm_re(g_y, Xk, precision)
    # P = D ⊙ β_s with D = exp(c_t − c_s): c_t gets Σ_s K[t, s] conj(β_s) =
    # w conj(Σ_s g_S P) + g_p conj(Σ_s A P), and c_s minus conj(β_s) Σ_t K[t, s]
    g_c = w * gsP.conj_physical() + g_p * p_pair.conj_physical() - g_beta * ch.beta.conj_physical()
    # the scan over chunks, backwards: X_{j+1} = carry_j X_j + ΔX_j
    g_starts = torch.cat([g_Xk, g_Xv], 3)  # (B, H, n, R+D, M)
    carry = ch.F[..., -1, :].unsqueeze(3).conj_physical()
    # G_n = g_Z, G_j = g_starts_j + conj(carry_j) G_{j+1}; ΔX_j's gradient is G_{j+1}
    g_delta, G = scan_complex(g_starts, carry, g_X, reverse=True)
    g_F[..., -1, :] += (g_delta * Xs.conj_physical()).sum(3)
    # ΔX = Σ_s E_s ⊗ z_s with E = De ⊙ β (De = exp(c_{L−1} − c_s))
    z = torch.cat([ch.k, ch.v], -1)
    E = ch.De * ch.beta
    g_z = mm_re(E, g_delta, precision)  # (B, H, n, L, R+D)
    g_E = mm_rc(z, g_delta, precision)
    g_beta = g_beta + g_E * ch.De.conj_physical()
    g_Ue = g_E * E.conj_physical()
    g_c = g_c - g_Ue
    g_c[..., -1, :] += g_Ue.sum(3)
    g_c = g_c + g_F * ch.F.conj_physical()  # F = exp(c)
    # c = cumsum(log λ): log λ's gradient is the reverse cumsum; λ's is that / conj(λ)
    g_log = g_c.flip(3).cumsum(3).flip(3)
    tiny = torch.finfo(ch.rho.dtype).tiny
    inv_conj = ch.lam / (ch.lam.real.square() + ch.lam.imag.square()).clamp_min(tiny)
    return (
        *(unchunk_tokens(g, T) for g in (g_q, g_k + g_z[..., :R], g_v + g_z[..., R:])),
        torch.view_as_real(unchunk_tokens(g_log * inv_conj, T)),
        torch.view_as_real(unchunk_tokens(g_beta, T)), g_G, G,
    )  # fmt: skip


class SelectiveSegments:
    """The segment math of per-token decays (``driver.SegmentMath``): tokens q, k, v, lam_ri,
    beta_ri; params: Ĝ; states cross segments in interleaved real form (views, no copies).

    Per chunk, with P[t, s] = D[t, s] ⊙ β_s: p(t) = F ⊙ (Xᵏ q_t) + Σ_s A[t, s] P[t, s];
    w = Ĝ p̂; S[t, s] = Re Σ_m conj(P[t, s, m]) w[t, m]; o_t = Re Σ_m conj(F[t] ⊙ Xᵛ) w_t +
    Σ_s S[t, s] v_s."""

    def __init__(self, G_hat, backend):
        self.G_hat, self.ops = G_hat, backend.selective

    def forward(self, piece, tokens, Z0, reset):
        o, X = segment_forward(*tokens, self.G_hat, _complex(Z0), piece.L, reset, self.ops)
        return o, _real(X)

    def backward(self, piece, tokens, Z0, do, dZ_end, reset):
        *g, g_G, g_X = segment_backward(
            *tokens, self.G_hat, _complex(Z0), piece.L, reset, self.ops, do, _complex(dZ_end)
        )
        return g, {0: g_G}, _real(g_X)


# --- the pair work ---
# The work over (t, s) pairs of the per-token path, factored so that only a real kernel is
# per pair: D[t, s] = K[t, s] · u_t · conj(u_s), with
#
#     K[t, s] = exp(ρ_t − ρ_s) for s ≤ t in one document, else 0   (ρ: cumulative log|λ|),
#     u_t = Π_{r≤t} λ_r / |λ_r|                                     (unit phasors, a cumprod).
#
# Every exponent is ≤ 0 (nothing overflows; the exp is taken per pair, never split into a
# product exp(ρ_t)·exp(−ρ_s), which would overflow at Δ_t·|Re A| ≳ 88/L), and the phase rides on
# products of unit factors with no angle to wrap. The phasors fold into the vectors outside the
# pair sums (β̃ = conj(u) ⊙ β, w̃ = conj(u) ⊙ w), so each sum below is one real kernel times
# real vectors, over modes kept innermost.
#
# Each function is elementwise-then-reduce over an (L, L, M) product. Eager PyTorch would
# materialise it; on CPU the functions run through Inductor (``torch.compile``), which fuses the
# exp, the products and the reduction into one loop nest and never stores a pair tensor (the
# first call per function and dtype compiles, with dynamic shapes so new lengths do not
# recompile; ``benchmarks/bench_selective_cpu.py`` measures the path). Inside a region already being
# compiled, and where no
# C++ compiler is found, the plain functions run (same code, same numbers up to rounding).
# Shapes: (.., L, M) per position and mode, (.., L, L) per pair; `doc` (.., L) document index
# within the chunk (pairs in different documents are cut), or None.


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


# --- the pair work in PyTorch ---
# The per-token path's work over (t, s) pairs in PyTorch (the functions above, fused by
# Inductor on CPU) and its intra-chunk forward: the interface ``triton_engine`` supplies on
# the Triton kernels. Shapes as in ``layout``.


class Pairs:
    """The work over the (t, s) pairs of every chunk (the pair work above): D = K u_t conj(u_s)
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


class PairOps(Protocol):
    """The per-token primitives an engine supplies, its product precision bound in:
    ``SelectiveTorchOps`` (PyTorch, fused by Inductor) and ``triton_engine.SelectiveTritonOps``.
    needs_log_decay: whether ``prepare`` must build the cumulative log-decay c."""

    precision: str
    needs_log_decay: bool

    def pairs(self, ch: Chunked, go: torch.Tensor):
        """The backward's work over the pairs: an object with ``sums()`` and ``grads(w, g_p)``."""

    def intra_forward(self, ch: Chunked, Xs, G_hat, R: int) -> torch.Tensor:
        """The two intra-chunk passes from the chunk start states Xs (.., R+D, M) complex:
        o (B, H, n, L, D)."""


class SelectiveTorchOps:
    """``PairOps`` in PyTorch at one precision (only the kernels read c)."""

    needs_log_decay = False

    def __init__(self, precision: str):
        self.precision = precision

    @staticmethod
    def pairs(ch: Chunked, go: torch.Tensor) -> TorchPairs:
        return TorchPairs(ch, go)

    def intra_forward(self, ch: Chunked, Xs, G_hat, R: int) -> torch.Tensor:
        """The two intra-chunk passes from the chunk start states Xs (.., R+D, M) complex:
        o (B, H, n, L, D)."""
        precision = self.precision
        pairs = Pairs(ch)
        y = from_start(ch, Xs[..., :R, :], precision)
        p = ch.F * y + pairs.sums(ch.scores)[0]
        w = gram(p, G_hat.mT, precision)
        S = pairs.dots(w)[0]
        u = ch.F.conj_physical() * w
        return mm_re(u, Xs[..., R:, :], precision) + S @ ch.v
