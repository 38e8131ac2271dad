"""Fused, in-place decode step of Interdomain Attention (docs/design.md §5) in Triton.

It reads the state once, updates it in place (X ← λ⊙X + β⊗z), and produces o = Re(Xᵛᴴ w)
with w = Ĝ p̂, p = Xᵏᵀ q. One program per (batch, head) when those fill the GPU; at small batch,
a program per (batch, head, block of modes), in two launches (the key phase, then the value
phase, which needs all of p̂) and a sum of the blocks' shares of o.
The state is the runtime contract's interleaved real tensor (B, H, R+D, 2M): rows the R key
then the D value channels, entry [.., c, 2m + {0, 1}] = (Re, Im) of X[m, c]; Ĝ is interleaved
the same way (docs/design.md §3). Accumulation in fp32.

Blocked so that no tile outgrows a few registers per thread at any R, D, M: phase 1 walks the
key state in mode blocks (update, then p for those modes, written to a (B, H, 2M) scratch row
that stays in L1/L2); after a barrier (or the next launch), phase 2 walks w's modes in blocks:
the block's rows of Ĝ times p̂, then the value state's same modes (update, and their share of
o). A matrix-vector step: fp32 multiply-adds, bound by reading the state and Ĝ, no tensor-core work.
No autotuning: the kernel writes its inputs in place (a retried config would see mutated state).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .scan_splits import target_programs
from .tiles import on_device

TILE = 1024  # elements of one (rows, modes) tile: 8 fp32 registers a thread at 4 warps
MIN_MODES = 8  # modes a program owns at least when a step's rows are split by modes


@triton.jit
def _update_state(ptr, mask, lr, li, br, bi, z):
    """X ← λ ⊙ X + β z_c in place on one (C, BM) interleaved tile; returns the new (re, im)."""
    xr = tl.load(ptr, mask=mask, other=0.0)
    xi = tl.load(ptr + 1, mask=mask, other=0.0)
    nr = lr[None, :] * xr - li[None, :] * xi + br[None, :] * z[:, None]
    ni = lr[None, :] * xi + li[None, :] * xr + bi[None, :] * z[:, None]
    tl.store(ptr, nr, mask=mask)
    tl.store(ptr + 1, ni, mask=mask)
    return nr, ni


@triton.jit
def _decays(lam_ptr, beta_ptr, h, mm, hi, M):
    """(λ re, λ im, β re, β im) of the head's modes mm below hi (interleaved (H, M, 2) inputs)."""
    ok = mm < hi
    lr = tl.load(lam_ptr + h * 2 * M + 2 * mm, mask=ok, other=0.0).to(tl.float32)
    li = tl.load(lam_ptr + h * 2 * M + 2 * mm + 1, mask=ok, other=0.0).to(tl.float32)
    br = tl.load(beta_ptr + h * 2 * M + 2 * mm, mask=ok, other=0.0).to(tl.float32)
    bi = tl.load(beta_ptr + h * 2 * M + 2 * mm + 1, mask=ok, other=0.0).to(tl.float32)
    return lr, li, br, bi


@triton.jit
def _decode_step_kernel(
    q_ptr, k_ptr, v_ptr, lam_ptr, beta_ptr, g_ptr, kst_ptr, vst_ptr, p_ptr, o_ptr,
    H, R, D, M,
    s_qb, s_qh, s_kb, s_kh, s_vb, s_vh,
    s_ksb, s_ksh, s_ksr, s_vsb, s_vsh, s_vsd,
    BR: tl.constexpr, BD: tl.constexpr, BP: tl.constexpr, BMK: tl.constexpr, BMW: tl.constexpr,
    MODES: tl.constexpr, PHASE: tl.constexpr,
):  # fmt: skip
    """Program (row, j) owns modes [j·MODES, (j+1)·MODES) of row = (b, h). PHASE 0: both
    phases (one program per row); 1: the key phase only; 2: the value phase only (p̂ complete,
    written by the launch of phase 1)."""
    pid = tl.program_id(0).to(tl.int64)
    b, h = pid // H, pid % H
    lo = tl.program_id(1) * MODES
    hi = tl.minimum(lo + MODES, M)
    rr, dd = tl.arange(0, BR), tl.arange(0, BD)
    r_ok, d_ok = rr < R, dd < D
    p_row = p_ptr + pid * 2 * M
    if PHASE != 2:
        # key state Kᵀ[r, m] ← λ_m Kᵀ[r, m] + β_m k_r, then p_m = Σ_r q_r Kᵀ[r, m]
        q = tl.load(q_ptr + b * s_qb + h * s_qh + rr, mask=r_ok, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + b * s_kb + h * s_kh + rr, mask=r_ok, other=0.0).to(tl.float32)
        for m0 in range(lo, hi, BMK):
            mm = m0 + tl.arange(0, BMK)
            lr, li, br, bi = _decays(lam_ptr, beta_ptr, h, mm, hi, M)
            k_off = kst_ptr + b * s_ksb + h * s_ksh + rr[:, None] * s_ksr + 2 * mm[None, :]
            nr, ni = _update_state(k_off, r_ok[:, None] & (mm < hi)[None, :], lr, li, br, bi, k)
            tl.store(p_row + 2 * mm, tl.sum(q[:, None] * nr, axis=0), mask=mm < hi)
            tl.store(p_row + 2 * mm + 1, tl.sum(q[:, None] * ni, axis=0), mask=mm < hi)
    if PHASE == 0:
        tl.debug_barrier()  # p̂ complete before any thread reads it whole
    if PHASE != 1:
        # w = Ĝ p̂ for the owned modes, then the value state's same modes and their o share
        v = tl.load(v_ptr + b * s_vb + h * s_vh + dd, mask=d_ok, other=0.0).to(tl.float32)
        pp = tl.arange(0, BP)
        p = tl.load(p_row + pp, mask=pp < 2 * M, other=0.0)
        o = tl.zeros((BD,), dtype=tl.float32)
        for m0 in range(lo, hi, BMW):
            mm = m0 + tl.arange(0, BMW)
            g_ok = (mm < hi)[:, None] & (pp < 2 * M)[None, :]
            g_rows = g_ptr + h * 4 * M * M + (2 * mm)[:, None] * (2 * M) + pp[None, :]
            wr = tl.sum(tl.load(g_rows, mask=g_ok, other=0.0) * p[None, :], axis=1)
            wi = tl.sum(tl.load(g_rows + 2 * M, mask=g_ok, other=0.0) * p[None, :], axis=1)
            lr, li, br, bi = _decays(lam_ptr, beta_ptr, h, mm, hi, M)
            v_off = vst_ptr + b * s_vsb + h * s_vsh + dd[:, None] * s_vsd + 2 * mm[None, :]
            ur, ui = _update_state(v_off, d_ok[:, None] & (mm < hi)[None, :], lr, li, br, bi, v)
            o += tl.sum(ur * wr[None, :] + ui * wi[None, :], axis=1)
        tl.store(o_ptr + (pid * tl.num_programs(1) + tl.program_id(1)) * D + dd, o, mask=d_ok)


