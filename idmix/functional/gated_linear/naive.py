"""Gated linear attention as a literal per-step recurrence: the reference.

    S_t = diag(α_t) S_{t−1} + k_t v_tᵀ,    o_t = scale · S_tᵀ q_t,

with α_t = exp(log_decay_t) along the key dim (one per channel, or one per head broadcast), and
S_{t−1} replaced by zeros where reset[:, t] starts a document.
"""

from __future__ import annotations

import torch

from .validation import prepare


def naive_core(q, k, v, log_decay, state, reset, scale: float):
    """The recurrence on checked inputs in the compute dtype; returns (o, S_T)."""
    S = state
    alpha = log_decay.exp()
    if alpha.dim() == 3:  # one decay per head
        alpha = alpha[..., None]
    outs = []
    for t in range(q.shape[1]):
        if reset is not None:
            S = torch.where(reset[:, t, None, None, None], torch.zeros_like(S), S)
        S = alpha[:, t, :, :, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(scale * (q[:, t, :, :, None] * S).sum(-2))
    return torch.stack(outs, 1), S


def gated_linear_attention_naive(
    q, k, v, log_decay, *, scale=None, initial_state=None, reset=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated linear attention, one token at a time (O(T) steps of O(K·V) each); arguments and
    results as ``gated_linear_attention``."""
    p = prepare(q, k, v, log_decay, scale, initial_state, reset)
    o, S = naive_core(p.q, p.k, p.v, p.log_decay, p.state, p.reset, p.scale)
    return o.to(p.out_dtype), S
