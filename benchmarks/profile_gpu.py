"""Where the GPU time goes: torch.profiler over one forward+backward of the chunked op (short
and long rows at the same tokens) and over decode steps, each kernel's device time per call
beside the call's wall time. Writes a markdown report. For a lent GPU (benchmarks/gpu_check.sh
runs it after bench_gpu.py); under a minute there.

    python benchmarks/profile_gpu.py --markdown benchmarks/results/h100_profile.md  # CUDA
    python benchmarks/profile_gpu.py --dry-run --markdown /tmp/x.md                 # CPU, tiny

Shapes as bench_gpu.py: H = 16, R = D = M = 64, chunk 64, bf16 q, k, v, precision "auto".
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import D, H, L, R, params, parse_gpu_args  # noqa: E402
from common import print_table  # noqa: E402

TOP = 12


def kernel_table(fn, device, calls: int) -> tuple[list[list[str]], float, float]:
    """Run fn `calls` times under the profiler (after one warm call, timed: the autotuner's
    and the compiler's share). Rows: the TOP entries by self device time (self CPU time on CPU)
    per call, then the rest summed; the wall seconds per call; the warm call's seconds."""
    t0 = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / calls
    self_us = (
        (e.key, e.self_device_time_total if device == "cuda" else e.self_cpu_time_total)
        for e in prof.key_averages()  # one entry per name
    )
    ranked = sorted(((name, us / calls) for name, us in self_us if us > 0), key=lambda kv: -kv[1])
    total = sum(us for _, us in ranked)
    rest = sum(us for _, us in ranked[TOP:])
    rows = [[name[:70], f"{us / 1e3:.3f}", f"{us / total:.1%}"] for name, us in ranked[:TOP]]
    if rest:
        rows.append([f"({len(ranked) - TOP} others)", f"{rest / 1e3:.3f}", f"{rest / total:.1%}"])
    rows.append(["**all kernels**", f"{total / 1e3:.3f}", "100%"])
    return rows, wall, first


def training_case(device, T, B, heads, lam, beta, C):
    from idmix.functional import interdomain_attention

    q, k, v = (
        torch.randn(B, T, heads, n, device=device, dtype=torch.bfloat16, requires_grad=True)
        for n in (R, R, D)
    )

    def step():
        o = interdomain_attention(q, k, v, lam, beta, C, chunk_size=L, backend="triton")[0]
        o.float().sum().backward()

    return step


def decode_case(device, heads, lam, beta, G):
    from idmix.functional import interdomain_decode_step

    q, k, v = (torch.randn(1, heads, R, device=device) for _ in range(3))
    state = torch.zeros(1, heads, R + D, 2 * lam.shape[-1], device=device)
    lam_ri, beta_ri = torch.view_as_real(lam), torch.view_as_real(beta)

    @torch.no_grad()
    def step():
        interdomain_decode_step(q, k, v, lam_ri, beta_ri, G, state, backend="triton", inplace=True)[
            0
        ]

    return step


def main(argv=None):
    args, device = parse_gpu_args(__doc__, argv, "profile_gpu.py")
    if device == "cpu":
        heads, rows_of, calls = 2, ((128, 1),), 1
    else:
        heads, rows_of, calls = H, ((1024, 64), (65536, 1)), 3
    from idmix.functional import readout_gram

    lam, beta, C = params(device, heads)
    sections = []
    for T, B in rows_of:
        step = training_case(device, T, B, heads, lam, beta, C)
        rows, wall, first = kernel_table(step, device, calls)
        title = f"Forward+backward, T = {T}, B = {B}: {wall * 1e3:.2f} ms wall"
        sections.append((f"{title} (first call, with autotuning: {first:.1f} s)", rows))
    decode = decode_case(device, heads, lam.detach(), beta.detach(), readout_gram(C.detach()))
    rows, wall, _ = kernel_table(decode, device, 20 * calls)
    sections.append((f"Decode step, B = 1: {wall * 1e6:.1f} µs wall per step", rows))
    header = ["kernel or op (self time)", "ms per call", "share"]
    for title, rows in sections:
        print_table(title, header, rows)
    if args.markdown:
        from idmix.evaluation.report import markdown_table

        name = torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)"
        lines = [f"# Where the time goes: {name}", "", f"torch {torch.__version__}; "
                 "written by `benchmarks/profile_gpu.py`. Device time per call of each kernel "
                 "(CPU time in a dry run), beside the call's wall time.", ""]  # fmt: skip
        for title, rows in sections:
            lines += [f"## {title}", "", markdown_table(header, rows)]
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text("\n".join(lines))
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
