"""Training and decoding tokens/s of every mixer in the baselines studies, at the study's
shape, side by side with interdomain (docs/baselines.md's tokens/s column).

    python benchmarks/bench_study_mixers_cpu.py                   # tiny, B=8, T=256
    python benchmarks/bench_study_mixers_cpu.py --scale small --threads 1

Training step = forward + cross-entropy + backward + AdamW, fp32, eager models, the study's
batch (B=8, T=256). Decoding = one token through the cache at B=1, the cache filled to the
training length (``bench_models_cpu.decode_fn``; eager). Each mixer's steps run in blocks,
round-robin over the mixers, median over rounds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models_cpu import decode_fn, train_step_fn  # noqa: E402
from common import blocked_medians, print_table  # noqa: E402

from idmix import models  # noqa: E402

# name: (builder, overrides), as recipes/configs/compare_{baselines,future_work}_tiny.yaml
MIXERS = {
    "interdomain": ("interdomain", {}),
    "softmax": ("softmax", {}),
    "interdomain_output_gate": ("interdomain", {"gate": True, "intermediate_dim": 344}),
    "selective_interdomain": ("selective_interdomain", {}),
    "gla": ("gla", {}),
    "mamba2": ("mamba2", {}),
    "gated_deltanet": ("gated_deltanet", {}),
    "mamba3": ("mamba3", {}),
    "interdomain_mamba3": ("interdomain_mamba3", {}),
    "interdomain_delta": ("interdomain_delta", {}),
}


def build(name: str, scale: str):
    builder, overrides = MIXERS[name]
    torch.manual_seed(0)
    return getattr(models, f"{builder}_{scale}")(**overrides)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--mixers", nargs="*", default=list(MIXERS), choices=list(MIXERS))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    built = {name: build(name, args.scale) for name in args.mixers}
    train = blocked_medians(
        {n: train_step_fn(m, args.seq_len, args.batch) for n, m in built.items()}, calls=2, rounds=3
    )
    decode = blocked_medians({n: decode_fn(m, args.seq_len) for n, m in built.items()}, calls=20)
    tokens = args.batch * args.seq_len
    ref = "interdomain" if "interdomain" in built else args.mixers[0]
    rows = [
        [n, f"{tokens / train[n]:.0f}", f"{train[ref] / train[n]:.2f}",
         f"{1 / decode[n]:.0f}", f"{decode[ref] / decode[n]:.2f}"]
        for n in built
    ]  # fmt: skip
    print_table(
        f"{args.scale}, {torch.get_num_threads()} threads: training tokens/s (B={args.batch}, "
        f"T={args.seq_len}, fwd+bwd+AdamW) and decoding tokens/s (B=1); ratios over {ref}",
        ["mixer", "train tok/s", f"× {ref}", "decode tok/s", f"× {ref}"],
        rows,
    )


if __name__ == "__main__":
    main()
