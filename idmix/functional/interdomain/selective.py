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
The shared-decay math (``chunked.py``) is not routed through this code. Conjugates are
physical (``conj_physical``): the body runs inside a custom op, where a lazy conjugate is
dropped when the op is dispatched with the conjugate fallback excluded (AOTAutograd does).

The intra-chunk work is O(L²M) per chunk (a decay per pair and mode), so chunks are short
(``SELECTIVE_CHUNK``); chunk start states come from a scan over chunks. Every contraction with
a state is one real GEMM on interleaved views (no complex GEMMs, no real→complex copies). The
sequence runs in segments of ``SELECTIVE_SEGMENT`` positions (memory bounded by one segment,
and its working set stays in cache). The segments run through the one segment
driver (``segments``), as the custom ops of ``selective_op``: the forward keeps only its inputs
and each segment's start state; the hand-written backward recomputes a segment's chunk states and
pair sums from it. On CPU the pair sums run
fused through Inductor (``selective_torch``); on the triton backend (CUDA, or the interpreter)
the work over pairs, forward and backward, runs in ``idmix_kernels.selective_*`` instead
(``selective_triton``), the pair decays held in
registers (from the cumulative log-decay c, which only that path builds).
"""

from __future__ import annotations

import torch

from .forms import scan_complex
from .precision import matmul
from .realform import as_complex as _complex
from .realform import as_interleaved as _real
from .segments import Piece
from .selective_chunks import Chunked, chunks, from_start, gram, mm_rc, mm_re, prepare, unchunk

SELECTIVE_CHUNK = 16
SELECTIVE_SEGMENT = 256


def _segment_len(L: int) -> int:
    return max(L, SELECTIVE_SEGMENT // L * L)


def plan(T: int, L: int) -> list[Piece]:
    """Segments of SELECTIVE_SEGMENT positions (a multiple of L) each; the last one ragged (its
    chunks zero-padded inside the piece)."""
    S = _segment_len(L)
    return [Piece(t0, min(t0 + S, T), L) for t0 in range(0, T, S)]


def num_segments(T, L: int):
    """len(plan(T, L)) in arithmetic only, so that a symbolic T adds no guard."""
    S = _segment_len(L)
    return (T + S - 1) // S


def chunk_starts(ch: Chunked, X0: torch.Tensor, precision: str):
    """Chunk start states (B, H, n, R+D, M) and the final state, from X0 (B, H, R+D, M) by the
    scan X ← carry ⊙ X + ΔX over chunks (ΔX: the chunk's contribution from a zero start)."""
    z = torch.cat([ch.k, ch.v], -1)  # (B, H, n, L, R+D)
    delta = mm_rc(z.mT, ch.De * ch.beta, precision)  # (B, H, n, R+D, M)
    carry = ch.F[..., -1, :].unsqueeze(3)  # (B, H, n, 1, M); 0 where the chunk holds a reset
    return scan_complex(delta, carry, X0, reverse=False)


def segment_forward(q, k, v, lam_ri, beta_ri, G_hat, X0, L, reset, ops, precision):
    """One segment: (o (B, T, H, D), X_end complex (B, H, R+D, M)) from X0 (complex); ops: the
    backend's per-token primitives; precision: of the contractions with a state or Ĝ (the pair
    work stays fp32)."""
    ch = prepare(q, k, v, lam_ri, beta_ri, reset, L, ops.needs_log_decay)
    Xs, X = chunk_starts(ch, X0, precision)
    o = ops.intra_forward(ch, Xs, G_hat, q.shape[-1], precision)
    return unchunk(o, q.shape[1]), X


def segment_backward(q, k, v, lam_ri, beta_ri, G_hat, X0, L, reset, ops, precision, g_o, g_X):
    """One segment's gradients, recomputing its chunk start states from X0 (complex); g_X:
    the gradient of its end state (complex). Returns (g_q, g_k, g_v, g_lam_ri, g_beta_ri, g_G,
    g_X0 complex)."""
    T, R = q.shape[1], q.shape[-1]
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
        unchunk(g_q, T), unchunk(g_k + g_z[..., :R], T), unchunk(g_v + g_z[..., R:], T),
        torch.view_as_real(unchunk(g_log * inv_conj, T)),
        torch.view_as_real(unchunk(g_beta, T)), g_G, G,
    )  # fmt: skip


class SelectiveSegments:
    """The segment math of per-token decays (``segments.SegmentMath``): tokens q, k, v, lam_ri,
    beta_ri; params: Ĝ; states cross segments in interleaved real form (views, no copies).

    Per chunk, with P[t, s] = D[t, s] ⊙ β_s: p(t) = F ⊙ (Xᵏ q_t) + Σ_s A[t, s] P[t, s];
    w = Ĝ p̂; S[t, s] = Re Σ_m conj(P[t, s, m]) w[t, m]; o_t = Re Σ_m conj(F[t] ⊙ Xᵛ) w_t +
    Σ_s S[t, s] v_s."""

    def __init__(self, G_hat, backend, precision: str):
        self.G_hat, self.ops, self.precision = G_hat, backend.selective, precision

    def forward(self, piece, tokens, Z0, reset):
        o, X = segment_forward(
            *tokens, self.G_hat, _complex(Z0), piece.L, reset, self.ops, self.precision
        )
        return o, _real(X)

    def backward(self, piece, tokens, Z0, do, dZ_end, reset):
        *g, g_G, g_X = segment_backward(
            *tokens, self.G_hat, _complex(Z0), piece.L, reset, self.ops, self.precision,
            do, _complex(dZ_end),
        )  # fmt: skip
        return g, {0: g_G}, _real(g_X)