def _modes_per_block(rows: int, M: int) -> int:
    """Power-of-two mode block so that a (rows, block) tile holds about TILE elements."""
    return max(1, min(triton.next_power_of_2(M), TILE // triton.next_power_of_2(rows)))


def mode_blocks(rows: int, M: int, target: int) -> int:
    """Programs per (batch, head) row: one, walking every mode, once the rows alone reach the
    target (one per SM); else enough blocks of at least MIN_MODES modes to approach it."""
    if rows >= target:
        return 1
    return min(triton.cdiv(M, MIN_MODES), triton.next_power_of_2(triton.cdiv(target, rows)))


@torch.library.custom_op("idmix::decode_step_", mutates_args=("state",))
def decode_step_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam_ri: torch.Tensor,
    beta_ri: torch.Tensor,
    G_hat: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    """q, k: (B, H, R); v: (B, H, D); lam_ri, beta_ri: (H, M, 2) [re, im]; G_hat: (H, 2M, 2M)
    interleaved; state: (B, H, R+D, 2M) fp32 interleaved, unit stride over its last dim,
    updated in place. Returns o: (B, H, D) fp32.

    Launches: one program per (b, h) when B·H fills the GPU; else a (B·H, blocks) grid of the
    key phase, then of the value phase (each program its block of modes), and the sum of the
    blocks' shares of o."""
    B, H, R = q.shape
    D, M = v.shape[-1], lam_ri.shape[1]
    if state.dtype != torch.float32 or state.stride(-1) != 1:
        raise ValueError("state: the triton decode step takes fp32 with unit stride over 2M")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    K, V = state[:, :, :R], state[:, :, R:]
    lam_ri, beta_ri = (x.float().contiguous() for x in (lam_ri, beta_ri))
    G = G_hat.float().contiguous()
    modes = triton.cdiv(M, mode_blocks(B * H, M, target_programs(q.device)))
    blocks = triton.cdiv(M, modes)  # none left empty
    o = torch.empty(B * H, blocks, D, dtype=torch.float32, device=q.device)  # shares per block
    p = torch.empty(B * H, 2 * M, dtype=torch.float32, device=q.device)  # p̂ scratch rows
    BR, BD = triton.next_power_of_2(R), triton.next_power_of_2(D)
    BP = triton.next_power_of_2(2 * M)
    phases = (0,) if blocks == 1 else (1, 2)
    with on_device(q):
        for phase in phases:
            _decode_step_kernel[(B * H, blocks)](
                q, k, v, lam_ri, beta_ri, G, K, V, p, o,
                H, R, D, M,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                K.stride(0), K.stride(1), K.stride(2), V.stride(0), V.stride(1), V.stride(2),
                BR=BR, BD=BD, BP=BP,
                BMK=min(_modes_per_block(BR, M), triton.next_power_of_2(modes)),
                BMW=max(1, min(triton.next_power_of_2(modes), TILE // (2 * BP))),
                MODES=modes, PHASE=phase,
            )  # fmt: skip
    return (o if blocks == 1 else o.sum(1)).view(B, H, D)


@decode_step_triton.register_fake
def _(q, k, v, lam_ri, beta_ri, G_hat, state):
    return q.new_empty(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float32)
