"""torch.compile (Inductor, fullgraph) against eager on CPU, side by side in one run.

    python benchmarks/bench_compile_cpu.py           # layer at T in {1K, 4K, 16K}; tiny model
    python benchmarks/bench_compile_cpu.py --quick   # layer at T in {1K, 4K}

Layer: InterdomainAttention (d = 512, 8 heads of 64, M = 64), B = 1, fp32, forward + backward.
Tiny model: training step (forward, cross-entropy, backward, AdamW) at B = 4, T = 512, each block
and the loss compiled with fullgraph=True (torchtune's compile_model + compile_loss). Layer and
training rows run twice: with the default op (opaque to Inductor, eager inside) and with
backend="inductor" (its segment math compiled too, in the eager and the compiled model alike);
the target compares the compiled step with backend="inductor" against the default eager one.
Decoding:
one token per step through the recurrent cache, B = 1, the whole model compiled. Compile
time = the first call's wall time (Dynamo + AOTAutograd + Inductor, with whatever the Inductor
cache already holds).
"""

from __future__ import annotations

import argparse
import itertools
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


BACKENDS = ("auto", "inductor")


def layer_rows(lengths):
    rows = []
    for T, backend in itertools.product(lengths, BACKENDS):
        torch._dynamo.reset()
        torch.manual_seed(0)
        layer = InterdomainAttention(512, 8, num_modes=64, backend=backend)
        fast = torch.compile(layer, fullgraph=True, dynamic=False)
        x = torch.randn(1, T, 512, requires_grad=True)

        def run(mod, x=x):
            def fwd_bwd():
                mod(x, x).sum().backward()

            return fwd_bwd

        run(layer)()  # backend="inductor" compiles its pieces here
        compile_s = first_call_seconds(run(fast))
        t = interleaved_medians({"eager": run(layer), "compiled": run(fast)}, reps=5)
        rows.append(
            [
                f"layer f+b T={T} [{backend}]",
                f"{t['eager'] * 1e3:.1f} ms",
                f"{t['compiled'] * 1e3:.1f} ms",
                f"{t['eager'] / t['compiled']:.2f}x",
                f"{compile_s:.1f}",
            ]
        )
    return rows


def cross_entropy(logits, labels):
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def train_rows(B=4, T=512):
    """(a table row per backend, compiled tokens/s with backend="inductor" over eager's with
    the default), the four steps timed in one interleaved run."""
    torch._dynamo.reset()
    tokens = torch.randint(0, 4096, (B, T + 1))
    compiled_loss = torch.compile(cross_entropy, fullgraph=True)

    def step_fn(backend, compiled):
        torch.manual_seed(0)
        model = cpu_model("interdomain", "tiny", max_seq_len=T, backend=backend)
        if compiled:
            for layer in model.layers:
                layer.compile(fullgraph=True, dynamic=False)
        loss_fn = compiled_loss if compiled else cross_entropy
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    fns = {(b, c): step_fn(b, c) for b in BACKENDS for c in (False, True)}
    fns[BACKENDS[1], False]()  # the inductor pieces compile here, outside the compile column
    compile_s = {b: first_call_seconds(fns[b, True]) for b in BACKENDS}
    t = interleaved_medians(fns, reps=7)
    tps = {key: B * T / s for key, s in t.items()}
    rows = [
        [
            f"tiny train step (B={B}, T={T}) [{b}]",
            f"{tps[b, False]:.0f} tok/s",
            f"{tps[b, True]:.0f} tok/s",
            f"{tps[b, True] / tps[b, False]:.2f}x",
            f"{compile_s[b]:.1f}",
        ]
        for b in BACKENDS
    ]
    return rows, tps["inductor", True] / tps["auto", False]


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
    train, speedup = train_rows()
    rows = layer_rows(lengths) + train + [decode_row()]
    print_table(
        f"torch.compile vs eager (Inductor, fullgraph, fp32, {torch.get_num_threads()} threads)",
        ["what", "eager", "compiled", "speed-up", "compile s"],
        rows,
    )
    print_table(
        "Target (CPU speed issue)",
        ["target", "measured", ""],
        [
            [
                "compiled training step [inductor] ≥ 1.3× eager [auto]",
                f"{speedup:.2f}×",
                mark(speedup >= 1.3),
            ]
        ],
    )


if __name__ == "__main__":
    main()
