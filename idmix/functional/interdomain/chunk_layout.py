"""Layouts of the shared-decay chunked path: a piece of the sequence as chunks, and document
starts as masks.

Inside a segment: q (B, H, N, L, R); zT = [kᵀ; vᵀ] (B, H, N, R+D, L); per-position mode vectors
(.., L, 2M) and states (.., R+D, 2M) = [Xᵏ | Xᵛ]ᵀ, both in interleaved real form.
"""

from __future__ import annotations

import torch


class DocMasks:
    """Document boundaries inside a segment (from reset: (B, N, L), True where a document
    starts), as 0/1 float masks broadcastable against (B, H, N, ...) tensors. All masked
    values are finite, so masking by multiplication is exact.

    same (B, 1, N, L, L): t and s in the same document; valid (B, 1, N, L, 1): no start in
    [chunk start, t], so the chunk-start state reaches t; contrib (B, 1, N, 1, L): no start in
    (s, chunk end], so z_s reaches the chunk-end state; carry (B, N): no start in the chunk.
    """

    def __init__(self, reset: torch.Tensor, dtype):
        self.reset = reset
        d = reset.long().cumsum(-1)  # starts so far within the chunk, (B, N, L)
        self.same = (d[..., :, None] == d[..., None, :]).to(dtype)[:, None]
        self.valid = (d == 0).to(dtype)[:, None, ..., None]
        self.contrib = (d == d[..., -1:]).to(dtype)[:, None, :, None, :]
        self.carry = (d[..., -1] == 0).to(dtype)


def doc_masks(reset: torch.Tensor | None, n: int, L: int, dtype) -> DocMasks | None:
    """DocMasks of one piece's reset (B, n·L), or None without resets."""
    return None if reset is None else DocMasks(reset.unflatten(1, (n, L)), dtype)


def reset_of(masks: DocMasks | None) -> torch.Tensor | None:
    """The (B, N, L) document starts behind masks (what the kernels take), or None."""
    return None if masks is None else masks.reset


def mask(x: torch.Tensor, masks: DocMasks | None, name: str) -> torch.Tensor:
    """x times the mask called name, or x itself without document starts."""
    return x if masks is None else x * getattr(masks, name)


def chunk_view(x: torch.Tensor, n: int, L: int, transpose: bool) -> torch.Tensor:
    """(B, n·L, H, F) -> view (B, H, n, L, F), or (B, H, n, F, L) if transpose."""
    x = x.unflatten(1, (n, L))  # (B, n, L, H, F)
    return x.permute(0, 3, 1, 4, 2) if transpose else x.permute(0, 3, 1, 2, 4)


def unchunk(x: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """(B, H, n, L, F) (or (B, H, n, F, L) if transposed) -> view (B, n, L, H, F), which the
    segment driver writes into positions [t0, t0 + n·L) of a (B, T, H, F) tensor."""
    x = x.transpose(-1, -2) if transposed else x
    return x.permute(0, 2, 3, 1, 4)


def to_chunks(x: torch.Tensor, n: int, L: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, n·L, H, F) -> (B, H, n, L, F) copy in dtype (the cast rides on the copy)."""
    return chunk_view(x, n, L, transpose=False).to(dtype, memory_format=torch.contiguous_format)


def to_chunks_T(k: torch.Tensor, v: torch.Tensor, n: int, L: int, dtype) -> torch.Tensor:
    """zT = [kᵀ; vᵀ] per chunk: (B, H, n, R+D, L) in dtype, one copy from the (B, n·L, H, ·)
    inputs."""
    B, _, H, R = k.shape
    zT = k.new_empty(B, H, n, R + v.shape[-1], L, dtype=dtype)
    zT[..., :R, :] = chunk_view(k, n, L, transpose=True)
    zT[..., R:, :] = chunk_view(v, n, L, transpose=True)
    return zT
