"""The gated delta rule as a literal per-step recurrence: the reference (and a T = 1 decode step).

    S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,    o_t = scale · S_tᵀ q_t,

with α_t = exp(log_decay_t), and S_{t−1} replaced by zeros where reset[:, t] starts a document.
"""

from __future__ import annotations

import torch

from .validation import prepare


def naive_core(q, k, v, beta, log_decay, state, reset, scale: float):
    """The recurrence on checked inputs in the compute dtype; returns (o, S_T)."""
    S = state
    alpha = log_decay.exp()
    outs = []
    for t in range(q.shape[1]):
        if reset is not None:
            S = torch.where(reset[:, t, None, None, None], torch.zeros_like(S), S)
        a = alpha[:, t, :, None, None]
        b = beta[:, t, :, None, None]
        kt = k[:, t, :, :, None]  # (B, H, K, 1)
        # α (I − β k kᵀ) S + β k vᵀ, with (k kᵀ) S evaluated as k (kᵀ S).
        S = a * (S - b * kt * (kt * S).sum(-2, keepdim=True)) + b * kt * v[:, t, :, None, :]
        outs.append(scale * (q[:, t, :, :, None] * S).sum(-2))
    return torch.stack(outs, 1), S


def gated_delta_rule_naive(
    q, k, v, beta, log_decay, *, scale=None, initial_state=None, reset=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule, one token at a time (O(T) steps of O(K·V) each).

    q, k: (B, T, H, K); v: (B, T, H, V); beta, log_decay: (B, T, H) (log_decay <= 0);
    initial_state: (B, H, K, V) or None (zeros); reset: (B, T) bool or None (True where a
    document starts: the state is zeroed before that token); scale defaults to K**-0.5.
    Returns o: (B, T, H, V) in q's dtype and the final state (B, H, K, V) in the compute dtype
    (fp32 for half/bfloat16 inputs, else the input dtype).
    """
    p = prepare(q, k, v, beta, log_decay, scale, initial_state, reset)
    o, S = naive_core(p.q, p.k, p.v, p.beta, p.log_decay, p.state, p.reset, p.scale)
    return o.to(p.out_dtype), S
