"""Chunked interdomain op vs causal SDPA on CPU, and the decode step vs a KV-cache SDPA step.

    python benchmarks/bench_interdomain_cpu.py            # full tables (a few minutes)
    python benchmarks/bench_interdomain_cpu.py --quick    # T <= 4K, fewer repetitions

Shapes: B=1, H=8, R=D=M=64, fp32, chunk 64. Times are interleaved medians; memory is the peak
RSS increase of one forward+backward in a fresh process (inputs excluded). "inductor" is the
chunked op with backend="inductor" (its segment math compiled by torch.compile; the compile
runs in the untimed warm-up call; memory not measured). The decode step is
the layers' runtime path (``interdomain_decode_step`` in place on the real state), eager
against eager SDPA and compiled against compiled. The last table marks the CPU speed issue's
targets ✓/✗.
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
    mark,
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
    state_to_interleaved,
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
        backend = "inductor" if kind == "inductor" else "auto"

        def f():
            return interdomain_attention(q, k, v, lam, beta, C, impl=impl, backend=backend)[0]

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
        ind_f, ind_fb = fwd_bwd("inductor", T)
        sdpa_f, sdpa_fb = fwd_bwd("sdpa", T)
        n = max(2, reps if T <= 4096 else reps // 2)
        fns = {"of": ours_f, "if": ind_f, "sf": sdpa_f, "ofb": ours_fb, "ifb": ind_fb}
        t = interleaved_medians({**fns, "sfb": sdpa_fb}, n)
        mem_o = measure_in_subprocess(script, "chunked", str(T))["mb"]
        mem_s = measure_in_subprocess(script, "sdpa", str(T))["mb"]
        naive = "-"
        if T <= 512:
            naive_f, _ = fwd_bwd("naive", T)
            naive = f"{interleaved_medians({'n': naive_f}, 1, warmup=0)['n'] * 1e3:.0f}"
        results[T] = {**t, "mem_ratio": mem_o / mem_s}
        rows.append(
            [
                str(T),
                f"{t['of'] * 1e3:.1f}",
                f"{t['sf'] * 1e3:.1f}",
                f"{t['sf'] / t['of']:.2f}x",
                f"{t['ofb'] * 1e3:.1f}",
                f"{t['sfb'] * 1e3:.1f}",
                f"{t['sfb'] / t['ofb']:.2f}x",
                f"{t['sf'] / t['if']:.2f}x",
                f"{t['sfb'] / t['ifb']:.2f}x",
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
            "inductor fwd speed-up",
            "inductor f+b speed-up",
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
    return results


def decode_steps(ctx, lam, beta, C, G_hat):
    """The layers' decode step (real state, in place) after a real prefill of ctx tokens, and one
    SDPA step over a KV cache of ctx tokens (appending in place); each eager and compiled."""
    q, k, v = inputs(ctx, "ours")
    with torch.no_grad():  # a real prefill, so the state is the one a decoder would hold
        _, (xk, xv) = interdomain_attention(q, k, v, lam, beta, C, output_final_state=True)
    Z = state_to_interleaved(xk, xv).contiguous()
    lam_ri, beta_ri = torch.view_as_real(lam), torch.view_as_real(beta)
    qt, kt, vt = (torch.randn(B, H, R) for _ in range(3))
    k_cache, v_cache = torch.randn(B, H, ctx + 1, R), torch.randn(B, H, ctx + 1, D)

    def ours_step(q_, k_, v_, state):
        return interdomain_decode_step(q_, k_, v_, lam_ri, beta_ri, G_hat, state, inplace=True)[0]

    def sdpa_step(q_, k_, v_, kc, vc):
        kc[:, :, ctx] = k_
        vc[:, :, ctx] = v_
        return F.scaled_dot_product_attention(q_[:, :, None], kc, vc)

    ours_c = torch.compile(ours_step, fullgraph=True, dynamic=False)
    sdpa_c = torch.compile(sdpa_step, fullgraph=True, dynamic=False)
    calls = {
        "ours": lambda: ours_step(qt, kt, vt, Z),
        "sdpa": lambda: sdpa_step(qt, kt, vt, k_cache, v_cache),
        "ours_c": lambda: ours_c(qt, kt, vt, Z),
        "sdpa_c": lambda: sdpa_c(qt, kt, vt, k_cache, v_cache),
    }
    return {name: torch.no_grad()(fn) for name, fn in calls.items()}


def decode_table(contexts, steps):
    """Interdomain steps of all contexts run round-robin (one state per context, from a real
    prefill), so machine drift cannot masquerade as a context effect; SDPA per context.
    Returns {context: {method: seconds}}."""
    lam, beta, C = params()
    G_hat = readout_gram(C, "conj")
    fns = {ctx: decode_steps(ctx, lam, beta, C, G_hat) for ctx in contexts}
    times = {ctx: {} for ctx in contexts}
    for kind in ("ours", "ours_c"):
        t = blocked_medians({ctx: f[kind] for ctx, f in fns.items()}, steps, rounds=15)
        for ctx in contexts:
            times[ctx][kind] = t[ctx]
    rows = []
    for ctx in contexts:
        sdpa = blocked_medians({k: fns[ctx][k] for k in ("sdpa", "sdpa_c")}, steps, rounds=3)
        times[ctx].update(sdpa)
        t = times[ctx]
        rows.append([
            str(ctx),
            f"{t['ours'] * 1e6:.0f}", f"{t['sdpa'] * 1e6:.0f}", f"{t['sdpa'] / t['ours']:.2f}x",
            f"{t['ours_c'] * 1e6:.0f}", f"{t['sdpa_c'] * 1e6:.0f}",
            f"{t['sdpa_c'] / t['ours_c']:.2f}x",
            f"{t['ours'] / times[contexts[0]]['ours']:.3f}",
        ])  # fmt: skip
    print_table(
        "Decode step latency (us per token, all heads, the layers' real-state step in place; "
        "speed-up = SDPA / ours; flat = eager latency / latency at the first context)",
        ["context", "ours eager", "SDPA eager", "speed-up", "ours compiled", "SDPA compiled",
         "speed-up", "flat"],
        rows,
    )  # fmt: skip
    return times


def targets_table(train: dict, decode: dict) -> None:
    """The CPU speed issue's targets that this benchmark measures, each ✓/✗."""
    rows = []

    def row(target, value, ok):
        rows.append([target, value, mark(ok)])

    for o, tag in (("o", ""), ("i", " [inductor]")):
        if 1024 in train:
            r = train[1024]["sfb"] / train[1024][o + "fb"]
            row(f"fwd+bwd ≥ 1.0× SDPA at 1K{tag}", f"{r:.2f}×", r >= 1.0)
        if 16384 in train:
            r = train[16384]["sfb"] / train[16384][o + "fb"]
            row(f"fwd+bwd ≥ 10× SDPA at 16K{tag}", f"{r:.2f}×", r >= 10)
        if 2048 in train and 16384 in train:
            r = train[16384][o + "fb"] / train[2048][o + "fb"]
            row(f"linear: f+b time 16K / 2K ≤ 8.8{tag}", f"{r:.2f}", r <= 8.8)
        fwd = min(t["sf"] / t[o + "f"] for T, t in train.items() if T >= 1024)
        row(f"fwd ≥ 1.0× SDPA from 1K{tag}", f"min {fwd:.2f}×", fwd >= 1.0)
    mem = {T: t["mem_ratio"] for T, t in train.items() if T >= 4096}
    if mem:
        worst = max(mem.values())
        row("peak memory ≤ 1.5× SDPA from 4K", f"max {worst:.2f}×", worst <= 1.5)
    at = [ctx for ctx in decode if ctx >= 512]
    for kind, label in (("", "eager"), ("_c", "compiled")):
        worst = min(decode[c]["sdpa" + kind] / decode[c]["ours" + kind] for c in at)
        row(f"decode step ≤ SDPA's from 512 ({label})", f"min speed-up {worst:.2f}×", worst >= 1)
    flat = max(decode[c]["ours"] for c in at) / min(decode[c]["ours"] for c in at)
    row(f"decode step flat within 5% to {max(at)}", f"max/min {flat:.3f}", flat <= 1.05)
    print_table("Targets (CPU speed issue)", ["target", "measured", ""], rows)


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
    train = training_table(lengths, reps=3 if args.quick else 7)
    decode = decode_table(contexts, steps=50 if args.quick else 100)
    targets_table(train, decode)


if __name__ == "__main__":
    main()
