"""Interdomain attention with the exponential-trapezoidal update of Mamba-3: the key and value
projections onto the modes driven by per-token complex decays and the trapezoid, the
query-conditioned readout unchanged (issue 54, the paper's future work 1;
docs/research/interdomain_mamba3.md has the design).

Per head, with the state X (R+D channels × M complex modes) in the op's real form and
z_t = [k_t; v_t]:

    X_t = λ_t ⊙ (X_{t−1} + b_t z_{t−1}) + g_t z_t,        o_t = X̂ᵛ_t Ĝ (X̂ᵏ_tᵀ q_t)

λ_t (B, T, H, M) per token and mode; g_t = σ_t Δ_t and b_t = (1 − σ_t) Δ_t the trapezoid's
weights of the newer and the older end of [t−1, t] (per head: every mode takes the input with
the same weight). With b = 0 this is ``interdomain_attention``'s per-token path with β = g.

The chunked form is that path on an interleaved sequence of 2T steps: step 2t has decay 1 and
input b_t z_{t−1} (its output is dropped), step 2t+1 has decay λ_t and input g_t z_t and reads
with q_t. Each step is one of the recurrence's two terms, so the result is exact, and the
per-token engine's chunking, resets, states and kernels carry over unchanged (at twice the
tokens). A document start at t zeroes the state before step 2t, whose input is then 0.

The state carried between calls is (Z (B, H, R+D, 2M), the last token's z (B, H, R+D)): the
next call's first step adds its b_1 z_0.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .chunking import check_gate, check_qkv
from .interdomain.api import interdomain_attention
from .interdomain.decode import torch_step
from .interdomain.validation import check_real_params, check_reset

IMPLS = ("chunked", "naive")


class TrapezoidState(NamedTuple):
    """Z (B, H, R+D, 2M): the interleaved real state; z (B, H, R+D): the last token's input."""

    Z: torch.Tensor
    z: torch.Tensor


def _check(q, k, v, lam_ri, g, b, G_hat, initial_state, reset, impl) -> tuple[int, ...]:
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    B, T, H, R, D = check_qkv(q, k, v)
    M = check_real_params(lam_ri, lam_ri, G_hat, H, lead=(B, T), names=("lam", "lam", "G_hat"))
    for name, x in (("g", g), ("b", b)):
        check_gate(name, x, ((B, T, H),), f"(B, T, H) = {(B, T, H)}")
    if initial_state is not None:
        if not isinstance(initial_state, tuple) or len(initial_state) != 2:
            raise TypeError("initial_state: expected a TrapezoidState (Z, z) or None")
        for name, x, shape in zip(
            ("Z", "z"), initial_state, ((B, H, R + D, 2 * M), (B, H, R + D)), strict=True
        ):
            if not isinstance(x, torch.Tensor) or tuple(x.shape) != shape:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"initial_state.{name}: expected shape {shape}, got {got}")
    check_reset(reset, B, T)
    return B, T, H, R, D, M


def _interleave(older: torch.Tensor, newer: torch.Tensor) -> torch.Tensor:
    """(B, T, ...) twice -> (B, 2T, ...): older[t] at step 2t, newer[t] at step 2t + 1."""
    return torch.stack((older, newer), 2).flatten(1, 2)


def _as_pairs(x: torch.Tensor, M: int) -> torch.Tensor:
    """(B, T, H) real -> (B, T, H, M, 2): the same real weight for every mode."""
    return torch.stack((x, torch.zeros_like(x)), -1)[..., None, :].expand(*x.shape, M, 2)


