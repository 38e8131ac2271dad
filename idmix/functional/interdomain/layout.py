"""How the op's tensors are laid out: the interleaved real form, the decay values and their
tables per chunk length, the chunk layouts of the shared and per-token paths, the pieces a
sequence runs in, and packed (``cu_seqlens``) sequences.

Real form. Complex dtypes never reach the GEMM paths: a complex vector over M modes
becomes 2M interleaved reals (re₀, im₀, re₁, …), the one layout of the runtime contract: the
state (B, H, R+D, 2M) and Ĝ (H, 2M, 2M) (``view_as_complex`` of it is then free).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..powers import polar, powers


def varlen(attend, tokens, cu: list[int], initial_state, final: bool):
    """Runs attend(tokens, reset, initial_state) -> (o, state) over packed sequences.

    tokens: the per-position inputs, each (1, S, ...): q, k: (1, S, H, R), v: (1, S, H, D),
    then per-token decays if any; cu: the N+1 checked offsets; initial_state: (N, H, R+D, 2M)
    real or None; attend takes and returns states in that form. Without initial or final
    states: one call on the packed row with a reset at every sequence start. Otherwise the
    sequences are grouped by length and each group runs as one batch (exact; one call per
    distinct length). Returns (o (1, S, H, D), final states or None).
    """
    q = tokens[0]
    if initial_state is None and not final:
        reset = torch.zeros(1, q.shape[1], dtype=torch.bool, device=q.device)
        reset[0, cu[:-1]] = True
        return attend(tokens, reset, None)[0], None
    lengths = [b - a for a, b in zip(cu, cu[1:], strict=False)]
    positions, outs, members, finals = [], [], [], []
    for length in sorted(set(lengths)):
        rows = [i for i, n in enumerate(lengths) if n == length]
        starts = torch.tensor([cu[i] for i in rows], device=q.device)
        index = starts[:, None] + torch.arange(length, device=q.device)  # (n, length)
        init = None if initial_state is None else initial_state[rows]
        o, state = attend([x[0, index] for x in tokens], None, init)
        positions.append(index.flatten())
        outs.append(o.flatten(0, 1))
        members += rows
        finals.append(state)
    o = torch.cat(outs)[torch.cat(positions).argsort()][None]
    if not final:
        return o, None
    order = torch.tensor(members, device=q.device).argsort()
    return o, torch.cat(finals)[order]


def state_to_interleaved(Xk: torch.Tensor, Xv: torch.Tensor) -> torch.Tensor:
    """(Xk: (B, H, M, R), Xv: (B, H, M, D)) complex -> (B, H, R+D, 2M) interleaved real."""
    Z = torch.cat([Xk, Xv], dim=-1).transpose(-1, -2)  # (B, H, R+D, M)
    return torch.view_as_real(Z).flatten(-2).contiguous()


def interleaved_to_state(Z: torch.Tensor, R: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`state_to_interleaved` (R is the key width), as views of Z's storage:
    mode-last, the layout the decode step reads without copying."""
    Zc = torch.view_as_complex(Z.unflatten(-1, (-1, 2))).mT  # (B, H, M, R+D)
    return Zc[..., :R], Zc[..., R:]


def as_complex(x: torch.Tensor) -> torch.Tensor:
    """(..., 2M) interleaved real -> (..., M) complex view (no copy)."""
    return torch.view_as_complex(x.unflatten(-1, (-1, 2)))


def as_interleaved(x: torch.Tensor) -> torch.Tensor:
    """(..., M) complex -> (..., 2M) interleaved real view (no copy)."""
    return torch.view_as_real(x).flatten(-2)


# --- decay tables of one chunk length ---
# Data-independent decay tensors of one chunk length L, built from (λ, β).
#
# Real form used by the chunked path: a complex vector over M modes is stored as 2M reals,
# interleaved (re₀, im₀, re₁, im₁, …), so that ``torch.view_as_complex`` gives the complex
# view for free while every contraction stays a real GEMM.


class ChunkDecays(NamedTuple):
    """start: (H, L, 2M)  λ^{i+1}: decay of the chunk-start state to position i
    end: (H, L, 2M)    β λ^{L-1-s}: weight of input s in the chunk-end state; read backwards it
                       is also the intra-chunk kernel β λ^{t-s} by lag t - s
    chunk: (H, 2M)     λ^L
    """

    start: torch.Tensor
    end: torch.Tensor
    chunk: torch.Tensor


def chunk_decays(lam_ri: torch.Tensor, beta_ri: torch.Tensor, L: int) -> ChunkDecays:
    """lam_ri, beta_ri: (H, M, 2) real views of λ and β. Every exponent used is >= 0."""
    log_mag, theta = polar(lam_ri)
    br, bi = beta_ri[..., 0][:, None, :], beta_ri[..., 1][:, None, :]  # (H, 1, M)
    pr, pi = powers(log_mag, theta, torch.arange(L + 1, device=lam_ri.device))  # λ^0..λ^L

    def interleave(re, im):
        return torch.stack([re, im], dim=-1).flatten(-2)

    by_lag = interleave(br * pr[:, :L] - bi * pi[:, :L], br * pi[:, :L] + bi * pr[:, :L])
    return ChunkDecays(
        interleave(pr[:, 1:], pi[:, 1:]), by_lag.flip(1), interleave(pr[:, -1], pi[:, -1])
    )


