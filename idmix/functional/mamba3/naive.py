"""Mamba-3's recurrence (arXiv 2603.15569, SISO), one token at a time: the reference, and the
decode step.

Per head, with Δ_t > 0, A_t < 0, λ_t ∈ [0, 1] and rotation angles θ_t (all per token):

    Θ_t = Θ_{t−1} + θ_t Δ_t,          k̃_t = R(Θ_t) k_t,   q̃_t = R(Θ_t) q_t,
    α_t = exp(Δ_t A_t),  β_t = (1 − λ_t) Δ_t α_t,  γ_t = λ_t Δ_t,
    h_t = α_t h_{t−1} + β_t k̃_{t−1} x_{t−1}ᵀ + γ_t k̃_t x_tᵀ,      y_t = h_tᵀ q̃_t,

the exponential-trapezoidal rule: the input is integrated over [t−1, t] from both ends, the
older end decayed with the state. R(Θ) rotates the channel pairs (2j, 2j+1), j < S, by Θ_j;
channels from 2S on are not rotated. A rotation by a running angle is what makes the state
complex-valued: each rotated pair is one complex mode with decay exp(Δ_t(A_t + iθ_t)), the
rest are real modes. Where reset[:, t] starts a document, h, the previous key and value and
the angles restart from zero. Shapes: docs of ``mamba3_attention``.
"""

from __future__ import annotations

import math

import torch

from .validation import Mamba3State, prepare


def rotate(x: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """x (..., N) with its pairs (2j, 2j+1), j < S, rotated by angle (..., S); the rest as is."""
    S = angle.shape[-1]
    pairs = x[..., : 2 * S].unflatten(-1, (S, 2))
    c, s = angle.cos(), angle.sin()
    a, b = pairs[..., 0], pairs[..., 1]
    turned = torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)
    return torch.cat((turned, x[..., 2 * S :]), -1)


def wrap(angle: torch.Tensor) -> torch.Tensor:
    """angle reduced to [0, 2π) (what a state carries, so that it does not grow without bound)."""
    return torch.remainder(angle, 2 * math.pi)


def mamba3_step(q, k, x, dt, A, trap, angles, state: Mamba3State):
    """One token of every row: q, k (B, H, N); x (B, H, P); dt, A, trap (B, H); angles
    (B, H, S); state: Mamba3State. Returns (y (B, H, P), the next state)."""
    angle = state.angle + angles * dt[..., None]
    q_rot, k_rot = rotate(q, angle), rotate(k, angle)
    alpha = torch.exp(dt * A)
    beta, gamma = (1 - trap) * dt * alpha, trap * dt
    h = (
        alpha[..., None, None] * state.h
        + beta[..., None, None] * state.k[..., :, None] * state.x[..., None, :]
        + gamma[..., None, None] * k_rot[..., :, None] * x[..., None, :]
    )
    y = torch.einsum("bhn,bhnp->bhp", q_rot, h)
    return y, Mamba3State(h, k_rot, x, wrap(angle))


def naive_core(p) -> tuple[torch.Tensor, Mamba3State]:
    """The recurrence on checked inputs (``validation.Inputs``) in the compute dtype."""
    state, outs = p.state, []
    for t in range(p.q.shape[1]):
        if p.reset is not None:
            keep = ~p.reset[:, t]
            state = Mamba3State(
                *(torch.where(keep.view(-1, *[1] * (s.dim() - 1)), s, 0) for s in state)
            )
        tok = (u[:, t] for u in (p.q, p.k, p.x, p.dt, p.A, p.trap, p.angles))
        y, state = mamba3_step(*tok, state)
        outs.append(y)
    return torch.stack(outs, 1), state


def mamba3_naive(q, k, x, dt, A, trap, angles, *, initial_state=None, reset=None):
    """Mamba-3's recurrence one token at a time (O(T) steps of O(N·P) each); arguments and
    results as ``mamba3_attention``."""
    p = prepare(q, k, x, dt, A, trap, angles, initial_state, reset)
    y, state = naive_core(p)
    return y.to(p.out_dtype), state
