"""What the chunked linear-recurrence ops (``delta_rule``, ``gated_linear``) share: the argument
checks and compute dtype of their (B, T, H, K) inputs, the cut into chunks, the document masks
of a chunk and the segment-sum decays within it."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..debug import check_values
from .interdomain.validation import check_devices, check_reset

IMPLS = ("chunked", "naive")
_HALF = (torch.float16, torch.bfloat16)


def _floating(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a real floating tensor, got {x.dtype}")


def check_impl(impl) -> None:
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")


def check_chunk_size(chunk_size) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected a positive int, got {chunk_size!r}")


def check_qkv(q, k, v) -> tuple[int, int, int, int, int]:
    """q, k (B, T, H, K) and v (B, T, H, V) of one floating dtype; returns (B, T, H, K, V)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _floating(name, x)
        if x.dim() != 4:
            last = "V" if name == "v" else "K"
            raise ValueError(
                f"{name}: expected 4 dims (B, T, H, {last}), got shape {tuple(x.shape)}"
            )
    B, T, H, K = q.shape
    V = v.shape[3]
    if k.shape != q.shape:
        raise ValueError(f"k: expected the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:3] != (B, T, H):
        raise ValueError(
            f"v: expected (B, T, H, V) with (B, T, H) = {(B, T, H)}, got {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v: expected one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if T < 1:
        raise ValueError("q: expected at least one time step (T >= 1), got T = 0")
    if 0 in (B, H, K, V):
        raise ValueError(
            f"q, v: expected non-zero B, H, K and V, got q {tuple(q.shape)}, v {tuple(v.shape)}"
        )
    return B, T, H, K, V


def check_gate(name: str, x, shapes: tuple[tuple[int, ...], ...], layout: str) -> None:
    """A floating per-token gate of one of the given shapes (layout names them)."""
    _floating(name, x)
    if tuple(x.shape) not in shapes:
        raise ValueError(f"{name}: expected shape {layout}, got {tuple(x.shape)}")


def check_log_decay(log_decay) -> None:
    """Entries <= 0, where a host sync is allowed (``idmix.debug.check_values``)."""
    if check_values(log_decay) and bool((log_decay > 0).any()):
        raise ValueError(
            f"log_decay: expected entries <= 0 (a decay exp(log_decay) <= 1), got a maximum of "
            f"{log_decay.max().item():.3g}"
        )


def initial_state_and_scale(q, v, scale, initial_state, reset, **gates):
    """The checks after the inputs' shapes: initial_state (B, H, K, V) or None, reset, scale
    (default K**-0.5), devices. Returns (compute dtype, the state in it (zeros if None),
    scale as a float)."""
    B, T, H, K = q.shape
    V = v.shape[3]
    if initial_state is not None:
        _floating("initial_state", initial_state)
        if tuple(initial_state.shape) != (B, H, K, V):
            raise ValueError(
                f"initial_state: expected shape (B, H, K, V) = {(B, H, K, V)}, "
                f"got {tuple(initial_state.shape)}"
            )
    check_reset(reset, B, T)
    if scale is None:
        scale = K**-0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale: expected a real number or None, got {type(scale).__name__}")
    check_devices("q", q, v=v, initial_state=initial_state, reset=reset, **gates)
    dtype = torch.float32 if q.dtype in _HALF else q.dtype
    if initial_state is None:
        state = q.new_zeros(B, H, K, V, dtype=dtype)
    else:
        state = initial_state.to(dtype)
    return dtype, state, float(scale)


def blocks(x: torch.Tensor, N: int, L: int) -> torch.Tensor:
    """(B, T, H, ...) -> (B, H, N, L, ...), zero-padded at the end to N·L tokens."""
    x = x.movedim(1, 2)
    pad = N * L - x.shape[2]
    if pad:
        x = F.pad(x, (0, 0) * (x.dim() - 3) + (0, pad))
    return x.reshape(*x.shape[:2], N, L, *x.shape[3:])


class ChunkMasks(NamedTuple):
    """Which pairs and tokens of a chunk of L tokens interact, documents included."""

    strict: torch.Tensor  # (L, L) bool: s < t
    pair: torch.Tensor  # (L, L), or (B, 1, N, L, L) with resets: s ≤ t in one document
    fresh: torch.Tensor | None  # (B, 1, N, L): the tokens that still see S_0; None: all do


def chunk_masks(reset: torch.Tensor | None, N: int, L: int, device) -> ChunkMasks:
    """The masks of N chunks of L tokens; reset (B, T) bool or None, True where a document
    starts (padded with False to N·L tokens)."""
    ones = torch.ones(L, L, dtype=torch.bool, device=device)
    causal, strict = ones.tril(), ones.tril(-1)
    if reset is None:
        return ChunkMasks(strict, causal, None)
    B, T = reset.shape
    r = F.pad(reset, (0, N * L - T)).reshape(B, 1, N, L)
    seg = r.long().cumsum(-1)  # documents started so far in the chunk
    pair = causal & (seg[..., :, None] == seg[..., None, :])
    return ChunkMasks(strict, pair, seg == 0)


def segment_sums(g: torch.Tensor, strict: torch.Tensor) -> torch.Tensor:
    """g (..., L) -> D (..., L, L), D[t, s] = Σ_{s<r≤t} g_r for s < t (0 on and above the
    diagonal): a cumsum down each column of the strictly lower part, so each entry is a sum of
    its own terms only (never a difference of two long cumulative sums)."""
    return torch.where(strict, g[..., :, None], 0).cumsum(-2)


def scalar_decays(g: torch.Tensor, masks: ChunkMasks) -> tuple[torch.Tensor, torch.Tensor]:
    """One log decay per token (..., N, L) -> (Γ, γ): the pairwise decays Γ[t, s] =
    exp(Σ_{s<r≤t} g_r) for s ≤ t in one document (else 0), (..., N, L, L), and the decays
    from the chunk's start γ_t = exp(Σ_{r≤t} g_r) (0 from a document's start on), (..., N, L).
    Every exponent is a sum of log decays: ≤ 0."""
    gam_pair = torch.where(masks.pair, segment_sums(g, masks.strict).exp(), 0)
    c = g.cumsum(-1)
    gam = c.exp() if masks.fresh is None else torch.where(masks.fresh, c.exp(), 0)
    return gam_pair, gam
