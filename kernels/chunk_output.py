"""The chunked forward's output in one kernel: pass 1, w̃ = Ĝ p and pass 2 of chunk_intra.py
fused, one program per (batch, head, chunk), so that p and w̃ never leave the chip and o is
written once, in its tensor's dtype.

    p_t = λ^{t+1} ⊙ (Xᵏ_start q_t) + Σ_{s≤t} (q_t · k_s) β λ^{t-s}
    w̃_t = Ĝ p_t
    o_t = Re(Xᵛ_startᴴ (conj(λ^{t+1}) ⊙ w̃_t)) + Σ_{s≤t} Re(conj(β λ^{t-s}) · w̃_t) v_s

Blocking: w̃ is produced one block of BM output modes at a time, each the sum over input mode
blocks of p's block times Ĝ's (BM, BM) tile, with p's block formed on chip where it is used:
with nb = M / BM blocks p is formed nb times (nb× pass 1's products), the price of holding
(L, BM) tiles instead of (L, M). For the paper head only 8 warps with BM = 16 (sm_90) or BM = 8
(sm_80) compile without spills (wider blocks and 4 warps spill), and only heads of at most 64
features and modes at chunks of at most 64 (fits_fused_output): the op sends the others
through pass 1, a GEMM and pass 2 (chunk_intra.py). Each w̃ block is consumed at once: its
start-state part goes into o, its lag weights into the (t, j) tile, sheared once after the loop
into the (t, s) weights that multiply v. Products at the PREC precision (tiles.mma); decays,
states and accumulators fp32. Containment as in pass 2: inputs zeroed at load, the poisoned
rows written as NaN.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .chunk_intra import lag_part, lagged_scores, p_block, start_part, store_output
from .tiles import (
    PRECISION_CODES,
    Space,
    block,
    flags_strides,
    load_tile,
    mma,
    on_device,
    program_bhn,
    reset_args,
)

# Where the fused kernel holds its tiles without spilling (benchmarks/offline_compile.py, sm_90
# and sm_80): features, modes and chunk up to 64; others take pass 1, a GEMM and pass 2.
MAX_FUSED = 64


def fits_fused_output(R: int, D: int, M: int, L: int) -> bool:
    """Whether chunk_output serves heads of R key, D value features and M modes at chunk L."""
    return max(block(R), block(D), block(M), block(L)) <= MAX_FUSED


# Keys: the chunk's block BL, never L, T or B (a ragged tail reuses the main chunk's kernel).
_KEY = ["BL", "R", "D", "M", "HAS_RESET", "PREC"]
_SPACE = Space(sm90=[(8, 16)], sm80=[(8, 8)])


@triton.autotune(configs=_SPACE.configs, key=_KEY, prune_configs_by=_SPACE.prune)
@triton.jit(do_not_specialize=["N", "L"])
def _output_kernel(
    q_ptr, k_ptr, v_ptr, st_ptr, dstart_ptr, dend_ptr, g_ptr, reset_ptr, poison_ptr, o_ptr,
    H, N, L, R, D, M,
    s_qb, s_qh, s_qn, s_ql,
    s_kb, s_kh, s_kn, s_kl,
    s_vb, s_vh, s_vn, s_vl,
    s_sb, s_sh, s_sn, s_sc,
    s_dh, s_dl,
    s_gh, s_go, s_gi,
    s_rb, s_rn,
    s_fb, s_fh, s_fn,
    s_ob, s_oh, s_on, s_ol,
    HAS_RESET: tl.constexpr, PREC: tl.constexpr, POISON: tl.constexpr,
    BL: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    b, h, n = program_bhn(H, N)
    ll, rr, dd = tl.arange(0, BL), tl.arange(0, BR), tl.arange(0, BD)
    q, lagged, valid, same = lagged_scores(
        q_ptr + b * s_qb + h * s_qh + n * s_qn, k_ptr + b * s_kb + h * s_kh + n * s_kn,
        reset_ptr, b, n, s_ql, s_kl, s_rb, s_rn, L, R, HAS_RESET, PREC, BL, BR,
    )  # fmt: skip
    st_base = st_ptr + b * s_sb + h * s_sh + n * s_sn
    dstart_base, dend_base, g_base = dstart_ptr + h * s_dh, dend_ptr + h * s_dh, g_ptr + h * s_gh
    by_lag = tl.zeros((BL, BL), dtype=tl.float32)
    o = tl.zeros((BL, BD), dtype=tl.float32)
    for mo in range(0, M, BM):
        co = 2 * mo + tl.arange(0, 2 * BM)  # interleaved columns of output modes [mo, mo + BM)
        w = tl.zeros((BL, 2 * BM), dtype=tl.float32)
        for mi in range(0, M, BM):
            ci = 2 * mi + tl.arange(0, 2 * BM)
            p = p_block(q, lagged, valid, st_base, dstart_base, dend_base, ci, ll, rr, s_sc,
                        s_dl, L, R, M, HAS_RESET, PREC)  # fmt: skip
            w = mma(p, load_tile(g_base, ci, co, s_gi, s_go, 2 * M, 2 * M), w, PREC)  # p Ĝᵀ
        end = load_tile(dend_base, ll, co, s_dl, 1, L, 2 * M)
        by_lag = mma(w, tl.trans(end), by_lag, PREC)
        o = start_part(w, o, dstart_base, st_base + R * s_sc, valid, co, ll, dd, s_dl, s_sc,
                       L, D, M, HAS_RESET, PREC)  # fmt: skip
    v_base = v_ptr + b * s_vb + h * s_vh + n * s_vn
    o = lag_part(by_lag, o, same, v_base, ll, dd, s_vl, L, D, HAS_RESET, PREC, BL)
    store_output(o, o_ptr + b * s_ob + h * s_oh + n * s_on, poison_ptr + b * s_fb + h * s_fh
                 + n * s_fn, ll, dd, s_ol, L, D, POISON)  # fmt: skip


def chunk_output(
    q, k, v, starts, d_start, d_end, G_hat, o, reset=None, poison=None, precision="ieee", BL=None
):
    """One piece of n chunks of length L. q, k: (B, H, n, L, R), v: (B, H, n, L, D) and o
    (written, any float dtype) chunk views of the (B, T, H, ·) tensors (chunk_view); starts:
    (B, H, n, R+D, 2M) chunk-start states; d_start, d_end: (H, L, 2M) (ChunkDecays); G_hat:
    (H, 2M, 2M); reset: (B, n, L) uint8 or None; poison: (B, H, n·L) int8 or None (rows written
    as NaN where nonzero); precision of every product; BL: the block of the call's main chunk
    length. Any strides, unit last ones."""
    B, H, N, L, R = q.shape
    D, M = v.shape[-1], starts.shape[-1] // 2
    r, s_rb, s_rn, has_reset = reset_args(reset, q)
    with on_device(q):
        _output_kernel[(B * H * N,)](
            q, k, v, starts, d_start, d_end, G_hat, r, poison if poison is not None else r, o,
            H, N, L, R, D, M,
            *q.stride()[:4], *k.stride()[:4], *v.stride()[:4], *starts.stride()[:4],
            *d_start.stride()[:2], *G_hat.stride(), s_rb, s_rn, *flags_strides(poison, L),
            *o.stride()[:4],
            HAS_RESET=has_reset, PREC=PRECISION_CODES[precision], POISON=poison is not None,
            BL=BL or block(L), BR=block(R), BD=block(D),
        )  # fmt: skip
    return o
