"""CPU int8 (PT2E, oneDNN) against fp32, both as AOTInductor packages with freezing, side by side.

    python benchmarks/bench_quantized_cpu.py                 # interdomain_125m (d = 768)
    python benchmarks/bench_quantized_cpu.py --model interdomain_small --layers 0

Rows: the decode step at B = 1 (tokens/s of one step with a state) and the prefill at B = 8
(tokens/s over the prompt), for fp32, x86_int8_dynamic and x86_int8_static
(``idmix.evaluation.pt2e``), as AOTInductor packages; and the decode step of fp32 and of
torchao's int8_dynamic_int4 lowered to ExecuTorch with XNNPACK (``idmix.evaluation.edge``;
"vs fp32" against the fp32 AOTInductor package). Random weights (speed does not depend on
training); static ranges calibrated on random tokens. Targets (issue: quantised export): at the
125M width int8 decode ≥ 2× fp32 at B = 1 and prefill ≥ 1.5× at B = 8; at d ≤ 256, int8 not
slower than fp32. Each program is also checked against the one it was compiled or lowered from
(top-1 agreement and max |Δlogit| over the logit range, on one call).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import blocked_medians, mark, print_table  # noqa: E402

from idmix import models  # noqa: E402
from idmix.evaluation.deploy import (  # noqa: E402
    causal_mask,
    export_programs,
    load_program,
    quantize_linears,
    save_program,
)
from idmix.evaluation.edge import load_executorch, save_executorch  # noqa: E402
from idmix.evaluation.pt2e import PT2E_MODES, agreement, quantize_program  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="interdomain_125m")
    parser.add_argument("--layers", type=int, default=0, help="override num_layers (0: keep)")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--reps", type=int, default=10, help="calls per timing round")
    args = parser.parse_args()
    torch.manual_seed(0)
    overrides = {"num_layers": args.layers} if args.layers else {}
    model = getattr(models, args.model)(max_seq_len=args.prompt + 8, **overrides).eval()
    d = model.tok_embeddings.weight.shape[1]
    V = model.output.weight.shape[0]
    P, S = args.prompt, args.prompt + 8
    mask = causal_mask(8, S)
    prompt8 = torch.randint(0, V, (8, P))
    pre_args = (prompt8, torch.arange(P).expand(8, -1), mask[:, :P])
    prefill = export_programs(model, 8, P, S)[0]
    decode = export_programs(model, 1, P, S)[1]
    state = [torch.randn(t.shape) * 0.1 for t in decode.example_inputs[0][3:]]
    dec_args = (torch.randint(0, V, (1, 1)), torch.full((1, 1), P), mask[:1, P : P + 1], *state)
    calib_pre = [(torch.randint(0, V, (8, P)), *pre_args[1:]) for _ in range(2)]
    calib_dec = [(torch.randint(0, V, (1, 1)), *dec_args[1:]) for _ in range(4)]
    runs, checks = {}, {}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        for name in ("fp32", *PT2E_MODES):
            programs = {"prefill": prefill, "decode": decode}
            if name != "fp32":
                programs = {
                    "prefill": quantize_program(prefill, name, calib_pre),
                    "decode": quantize_program(decode, name, calib_dec),
                }
            for part, program in programs.items():
                path = Path(tmp) / f"{name}_{part}.pt2"
                t0 = time.perf_counter()
                save_program(program, path, aoti=True)
                compile_s = time.perf_counter() - t0
                run = load_program(path, aoti=True)
                call = pre_args if part == "prefill" else dec_args
                runs[name, part] = lambda run=run, call=call: run(*call)
                a = agreement(run(*call)[0], program.module()(*call)[0])
                checks[name, part] = (a, compile_s)
        for name in ("fp32", "int8_dynamic_int4"):  # the decode step in ExecuTorch (XNNPACK)
            program = decode
            if name != "fp32":
                program = export_programs(quantize_linears(model, name), 1, P, S)[1]
            path = Path(tmp) / f"{name}_decode.pte"
            t0 = time.perf_counter()
            save_executorch(program, path)
            compile_s = time.perf_counter() - t0
            run = load_executorch(path)
            key = (f"executorch {name}", "decode")
            runs[key] = lambda run=run: run(*dec_args)
            checks[key] = (agreement(run(*dec_args)[0], program.module()(*dec_args)[0]), compile_s)
        # all packages timed round by round, so machine noise hits every mode alike
        seconds = blocked_medians(runs, calls=args.reps)
    speed = {key: (8 * P if key[1] == "prefill" else 1) / s for key, s in seconds.items()}
    rows = [
        [
            name, part, f"{speed[name, part]:,.0f}",
            f"{speed[name, part] / speed['fp32', part]:.2f}×", f"{a['top1']:.3f}",
            f"{a['max_dlogit_over_range']:.1e}", f"{compile_s:.0f}",
        ]
        for (name, part), (a, compile_s) in checks.items()
    ]  # fmt: skip
    title = (
        f"{args.model} (d = {d}, {len(model.layers)} layers, vocab {V}): fp32 vs PT2E int8, "
        f"AOTInductor + freezing, {torch.get_num_threads()} threads; prefill B = 8 × {P}"
    )
    header = ["mode", "program", "tokens/s", "vs fp32", "top-1 vs converted", "max|Δ|/range"]
    print_table(title, [*header, "compile/lower s"], rows)
    wide = d > 256
    targets = []
    for name in PT2E_MODES:
        dec = speed[name, "decode"] / speed["fp32", "decode"]
        pre = speed[name, "prefill"] / speed["fp32", "prefill"]
        want_dec, want_pre = (2.0, 1.5) if wide else (1.0, 1.0)
        targets.append([name, f"decode B=1 {dec:.2f}× (≥{want_dec:g}×)", mark(dec >= want_dec)])
        targets.append([name, f"prefill B=8 {pre:.2f}× (≥{want_pre:g}×)", mark(pre >= want_pre)])
    print_table("Targets", ["mode", "figure", "met"], targets)


if __name__ == "__main__":
    main()