# --- the shared-decay chunk layout ---
# Layouts of the shared-decay chunked path: a piece of the sequence as chunks, and document
# starts as masks.
#
# Inside a segment: q (B, H, N, L, R); zT = [kᵀ; vᵀ] (B, H, N, R+D, L); per-position mode vectors
# (.., L, 2M) and states (.., R+D, 2M) = [Xᵏ | Xᵛ]ᵀ, both in interleaved real form.


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


# --- the per-token chunk layout ---
# The per-token path's chunk layout and the decays it implies (``selective``): a piece of
# the sequence as chunks (B, H, n, L, ...), with the magnitude and phase of the decays kept apart
# (every exponent ≤ 0).


def chunks(x: torch.Tensor, n: int, L: int) -> torch.Tensor:
    """(B, T, H, ...) -> (B, H, n, L, ...), zero-padded at the end to n·L positions."""
    pad = n * L - x.shape[1]
    if pad:
        x = torch.cat([x, x.new_zeros(x.shape[0], pad, *x.shape[2:])], 1)
    return x.unflatten(1, (n, L)).movedim(3, 1)


def unchunk_tokens(x: torch.Tensor, T: int) -> torch.Tensor:
    """(B, H, n, L, ...) -> (B, T, H, ...): the inverse of :func:`chunks`."""
    return x.movedim(1, 3).flatten(1, 2)[:, :T]


class Chunked(NamedTuple):
    """One call's inputs cut into chunks (B, H, n, L, ...) and the decays they imply.

    q, k, v: the tokens; beta, lam (.., L, M) complex; starts (B, 1, n, L) bool (document
    starts) or None; doc (B, 1, n, L) document index within the chunk (float) or None;
    rho (.., L, M): the cumulative sum of log|λ| over the chunk (≤ 0, non-increasing);
    u (.., L, M): the running product of λ/|λ| (unit phasors); scores A[t, s] = q_t·k_s
    (.., L, L), not masked (the pair kernel is exactly 0 on every pair that does not count);
    F[t] = exp(ρ_t) u_t where no document starts in [0, t], else 0; De[s] = exp(ρ_{L−1} − ρ_s)
    u_{L−1} conj(u_s) where s is in the chunk's last document, else 0 (.., L, M) each;
    c: the cumulative sum of log λ with wrapped phases, for the Triton kernels only (else None).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    beta: torch.Tensor
    lam: torch.Tensor
    starts: torch.Tensor | None
    doc: torch.Tensor | None
    rho: torch.Tensor
    u: torch.Tensor
    scores: torch.Tensor
    F: torch.Tensor
    De: torch.Tensor
    c: torch.Tensor | None


def prepare(q, k, v, lam_ri, beta_ri, reset, L: int, with_c: bool = False) -> Chunked:
    B, T = q.shape[:2]
    n = -(-T // L)
    # padding: λ = 1 (log|λ| = 0, phasor 1), β = 0, z = 0 leaves the state unchanged past T
    lam = torch.view_as_complex(lam_ri.contiguous())
    sq = lam_ri.square().sum(-1)
    tiny = torch.finfo(sq.dtype).tiny
    rho = chunks(0.5 * torch.log(sq.clamp_min(tiny)), n, L).cumsum(3)  # (B, H, n, L, M)
    phasor = torch.where(sq > tiny, lam * torch.rsqrt(sq.clamp_min(tiny)), 1)
    u = (chunks(phasor - 1, n, L) + 1).cumprod(3)
    qc, kc, vc = (chunks(x, n, L) for x in (q, k, v))
    F = u * torch.exp(rho)
    # to the chunk end: the exponent rho_{L-1} - rho_s is never > 0
    De = (u[..., -1:, :] * u.conj_physical()) * torch.exp(rho[..., -1:, :] - rho)
    starts = doc = None
    if reset is not None:
        starts = chunks(reset[..., None], n, L)  # (B, 1, n, L)
        doc = starts.cumsum(3, dtype=rho.dtype)
        F = torch.where((doc == 0)[..., None], F, 0)
        # s in the chunk's last document
        De = torch.where((doc == doc[..., -1:])[..., None], De, 0)
    beta = chunks(torch.view_as_complex(beta_ri.contiguous()), n, L)
    c = None
    if with_c:  # ρ is its real part; the phases are wrapped per step (atan2) before the sum
        theta = torch.atan2(lam_ri[..., 1], lam_ri[..., 0])
        c = torch.complex(rho, chunks(theta, n, L).cumsum(3))
    return Chunked(qc, kc, vc, beta, chunks(lam, n, L), starts, doc, rho, u, qc @ kc.mT, F, De, c)


def parts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(re, im) of a complex tensor, each contiguous."""
    return x.real.contiguous(), x.imag.contiguous()


class Piece(NamedTuple):
    """Positions [t0, t1) as chunks of length L."""

    t0: int
    t1: int
    L: int
