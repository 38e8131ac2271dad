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
    Space,
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

# (num_warps, BM) spill-free at chunk 64 and the builders' heads (benchmarks/offline_compile.py)
_SPACE = Space(sm90=[(8, 16)], sm80=[(8, 8)])


@triton.jit
def _one_side(
    g_base, s_gc, end_base, s_dl, ge_base, s_el, x_base, s_xl, in_base, s_il, s_if, out_base,
    s_ol, reach, L, F, M, PREC: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """One side of the state (its F key or value rows, G at g_base): for each block of BK
    features, dz = Σ_m end[s, m] G[f, m] where z_s reaches the chunk end, plus the intra-chunk
    part (in_base, strides s_il, s_if), zero where the input (x_base) is not finite, stored at
    out_base; and ge[s] += Σ_f z[s, f] G[f] into the end partials."""
    BL: tl.constexpr = reach.shape[0]
    ll = tl.arange(0, BL)
    for f0 in range(0, F, BK):
        ff = f0 + tl.arange(0, BK)
        x_raw = load_tile(x_base, ll, ff, s_xl, 1, L, F)
        z = tl.where(reach, finite(x_raw), 0.0)
        acc = tl.zeros((BL, BK), dtype=tl.float32)
        for m0 in range(0, M, BM):
            cc = 2 * m0 + tl.arange(0, 2 * BM)
            end = load_tile(end_base, ll, cc, s_dl, 1, L, 2 * M)
            G = load_tile(g_base, ff, cc, s_gc, 1, F, 2 * M)
            acc = mma(end, tl.trans(G), acc, PREC)
            ge = load_tile(ge_base, ll, cc, s_el, 1, L, 2 * M)
            store_tile(ge_base, ll, cc, s_el, 1, L, 2 * M, mma(z, G, ge, PREC))
        d = tl.where(reach, acc, 0.0) + load_tile(in_base, ll, ff, s_il, s_if, L, F)
        store_tile(out_base, ll, ff, s_ol, 1, L, F, tl.where(is_finite(x_raw), d, 0.0))


# it adds into the end partials: autotuning must put them back after each timed run
@triton.autotune(
    configs=_SPACE.configs, key=["BL", "R", "D", "M", "HAS_RESET", "PREC"],
    prune_configs_by=_SPACE.prune, restore_value=["gend_ptr"],
)  # fmt: skip
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
    BL: tl.constexpr, BKR: tl.constexpr, BKD: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    b, h, n = program_bhn(H, N)
    reach = tl.full((BL, 1), True, tl.int1)  # no start in (s, chunk end]: z_s reaches it
    if HAS_RESET:
        reach = _chunk_masks(_chunk_starts(reset_ptr, b, n, s_rb, s_rn, L, BL, True))[0][:, None]
    g_base = ginc_ptr + b * s_gb + h * s_gh + n * s_gn
    end_base = dend_ptr + h * s_dh
    ge_base = gend_ptr + b * s_eb + h * s_eh + n * s_en
    _one_side(
        g_base, s_gc, end_base, s_dl, ge_base, s_el,
        k_ptr + b * s_kb + h * s_kh + n * s_kn, s_kl,
        dkT_ptr + b * s_tb + h * s_th + n * s_tn, 1, s_tr,
        dk_ptr + b * s_ab + h * s_ah + n * s_an, s_al, reach, L, R, M, PREC, BKR, BM,
    )  # fmt: skip
    _one_side(
        g_base + R * s_gc, s_gc, end_base, s_dl, ge_base, s_el,
        v_ptr + b * s_vb + h * s_vh + n * s_vn, s_vl,
        dvin_ptr + b * s_ib + h * s_ih + n * s_in, s_il, 1,
        dv_ptr + b * s_cb + h * s_ch + n * s_cn, s_cl, reach, L, D, M, PREC, BKD, BM,
    )  # fmt: skip


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
    with on_device(k):
        _input_grads_kernel[(B * H * N,)](
            g_inc, d_end, k, v, r, dkT, dv_in, g_end, dk, dv,
            H, N, L, R, D, M,
            *g_inc.stride()[:4], *d_end.stride()[:2], *k.stride()[:4], *v.stride()[:4],
            s_rb, s_rn, *dkT.stride()[:4], *dv_in.stride()[:4], *g_end.stride()[:4],
            *dk.stride()[:4], *dv.stride()[:4],
            HAS_RESET=has_reset, PREC=PRECISION_CODES[precision], BL=BL or block(L),
            BKR=min(64, block(R)), BKD=min(64, block(D)),
        )  # fmt: skip
