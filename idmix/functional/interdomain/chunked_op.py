"""The shared-decay chunked path as torch custom ops (``idmix::chunked_forward`` and
``idmix::chunked_backward``): torch.compile and torch.export see one opaque node per direction
(the segment loop, complex views and in-place scans stay out of the traced graph), and every
kernel launch of the path happens inside one. The decay tensors are inputs, so autograd carries
their gradients on to λ and β outside the op. No argument has a default: autograd matches the
backward's outputs against the arguments as passed, which leave out a default-valued one.

Shapes: q, k (B, T, H, R); v (B, T, H, D) in one float dtype (o and the gradients come back in
it); decays = ``chunk_decay_inputs(...)`` (6 tensors: chunk length L, then the tail T % L);
G_hat (H, 2M, 2M) interleaved; Z0 (B, H, R+D, 2M) in the compute dtype (fp32, or fp64 for fp64
inputs); reset (B, T) bool or None; backend one of validation.BACKENDS; precision resolved
("ieee", "tf32" or "bf16": precision.py).
"""

from __future__ import annotations

import torch

from .backend import resolve_backend
from .chunked import SharedSegments, num_pieces, plan, segment_tokens
from .segments import incoming_grads, run_backward, run_forward
from .validation import refuse_double_backward


def _segments(q, decays, G_hat, chunk_size, backend, precision):
    math = SharedSegments(decays, G_hat, chunk_size, resolve_backend(backend, q), precision)
    return math, plan(q.shape[1], chunk_size, segment_tokens(q, chunk_size))


@torch.library.custom_op("idmix::chunked_forward", mutates_args=())
def chunked_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decays: list[torch.Tensor],
    G_hat: torch.Tensor,
    Z0: torch.Tensor,
    reset: torch.Tensor | None,
    chunk_size: int,
    backend: str,
    precision: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (o (B, T, H, D), Z_end (B, H, R+D, 2M), segment start states (P, B, H, R+D, 2M))."""
    with torch.autocast(q.device.type, enabled=False):
        math, pieces = _segments(q, decays, G_hat, chunk_size, backend, precision)
        return run_forward(math, pieces, [q, k, v], Z0, reset, v.shape[-1])


@chunked_forward.register_fake
def _(q, k, v, decays, G_hat, Z0, reset, chunk_size, backend, precision):
    B, T, H, _ = q.shape
    P = num_pieces(T, chunk_size, segment_tokens(q, chunk_size))
    return q.new_empty(B, T, H, v.shape[-1]), torch.empty_like(Z0), Z0.new_empty(P, *Z0.shape)


@torch.library.custom_op("idmix::chunked_backward", mutates_args=())
def chunked_backward(
    do: torch.Tensor,
    dZ_end: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decays: list[torch.Tensor],
    G_hat: torch.Tensor,
    starts: torch.Tensor,
    reset: torch.Tensor | None,
    chunk_size: int,
    backend: str,
    precision: str,
) -> list[torch.Tensor]:
    """Gradients of (q, k, v, *decays, G_hat, Z0), recomputing the forward segment by segment
    from the saved segment start states."""
    with torch.autocast(q.device.type, enabled=False):
        math, pieces = _segments(q, decays, G_hat, chunk_size, backend, precision)
        params = [*decays, G_hat]
        d_tokens, d_params, dZ0 = run_backward(
            math, pieces, [q, k, v], params, starts, do, dZ_end, reset
        )
        return [*d_tokens, *d_params, dZ0]


@chunked_backward.register_fake
def _(do, dZ_end, q, k, v, decays, G_hat, starts, reset, chunk_size, backend, precision):
    return [torch.empty_like(t) for t in (q, k, v, *decays, G_hat, dZ_end)]


def _setup_context(ctx, inputs, output):
    q, k, v, decays, G_hat, _Z0, reset, chunk_size, backend, precision = inputs
    ctx.chunk_size, ctx.n_decays = chunk_size, len(decays)
    ctx.backend, ctx.precision = backend, precision
    ctx.save_for_backward(
        q, k, v, *decays, G_hat, output[2], *([reset] if reset is not None else [])
    )


def _backward(ctx, do, dZ_end, _d_starts):
    q, k, v, *rest = ctx.saved_tensors
    decays, (G_hat, starts, *reset) = rest[: ctx.n_decays], rest[ctx.n_decays :]
    do, dZ_end = incoming_grads(do, dZ_end, q, v, starts)
    grads = torch.ops.idmix.chunked_backward(
        do, dZ_end, q, k, v, list(decays), G_hat, starts, reset[0] if reset else None,
        ctx.chunk_size, ctx.backend, ctx.precision,
    )  # fmt: skip
    # create_graph=True: a backward through these gradients raises a named error
    grads = refuse_double_backward(grads, (do, dZ_end, q, k, v, *decays, G_hat))
    dq, dk, dv, *d_dec, dG, dZ0 = grads
    return dq, dk, dv, d_dec, dG, dZ0, None, None, None, None


chunked_forward.register_autograd(_backward, setup_context=_setup_context)
