"""The last step of the chunked op's backward, one program per (batch, head, chunk): the
gradients of k and v completed and written in their (B, T, H, ·) layout and dtype.

Each input z_s = [k_s; v_s] reaches the chunk-end state through βλ^{L-1-s} (``end``), so its
gradient gains dz_s = G_{n+1} end[s]ᵀ (G the gradient of the chunk's increment, from the
reverse scan) on top of the intra-chunk part the pass kernels wrote, and the end table's
gradient gains z_sᵀ G_{n+1}, added into the per-program partials. A document start later in the
chunk cuts z_s off the chunk end (both terms masked); a non-finite input gets a zero gradient
(containment). Every product is a tile `mma` at the PREC precision with fp32 accumulation.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .chunk_states import _chunk_masks, _chunk_starts
from .tiles import (
    PRECISION_CODES,
    block,
    finite,
    is_finite,
    load_tile,
    mma,
    on_device,
    program_bhn,
    reset_args,
    store_tile,
)


@triton.jit
def _through_state(
    g_base, s_gc, end_base, s_dl, ge_base, s_el, z, L, rows, n_rows, M,
    PREC: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """For one side (the key or the value rows of the state): returns Σ_m end[s, m] G[row, m]
    (BL, rows) and adds zᵀ-weighted G into the end partials: ge[s] += Σ_row z[s, row] G[row]."""
    ll = tl.arange(0, z.shape[0])
    acc = tl.zeros((z.shape[0], rows.shape[0]), dtype=tl.float32)
    for m0 in range(0, M, BM):
        cc = 2 * m0 + tl.arange(0, 2 * BM)
        end = load_tile(end_base, ll, cc, s_dl, 1, L, 2 * M)
        G = load_tile(g_base, rows, cc, s_gc, 1, n_rows, 2 * M)
        acc = mma(end, tl.trans(G), acc, PREC)
        ge = load_tile(ge_base, ll, cc, s_el, 1, L, 2 * M)
        store_tile(ge_base, ll, cc, s_el, 1, L, 2 * M, mma(z, G, ge, PREC))
    return acc


@triton.jit(do_not_specialize=["N", "L"])
def _input_grads_kernel(
    ginc_ptr, dend_ptr, k_ptr, v_ptr, reset_ptr, dkT_ptr, dvin_ptr, gend_ptr, dk_ptr, dv_ptr,
    H, N, L, R, D, M,
    s_gb, s_gh, s_gn, s_gc,
    s_dh, s_dl,
    s_kb, s_kh, s_kn, s_kl,
    s_vb, s_vh, s_vn, s_vl,
    s_rb, s_rn,
    s_tb, s_th, s_tn, s_tr,
    s_ib, s_ih, s_in, s_il,
    s_eb, s_eh, s_en, s_el,
    s_ab, s_ah, s_an, s_al,
    s_cb, s_ch, s_cn, s_cl,
    HAS_RESET: tl.constexpr, PREC: tl.constexpr,
    BL: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    b, h, n = program_bhn(H, N)
    ll, rr, dd = tl.arange(0, BL), tl.arange(0, BR), tl.arange(0, BD)
    reach = tl.full((BL, 1), True, tl.int1)  # no start in (s, chunk end]: z_s reaches it
    if HAS_RESET:
        reach = _chunk_masks(_chunk_starts(reset_ptr, b, n, s_rb, s_rn, L, BL, True))[0][:, None]
    g_base = ginc_ptr + b * s_gb + h * s_gh + n * s_gn
    end_base = dend_ptr + h * s_dh
    ge_base = gend_ptr + b * s_eb + h * s_eh + n * s_en
    k_raw = load_tile(k_ptr + b * s_kb + h * s_kh + n * s_kn, ll, rr, s_kl, 1, L, R)
    zk = tl.where(reach, finite(k_raw), 0.0)
    dk = _through_state(g_base, s_gc, end_base, s_dl, ge_base, s_el, zk, L, rr, R, M, PREC, BM)
    dkT = load_tile(dkT_ptr + b * s_tb + h * s_th + n * s_tn, ll, rr, 1, s_tr, L, R)
    dk = tl.where(reach, dk, 0.0) + dkT
    dk = tl.where(is_finite(k_raw), dk, 0.0)
    store_tile(dk_ptr + b * s_ab + h * s_ah + n * s_an, ll, rr, s_al, 1, L, R, dk)
    v_raw = load_tile(v_ptr + b * s_vb + h * s_vh + n * s_vn, ll, dd, s_vl, 1, L, D)
    zv = tl.where(reach, finite(v_raw), 0.0)
    dv = _through_state(
        g_base + R * s_gc, s_gc, end_base, s_dl, ge_base, s_el, zv, L, dd, D, M, PREC, BM
    )
    dv_in = load_tile(dvin_ptr + b * s_ib + h * s_ih + n * s_in, ll, dd, s_il, 1, L, D)
    dv = tl.where(reach, dv, 0.0) + dv_in
    dv = tl.where(is_finite(v_raw), dv, 0.0)
    store_tile(dv_ptr + b * s_cb + h * s_ch + n * s_cn, ll, dd, s_cl, 1, L, D, dv)


# (num_warps, BM): spill-free on sm_90 and sm_80 at chunk 64 (benchmarks/offline_compile.py)
INPUT_GRADS_CONFIG = (8, 16)


def input_grads(
    g_inc, d_end, k, v, dkT, dv_in, g_end, dk, dv, reset=None, precision="ieee", BL=None
):
    """g_inc: (B, H, n, R+D, 2M) the increments' gradients (chunk_states_backward); d_end:
    (H, L, 2M) the end table; k, v: chunk views of the (B, T, H, ·) inputs; dkT: (B, H, n, R,
    L) and dv_in: (B, H, n, L, D), the intra-chunk parts (fp32); g_end: (B, H, n, L, 2M) end
    partials, added into; dk, dv: chunk views of the (B, T, H, ·) gradients, written in their
    dtype; reset: (B, n, L) uint8 or None."""
    B, H, N, L, R = k.shape
    D, M = v.shape[-1], d_end.shape[-1] // 2
    r, s_rb, s_rn, has_reset = reset_args(reset, k)
    warps, bm = INPUT_GRADS_CONFIG
    with on_device(k):
        _input_grads_kernel[(B * H * N,)](
            g_inc, d_end, k, v, r, dkT, dv_in, g_end, dk, dv,
            H, N, L, R, D, M,
            *g_inc.stride()[:4], *d_end.stride()[:2], *k.stride()[:4], *v.stride()[:4],
            s_rb, s_rn, *dkT.stride()[:4], *dv_in.stride()[:4], *g_end.stride()[:4],
            *dk.stride()[:4], *dv.stride()[:4],
            HAS_RESET=has_reset, PREC=PRECISION_CODES[precision], BL=BL or block(L),
            BR=block(R), BD=block(D), BM=min(bm, block(M)), num_warps=warps, num_stages=1,
        )  # fmt: skip
