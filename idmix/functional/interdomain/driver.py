"""The chunked paths' driver: ``backend=`` resolved once per call, the one segment driver (plan,
forward, recompute-backward) for shared and per-token decays, and their custom-op pairs.

A sequence runs in pieces of whole chunks (a segment); only the state carried between pieces
is sequential. The forward keeps nothing but the state at each piece's start; the backward
walks the pieces in reverse and recomputes each one from its start state, so memory is bounded
by one piece whatever T. What a piece computes is plugged in (``SegmentMath``):
``shared.SharedSegments`` for shared decays, ``selective.SelectiveSegments`` for per-token ones.

tokens: the per-position inputs, each (B, T, H, ·): q, k, v, then per-token decays if any;
params: the inputs every piece shares (decays, Ĝ); states (B, H, R+D, 2M) interleaved real.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Protocol

import torch

from .layout import Piece
from .numerics import compiled, have_cxx
from .selective import PairOps, SelectiveSegments, SelectiveTorchOps, num_segments, selective_plan
from .shared import ChunkOps, SharedSegments, TorchChunkOps, num_pieces, plan, segment_tokens
from .triton_engine import SelectiveTritonOps, kernels_if_installed, kernels_module
from .validation import check_backend, refuse_double_backward


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


# --- backend resolution ---
# ``backend=`` resolved once per call into the object that supplies the segment primitives.
#
# "torch": PyTorch, eager; "inductor": the same PyTorch pieces compiled by torch.compile (their
# glue fused around the GEMMs); "triton": the kernels of ``idmix_kernels`` (CUDA, or on CPU the
# Triton interpreter); "auto": triton for CUDA tensors where it is installed, else torch. This is
# the only place the Triton-vs-torch decision is made (the decode step asks ``takes_triton``).


class Backend(NamedTuple):
    """name: "torch", "inductor" or "triton"; chunk: the shared-decay primitives
    (``shared.ChunkOps``; None for "triton", whose shared-decay path is its own op in
    ``triton_engine``); selective: the per-token ones (``selective.PairOps``), each with the
    call's product precision bound in; compile_pieces: whether the shared pieces run compiled
    by Inductor."""

    name: str
    chunk: ChunkOps | None
    selective: PairOps
    compile_pieces: bool

    def run(self, piece):
        """The piece function as this backend runs it: compiled once per process and input
        shape for "inductor" (static shapes: a run at one length meets at most three, a full
        segment, a shorter last one and the ragged tail; not fullgraph, so that past Dynamo's
        recompile limit it runs eagerly with torch's warning instead of failing), else as is.
        Either way it takes the backend's primitives (``chunk``) as its last argument."""
        return compiled(piece, dynamic=False) if self.compile_pieces else piece


def _wants_triton(backend: str, x: torch.Tensor) -> bool:
    if backend != "auto":
        return backend == "triton"
    return x.is_cuda and kernels_if_installed() is not None


def takes_triton(backend: str, x: torch.Tensor) -> bool:
    """ "triton": always (checked: on CPU only under the interpreter); "auto": for CUDA tensors
    when the kernels are installed."""
    check_backend(backend, x)
    return _wants_triton(backend, x)


def shared_on_kernels(backend: str, x: torch.Tensor) -> bool:
    """Whether the shared-decay chunked path runs on the kernels (``triton_engine``) for
    inputs like x: as ``resolve_backend`` would pick "triton", without building the backend (so
    that torch.compile traces it as a plain condition)."""
    if backend == "inductor" or not _wants_triton(backend, x):
        return False
    if x.dtype == torch.float64:
        if backend == "triton":
            raise ValueError(
                "backend='triton': the kernels compute in fp32; fp64 inputs take 'torch'"
            )
        return False
    return True


@functools.cache
def _engines(name: str, precision: str) -> Backend:
    """One Backend per (name, precision) for the process, so that compiled pieces, which take
    its primitives as an argument, meet the same object on every call."""
    if name == "triton":
        return Backend(name, None, SelectiveTritonOps(kernels_module(), precision), False)
    torch_ops = TorchChunkOps(precision), SelectiveTorchOps(precision)
    return Backend(name, *torch_ops, name == "inductor")


def resolve_backend(backend: str, x: torch.Tensor, precision: str) -> Backend:
    """The Backend for inputs like x at the resolved precision (the entry points have checked
    the name). The kernels compute in fp32: fp64 inputs take torch ("triton" refuses them)."""
    if backend == "inductor":
        if not x.is_cuda and not have_cxx():
            raise RuntimeError("backend: 'inductor' on CPU needs a C++ compiler (g++ or clang++)")
        return _engines("inductor", precision)
    return _engines("triton" if shared_on_kernels(backend, x) else "torch", precision)


# --- shared decays: the custom-op pair ---
# The shared-decay chunked path as torch custom ops (``idmix::chunked_forward`` and
# ``idmix::chunked_backward``): torch.compile and torch.export see one opaque node per direction
# (the segment loop, complex views and in-place scans stay out of the traced graph), and every
# kernel launch of the path happens inside one. The decay tensors are inputs, so autograd carries
# their gradients on to λ and β outside the op. No argument has a default: autograd matches the
# backward's outputs against the arguments as passed, which leave out a default-valued one.
#
# Shapes: q, k (B, T, H, R); v (B, T, H, D) in one float dtype (o and the gradients come back in
# it); decays = ``chunk_decay_inputs(...)`` (6 tensors: chunk length L, then the tail T % L);
# G_hat (H, 2M, 2M) interleaved; Z0 (B, H, R+D, 2M) in the compute dtype (fp32, or fp64 for fp64
# inputs); reset (B, T) bool or None; backend one of validation.BACKENDS; precision resolved
# ("ieee", "tf32" or "bf16": numerics.py).


def _segments(q, decays, G_hat, chunk_size, backend, precision):
    math = SharedSegments(decays, G_hat, chunk_size, resolve_backend(backend, q, precision))
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


def _setup_shared(ctx, inputs, output):
    q, k, v, decays, G_hat, _Z0, reset, chunk_size, backend, precision = inputs
    ctx.chunk_size, ctx.n_decays = chunk_size, len(decays)
    ctx.backend, ctx.precision = backend, precision
    ctx.save_for_backward(
        q, k, v, *decays, G_hat, output[2], *([reset] if reset is not None else [])
    )


def _backward_shared(ctx, do, dZ_end, _d_starts):
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


chunked_forward.register_autograd(_backward_shared, setup_context=_setup_shared)


# --- per-token decays: the custom-op pair ---
# The per-token (selective) chunked path as torch custom ops (``idmix::selective_forward``
# and ``idmix::selective_backward``), registered like the shared pair above: one opaque node per
# direction for torch.compile and torch.export, every kernel launch inside one, and no argument
# with a default.
#
# Shapes: q, k (B, T, H, R); v (B, T, H, D); lam_ri, beta_ri (B, T, H, M, 2); G_hat (H, 2M, 2M)
# interleaved; Z0 (B, H, R+D, 2M) interleaved real; one real dtype throughout; reset (B, T) bool
# or None; chunk_size: the chunk length (≤ SELECTIVE_CHUNK); backend one of validation.BACKENDS;
# precision resolved, of the contractions with a state or Ĝ (the pair work is fp32).


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
    math = SelectiveSegments(G_hat, resolve_backend(backend, q, precision))
    tokens = [q, k, v, lam_ri, beta_ri]
    return run_forward(math, selective_plan(q.shape[1], chunk_size), tokens, Z0, reset, v.shape[-1])


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
    math = SelectiveSegments(G_hat, resolve_backend(backend, q, precision))
    tokens = [q, k, v, lam_ri, beta_ri]
    with torch.no_grad():
        d_tokens, (dG,), dZ0 = run_backward(
            math, selective_plan(q.shape[1], chunk_size), tokens, [G_hat], starts, do, dZ_end, reset
        )
    return [*d_tokens, dG, dZ0]


@selective_backward.register_fake
def _(do, dZ_end, q, k, v, lam_ri, beta_ri, G_hat, starts, reset, chunk_size, backend, precision):
    return [torch.empty_like(t) for t in (q, k, v, lam_ri, beta_ri, G_hat, dZ_end)]


def _setup_selective(ctx, inputs, output):
    q, k, v, lam_ri, beta_ri, G_hat, _Z0, reset, chunk_size, backend, precision = inputs
    ctx.chunk_size, ctx.backend, ctx.precision = chunk_size, backend, precision
    ctx.save_for_backward(
        q, k, v, lam_ri, beta_ri, G_hat, output[2], *([reset] if reset is not None else [])
    )


def _backward_selective(ctx, do, dZ_end, _d_starts):
    q, k, v, lam_ri, beta_ri, G_hat, starts, *reset = ctx.saved_tensors
    do, dZ_end = incoming_grads(do, dZ_end, q, v, starts)
    grads = torch.ops.idmix.selective_backward(
        do, dZ_end, q, k, v, lam_ri, beta_ri, G_hat, starts, reset[0] if reset else None,
        ctx.chunk_size, ctx.backend, ctx.precision,
    )  # fmt: skip
    # create_graph=True: a backward through these gradients raises a named error
    grads = refuse_double_backward(grads, (do, dZ_end, q, k, v, lam_ri, beta_ri, G_hat))
    return *grads, None, None, None, None


selective_forward.register_autograd(_backward_selective, setup_context=_setup_selective)
