"""Mamba-3's recurrence in chunks: the per-head-decay linear attention of Mamba-2 on rotated
queries and keys, with the trapezoid's two weights folded into one per key.

Rotations: q̃_s · k̃_u = q_s · R(Θ_u − Θ_s) k_u depends on the angles' difference only, so the
running angles Θ (a cumulative sum of θΔ along T, restarted at each document start, computed in
fp64) rotate q and k once, up front; the recurrence on q̃, k̃ is then real.

Trapezoid: the pair written at s enters h_s with weight γ_s and h_{s+1} with β_{s+1}, which
then decays with the state; at any t > s the two add up to

    exp(Σ_{s<r≤t} Δ_r A_r) · w_s,    w_s = γ_s + ℓ_s,    ℓ_s = (1 − λ_{s+1}) Δ_{s+1}

(ℓ_s = 0 at a call's last token and before a document start: no next token of the same
document). So y is Mamba-2's recurrence h_t = α_t h_{t−1} + (w_t k̃_t) x_tᵀ, y_t = h_tᵀ q̃_t
(``gated_linear``'s chunked form, per-head log decays Δ_t A_t), minus the one term it counts
that the trapezoid does not: the lookahead ℓ_t on the diagonal, ℓ_t (q_t · k_t) x_t. A given
state enters as h_0 + (1 − λ_1) Δ_1 k̃_0 x_0ᵀ (its pending trapezoid term), and the final h is
the recurrence's (its last ℓ is 0). Shapes: docs of ``mamba3_attention``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..gated_linear.chunked import chunked_core
from .naive import naive_core, rotate, wrap
from .validation import Mamba3State, check_chunk_size, check_impl, prepare


def running_angles(angles, dt, start, reset) -> torch.Tensor:
    """Θ_t (B, T, H, S): start (B, H, S) plus the cumulative θΔ, restarted from 0 at each
    document start; summed in fp64 (a long sum of angles in fp32 loses the small differences
    the scores depend on), returned in the compute dtype."""
    inc = (angles * dt[..., None]).double()
    total = inc.cumsum(1)
    if reset is None:
        return (total + start.double()[:, None]).to(angles.dtype)
    B, T = reset.shape
    steps = torch.arange(T, device=reset.device).expand(B, T)
    last = torch.where(reset, steps, -1).cummax(1).values  # the latest document start, or -1
    before = F.pad(total, (0, 0, 0, 0, 1, 0))[:, :-1]  # Σ up to t − 1 (0 at t = 0)
    index = last.clamp_min(0)[..., None, None].expand_as(total)
    base = torch.where(
        (last >= 0)[..., None, None], before.gather(1, index), -start.double()[:, None]
    )
    return (total - base).to(angles.dtype)


def chunked(p, chunk_size: int) -> tuple[torch.Tensor, Mamba3State]:
    """The chunked form on checked inputs (``validation.Inputs``) in the compute dtype."""
    theta = running_angles(p.angles, p.dt, p.state.angle, p.reset)
    q_rot, k_rot = rotate(p.q, theta), rotate(p.k, theta)
    look = F.pad((1 - p.trap[:, 1:]) * p.dt[:, 1:], (0, 0, 0, 1))  # ℓ_t, 0 at the last token
    if p.reset is not None:
        look = torch.where(F.pad(p.reset[:, 1:], (0, 1))[..., None], 0, look)
    weight = p.trap * p.dt + look
    pending = ((1 - p.trap[:, 0]) * p.dt[:, 0])[..., None, None] * (
        p.state.k[..., :, None] * p.state.x[..., None, :]
    )
    y, h = chunked_core(
        q_rot, k_rot * weight[..., None], p.x, p.dt * p.A, p.state.h + pending, p.reset, 1.0,
        chunk_size,
    )  # fmt: skip
    y = y - (look * (p.q * p.k).sum(-1))[..., None] * p.x
    final = Mamba3State(h, k_rot[:, -1], p.x[:, -1], wrap(theta[:, -1]))
    return y, final


def mamba3_chunked(
    q, k, x, dt, A, trap, angles, *, initial_state=None, reset=None, chunk_size=64
) -> tuple[torch.Tensor, Mamba3State]:
    """Mamba-3's recurrence in chunks of chunk_size tokens (arguments as mamba3_attention)."""
    check_chunk_size(chunk_size)
    p = prepare(q, k, x, dt, A, trap, angles, initial_state, reset)
    y, state = chunked(p, chunk_size)
    return y.to(p.out_dtype), state


def mamba3_attention(
    q, k, x, dt, A, trap, angles, *, initial_state=None, reset=None, chunk_size=64,
    impl="chunked",
) -> tuple[torch.Tensor, Mamba3State]:  # fmt: skip
    """Mamba-3's SISO recurrence (``naive.py`` states it): rotated, exponential-trapezoidal,
    one data-dependent decay per head and token.

    q, k: (B, T, H, N) (C and B after their norm and bias, not yet rotated); x: (B, T, H, P);
    dt: (B, T, H) step sizes Δ > 0; A: (B, T, H) decay rates < 0; trap: (B, T, H) the
    trapezoid's weights λ ∈ [0, 1]; angles: (B, T, H, S) rotation rates θ, 2S <= N;
    initial_state: a ``Mamba3State`` or None (zeros); reset: (B, T) bool or None, True where a
    document starts; chunk_size: tokens per chunk (impl="chunked"); impl: "chunked" (O(T)) or
    "naive" (the per-step loop).

    Half and bfloat16 inputs are computed in fp32. Returns y: (B, T, H, P) in q's dtype (no D
    skip, no gate: the layer adds them) and the final ``Mamba3State`` in the compute dtype.
    """
    check_impl(impl)
    check_chunk_size(chunk_size)
    p = prepare(q, k, x, dt, A, trap, angles, initial_state, reset)
    y, state = naive_core(p) if impl == "naive" else chunked(p, chunk_size)
    return y.to(p.out_dtype), state
