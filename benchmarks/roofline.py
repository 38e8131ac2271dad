"""A roofline estimate, on paper, of the chunked op on an H200 against FlashAttention's published
H100 throughput: for each kernel and each PyTorch step between them, multiply-adds and bytes
per token and head at the paper's head shape, and the time those imply at the tensor-core peak
and at HBM bandwidth (each step takes the larger of the two); then the same for the op fused
(only inputs, outputs and gradients through HBM). An estimate, not a measurement: it assumes
every kernel runs at its roofline and ignores launches, tails and caches; what the one H200 run
says about the real efficiencies is benchmarks/cost_model.py's fit.

As the kernels stand, every step is bound by its traffic (the fp32 states and intermediates
between the passes). That is a property of the unfused pass chain, not of the op: fused, its
arithmetic (74K multiply-adds per token·head forward) outweighs its traffic at TF32 and at bf16
alike, so it is compute-bound and bf16 products would then pay.

    python benchmarks/roofline.py                  # TF32 products (the GPU default), bf16 inputs
    python benchmarks/roofline.py --precision tf32 --markdown

What moves through memory is counted from the code as it is (idmix/functional/interdomain/
triton_engine.py and kernels/): the kernels read q, k, v and write o and the gradients by
stride in the inputs' dtype, and keep every per-chunk tensor (start states, p, w̃, the decay
partials) in fp32 in HBM; no document resets. The decays and Ĝ (per head, a few KB) live in L2 and
are not counted. FlashAttention: FlashAttention-3 on an H100 SXM5, bf16, head dim 64 (Shah et
al. 2024, Fig. 5 causal forward, Fig. 6 backward), at its 16K throughput beyond 16K; the H200
has the H100's tensor cores, so the same rates are used for it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table  # noqa: E402

# H200 SXM: dense tensor-core peaks (TFLOP/s) and HBM3e bandwidth (TB/s)
PEAK = {"bf16": 989.0, "tf32": 494.7, "ieee": 67.0}
HBM = 4.8
# FlashAttention-3, H100 SXM5, bf16, head dim 64, TFLOP/s by sequence length
FA3_FWD_CAUSAL = {512: 197, 1024: 265, 2048: 371, 4096: 420, 8192: 460, 16384: 473}
FA3_BWD = {512: 272, 1024: 363, 2048: 422, 4096: 453, 8192: 472, 16384: 474}
LENGTHS = (4096, 8192, 16384, 32768, 65536)


def steps(L=64, R=64, D=64, M=64, in_bytes=2):
    """[(direction, step, engine, multiply-adds per token·head, bytes per token·head)]: engine
    "tc" for products on the tensor cores, "mem" for pure data movement (memory-bound)."""
    f4, C, M2 = 4, R + D, 2 * M
    row = lambda n: n * f4  # noqa: E731  fp32 bytes of n values per token
    inp = lambda n: n * in_bytes  # noqa: E731  the same in the inputs' dtype
    state = row(C * M2 // L)  # one (R+D, 2M) fp32 state per chunk, per token
    key, value = row(R * M2 // L), row(D * M2 // L)  # its key and value rows
    fwd = [
        ("non-finite flags: q, k, v read once (kernel)", "mem", 0, inp(2 * R + D)),
        ("chunk states: increments z·end and scan (kernel)", "tc", C * M2, inp(C) + state),
        ("pass 1 (kernel)", "tc", L * R + R * M2 + L * M2, inp(2 * R) + key + row(M2)),
        ("w̃ = Ĝ p (GEMM per head)", "tc", M2 * M2, 2 * row(M2)),
        (
            "pass 2, o in the input dtype (kernel)",
            "tc",
            L * M2 + L * D + M2 * D,
            row(M2) + inp(2 * D) + value,
        ),
    ]
    bwd = [
        ("recompute: chunk states (kernel)", "tc", C * M2, inp(C) + state),
        ("recompute: pass 1, w̃", "tc", L * R + R * M2 + L * M2 + M2 * M2,
         inp(2 * R) + key + 3 * row(M2)),
        ("pass 2 backward, lag part (kernel)", "tc", 2 * L * M2 + 2 * L * D + L * M2,
         row(M2) + inp(2 * D) + row(D + 2 * M2)),
        ("pass 2 backward, start part (kernel)", "tc", 2 * M2 * D,
         inp(D) + row(M2) + value + 2 * row(M2) + value + row(M2)),
        ("dp = dw̃ Ĝ, dĜ += dw̃ᵀ p (GEMMs per head)", "tc", 2 * M2 * M2, row(M2) * 4),
        ("pass 1 backward, lag part (kernel)", "tc", 2 * L * R + 2 * L * M2 + L * R,
         row(M2) + inp(2 * R) + 2 * row(M2) + row(2 * R)),
        ("pass 1 backward, start part (kernel)", "tc", 3 * R * M2,
         row(M2) + inp(R) + key + row(R) + inp(R) + key + 2 * row(M2)),
        # reads dXᵏ, dXᵛ and the start states, writes the increments' gradients
        ("reverse scan and d(λ^L) (kernel)", "mem", 0, 3 * state),
        ("dk, dv through the chunk end, d(end) partial (kernel)", "tc", 2 * C * M2,
         state + inp(C) + row(C) + 2 * row(M2) + inp(C)),
        ("decay partials summed over rows and chunks", "mem", 0, 2 * row(M2)),
    ]  # fmt: skip
    return [("fwd", *s) for s in fwd] + [("bwd", *s) for s in bwd]


def fused_bound(L=64, R=64, D=64, M=64, in_bytes=2):
    """(forward, forward+backward) multiply-adds and bytes per token·head of the op fused so
    that only q, k, v, o and their gradients move through HBM (the states and intermediates
    stay on chip): the floor part 2 (the fused kernels) aims at."""
    macs = L * (R + D) + 4 * L * M + 4 * M * (R + D) + 4 * M * M
    fwd_bytes = in_bytes * (2 * R + 2 * D)
    return (macs, fwd_bytes), (4 * macs, fwd_bytes + in_bytes * (2 * (2 * R + D) + 2 * D))


def seconds(engine, macs, nbytes, precision):
    """Per token·head: the larger of compute at peak and traffic at HBM bandwidth."""
    compute = 2 * macs / (PEAK[precision] * 1e12) if engine == "tc" else 0.0
    return max(compute, nbytes / (HBM * 1e12))


def flash_seconds(T: int, d: int = 64) -> tuple[float, float]:
    """FlashAttention-3 forward (causal) and backward seconds per token·head at length T."""
    at = min(T, 16384)
    fwd_flop = 2 * T * d  # causal: 4·T·d per query, half the keys
    return fwd_flop / (FA3_FWD_CAUSAL[at] * 1e12), 2.5 * fwd_flop / (FA3_BWD[at] * 1e12)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", choices=sorted(PEAK), default="tf32")
    ap.add_argument("--input-bytes", type=int, default=2, help="2: bf16 q, k, v; 4: fp32")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    rows, totals = [], {"fwd": [0, 0, 0.0], "bwd": [0, 0, 0.0]}
    for direction, name, engine, macs, nbytes in steps(in_bytes=args.input_bytes):
        t = seconds(engine, macs, nbytes, args.precision)
        bound = (
            "memory"
            if engine == "mem" or t > 2 * macs / (PEAK[args.precision] * 1e12)
            else "compute"
        )
        rows.append([direction, name, f"{macs:,}", f"{nbytes:,}", f"{t * 1e9:.3f}", bound])
        acc = totals[direction]
        acc[0], acc[1], acc[2] = acc[0] + macs, acc[1] + nbytes, acc[2] + t
    for d, (macs, nbytes, t) in totals.items():
        rows.append([d, "total", f"{macs:,}", f"{nbytes:,}", f"{t * 1e9:.3f}", ""])
    header = ["dir", "step", "MACs/tok·head", "bytes/tok·head", "ns/tok·head", "bound"]
    title = (
        f"Estimate: the chunked op on an H200 (R = D = M = 64, chunk 64, {args.precision} "
        f"products, {'bf16' if args.input_bytes == 2 else 'fp32'} inputs)"
    )
    emit(title, header, rows, args.markdown)
    ours = totals["fwd"][2], totals["fwd"][2] + totals["bwd"][2]
    cmp_rows = []
    for T in LENGTHS:
        fa_f, fa_b = flash_seconds(T)
        cmp_rows.append([
            str(T), f"{ours[0] * 1e9:.2f}", f"{fa_f * 1e9:.2f}", f"{fa_f / ours[0]:.1f}x",
            f"{ours[1] * 1e9:.2f}", f"{(fa_f + fa_b) * 1e9:.2f}", f"{(fa_f + fa_b) / ours[1]:.1f}x",
        ])  # fmt: skip
    emit(
        "Estimate against FlashAttention-3's published H100 rates (ns per token·head)",
        ["T", "ours fwd", "FA3 fwd", "fwd ×", "ours f+b", "FA3 f+b", "f+b ×"],
        cmp_rows,
        args.markdown,
    )
    (f_macs, f_bytes), (fb_macs, fb_bytes) = fused_bound(in_bytes=args.input_bytes)
    fused_rows = []
    for precision in ("tf32", "bf16"):
        for name, macs, nbytes in (("fwd", f_macs, f_bytes), ("f+b", fb_macs, fb_bytes)):
            compute = 2 * macs / (PEAK[precision] * 1e12)
            traffic = nbytes / (HBM * 1e12)
            fused_rows.append([
                precision, name, f"{macs:,}", f"{nbytes:,}", f"{compute * 1e9:.3f}",
                f"{traffic * 1e9:.3f}", "compute" if compute > traffic else "memory",
            ])  # fmt: skip
    emit(
        "Fused (only q, k, v, o and their gradients through HBM): the floor part 2 aims at",
        ["products", "dir", "MACs/tok·head", "bytes/tok·head", "compute ns", "traffic ns", "bound"],
        fused_rows,
        args.markdown,
    )


def emit(title, header, rows, markdown: bool) -> None:
    if not markdown:
        print_table(title, header, rows)
        return
    print(f"\n**{title}**\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
