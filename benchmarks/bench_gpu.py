"""GPU benchmark, one run: the interdomain op vs SDPA (flash) in bf16, and decode-step latency
against context length. For a lent H200; finishes in a few minutes.

    python benchmarks/bench_gpu.py                 # on a CUDA device
    python benchmarks/bench_gpu.py --dry-run       # the same code on CPU, tiny sizes (smoke test)

Shapes: H=16, R=D=M=64, chunk 64, bf16 inputs (the SSM runs in fp32 inside), B = 65,536 // T
(at least 1) so every length processes the same number of tokens. TFLOP/s use the op's
multiply-add count per token and head, L(R+D) + 4LM + 4M(R+D) + 4M² (docs/design.md §4; ×3 for
fwd+bwd), and 2·T·d per token and head for causal attention (×2.5 for fwd+bwd).
"id" columns run the chunked op on the Triton kernels (state scan and the intra-chunk passes,
forward and backward), "id … torch" on its PyTorch GEMM path, so one run shows which is faster.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table  # noqa: E402

from idmix.functional import (  # noqa: E402
    complex_A,
    discretize,
    interdomain_attention,
    interdomain_decode_step_real,
    log_uniform_dt,
    readout_gram,
    s4d_inv_init,
)

H, R, D, M, L = 16, 64, 64, 64, 64


def timer(device):
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
    else:

        def run(fn, reps):
            fn()
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            return (time.perf_counter() - t0) / reps

    return run


def params(device):
    log_re, im = s4d_inv_init(H, M)
    lam, beta = discretize(torch.exp(log_uniform_dt(H)), complex_A(log_re, im))
    C = torch.randn(H, M, M, dtype=torch.complex64) / M
    return [t.to(device).requires_grad_() for t in (lam, beta, C)]


def training_fns(device, T, B, lam, beta, C):
    """(interdomain fwd, fwd+bwd on the Triton kernels, the same two on the PyTorch GEMM path,
    SDPA fwd, fwd+bwd) closures at length T and batch B."""
    q, k, v = (
        torch.randn(B, T, H, R, device=device, dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    qs, ks, vs = (
        torch.randn(B, H, T, R, device=device, dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )

    def ours(backend="triton"):
        return interdomain_attention(q, k, v, lam, beta, C, chunk_size=L, backend=backend)

    def sdpa():
        return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)

    def no_grad(fn):
        return torch.no_grad()(fn)

    def fwd_bwd(fn):
        return lambda: fn().float().sum().backward()

    return (
        no_grad(ours),
        fwd_bwd(ours),
        no_grad(lambda: ours("torch")),
        fwd_bwd(lambda: ours("torch")),
        no_grad(sdpa),
        fwd_bwd(sdpa),
    )


def training_table(device, lengths, tokens, reps):
    time_it = timer(device)
    lam, beta, C = params(device)
    per_tok_id = L * (R + D) + 4 * L * M + 4 * M * (R + D) + 4 * M * M  # multiply-adds
    rows = []
    for T in lengths:
        B = max(1, tokens // T)
        fns = dict(
            zip(
                ("of", "ofb", "oft", "ofbt", "sf", "sfb"),
                training_fns(device, T, B, lam, beta, C),
                strict=True,
            )
        )
        t = {n: time_it(f, reps) for n, f in fns.items()}
        flop_id = 2 * per_tok_id * B * T * H
        flop_sd = 2 * T * R * B * T * H  # causal: half of 2 matmuls of 2·T·d flops per query
        rows.append(
            [
                str(T),
                str(B),
                f"{t['of'] * 1e3:.2f}",
                f"{t['oft'] * 1e3:.2f}",
                f"{t['sf'] * 1e3:.2f}",
                f"{t['sf'] / t['of']:.2f}x",
                f"{t['ofb'] * 1e3:.2f}",
                f"{t['ofbt'] * 1e3:.2f}",
                f"{t['sfb'] * 1e3:.2f}",
                f"{t['sfb'] / t['ofb']:.2f}x",
                f"{flop_id / t['of'] / 1e12:.1f}",
                f"{flop_sd / t['sf'] / 1e12:.1f}",
                f"{3 * flop_id / t['ofb'] / 1e12:.1f}",
                f"{2.5 * flop_sd / t['sfb'] / 1e12:.1f}",
            ]
        )
    print_table(
        f"Training path on {device}: H={H} R=D=M={M} bf16 (ms; speed-up = SDPA / interdomain)",
        [
            "T",
            "B",
            "id fwd",
            "id fwd torch",
            "sdpa fwd",
            "fwd x",
            "id f+b",
            "id f+b torch",
            "sdpa f+b",
            "f+b x",
            "id TF/s fwd",
            "sdpa TF/s fwd",
            "id TF/s f+b",
            "sdpa TF/s f+b",
        ],
        rows,
    )


def decode_fns(device, ctx, lam, beta, G):
    """Decode-step closures at one context: interdomain (torch, triton backends) and SDPA."""
    q, k, v = (torch.randn(1, H, R, device=device) for _ in range(3))
    state = torch.zeros(1, H, R + D, 2 * M, device=device)  # the runtime (real) state
    kc = torch.randn(1, H, ctx + 1, R, device=device, dtype=torch.bfloat16)
    vc = torch.randn(1, H, ctx + 1, D, device=device, dtype=torch.bfloat16)
    qb = q.to(torch.bfloat16)[:, :, None]

    def step(backend):
        lam_ri, beta_ri = torch.view_as_real(lam), torch.view_as_real(beta)
        return lambda: interdomain_decode_step_real(
            q, k, v, lam_ri, beta_ri, G, state, backend=backend
        )

    return {
        "torch": step("torch"),
        "triton": step("triton"),
        "sdpa": lambda: F.scaled_dot_product_attention(qb, kc, vc),
    }


@torch.no_grad()
def decode_table(device, contexts, reps):
    time_it = timer(device)
    lam, beta, C = (t.detach() for t in params(device))
    G = readout_gram(C)
    rows, first = [], {}
    for ctx in contexts:
        times = {}
        for name, fn in decode_fns(device, ctx, lam, beta, G).items():
            try:
                times[name] = time_it(fn, reps)
            except Exception as e:  # noqa: BLE001 - report, do not hide
                print(f"decode {name} failed: {type(e).__name__}: {e}")
                times[name] = float("nan")
        first = first or dict(times)
        rows.append(
            [str(ctx)]
            + [f"{times[n] * 1e6:.1f}" for n in ("triton", "torch", "sdpa")]
            + [f"{times['triton'] / first['triton']:.3f}"]
        )
    print_table(
        f"Decode step on {device}, B=1, all {H} heads (us)",
        ["context", "id triton", "id torch", "sdpa", "triton flat"],
        rows,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.dry_run:
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
        global H
        H = 2
        training_table("cpu", [128, 256], tokens=256, reps=1)
        decode_table("cpu", [128, 512], reps=2)
        return
    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs a CUDA device (or --dry-run)")
    training_table("cuda", [1024, 2048, 4096, 8192, 16384, 32768], tokens=65536, reps=5)
    decode_table("cuda", [512, 2048, 8192, 32768, 131072], reps=200)


if __name__ == "__main__":
    main()
