"""The one segment driver of the chunked paths (shared and per-token decays): plan, forward,
recompute-backward.

A sequence runs in pieces of whole chunks (a segment); only the state carried between pieces
is sequential. The forward keeps nothing but the state at each piece's start; the backward
walks the pieces in reverse and recomputes each one from its start state, so memory is bounded
by one piece whatever T. What a piece computes is plugged in (``SegmentMath``): ``chunked`` for
shared decays, ``selective`` for per-token ones.

tokens: the per-position inputs, each (B, T, H, ·): q, k, v, then per-token decays if any;
params: the inputs every piece shares (decays, Ĝ); states (B, H, R+D, 2M) interleaved real.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch


class Piece(NamedTuple):
    """Positions [t0, t1) as chunks of length L."""

    t0: int
    t1: int
    L: int


class SegmentMath(Protocol):
    """What one piece computes. Token tensors come sliced to the piece, (B, t1 − t0, H, ·)."""

    def forward(self, piece: Piece, tokens, Z0, reset):
        """-> (o (B, t1 − t0, H, D) or chunked (B, n, L, H, D), Z_end)."""

    def backward(self, piece: Piece, tokens, Z0, do, dZ_end, reset):
        """-> (the tokens' gradients, each like its token or chunked; {index in params:
        gradient}; dZ0)."""


def _span(x, piece: Piece):
    return None if x is None else x[:, piece.t0 : piece.t1]


def _write(dst: torch.Tensor, piece: Piece, x: torch.Tensor) -> None:
    """dst[:, t0:t1] = x, for x shaped like that span or chunked, (B, n, L, ...) for a
    (B, n·L, ...) span."""
    span = _span(dst, piece)
    (span if x.dim() == span.dim() else span.unflatten(1, x.shape[1:3])).copy_(x)


def incoming_grads(do, dZ_end, q, v, starts):
    """The backward's incoming gradients, zeros for an output autograd gave None: do
    (B, T, H, D) like o, dZ_end like a state."""
    if do is None:
        do = q.new_zeros(*q.shape[:-1], v.shape[-1])
    if dZ_end is None:
        dZ_end = torch.zeros_like(starts[0])
    return do, dZ_end


def run_forward(math: SegmentMath, plan: list[Piece], tokens, Z0, reset, D: int):
    """Returns (o (B, T, H, D) in q's dtype, Z_end, the piece start states (P, B, H, R+D, 2M))."""
    q = tokens[0]
    o = q.new_empty(*q.shape[:3], D)
    Z, starts = Z0.contiguous(), []
    for piece in plan:
        starts.append(Z)
        o_p, Z = math.forward(piece, [_span(t, piece) for t in tokens], Z, _span(reset, piece))
        _write(o, piece, o_p)
    return o, Z, torch.stack(starts)


def run_backward(math: SegmentMath, plan: list[Piece], tokens, params, starts, do, dZ_end, reset):
    """Returns (the tokens' gradients, the params' gradients (summed over pieces), dZ0)."""
    d_tokens = [torch.empty_like(t) for t in tokens]
    d_params = [torch.zeros_like(p) for p in params]
    dZ = dZ_end.contiguous()
    for piece, Z0 in reversed(list(zip(plan, starts.unbind(0), strict=True))):
        sliced = [_span(t, piece) for t in tokens]
        g_tokens, g_params, dZ = math.backward(
            piece, sliced, Z0, _span(do, piece), dZ, _span(reset, piece)
        )
        for dst, g in zip(d_tokens, g_tokens, strict=True):
            _write(dst, piece, g)
        for i, g in g_params.items():
            d_params[i] += g
    return d_tokens, d_params, dZ
