"""Timing and memory helpers shared by the benchmark scripts (never used by tests)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable


def interleaved_medians(fns: dict[str, Callable[[], object]], reps: int, warmup: int = 1):
    """Median seconds of each fn, running them round-robin so machine noise hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def blocked_medians(fns: dict[str, Callable[[], object]], calls: int, rounds: int = 5):
    """Median over rounds of the mean per-call seconds of `calls` back-to-back calls of each fn.

    For steady-state loops (decoding): consecutive calls of one fn, as in real use, so one
    method's cache footprint does not slow the other's calls down.
    """
    per_round = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            fn()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            per_round[name].append((time.perf_counter() - t0) / calls)
    return {name: statistics.median(ts) for name, ts in per_round.items()}


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_rss_increase_mb(fn: Callable[[], object]) -> float:
    """Peak RSS during fn minus RSS before it, in MiB (Linux: resets VmHWM via clear_refs).

    Meaningful in a fresh process started with MALLOC_MMAP_THRESHOLD_ set low (see
    ``measure_in_subprocess``), so that freed tensors return to the OS and RSS tracks live memory.
    """
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kb("VmRSS")
    fn()
    return (_status_kb("VmHWM") - before) / 1024


def measure_in_subprocess(script: str, *args: str) -> dict:
    """Run ``python script --measure args…`` in a fresh process; it prints one JSON line."""
    env = {"MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, script, "--measure", *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))


def mark(ok: bool) -> str:
    """✓ / ✗ for a target row."""
    return "✓" if ok else "✗"
