"""Context parallelism on CPU (gloo): one long sequence on one process against the same sequence
split over N processes, side by side in one run.

    python benchmarks/bench_context_parallel_cpu.py                 # T in {16K, 64K}, N = 4
    python benchmarks/bench_context_parallel_cpu.py --lengths 4096 --world 2   # quick

Model: interdomain_tiny (2 layers, d = 128), B = 1, fp32, two AdamW steps (forward,
cross-entropy, backward, step) on the same random tokens. Each configuration runs in a fresh
process (MALLOC_MMAP_THRESHOLD_ low, so RSS tracks live memory); memory is each rank's peak RSS
during the steps minus its RSS before them (the model, the optimiser state and the interpreter
are the same on every rank and not counted). Traffic: the bytes each rank puts into the
state / halo all-gathers (forward) and their gradient all-reduces (backward), per layer and
step. Targets: per-rank peak ≤ 0.35× the single process's; loss equal within fp32 noise; the
bytes independent of T.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import mark, measure_in_subprocess, peak_rss_increase_mb, print_table  # noqa: E402

from idmix.models import interdomain_tiny  # noqa: E402
from idmix.parallel import ContextParallel, count_traffic  # noqa: E402

STEPS = 2
TARGET_MEMORY = 0.35


def _steps(T: int, rank: int, world: int) -> dict:
    """Two training steps of this rank's slice of one T-token sequence."""
    torch.manual_seed(0)
    split = {"context_parallel": ContextParallel()} if world > 1 else {}
    model = interdomain_tiny(max_seq_len=T, **split)  # max_seq_len: torchtune's bound only
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 4096, (1, T + 1), generator=torch.Generator().manual_seed(1))
    n = T // world
    inputs, labels = tokens[:, :-1][:, rank * n : (rank + 1) * n], tokens[:, 1:][:, rank * n :]
    labels = labels[:, :n]
    losses = []

    def run():
        for _ in range(STEPS):
            loss = F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten(), reduction="sum")
            (loss / T).backward()
            if world > 1:
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                loss = loss.detach()
                dist.all_reduce(loss)
            losses.append(loss.item() / T)
            opt.step()
            opt.zero_grad()

    with count_traffic() as traffic:
        peak = peak_rss_increase_mb(run)
    per_layer_step = len(model.layers) * STEPS
    split = {d: {k: v // per_layer_step for k, v in getattr(traffic, d).items() if k != "lengths"}
             for d in ("forward", "backward")}  # fmt: skip
    return {"peak_mb": peak, "losses": losses, "traffic": split}


def _rank(rank, world, init, T, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))  # fmt: skip
    try:
        result = _steps(T, rank, world)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def measure(T: int, world: int) -> dict:
    """One configuration in this (fresh) process: the worst rank's peak, rank 0's losses and
    traffic."""
    if world == 1:
        torch.set_num_threads(1)
        return _steps(T, 0, 1)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(world, os.path.join(tmp, "init"), T, tmp), nprocs=world)
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    return {
        "peak_mb": max(r["peak_mb"] for r in ranks),
        "losses": ranks[0]["losses"],
        "traffic": ranks[0]["traffic"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384, 65536])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--measure", nargs=2, type=int, metavar=("T", "WORLD"))
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    script = str(Path(__file__).resolve())
    rows, records = [], []
    for T in args.lengths:
        one = measure_in_subprocess(script, str(T), "1")
        split = measure_in_subprocess(script, str(T), str(args.world))
        ratio = split["peak_mb"] / one["peak_mb"]
        loss_rel = max(abs(a / b - 1) for a, b in zip(split["losses"], one["losses"], strict=True))
        fwd, bwd = split["traffic"]["forward"], split["traffic"]["backward"]
        rows.append([
            f"{T:,}", f"{one['peak_mb']:.0f}", f"{split['peak_mb']:.0f}",
            f"{ratio:.2f} {mark(ratio <= TARGET_MEMORY)}", f"{loss_rel:.1e}",
            f"{fwd.get('state', 0):,}", f"{fwd.get('conv_halo', 0):,}",
            f"{sum(bwd.values()):,}",
        ])  # fmt: skip
        records.append({"T": T, "world": args.world, "one": one, "split": split})
    print_table(
        f"interdomain_tiny, B = 1, {STEPS} AdamW steps; {args.world} gloo processes vs 1",
        ["T", "1 proc MiB", "per rank MiB", "ratio (≤0.35)", "loss rel Δ",
         "state B/layer/step", "halo B/layer/step", "backward B/layer/step"],
        rows,
    )  # fmt: skip
    out = Path(__file__).resolve().parent / "results" / "context_parallel_cpu.json"
    out.write_text(json.dumps(records, indent=1) + "\n")
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
