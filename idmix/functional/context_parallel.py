"""The chunked op with the sequence split across the ranks of a process group.

Rank r holds positions [s_r, s_r + T_r) of every sequence. Its final state is linear in its
initial state, Z_out = Λ_r ⊙ Z_in + Z_r (Λ_r: the product of the slice's decays, 0 once a
document starts in it; Z_r: the slice's final state from zero), so one all-gather of
(Z_r, Λ_r) gives every rank its initial state, Z_in(r) = Σ_{j<r} (Π_{j<i<r} Λ_i) ⊙ Z_j, and
the rank then runs the chunked op from it. The backward is the all-gather's: each rank's
(Z_r, Λ_r) receives the gradients of every later rank. Z_r and Λ_r are a weighted sum over
the slice (weights in float64, so their phases stay exact at any length), not a second pass
of the op.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .collectives import all_gather_with_grad
from .interdomain.api import compute_dtypes, interdomain_attention
from .interdomain.validation import check_qkv, check_real_params, check_reset


def _complex(x_ri: torch.Tensor) -> torch.Tensor:
    """(..., 2) [re, im] -> complex128 (...)."""
    x = x_ri.double()
    return torch.complex(x[..., 0], x[..., 1])


def _log_suffix(lam_ri: torch.Tensor, B: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ_{s>t} log λ_s for each t: (B, T, H, M), Σ_s log λ_s: (B, H, M)), complex128; λ
    shared (H, M, 2) or per token (B, T, H, M, 2)."""
    log_lam = torch.log(_complex(lam_ri))
    if log_lam.dim() == 2:  # shared: (T - 1 - t) log λ
        steps = torch.arange(T - 1, -1, -1, device=lam_ri.device, dtype=torch.float64)
        after = steps[:, None, None] * log_lam
        return after.expand(B, T, *log_lam.shape), (T * log_lam).expand(B, *log_lam.shape)
    inclusive = log_lam.flip(1).cumsum(1).flip(1)  # Σ_{s>=t}
    after = torch.cat([inclusive[:, 1:], torch.zeros_like(inclusive[:, :1])], dim=1)
    return after, inclusive[:, 0]


def slice_transfer(k, v, lam_ri, beta_ri, reset=None) -> tuple[torch.Tensor, torch.Tensor]:
    """What a slice hands to later ones: (Z_r: (B, H, R+D, 2M) its final state from zero,
    Λ_r: (B, H, M, 2) the factor it applies to its initial state), in the compute dtype.
    k: (B, T, H, R); v: (B, T, H, D); lam_ri, beta_ri: (H, M, 2) or (B, T, H, M, 2); reset:
    (B, T) bool or None."""
    rdtype, _ = compute_dtypes(k)
    B, T = k.shape[:2]
    after, total = _log_suffix(lam_ri, B, T)
    if reset is not None:  # tokens before the slice's last document start reach nothing after
        later = reset.flip(1).long().cumsum(1).flip(1)  # resets at s >= t
        reach = torch.cat([later[:, 1:], torch.zeros_like(later[:, :1])], 1) == 0
        keeps = reach[:, 0] & ~reset[:, 0]  # no reset anywhere in the slice
    weight = torch.exp(after) * _complex(beta_ri)  # (B, T, H, M): Π_{s>t} λ_s · β_t
    lam = torch.exp(total)  # (B, H, M)
    if reset is not None:
        weight = weight * reach[:, :, None, None]
        lam = lam * keeps[:, None, None]
    z = torch.cat([k, v], dim=-1).to(rdtype)  # (B, T, H, C)
    re, im = (torch.einsum("bthm,bthc->bhcm", w.to(rdtype), z) for w in (weight.real, weight.imag))
    state = torch.stack([re, im], dim=-1).flatten(-2)  # (B, H, C, 2M) interleaved
    return state, torch.stack([lam.real, lam.imag], dim=-1).to(rdtype)


def carry(lam: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Λ ⊙ Z: lam (B, H, M, 2), state (B, H, C, 2M) interleaved -> (B, H, C, 2M)."""
    B, H, C, M2 = state.shape
    zr, zi = state.view(B, H, C, M2 // 2, 2).unbind(-1)
    lr, li = (x[:, :, None] for x in lam.unbind(-1))
    return torch.stack([lr * zr - li * zi, lr * zi + li * zr], dim=-1).view(B, H, C, M2)


def incoming_state(own_state, own_lam, group=None, initial_state=None, gather=None):
    """This rank's initial state from every rank's (Z_r, Λ_r), by one all-gather of them:
    initial_state (zeros if None) on the first rank. Every rank's result depends on the
    gathered tensor, so that every rank's backward joins the gradient all-reduce. gather:
    (x, label) -> (world, ...), default ``all_gather_with_grad`` over group."""
    rank = dist.get_rank(group)
    B, H, C, M2 = own_state.shape
    packed = torch.cat([own_state.flatten(1), own_lam.flatten(1)], dim=1)
    if gather is None:
        gathered = all_gather_with_grad(packed, group, "state")  # (world, B, n)
    else:
        gathered = gather(packed, "state")
    Z = torch.zeros_like(own_state) if initial_state is None else initial_state
    for j in range(rank):
        Z_j = gathered[j, :, : H * C * M2].view(B, H, C, M2)
        lam_j = gathered[j, :, H * C * M2 :].view(B, H, M2 // 2, 2)
        Z = Z_j if j == 0 else carry(lam_j, Z) + Z_j
    return Z + 0 * gathered[rank].sum()


def interdomain_attention_context_parallel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam_ri: torch.Tensor,
    beta_ri: torch.Tensor,
    G_hat: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    group=None,
    gather=None,
    chunk_size: int = 64,
    reset: torch.Tensor | None = None,
    backend: str = "auto",
    precision: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``interdomain_attention`` (real form, impl "chunked") on this rank's slice of the sequence.

    Every rank of group calls it with its contiguous slice, in rank order: q, k, v (B, T_r, ·)
    (T_r may differ between ranks), reset (B, T_r) for the slice (documents may start anywhere,
    at a slice's first position too, and span several slices), lam_ri, beta_ri shared
    (H, M, 2) or this slice's per-token decays (B, T_r, H, M, 2), G_hat as in the op.
    initial_state: the state before the whole sequence, read on rank 0 only (None elsewhere).
    gather: None, or the all-gather to use, (x, label) -> (world, ...) (a model's layers pass
    ``ContextParallel.gather``, which orders their collectives).
    Returns (o (B, T_r, H, D), the state after this rank's slice); the last rank's is the
    sequence's final state. A dead rank makes the others fail when group's timeout expires.
    """
    B, T, H, _, _ = check_qkv(q, k, v)
    check_real_params(lam_ri, beta_ri, G_hat, H, lead=(B, T))
    check_reset(reset, B, T)
    if initial_state is not None and dist.get_rank(group) != 0:
        raise ValueError(
            "initial_state: the state before the sequence belongs to rank 0; pass None on the "
            f"other ranks (this is rank {dist.get_rank(group)})"
        )
    own_state, own_lam = slice_transfer(k, v, lam_ri, beta_ri, reset)
    if initial_state is not None:
        own_state = carry(own_lam, initial_state.to(own_state.dtype)) + own_state
    first = initial_state if initial_state is None else initial_state.to(own_state.dtype)
    start = incoming_state(own_state, own_lam, group, first, gather)
    return interdomain_attention(
        q, k, v, lam_ri, beta_ri, G_hat, initial_state=start, output_final_state=True,
        chunk_size=chunk_size, reset=reset, backend=backend, precision=precision,
    )  # fmt: skip
