"""Chunked interdomain op vs causal SDPA on CPU, and the decode step vs a KV-cache SDPA step.

    python benchmarks/bench_interdomain_cpu.py            # full tables (a few minutes)
    python benchmarks/bench_interdomain_cpu.py --quick    # T <= 4K, fewer repetitions

Shapes: B=1, H=8, R=D=M=64, fp32, chunk 64. Times are interleaved medians; memory is the peak
RSS increase of one forward+backward in a fresh process (inputs excluded).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    blocked_medians,
    interleaved_medians,
    measure_in_subprocess,
    peak_rss_increase_mb,
    print_table,
)

from idmix.functional import (  # noqa: E402
    complex_A,
    discretize,
    interdomain_attention,
    interdomain_decode_step,
    log_uniform_dt,
    readout_gram,
    s4d_inv_init,
)

B, H, R, D, M = 1, 8, 64, 64, 64


def params(requires_grad=False):
    g = torch.Generator().manual_seed(0)
    log_re, im = s4d_inv_init(H, M)
    lam, beta = discretize(torch.exp(log_uniform_dt(H, generator=g)), complex_A(log_re, im))
    C = torch.randn(H, M, M, dtype=torch.complex64, generator=g) / M
    return [x.requires_grad_(requires_grad) for x in (lam, beta, C)]


def inputs(T, layout, requires_grad=False):
    shape = (B, T, H, R) if layout == "ours" else (B, H, T, R)
    return [torch.randn(shape, requires_grad=requires_grad) for _ in range(3)]


def fwd_bwd(kind, T):
    """Closures (forward, forward+backward) of one method at length T."""
    if kind == "sdpa":
        q, k, v = inputs(T, "sdpa", True)
        g = torch.randn(B, H, T, D)

        def f():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        q, k, v = inputs(T, "ours", True)
        lam, beta, C = params(True)
        g = torch.randn(B, T, H, D)
        impl = "naive" if kind == "naive" else "chunked"

        def f():
            return interdomain_attention(q, k, v, lam, beta, C, impl=impl)

    def fwd():
        with torch.no_grad():
            f()

    def fb():
        f().backward(g)

    return fwd, fb


def measure_memory(kind, T):
    """Child-process entry: peak RSS increase of one forward+backward."""
    fwd_bwd(kind, 256)[1]()  # load kernels and libraries first
    _, fb = fwd_bwd(kind, T)
    print(json.dumps({"mb": peak_rss_increase_mb(fb)}))


def training_table(lengths, reps):
    rows, results = [], {}
    script = str(Path(__file__).resolve())
    for T in lengths:
        ours_f, ours_fb = fwd_bwd("chunked", T)
        sdpa_f, sdpa_fb = fwd_bwd("sdpa", T)
        n = max(2, reps if T <= 4096 else reps // 2)
        t = interleaved_medians({"of": ours_f, "sf": sdpa_f, "ofb": ours_fb, "sfb": sdpa_fb}, n)
        mem_o = measure_in_subprocess(script, "chunked", str(T))["mb"]
        mem_s = measure_in_subprocess(script, "sdpa", str(T))["mb"]
        naive = "-"
        if T <= 512:
            naive_f, _ = fwd_bwd("naive", T)
            naive = f"{interleaved_medians({'n': naive_f}, 1, warmup=0)['n'] * 1e3:.0f}"
        results[T] = t
        rows.append(
            [
                str(T),
                f"{t['of'] * 1e3:.1f}",
                f"{t['sf'] * 1e3:.1f}",
                f"{t['sf'] / t['of']:.2f}x",
                f"{t['ofb'] * 1e3:.1f}",
                f"{t['sfb'] * 1e3:.1f}",
                f"{t['sfb'] / t['ofb']:.2f}x",
                f"{mem_o:.0f}",
                f"{mem_s:.0f}",
                f"{mem_o / mem_s:.2f}",
                naive,
            ]
        )
    print_table(
        f"Training path, B={B} H={H} R=D=M={M} fp32, {torch.get_num_threads()} threads "
        "(ms; speed-up = SDPA time / chunked time; memory = peak RSS increase of fwd+bwd, MiB)",
        [
            "T",
            "chunked fwd",
            "SDPA fwd",
            "fwd speed-up",
            "chunked f+b",
            "SDPA f+b",
            "f+b speed-up",
            "chunked MiB",
            "SDPA MiB",
            "mem ratio",
            "naive fwd",
        ],
        rows,
    )
    if 2048 in results and 16384 in results:
        print(
            f"linearity: chunked f+b time(16K)/time(2K) = "
            f"{results[16384]['ofb'] / results[2048]['ofb']:.2f} (8.0 is linear)"
        )


def decode_steps(ctx, lam, beta, C, G_hat):
    """One interdomain decode step after a real prefill of ctx tokens, and one SDPA step over a
    KV cache of ctx tokens (appending in place)."""
    q, k, v = inputs(ctx, "ours")
    with torch.no_grad():  # a real prefill, so the state is the one a decoder would hold
        _, state = interdomain_attention(q, k, v, lam, beta, C, return_final_state=True)
    qt, kt, vt = (torch.randn(B, H, R) for _ in range(3))
    k_cache, v_cache = torch.randn(B, H, ctx + 1, R), torch.randn(B, H, ctx + 1, D)

    @torch.no_grad()
    def ours():
        interdomain_decode_step(qt, kt, vt, lam, beta, G_hat, state, inplace=True)

    @torch.no_grad()
    def sdpa():
        k_cache[:, :, ctx] = kt
        v_cache[:, :, ctx] = vt
        F.scaled_dot_product_attention(qt[:, :, None], k_cache, v_cache)

    return {"ours": ours, "sdpa": sdpa}


def decode_table(contexts, steps):
    """Interdomain steps of all contexts run round-robin (one state per context, from a real
    prefill), so machine drift cannot masquerade as a context effect; SDPA per context."""
    lam, beta, C = params()
    G_hat = readout_gram(C, "conj")
    fns = {ctx: decode_steps(ctx, lam, beta, C, G_hat) for ctx in contexts}
    ours = blocked_medians({ctx: f["ours"] for ctx, f in fns.items()}, steps, rounds=15)
    rows = []
    for ctx in contexts:
        sdpa = blocked_medians({"sdpa": fns[ctx]["sdpa"]}, steps, rounds=3)["sdpa"]
        rows.append(
            [
                str(ctx),
                f"{ours[ctx] * 1e6:.0f}",
                f"{sdpa * 1e6:.0f}",
                f"{sdpa / ours[ctx]:.2f}x",
                f"{ours[ctx] / ours[contexts[0]]:.3f}",
            ]
        )
    print_table(
        "Decode step latency (us per token, all heads; flat = latency / latency at first context)",
        ["context", "interdomain step", "SDPA KV-cache step", "speed-up", "flat"],
        rows,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--measure", nargs=2, metavar=("KIND", "T"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        measure_memory(args.measure[0], int(args.measure[1]))
        return
    torch.manual_seed(0)
    lengths = [512, 1024, 2048, 4096] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    contexts = [512, 2048, 8192] if args.quick else [512, 1024, 2048, 4096, 8192, 16384, 32768]
    training_table(lengths, reps=3 if args.quick else 7)
    decode_table(contexts, steps=50 if args.quick else 100)


if __name__ == "__main__":
    main()
