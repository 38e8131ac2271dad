"""GPU benchmark, one run: the interdomain op on its Triton kernels against SDPA's flash
backend in bf16 at 1K–64K tokens (forward, and forward+backward), and the decode step against
context length to 128K. Writes a markdown report. For a lent GPU (benchmarks/gpu_check.sh
runs it after the profile); a few minutes, much of it the first calls' autotuning.

    python benchmarks/bench_gpu.py --markdown benchmarks/results/h100.md   # on a CUDA device
    python benchmarks/bench_gpu.py --dry-run --markdown /tmp/x.md          # CPU, tiny sizes

Shapes: H = 16, R = D = M = 64, chunk 64, bf16 q, k, v, precision "auto" (TF32 products; bf16
products timed beside it, for the choice of docs/precision.md), and
B = 65,536 // T rows, so every length processes the same tokens. TFLOP/s use the op's
multiply-adds per token and head, L(R+D) + 4LM + 4M(R+D) + 4M² (docs/design.md §4; ×3 for
forward+backward), and SDPA's causal 2·T·d per token and head (×2.5 for forward+backward).
"first f+b s": the first forward+backward at each length, TF32 and bf16 products together,
which carries the autotuner's benchmarking and the compiles wherever a key is new.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table  # noqa: E402
from decode_models import HEADER  # noqa: E402

H, R, D, M, L = 16, 64, 64, 64, 64
TOKENS = 65536
LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
CONTEXTS = (512, 2048, 8192, 32768, 131072)


def timer(device):
    """seconds per call of fn (CUDA events on a GPU after a warm-up call; wall clock on CPU)."""
    if device == "cuda":

        def run(fn, reps):
            fn()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / reps / 1e3

        return run

    def run(fn, reps):  # the CPU is the dry run's: it covers the calls, it times nothing
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps

    return run


def params(device, heads):
    from idmix.functional import complex_A, discretize, log_uniform_dt, s4d_inv_init

    log_re, im = s4d_inv_init(heads, M)
    lam, beta = discretize(torch.exp(log_uniform_dt(heads)), complex_A(log_re, im))
    C = torch.randn(heads, M, M, dtype=torch.complex64) / M
    return [t.to(device).requires_grad_() for t in (lam, beta, C)]


def flash_context(device):
    """SDPA restricted to its flash backend on a GPU (an error if it cannot run), any on CPU."""
    if device != "cuda":
        return lambda: _nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def training_row(device, T, B, heads, lam, beta, C, reps, sdpa_ctx):
    from idmix.functional import interdomain_attention

    def leaf(*shape):
        return torch.randn(*shape, device=device, dtype=torch.bfloat16, requires_grad=True)

    q, k, v = leaf(B, T, heads, R), leaf(B, T, heads, R), leaf(B, T, heads, D)
    qs, ks, vs = leaf(B, heads, T, R), leaf(B, heads, T, R), leaf(B, heads, T, D)

    def ours(precision="auto"):
        return interdomain_attention(
            q, k, v, lam, beta, C, chunk_size=L, backend="triton", precision=precision
        )[0]

    def ours_bf16():
        return ours("bf16")

    def sdpa():
        with sdpa_ctx():
            return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)

    def fwd_bwd(fn):
        return lambda: fn().float().sum().backward()

    time_it = timer(device)
    first = first_call_seconds(device, fwd_bwd(ours)) + first_call_seconds(
        device, fwd_bwd(ours_bf16)
    )
    with torch.no_grad():
        t_of, t_ob, t_sf = time_it(ours, reps), time_it(ours_bf16, reps), time_it(sdpa, reps)
    t_ofb, t_obb = time_it(fwd_bwd(ours), reps), time_it(fwd_bwd(ours_bf16), reps)
    t_sfb = time_it(fwd_bwd(sdpa), reps)
    per_tok = L * (R + D) + 4 * L * M + 4 * M * (R + D) + 4 * M * M  # multiply-adds
    flop_id, flop_sd = 2 * per_tok * B * T * heads, 2 * T * R * B * T * heads
    return [
        str(T), str(B),
        f"{t_of * 1e3:.3f}", f"{t_ob * 1e3:.3f}", f"{t_sf * 1e3:.3f}", f"{t_sf / t_of:.2f}x",
        f"{t_ofb * 1e3:.3f}", f"{t_obb * 1e3:.3f}", f"{t_sfb * 1e3:.3f}", f"{t_sfb / t_ofb:.2f}x",
        f"{flop_id / t_of / 1e12:.0f}", f"{3 * flop_id / t_ofb / 1e12:.0f}",
        f"{flop_sd / t_sf / 1e12:.0f}", f"{2.5 * flop_sd / t_sfb / 1e12:.0f}", f"{first:.1f}",
    ]  # fmt: skip


def first_call_seconds(device, fn) -> float:
    """Seconds of fn's first call: with the autotuner's and the compiler's work where its keys
    are new (the keys hold no T or B: only the first length should pay)."""
    t0 = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


TRAINING_HEADER = [
    "T", "B", "ours fwd ms", "ours fwd bf16 ms", "SDPA fwd ms", "fwd ×", "ours f+b ms",
    "ours f+b bf16 ms", "SDPA f+b ms", "f+b ×", "ours TF/s fwd", "ours TF/s f+b",
    "SDPA TF/s fwd", "SDPA TF/s f+b", "first f+b s (both precisions)",
]  # fmt: skip


def graphed(fn, device):
    """fn captured once as a CUDA graph (after a warm-up call on a side stream): its replay,
    with no host work but the replay itself. On CPU fn itself (no graphs there)."""
    if device != "cuda":
        return fn
    from idmix.static_decode import capture, on_side_stream

    on_side_stream(fn)
    return capture(fn).replay


@torch.no_grad()
def decode_row(device, ctx, heads, lam, beta, G, reps, sdpa_ctx):
    """The op's step at B = 1, called (host path included) and replayed as a CUDA graph,
    against SDPA reading a bf16 KV cache of ctx tokens (graphed too)."""
    from idmix.functional import interdomain_decode_step

    q, k, v = (torch.randn(1, heads, R, device=device) for _ in range(3))
    state = torch.zeros(1, heads, R + D, 2 * M, device=device)
    kc = torch.randn(1, heads, ctx + 1, R, device=device, dtype=torch.bfloat16)
    vc = torch.randn(1, heads, ctx + 1, D, device=device, dtype=torch.bfloat16)
    qb = q.to(torch.bfloat16)[:, :, None]
    lam_ri, beta_ri = torch.view_as_real(lam), torch.view_as_real(beta)

    def step():
        return interdomain_decode_step(
            q, k, v, lam_ri, beta_ri, G, state, backend="triton", inplace=True
        )[0]

    def sdpa():
        with sdpa_ctx():
            return F.scaled_dot_product_attention(qb, kc, vc)

    time_it = timer(device)
    t = {
        "called": time_it(step, reps),
        "graphed": time_it(graphed(step, device), reps),
        "sdpa": time_it(graphed(sdpa, device), reps),
    }
    row = [str(ctx), *(f"{t[key] * 1e6:.1f}" for key in ("called", "graphed", "sdpa"))]
    return row, t["graphed"]


def autotune_choices() -> list[list[str]]:
    """The config each autotuned kernel settled on, per key it met."""
    import idmix_kernels.chunk_intra as fwd
    import idmix_kernels.chunk_intra_bwd as bwd
    import idmix_kernels.selective_intra as sel
    from triton.runtime.autotuner import Autotuner

    rows = []
    for module in (fwd, bwd, sel):
        for name in sorted(dir(module)):
            kernel = getattr(module, name)
            if isinstance(kernel, Autotuner):
                rows += [[name, str(key[:3]), str(c)] for key, c in kernel.cache.items()]
    return rows


def parse_gpu_args(doc: str, argv, script: str, add_arguments=lambda ap: None):
    """(args, device) of a GPU script: --markdown PATH, --dry-run for the CPU under the Triton
    interpreter, and what add_arguments(parser) adds; without --dry-run a CUDA device, or exit
    saying so."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--markdown", type=Path, help="write the report here")
    add_arguments(ap)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        return args, "cpu"
    if not torch.cuda.is_available():
        sys.exit(f"{script} needs a CUDA device (or --dry-run)")
    return args, "cuda"


