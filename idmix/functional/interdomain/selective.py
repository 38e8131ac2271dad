"""Per-token (selective) decays on the chunked path: λ_t, β_t of shape (B, T, H, M).

    X_t = λ_t ⊙ X_{t-1} + β_t ⊗ z_t,   o_t = X̂ᵛ(t)ᵀ Ĝ X̂ᵏ(t) q_t  (docs/design.md §1–2)

Inside a chunk of L positions the decay from s to t is Π_{s<r≤t} λ_r = exp(c_t − c_s), with
c the inclusive cumulative sum of log λ = log|λ| + iθ over the chunk (GLA-style). Numerics:
- every real exponent used is ≤ 0: c_t − c_s for s ≤ t (the pairs s > t are masked by a select
  on the exponent, before exp), c_t from the chunk start, c_{L−1} − c_s to the chunk end;
- the phase is wrapped per step (θ = atan2(Im λ, Re λ) ∈ (−π, π]) before the sum, so within a
  chunk it stays below L·π and fp32 keeps ~1e-5 rad of resolution however large Δ·Im A grows
  (unwrapped, Δ_t = 10 with M = 64 reaches ~1e5 rad in a few steps);
- a reset (document start) at r zeroes the state before r: pairs across it and the chunk start
  state after it are masked by selects, never multiplied by 0.
The shared-decay op (``chunked.py``) is not routed through this code.

The intra-chunk work is O(L²M) elementwise per chunk (a decay per pair and mode), so chunks
are short (``SELECTIVE_CHUNK``); chunk start states come from a scan over chunks. Gradients
are PyTorch autograd through this code (no hand-derived backward yet).
"""

from __future__ import annotations

import torch

from ..powers import polar

SELECTIVE_CHUNK = 16


def _complex(x: torch.Tensor) -> torch.Tensor:
    """(..., 2M) interleaved real -> (..., M) complex view."""
    return torch.view_as_complex(x.unflatten(-1, (-1, 2)))


def selective_chunked(q, k, v, lam_ri, beta_ri, G_hat, Z0, chunk_size=SELECTIVE_CHUNK, reset=None):
    """q, k: (B, T, H, R); v: (B, T, H, D); lam_ri, beta_ri: (B, T, H, M, 2); G_hat: (H, 2M, 2M)
    interleaved; Z0: (B, H, R+D, 2M) interleaved real; reset: (B, T) bool or None. One real
    dtype throughout. Returns (o (B, T, H, D), final state (B, H, R+D, 2M))."""
    B, T, H, R = q.shape
    L = chunk_size
    n = -(-T // L)
    pad = n * L - T

    def chunks(x, fill=0.0):  # (B, T, H, ...) -> (B, H, n, L, ...), padded at the end
        if pad:
            tail = x.new_full((B, pad, *x.shape[2:]), fill)
            x = torch.cat([x, tail], 1)
        return x.unflatten(1, (n, L)).movedim(3, 1)

    # padding: λ = 1, β = 0, z = 0 leaves the state unchanged past T
    log_mag, theta = polar(lam_ri)  # (B, T, H, M) each
    c_re = chunks(log_mag).cumsum(3)  # (B, H, n, L, M), non-increasing in L
    c_im = chunks(theta).cumsum(3)
    beta = chunks(torch.view_as_complex(beta_ri.contiguous()))  # (B, H, n, L, M)
    qc, kc, vc = chunks(q), chunks(k), chunks(v)
    if reset is None:
        doc = torch.zeros(B, 1, n, L, dtype=torch.long, device=q.device)
    else:
        doc = chunks(reset[..., None, None].long())[..., 0].cumsum(3)  # (B, 1, n, L)
    idx = torch.arange(L, device=q.device)
    causal = idx[:, None] >= idx[None, :]  # (t, s)
    pair_ok = causal & (doc[..., :, None] == doc[..., None, :])  # (B, 1|H, n, L, L)
    # exp(c_t − c_s) for the valid pairs: the exponent is selected before exp (never > 0)
    neg_inf = torch.full((), float("-inf"), dtype=c_re.dtype, device=q.device)
    pair_re = torch.where(
        pair_ok[..., None], c_re[..., :, None, :] - c_re[..., None, :, :], neg_inf
    )
    pair_im = c_im[..., :, None, :] - c_im[..., None, :, :]
    decay = torch.polar(torch.exp(pair_re), pair_im) * beta[..., None, :, :]  # (B,H,n,L,L,M)
    from_start = torch.polar(torch.exp(c_re), c_im)  # (B, H, n, L, M): Π_{0≤r≤t} λ_r
    from_start = torch.where((doc == 0)[..., None], from_start, 0)
    end_ok = doc[..., :] == doc[..., -1:]  # (B, 1, n, L): s in the chunk's last document
    to_end_re = torch.where(end_ok[..., None], c_re[..., -1:, :] - c_re, neg_inf)
    to_end = torch.polar(torch.exp(to_end_re), c_im[..., -1:, :] - c_im) * beta
    carry = from_start[..., -1, :]  # (B, H, n, M); already 0 where the chunk holds a reset

    # chunk start states: a scan over chunks of X ← carry ⊙ X + ΔX (ΔX from a zero start)
    z = torch.cat([kc, vc], -1).to(to_end.dtype)  # (B, H, n, L, R+D)
    delta = torch.einsum("bhnsm,bhnsc->bhncm", to_end, z)  # (B, H, n, R+D, M)
    X = _complex(Z0)  # (B, H, R+D, M)
    starts = []
    # unbind once: indexing chunk j inside the loop would make each step's backward allocate
    # and fill a gradient of the whole tensor (O(n²) work)
    for c, d in zip(carry.unsqueeze(3).unbind(2), delta.unbind(2), strict=True):
        starts.append(X)
        X = c * X + d
    Xs = torch.stack(starts, 2)  # (B, H, n, R+D, M)

    # pass 1: p(t) = from_start(t) ⊙ (Xᵏ_start q_t) + Σ_s A[t, s] decay[t, s]
    scores = torch.where(pair_ok, qc @ kc.mT, 0)  # (B, H, n, L, L)
    p = from_start * torch.einsum("bhnlr,bhnrm->bhnlm", qc.to(decay.dtype), Xs[..., :R, :])
    p = p + torch.einsum("bhnts,bhntsm->bhntm", scores.to(decay.dtype), decay)
    # pass 2: w = Ĝ p̂; o_t = Re Σ_m conj(Xᵛ(t)[m]) w_m
    w = _complex(torch.view_as_real(p).flatten(-2) @ G_hat.mT[:, None])  # (B, H, n, L, M)
    o = torch.einsum("bhnlm,bhndm->bhnld", from_start.conj() * w, Xs[..., R:, :].conj()).real
    mix = torch.einsum("bhntsm,bhntm->bhnts", decay.conj(), w).real  # S[t, s]
    o = o + mix @ vc
    o = o.movedim(1, 3).flatten(1, 2)[:, :T]  # (B, T, H, D)
    return o, torch.view_as_real(X).flatten(-2)
