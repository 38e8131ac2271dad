"""Fused, in-place decode step of Interdomain Attention (docs/design.md §5) in Triton.

One program per (batch, head): it reads the state once, updates it in place
(X ← λ⊙X + β⊗z), and produces o = Re(Xᵛᴴ w) with w = Ĝ p̂, p = Xᵏᵀ q.
The state is the runtime contract's interleaved real tensor (B, H, R+D, 2M): rows the R key
then the D value channels, entry [.., c, 2m + {0, 1}] = (Re, Im) of X[m, c]; Ĝ is interleaved
the same way (docs/design.md §3). Accumulation in fp32.
No autotuning: the kernel writes its inputs in place (a retried config would see mutated state).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _update_state(ptr, mask, lr, li, br, bi, z):
    """X ← λ ⊙ X + β z_c in place on one (C, M) interleaved tile; returns the new (re, im)."""
    xr = tl.load(ptr, mask=mask, other=0.0)
    xi = tl.load(ptr + 1, mask=mask, other=0.0)
    nr = lr[None, :] * xr - li[None, :] * xi + br[None, :] * z[:, None]
    ni = lr[None, :] * xi + li[None, :] * xr + bi[None, :] * z[:, None]
    tl.store(ptr, nr, mask=mask)
    tl.store(ptr + 1, ni, mask=mask)
    return nr, ni


@triton.jit
def _decode_step_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    lam_ptr,
    beta_ptr,
    g_ptr,
    kst_ptr,
    vst_ptr,
    o_ptr,
    H,
    R,
    D,
    M,
    s_qb,
    s_qh,
    s_kb,
    s_kh,
    s_vb,
    s_vh,
    s_ksb,
    s_ksh,
    s_ksr,
    s_vsb,
    s_vsh,
    s_vsd,
    s_ob,
    s_oh,
    BR: tl.constexpr,
    BD: tl.constexpr,
    BM: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    b, h = pid // H, pid % H
    rr, dd, mm = tl.arange(0, BR), tl.arange(0, BD), tl.arange(0, BM)
    r_ok, d_ok, m_ok = rr < R, dd < D, mm < M
    # λ, β of this head (interleaved re/im)
    lr = tl.load(lam_ptr + h * 2 * M + 2 * mm, mask=m_ok, other=0.0).to(tl.float32)
    li = tl.load(lam_ptr + h * 2 * M + 2 * mm + 1, mask=m_ok, other=0.0).to(tl.float32)
    br = tl.load(beta_ptr + h * 2 * M + 2 * mm, mask=m_ok, other=0.0).to(tl.float32)
    bi = tl.load(beta_ptr + h * 2 * M + 2 * mm + 1, mask=m_ok, other=0.0).to(tl.float32)
    q = tl.load(q_ptr + b * s_qb + h * s_qh + rr, mask=r_ok, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + b * s_kb + h * s_kh + rr, mask=r_ok, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + b * s_vb + h * s_vh + dd, mask=d_ok, other=0.0).to(tl.float32)
    # key state: Kᵀ[r, m] ← λ_m Kᵀ[r, m] + β_m k_r
    km = r_ok[:, None] & m_ok[None, :]
    k_off = kst_ptr + b * s_ksb + h * s_ksh + rr[:, None] * s_ksr + 2 * mm[None, :]
    nr, ni = _update_state(k_off, km, lr, li, br, bi, k)
    # p = Σ_r q_r Kᵀ[r, :]
    pr = tl.sum(q[:, None] * nr, axis=0)
    pi = tl.sum(q[:, None] * ni, axis=0)
    # w = Ĝ p̂, Ĝ interleaved (2M, 2M): the four M×M sub-grids of (even, odd) rows × columns
    gm = m_ok[:, None] & m_ok[None, :]
    g_off = g_ptr + h * 4 * M * M + (2 * mm)[:, None] * (2 * M) + (2 * mm)[None, :]
    g11 = tl.load(g_off, mask=gm, other=0.0)
    g12 = tl.load(g_off + 1, mask=gm, other=0.0)
    g21 = tl.load(g_off + 2 * M, mask=gm, other=0.0)
    g22 = tl.load(g_off + 2 * M + 1, mask=gm, other=0.0)
    wr = tl.sum(g11 * pr[None, :] + g12 * pi[None, :], axis=1)
    wi = tl.sum(g21 * pr[None, :] + g22 * pi[None, :], axis=1)
    # value state and readout: o_d = Σ_m Re Vᵀ[d, m] wr_m + Im Vᵀ[d, m] wi_m
    vm = d_ok[:, None] & m_ok[None, :]
    v_off = vst_ptr + b * s_vsb + h * s_vsh + dd[:, None] * s_vsd + 2 * mm[None, :]
    ur, ui = _update_state(v_off, vm, lr, li, br, bi, v)
    o = tl.sum(ur * wr[None, :] + ui * wi[None, :], axis=1)
    tl.store(o_ptr + b * s_ob + h * s_oh + dd, o, mask=d_ok)


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
    updated in place. Returns o: (B, H, D) fp32."""
    B, H, R = q.shape
    D, M = v.shape[-1], lam_ri.shape[1]
    if state.dtype != torch.float32 or state.stride(-1) != 1:
        raise ValueError("state: the triton decode step takes fp32 with unit stride over 2M")
    K, V = state[:, :, :R], state[:, :, R:]
    lam_ri, beta_ri = (x.float().contiguous() for x in (lam_ri, beta_ri))
    G = G_hat.float().contiguous()
    o = torch.empty(B, H, D, dtype=torch.float32, device=q.device)
    _decode_step_kernel[(B * H,)](
        q,
        k,
        v,
        lam_ri,
        beta_ri,
        G,
        K,
        V,
        o,
        H,
        R,
        D,
        M,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        K.stride(0),
        K.stride(1),
        K.stride(2),
        V.stride(0),
        V.stride(1),
        V.stride(2),
        o.stride(0),
        o.stride(1),
        BR=triton.next_power_of_2(R),
        BD=triton.next_power_of_2(D),
        BM=triton.next_power_of_2(M),
    )
    return o


@decode_step_triton.register_fake
def _(q, k, v, lam_ri, beta_ri, G_hat, state):
    return q.new_empty(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float32)