def _models_seconds(ap) -> None:
    ap.add_argument(
        "--models-seconds", type=float, default=100.0,
        help="time for the models table; cells past it are listed as not reached",
    )  # fmt: skip


def main(argv=None):
    args, device = parse_gpu_args(__doc__, argv, "bench_gpu.py", _models_seconds)
    if device == "cpu":
        heads, lengths, tokens, contexts, reps = 2, (128,), 128, (64, 128), 1
    else:
        heads, lengths, tokens, contexts, reps = H, LENGTHS, TOKENS, CONTEXTS, 5
    from idmix.functional import readout_gram

    t0 = time.perf_counter()
    lam, beta, C = params(device, heads)
    sdpa_ctx = flash_context(device)
    train = []
    for T in lengths:
        train.append(
            training_row(device, T, max(1, tokens // T), heads, lam, beta, C, reps, sdpa_ctx)
        )
        print_table("training (so far)", TRAINING_HEADER, train[-1:])
    G = readout_gram(C.detach())
    decode, steps = [], []
    for ctx in contexts:
        reps_ctx = 50 * reps if device == "cuda" else 2
        row, t = decode_row(device, ctx, heads, lam.detach(), beta.detach(), G, reps_ctx, sdpa_ctx)
        steps.append(t)
        decode.append(row)
        print_table("decode (so far)", DECODE_HEADER[:-1], decode[-1:])
    for row, t in zip(decode, steps, strict=True):
        row.append(f"{t / min(steps):.3f}")
    print_table("training", TRAINING_HEADER, train)
    print_table("decode", DECODE_HEADER, decode)
    from decode_models import model_rows

    models = model_rows(
        device,
        time.perf_counter() + args.models_seconds,
        **({} if device == "cuda" else {"cells": ((1, 16), (2, 24)), "new_tokens": 6}),
        report=lambda row: print_table("models (so far)", HEADER, [row]),
    )
    print_table("models", HEADER, models)
    if args.markdown:
        write_report(args.markdown, device, heads, train, decode, models, time.perf_counter() - t0)


DECODE_HEADER = [
    "context", "ours step µs (called)", "ours step µs (graphed)", "SDPA step µs (graphed)",
    "ours graphed / its fastest",
]  # fmt: skip


def write_report(path: Path, device, heads, train, decode, models, seconds) -> None:
    import triton

    from idmix.evaluation.report import markdown_table

    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    lines = [
        f"# GPU benchmark: {name}",
        "",
        f"torch {torch.__version__}, triton {triton.__version__}; written by "
        f"`benchmarks/bench_gpu.py` in {seconds:.0f} s. H = {heads}, R = D = M = 64, chunk 64, "
        "bf16 inputs, precision 'auto' (the bf16 columns: precision 'bf16'); × = SDPA time / "
        "ours at 'auto' (above 1: ours is faster).",
        "",
        "## Training path (the chunked op on the Triton kernels vs SDPA flash, causal)",
        "",
        markdown_table(TRAINING_HEADER, train),
        "## Decode step (B = 1, all heads; SDPA reads a bf16 KV cache of the context)",
        "",
        markdown_table(DECODE_HEADER, decode),
        "## Models decoding (benchmarks/decode_models.py: random weights, bf16, compiled step "
        "replayed as a CUDA graph; prefill in pieces of 16K tokens)",
        "",
        markdown_table(HEADER, models),
        "## Autotune choices",
        "",
        markdown_table(
            ["kernel", "key (first fields)", "config"], autotune_choices() or [["-"] * 3]
        ),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
