"""The per-token (selective) chunked path as torch custom ops (``idmix::selective_forward``
and ``idmix::selective_backward``), registered like ``chunked_op``: one opaque node per
direction for torch.compile and torch.export, every kernel launch inside one, and no argument
with a default.

Shapes: q, k (B, T, H, R); v (B, T, H, D); lam_ri, beta_ri (B, T, H, M, 2); G_hat (H, 2M, 2M)
interleaved; Z0 (B, H, R+D, 2M) interleaved real; one real dtype throughout; reset (B, T) bool
or None; chunk_size: the chunk length (≤ SELECTIVE_CHUNK); backend one of validation.BACKENDS;
precision resolved, of the contractions with a state or Ĝ (the pair work is fp32).
"""

from __future__ import annotations

import torch

from .backend import resolve_backend
from .segments import incoming_grads, run_backward, run_forward
from .selective import SelectiveSegments, num_segments, plan
from .validation import refuse_double_backward


@torch.library.custom_op("idmix::selective_forward", mutates_args=())
def selective_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam_ri: torch.Tensor,
    beta_ri: torch.Tensor,
    G_hat: torch.Tensor,
    Z0: torch.Tensor,
    reset: torch.Tensor | None,
    chunk_size: int,
    backend: str,
    precision: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (o (B, T, H, D), Z_end (B, H, R+D, 2M), segment start states (P, B, H, R+D, 2M))."""
    math = SelectiveSegments(G_hat, resolve_backend(backend, q), precision)
    tokens = [q, k, v, lam_ri, beta_ri]
    return run_forward(math, plan(q.shape[1], chunk_size), tokens, Z0, reset, v.shape[-1])


@selective_forward.register_fake
def _(q, k, v, lam_ri, beta_ri, G_hat, Z0, reset, chunk_size, backend, precision):
    B, T, H, _ = q.shape
    P = num_segments(T, chunk_size)
    return q.new_empty(B, T, H, v.shape[-1]), torch.empty_like(Z0), Z0.new_empty(P, *Z0.shape)


@torch.library.custom_op("idmix::selective_backward", mutates_args=())
def selective_backward(
    do: torch.Tensor,
    dZ_end: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam_ri: torch.Tensor,
    beta_ri: torch.Tensor,
    G_hat: torch.Tensor,
    starts: torch.Tensor,
    reset: torch.Tensor | None,
    chunk_size: int,
    backend: str,
    precision: str,
) -> list[torch.Tensor]:
    """Gradients of (q, k, v, lam_ri, beta_ri, G_hat, Z0), recomputing each segment from its
    saved start state."""
    math = SelectiveSegments(G_hat, resolve_backend(backend, q), precision)
    tokens = [q, k, v, lam_ri, beta_ri]
    with torch.no_grad():
        d_tokens, (dG,), dZ0 = run_backward(
            math, plan(q.shape[1], chunk_size), tokens, [G_hat], starts, do, dZ_end, reset
        )
    return [*d_tokens, dG, dZ0]


@selective_backward.register_fake
def _(do, dZ_end, q, k, v, lam_ri, beta_ri, G_hat, starts, reset, chunk_size, backend, precision):
    return [torch.empty_like(t) for t in (q, k, v, lam_ri, beta_ri, G_hat, dZ_end)]


def _setup_context(ctx, inputs, output):
    q, k, v, lam_ri, beta_ri, G_hat, _Z0, reset, chunk_size, backend, precision = inputs
    ctx.chunk_size, ctx.backend, ctx.precision = chunk_size, backend, precision
    ctx.save_for_backward(
        q, k, v, lam_ri, beta_ri, G_hat, output[2], *([reset] if reset is not None else [])
    )


def _backward(ctx, do, dZ_end, _d_starts):
    q, k, v, lam_ri, beta_ri, G_hat, starts, *reset = ctx.saved_tensors
    do, dZ_end = incoming_grads(do, dZ_end, q, v, starts)
    grads = torch.ops.idmix.selective_backward(
        do, dZ_end, q, k, v, lam_ri, beta_ri, G_hat, starts, reset[0] if reset else None,
        ctx.chunk_size, ctx.backend, ctx.precision,
    )  # fmt: skip
    # create_graph=True: a backward through these gradients raises a named error
    grads = refuse_double_backward(grads, (do, dZ_end, q, k, v, lam_ri, beta_ri, G_hat))
    return *grads, None, None, None, None


selective_forward.register_autograd(_backward, setup_context=_setup_context)
