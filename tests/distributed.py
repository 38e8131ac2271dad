"""Run a function on a gloo process group of several CPU processes (tests of context
parallelism): each rank joins through a file, with a timeout, so a dead peer fails the others
instead of hanging them."""

from __future__ import annotations

import datetime
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_S = 60


def _entry(rank, world, init_file, fn, args, timeout_s):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )  # fmt: skip
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, fn, *args, timeout_s: int = TIMEOUT_S) -> None:
    """fn(rank, world, *args) on world processes (fn importable at module level: spawned);
    an exception on any rank fails the call with that rank's traceback."""
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        mp.spawn(_entry, args=(world, init, fn, args, timeout_s), nprocs=world, join=True)


def exit_codes(world: int, fn, *args, timeout_s: int, wait_s: float) -> list[int | None]:
    """Start fn on world ranks and wait up to wait_s for each to exit by itself (no rank is
    stopped because another failed); returns their exit codes (None: still running, killed)."""
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        ctx = mp.start_processes(
            _entry, args=(world, init, fn, args, timeout_s), nprocs=world, join=False
        )
        deadline = time.monotonic() + wait_s
        for process in ctx.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        codes = [process.exitcode for process in ctx.processes]
        for process in ctx.processes:
            if process.is_alive():
                process.kill()
        return codes
