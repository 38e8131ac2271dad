"""transformers' generate on this CPU: the default IdmixCache against a static one (the
one-token step compiled, ``idmix.hf.static_step``), side by side, greedy, B = 1.

    python benchmarks/bench_hf_generate_cpu.py            # prompt 256, 64 new tokens
    python benchmarks/bench_hf_generate_cpu.py --prompt 1024 --new 128

The tiny builder with each mixer (random weights, one thread); tokens/s count the new tokens
over the whole call (prefill included), median of interleaved calls after one untimed call
each (the static side's compiles there). Both sides must give the same tokens.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import interleaved_medians, print_table  # noqa: E402

from idmix.hf import IdmixCache, IdmixConfig, IdmixForCausalLM  # noqa: E402


def mixer_row(mixer: str, prompt: int, new: int, reps: int, compile_config) -> list[str]:
    """[mixer, default tok/s, static tok/s, ratio] for the tiny model with that mixer."""
    torch.manual_seed(0)
    config = IdmixConfig(builder="interdomain_tiny", overrides={"mixer": mixer})
    model = IdmixForCausalLM(config).eval()
    ids = torch.randint(1, config.vocab_size, (1, prompt))
    outputs = {}

    def call(name: str) -> None:
        extra = {}
        if name == "static":
            cache = IdmixCache(model.model, 1, prompt + new, static=True)
            extra = {"cache": cache, "compile_config": compile_config}
        outputs[name] = model.generate(
            ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, **extra
        )

    seconds = interleaved_medians({n: (lambda n=n: call(n)) for n in ("default", "static")}, reps)
    if not torch.equal(outputs["default"], outputs["static"]):
        raise SystemExit(f"{mixer}: the static cache's tokens differ from the default's")
    default, static = new / seconds["default"], new / seconds["static"]
    return [mixer, f"{default:.0f}", f"{static:.0f}", f"{static / default:.2f}×"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import CompileConfig

    compile_config = CompileConfig()
    compile_config._compile_all_devices = True  # transformers compiles on accelerators only
    rows = [
        mixer_row(mixer, args.prompt, args.new, args.reps, compile_config)
        for mixer in ("interdomain", "softmax")
    ]
    print_table(
        f"HF generate, tiny models, B = 1, prompt {args.prompt}, {args.new} new tokens (tok/s)",
        ["mixer", "default cache", "static cache, compiled", "static / default"],
        rows,
    )


if __name__ == "__main__":
    main()