def _chunked(q, k, v, lam_ri, g, b, G_hat, state: TrapezoidState, reset, **options):
    B, T, H, R = q.shape
    M = lam_ri.shape[-2]
    z = torch.cat((k, v), -1)
    z_prev = torch.cat((state.z[:, None].to(z.dtype), z[:, :-1]), 1)
    if reset is not None:  # the previous token belongs to another document
        b = torch.where(reset[..., None], 0, b)
    identity = torch.stack((torch.ones_like(g), torch.zeros_like(g)), -1)[..., None, :]
    o, Z = interdomain_attention(
        _interleave(torch.zeros_like(q), q),
        _interleave(z_prev[..., :R], k),
        _interleave(z_prev[..., R:], v),
        _interleave(identity.expand_as(lam_ri).to(lam_ri.dtype), lam_ri),
        _interleave(_as_pairs(b, M), _as_pairs(g, M)).to(lam_ri.dtype),
        G_hat,
        initial_state=state.Z,
        output_final_state=True,
        reset=None if reset is None else _interleave(reset, torch.zeros_like(reset)),
        **options,
    )
    return o[:, 1::2], TrapezoidState(Z, z[:, -1].to(Z.dtype))


def trapezoid_step(q, k, v, lam_ri, g, b, G_hat, state: TrapezoidState):
    """One token of every row, in the state's dtype: q, k (B, H, R); v (B, H, D); lam_ri
    (B, H, M, 2); g, b (B, H); G_hat (H, 2M, 2M). Returns (o (B, H, D), the next state): the
    pending b z_{t−1} added to every mode, then ``interdomain_decode_step``'s torch step with
    β = g."""
    M, rdtype = lam_ri.shape[-2], state.Z.dtype
    pending = b.to(rdtype)[..., None] * state.z  # (B, H, R+D), the same for every mode
    Z = state.Z + _as_pairs(pending, M).flatten(-2)
    o, Z = torch_step(q, k, v, lam_ri, _as_pairs(g, M), G_hat, Z)
    return o, TrapezoidState(Z, torch.cat((k, v), -1).to(rdtype))


def _naive(q, k, v, lam_ri, g, b, G_hat, state: TrapezoidState, reset):
    outs = []
    for t in range(q.shape[1]):
        if reset is not None:  # a select: a NaN in an earlier document never crosses
            new = reset[:, t]
            state = TrapezoidState(
                torch.where(new[:, None, None, None], 0, state.Z),
                torch.where(new[:, None, None], 0, state.z),
            )
        tok = (x[:, t] for x in (q, k, v, lam_ri, g, b))
        o, state = trapezoid_step(*tok, G_hat, state)
        outs.append(o)
    return torch.stack(outs, 1), state


def trapezoid_attention(
    q, k, v, lam_ri, g, b, G_hat, *, initial_state=None, output_final_state=False, reset=None,
    chunk_size=64, impl="chunked", backend="auto", precision="auto",
) -> tuple[torch.Tensor, TrapezoidState | None]:  # fmt: skip
    """Interdomain attention with per-token decays and the trapezoid (this module's docstring).

    q, k: (B, T, H, R); v: (B, T, H, D); lam_ri: (B, T, H, M, 2) per-token decays [re, im];
    g, b: (B, T, H) the trapezoid's weights (newer end, older end); G_hat: (H, 2M, 2M) as
    ``interdomain_attention``'s real form; initial_state: a ``TrapezoidState`` or None (zeros);
    reset: (B, T) bool or None, True where a document starts; impl: "chunked" (O(T), through
    ``interdomain_attention``; chunk_size, backend and precision go to it) or "naive" (the
    per-step loop). Computes in fp32 (fp64 for fp64 inputs). Returns (o (B, T, H, D) in q's
    dtype, the final ``TrapezoidState`` or None unless output_final_state).
    """
    B, T, H, R, D, M = _check(q, k, v, lam_ri, g, b, G_hat, initial_state, reset, impl)
    rdtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    if initial_state is None:
        state = TrapezoidState(q.new_zeros(B, H, R + D, 2 * M, dtype=rdtype),
                               q.new_zeros(B, H, R + D, dtype=rdtype))  # fmt: skip
    else:
        state = TrapezoidState(*(s.to(rdtype) for s in initial_state))
    if impl == "naive":
        o, final = _naive(q, k, v, lam_ri, g, b, G_hat, state, reset)
    else:
        options = dict(chunk_size=chunk_size, backend=backend, precision=precision)
        o, final = _chunked(q, k, v, lam_ri, g, b, G_hat, state, reset, **options)
    return o.to(q.dtype), final if output_final_state else None
