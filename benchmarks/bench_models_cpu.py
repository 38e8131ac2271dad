"""Whole models on CPU: training-step tokens/s of the three mixers, and decoding tokens/s and
cache memory against context length (interdomain vs softmax), eager and compiled.

    python benchmarks/bench_models_cpu.py            # tiny+small, T 256..8K; contexts 512..32K
    python benchmarks/bench_models_cpu.py --quick    # tiny only, T <= 2K; contexts 512..8K

Training step = forward + cross-entropy + backward + AdamW, B=1, fp32. Decoding: B=1, one
token per step through the cache; the cache is filled to the context length directly (a KV
cache of random keys/values, a random SSM state): a step's cost depends on the cache's size,
not its contents, and a 32K softmax prefill would dominate the run. Compiled decoding is
``torch.compile(model, fullgraph=True, dynamic=False)`` (``generate(compile=True)`` compiles
that model call inside its whole one-token step, idmix.static_decode).
The last table marks the CPU speed issue's model-level targets ✓/✗.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import blocked_medians, mark, print_table  # noqa: E402

from idmix import cache_nbytes, models  # noqa: E402

MIXERS = ("interdomain", "s4d", "softmax")
# Training also runs interdomain with its op's segment math compiled (backend="inductor", an
# eager model otherwise); its first step per length compiles, outside the timed calls.
TRAINED = {
    **{m: (m, {}) for m in MIXERS},
    "interdomain[inductor]": ("interdomain", {"backend": "inductor"}),
}


def train_step_fn(model, T, batch=1):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 4096, (batch, T + 1))

    def step():
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def training_table(scales, lengths):
    """Returns {(scale, T, variant): tokens/s over softmax's} for both interdomain variants."""
    rows, ratios = [], {}
    for scale in scales:
        built = {
            name: models.cpu_model(mixer, scale, max_seq_len=max(lengths), **options)
            for name, (mixer, options) in TRAINED.items()
        }
        for T in lengths:
            fns = {name: train_step_fn(built[name], T) for name in TRAINED}
            t = blocked_medians(fns, calls=1, rounds=3 if T <= 2048 else 2)
            tps = {name: T / t[name] for name in TRAINED}
            for name in ("interdomain", "interdomain[inductor]"):
                ratios[scale, T, name] = tps[name] / tps["softmax"]
            rows.append(
                [scale, str(T)]
                + [f"{tps[name]:.0f}" for name in TRAINED]
                + [f"{ratios[scale, T, 'interdomain']:.2f}x"]
                + [f"{ratios[scale, T, 'interdomain[inductor]']:.2f}x"]
            )
    print_table(
        "Training step tokens/s (B=1, fp32, fwd+bwd+AdamW, eager models; ratios over softmax)",
        ["size", "T", *TRAINED, "ratio", "ratio[inductor]"],
        rows,
    )
    return ratios


@torch.no_grad()
def fill_cache(model, ctx):
    for layer in model.layers:
        cache = layer.attn.kv_cache
        if hasattr(cache, "length"):  # softmax KV cache
            cache.k[:, :, :ctx].normal_()
            cache.v[:, :, :ctx].normal_()
            cache.length.fill_(ctx)
        else:
            cache.state.copy_(torch.randn_like(cache.state) * 0.1)


def decode_fn(model, ctx, compiled=False):
    model.setup_caches(batch_size=1, dtype=torch.float32, decoder_max_seq_len=ctx + 1)
    forward = torch.compile(model, fullgraph=True, dynamic=False) if compiled else model
    fill_cache(model, ctx)
    token = torch.randint(0, 4096, (1, 1))
    pos = torch.tensor([[ctx]])
    mask = torch.ones(1, 1, ctx + 1, dtype=torch.bool)

    @torch.no_grad()
    def step():
        for layer in model.layers:  # decode the same position again: constant cache length
            if hasattr(layer.attn.kv_cache, "length"):
                layer.attn.kv_cache.length.fill_(ctx)
        forward(token, mask=mask, input_pos=pos)

    return step


def decode_table(scale, contexts, calls):
    """Flatness: interdomain steps of all contexts run round-robin on one model (its cache does
    not depend on the context; only the position does), so machine drift cannot pose as a
    context effect. Ratio: at each context, interdomain and softmax (one KV cache per context)
    timed in alternating rounds, so both see the same machine. Eager and compiled rows.
    Returns {(mode, context): interdomain tokens/s / softmax's}."""
    torch._dynamo.config.cache_size_limit = 64  # one graph per context and mode
    built = {
        m: models.cpu_model(m, scale, max_seq_len=max(contexts) + 1)
        for m in ("interdomain", "softmax")
    }
    ours_model = built["interdomain"]
    rows, ratios = [], {}
    for mode in ("eager", "compiled"):
        compiled = mode == "compiled"
        ours_fns = {ctx: decode_fn(ours_model, ctx, compiled) for ctx in contexts}
        ours_mem = cache_nbytes(ours_model) / 2**20
        flat = blocked_medians(ours_fns, calls=calls, rounds=25)
        for ctx in contexts:
            fn = decode_fn(built["softmax"], ctx, compiled)
            t = blocked_medians({"ours": ours_fns[ctx], "soft": fn}, calls=calls, rounds=9)
            soft_mem = cache_nbytes(built["softmax"]) / 2**20
            ratios[mode, ctx] = t["soft"] / t["ours"]
            rows.append([
                mode, str(ctx), f"{1 / t['ours']:.0f}", f"{1 / t['soft']:.0f}",
                f"{ratios[mode, ctx]:.2f}x", f"{flat[contexts[0]] / flat[ctx]:.3f}",
                f"{ours_mem:.2f}", f"{soft_mem:.1f}",
            ])  # fmt: skip
    print_table(
        f"Decoding, {scale} model, B=1 (tokens/s; flat = interdomain tokens/s / its value at the "
        "first context; cache MiB)",
        ["mode", "context", "interdomain tok/s", "softmax tok/s", "ratio", "flat",
         "interdomain MiB", "softmax MiB"],
        rows,
    )  # fmt: skip
    return ratios


def targets_table(train: dict, decode: dict) -> None:
    """The CPU speed issue's model-level targets this benchmark measures, each ✓/✗."""
    rows = []
    for (scale, T, name), r in sorted(train.items()):
        if T in (256, 512):
            rows.append(
                [f"{scale} {name} training ≥ softmax at T = {T}", f"{r:.2f}×", mark(r >= 1)]
            )
        if T == 4096:
            rows.append(
                [f"{scale} {name} training ≥ 2× softmax at T = 4K", f"{r:.2f}×", mark(r >= 2)]
            )
    compiled = {ctx: r for (mode, ctx), r in decode.items() if mode == "compiled" and ctx >= 1024}
    if compiled:
        worst = min(compiled.values())
        rows.append(["compiled generation > softmax from 1K", f"min {worst:.2f}×", mark(worst > 1)])
    print_table("Targets (CPU speed issue, models)", ["target", "measured", ""], rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.quick:
        train = training_table(["tiny"], [256, 512, 2048])
        decode = decode_table("tiny", [512, 1024, 2048, 8192], calls=20)
    else:
        train = training_table(["tiny", "small"], [256, 512, 2048, 4096, 8192])
        decode = decode_table("small", [512, 1024, 2048, 4096, 8192, 16384, 32768], calls=100)
    targets_table(train, decode)


if __name__ == "__main__":
    main()
