"""torch.compile (Inductor, fullgraph) against eager on CPU, side by side in one run.

    python benchmarks/bench_compile_cpu.py           # layer at T in {1K, 4K, 16K}; tiny model
    python benchmarks/bench_compile_cpu.py --quick   # layer at T in {1K, 4K}

Layer: InterdomainAttention (d = 512, 8 heads of 64, M = 64), B = 1, fp32, forward + backward.
Tiny model: training step (forward, cross-entropy, backward, AdamW) at B = 4, T = 512, each block
and the loss compiled with fullgraph=True (torchtune's compile_model + compile_loss); decoding:
one token per step through the recurrent cache, B = 1, the whole model compiled. Compile
time = the first call's wall time (Dynamo + AOTAutograd + Inductor, with whatever the Inductor
cache already holds).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import blocked_medians, interleaved_medians, mark, print_table  # noqa: E402

from idmix.models import cpu_model  # noqa: E402
from idmix.modules import InterdomainAttention  # noqa: E402


def first_call_seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def layer_rows(lengths):
    rows = []
    for T in lengths:
        torch._dynamo.reset()
        torch.manual_seed(0)
        layer = InterdomainAttention(512, 8, num_modes=64)
        fast = torch.compile(layer, fullgraph=True, dynamic=False)
        x = torch.randn(1, T, 512, requires_grad=True)

        def run(mod, x=x):
            def fwd_bwd():
                mod(x, x).sum().backward()

            return fwd_bwd

        compile_s = first_call_seconds(run(fast))
        t = interleaved_medians({"eager": run(layer), "compiled": run(fast)}, reps=5)
        rows.append(
            [
                f"layer f+b T={T}",
                f"{t['eager'] * 1e3:.1f} ms",
                f"{t['compiled'] * 1e3:.1f} ms",
                f"{t['eager'] / t['compiled']:.2f}x",
                f"{compile_s:.1f}",
            ]
        )
    return rows


def cross_entropy(logits, labels):
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def train_row(B=4, T=512):
    """(the table row, compiled tokens/s over eager's)."""
    torch._dynamo.reset()
    models = {}
    for name in ("eager", "compiled"):
        torch.manual_seed(0)
        models[name] = cpu_model("interdomain", "tiny", max_seq_len=T)
    for layer in models["compiled"].layers:
        layer.compile(fullgraph=True, dynamic=False)
    losses = {"eager": cross_entropy, "compiled": torch.compile(cross_entropy, fullgraph=True)}
    tokens = torch.randint(0, 4096, (B, T + 1))

    def step_fn(name):
        model = models[name]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            loss = losses[name](model(tokens[:, :-1]), tokens[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    fns = {name: step_fn(name) for name in models}
    compile_s = first_call_seconds(fns["compiled"])
    t = interleaved_medians(fns, reps=7)
    tps = {name: B * T / s for name, s in t.items()}
    speedup = tps["compiled"] / tps["eager"]
    row = [
        f"tiny train step (B={B}, T={T})",
        f"{tps['eager']:.0f} tok/s",
        f"{tps['compiled']:.0f} tok/s",
        f"{speedup:.2f}x",
        f"{compile_s:.1f}",
    ]
    return row, speedup


def decode_row(context=256):
    torch._dynamo.reset()
    steps = {}
    mask = torch.ones(1, 1, context + 1, dtype=torch.bool)
    pos = torch.tensor([[context]])
    token = torch.randint(0, 4096, (1, 1))
    for name in ("eager", "compiled"):
        torch.manual_seed(0)
        model = cpu_model("interdomain", "tiny", max_seq_len=context + 1).eval()
        model.setup_caches(batch_size=1, dtype=torch.float32, decoder_max_seq_len=context + 1)
        fn = torch.compile(model, fullgraph=True, dynamic=False) if name == "compiled" else model

        @torch.no_grad()
        def step(fn=fn):
            fn(token, mask=mask, input_pos=pos)

        steps[name] = step
    compile_s = first_call_seconds(steps["compiled"])
    t = blocked_medians(steps, calls=200, rounds=5)
    return [
        "tiny decode step (B=1)",
        f"{1 / t['eager']:.0f} tok/s",
        f"{1 / t['compiled']:.0f} tok/s",
        f"{t['eager'] / t['compiled']:.2f}x",
        f"{compile_s:.1f}",
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="layer at T in {1K, 4K} only")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    lengths = (1024, 4096) if args.quick else (1024, 4096, 16384)
    train, speedup = train_row()
    rows = layer_rows(lengths) + [train, decode_row()]
    print_table(
        f"torch.compile vs eager (Inductor, fullgraph, fp32, {torch.get_num_threads()} threads)",
        ["what", "eager", "compiled", "speed-up", "compile s"],
        rows,
    )
    print_table(
        "Target (CPU speed issue)",
        ["target", "measured", ""],
        [["compiled training step ≥ 1.3× eager", f"{speedup:.2f}×", mark(speedup >= 1.3)]],
    )


if __name__ == "__main__":
    main()
