"""A cost model of the chunked op on an H200, built from every launch it makes (counted on a CPU
by benchmarks/launches.py), fitted to the one H200 measurement of the code at aa05976
(benchmarks/results/h200.md), then used to predict the current code.

Each launch costs its launch overhead plus the larger of its products at a fraction of the
tensor-core peak and its bytes at a fraction of HBM bandwidth; two kinds of launch are serial
along T and cost by their length instead: the chunk-state scans (_states_*_kernel: one program
per (row, head, state block) walking its segment's chunks one after another, in waves of
programs over the SMs) and PyTorch's cummax (one thread per (row, head) walking T). The
fractions, the per-chunk step and the per-element cummax step are fitted (least squares on the
log of the ratio, forward and forward+backward at the seven measured lengths).

    python benchmarks/cost_model.py                  # fit on the stored aa05976 launches, predict
    python benchmarks/cost_model.py --markdown out.md
    python benchmarks/cost_model.py --count-old DIR  # recount aa05976 from a checkout at DIR
                                                     # (git worktree add DIR aa05976)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OLD_LAUNCHES = ROOT / "benchmarks" / "results" / "launches_aa05976.json"
H = 16
SMS = 132  # H200 SXM
PEAK = {"tf32": 494.7e12, "bf16": 989.0e12}  # dense tensor-core FLOP/s
HBM = 4.8e12  # bytes/s
RESIDENT = 4  # programs per SM a scan keeps in flight (its kernels: 1-5, offline_compile.py)
# benchmarks/results/h200.md (2026-12-04, code at aa05976): T -> (B, fwd ms, fwd bf16 ms,
# f+b ms, f+b bf16 ms, SDPA fwd ms, SDPA f+b ms)
MEASURED = {
    1024: (64, 7.341, 7.123, 24.984, 22.390, 0.651, 3.484),
    2048: (32, 7.285, 7.154, 23.381, 23.455, 1.033, 5.095),
    4096: (16, 7.754, 7.435, 23.188, 22.476, 1.897, 8.392),
    8192: (8, 8.475, 8.360, 23.735, 23.031, 3.659, 14.985),
    16384: (4, 9.805, 9.787, 25.211, 24.464, 7.167, 28.022),
    32768: (2, 13.157, 12.820, 28.982, 28.162, 14.143, 53.761),
    65536: (1, 19.734, 19.218, 37.961, 35.783, 28.121, 105.662),
}
PARAMS = ("tensor-core fraction", "Triton HBM fraction", "PyTorch HBM fraction",
          "GEMM fraction", "scan µs per chunk", "cummax ns per step", "µs per launch")  # fmt: skip
SCANS = ("_states_fwd_kernel", "_states_bwd_kernel")


def count(checkout: Path, B: int, T: int, precision: str = "tf32") -> dict:
    """{forward, backward: [launch]} of the code at checkout, at (B, T, H = 16) and precision
    ("tf32", or "bf16": this code's bf16 buffers)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "idmix_kernels").symlink_to(checkout / "kernels")
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{tmp}:{checkout}"}
        out = Path(tmp) / "launches.json"
        script = ROOT / "benchmarks" / "launches.py"
        args = ["--B", str(B), "--T", str(T), "--H", str(H), "--json", str(out)]
        if precision != "tf32":
            args += ["--precision", precision]
        subprocess.run([sys.executable, str(script), *args], check=True, env=env, cwd=checkout,
                       capture_output=True)  # fmt: skip
        return json.loads(out.read_text())


def count_all(checkout: Path, precision: str = "tf32") -> dict:
    return {str(T): count(checkout, row[0], T, precision) for T, row in MEASURED.items()}


def scan_steps(ints: dict) -> int:
    """The steps one program of a chunk-state scan walks in sequence: its run of chunks, and in
    the second launch of a split scan the split ends before it (kernels/scan_splits.py)."""
    splits = ints.get("SPLITS", 1)
    per_split = ints.get("NS", ints["N"])
    return per_split + (splits - 1 if ints.get("PHASE") == 2 else 0)


def launch_seconds(x: dict, p, precision: str) -> float:
    e_tc, e_tri, e_torch, e_gemm, t_chunk, t_cummax, t_launch = p
    if x["kind"] == "torch":
        if x["name"] == "cummax":
            t = x["ints"]["scan"] * t_cummax * 1e-9
        elif x["macs"]:
            t = max(2 * x["macs"] / (PEAK[precision] * e_gemm), x["nbytes"] / (HBM * e_torch))
        else:
            t = x["nbytes"] / (HBM * e_torch)
    elif x["name"] in SCANS:
        programs = math.prod(x["grid"])
        waves = math.ceil(programs / (SMS * RESIDENT))
        t = max(waves * scan_steps(x["ints"]) * t_chunk * 1e-6, x["nbytes"] / (HBM * e_tri))
    else:
        t = max(2 * x["macs"] / (PEAK[precision] * e_tc), x["nbytes"] / (HBM * e_tri))
    return x["n"] * (t + t_launch * 1e-6)


def call_seconds(launches: list[dict], p, precision="tf32") -> float:
    return sum(launch_seconds(x, p, precision) for x in launches)


def model_ms(counted: dict, p, precision="tf32") -> dict:
    """T -> (forward ms, forward+backward ms)."""
    out = {}
    for T, c in counted.items():
        f = call_seconds(c["forward"], p, precision)
        out[int(T)] = (1e3 * f, 1e3 * (f + call_seconds(c["backward"], p, precision)))
    return out


def fit(counted: dict):
    """Fitted parameters (PARAMS order) and the worst |log ratio| over the 14 points."""

    def residuals(logp):
        m = model_ms(counted, np.exp(logp))
        return [math.log(m[T][i] / MEASURED[T][j]) for T in MEASURED for i, j in ((0, 1), (1, 3))]

    start = np.log([0.3, 0.3, 0.3, 0.3, 2.0, 100.0, 5.0])
    lo = np.log([1e-3, 1e-2, 1e-2, 1e-2, 1e-2, 1e-1, 1e-1])
    hi = np.log([1.0, 1.0, 1.0, 1.0, 1e3, 1e5, 50.0])
    r = least_squares(residuals, start, bounds=(lo, hi))
    return np.exp(r.x), max(abs(x) for x in residuals(r.x))


def breakdown(launches: list[dict], p) -> dict:
    """Seconds by kind of work: containment and glue (PyTorch), Triton kernels, the scans."""
    parts = {"PyTorch ops": 0.0, "Triton kernels": 0.0, "chunk-state scans": 0.0, "cummax": 0.0}
    for x in launches:
        t = launch_seconds(x, p, "tf32")
        if x["name"] == "cummax":
            parts["cummax"] += t
        elif x["kind"] == "torch":
            parts["PyTorch ops"] += t
        elif x["name"] in SCANS:
            parts["chunk-state scans"] += t
        else:
            parts["Triton kernels"] += t
    return parts


def report(old: dict, new: dict, new_bf16: dict):
    p, worst = fit(old)
    sections = []
    within = 100 * (math.exp(worst) - 1)
    sections.append((
        f"Fitted to the H200 run of aa05976 (worst point within {within:.0f}%)",
        ["parameter", "value"],
        [[n, f"{v:.3g}"] for n, v in zip(PARAMS, p, strict=True)],
    ))  # fmt: skip
    m, mb = model_ms(old, p), model_ms(old, p, "bf16")
    rows = []
    for T, (B, f, fb16, fb, fbb16, *_) in MEASURED.items():
        rows.append([
            str(T), str(B), f"{f:.2f}", f"{m[T][0]:.2f}", f"{m[T][0] / f:.2f}",
            f"{fb:.2f}", f"{m[T][1]:.2f}", f"{m[T][1] / fb:.2f}",
            f"{fb16:.2f}", f"{mb[T][0]:.2f}", f"{fbb16:.2f}", f"{mb[T][1]:.2f}",
        ])  # fmt: skip
    sections.append((
        "aa05976: measured against the model (ms; bf16 columns predicted, not fitted)",
        ["T", "B", "fwd", "model", "ratio", "f+b", "model", "ratio", "fwd bf16", "model",
         "f+b bf16", "model"],
        rows,
    ))  # fmt: skip
    rows = []
    for name, counted in (("aa05976", old), ("this code", new)):
        for T in (1024, 65536):
            launches = counted[str(T)]["forward"] + counted[str(T)]["backward"]
            parts = breakdown(launches, p)
            rows.append([name, str(T), *(f"{1e3 * v:.2f}" for v in parts.values())])
    sections.append((
        "Where the forward+backward time goes, by the model (ms)",
        ["code", "T", *breakdown([], p)],
        rows,
    ))  # fmt: skip
    n = model_ms(new, p)
    rows = []
    for T, (B, f, _, fb, _, sdpa_f, sdpa_fb) in MEASURED.items():
        rows.append([
            str(T), str(B), f"{n[T][0]:.2f}", f"{f / n[T][0]:.1f}x", f"{sdpa_f / n[T][0]:.2f}x",
            f"{n[T][1]:.2f}", f"{fb / n[T][1]:.1f}x", f"{sdpa_fb / n[T][1]:.2f}x",
        ])  # fmt: skip
    sections.append((
        "This code, predicted with the same parameters (ms; × = aa05976 measured / predicted, and "
        "SDPA flash measured / predicted)",
        ["T", "B", "fwd", "vs aa05976", "vs SDPA", "f+b", "vs aa05976", "vs SDPA"],
        rows,
    ))  # fmt: skip
    nb, n32 = model_ms(new_bf16, p, "bf16"), model_ms(new, p, "bf16")
    rows = []
    for T, (B, *_, sdpa_f, sdpa_fb) in MEASURED.items():
        rows.append([
            str(T), str(B), f"{nb[T][0]:.2f}", f"{n32[T][0]:.2f}", f"{n[T][0] / nb[T][0]:.2f}x",
            f"{sdpa_f / nb[T][0]:.2f}x", f"{nb[T][1]:.2f}", f"{n32[T][1]:.2f}",
            f"{n[T][1] / nb[T][1]:.2f}x", f"{sdpa_fb / nb[T][1]:.2f}x",
        ])  # fmt: skip
    sections.append((
        "This code at precision=\"bf16\" (bf16 products; the buffers read only as product "
        "operands in bf16: chunk-start states, p, dw̃, the increments' gradients), predicted (ms; "
        "fp32 buffers: bf16 products alone; × = this code at TF32 predicted / this, and SDPA "
        "flash measured / this)",
        ["T", "B", "fwd", "fp32 buffers", "vs TF32", "vs SDPA", "f+b", "fp32 buffers", "vs TF32",
         "vs SDPA"],
        rows,
    ))  # fmt: skip
    return sections


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count-old", type=Path, help="a checkout of aa05976: recount its launches")
    ap.add_argument("--markdown", type=Path, help="also write the tables here")
    args = ap.parse_args(argv)
    if args.count_old:
        OLD_LAUNCHES.write_text(json.dumps(count_all(args.count_old.resolve())))
    old = json.loads(OLD_LAUNCHES.read_text())
    sections = report(old, count_all(ROOT), count_all(ROOT, "bf16"))
    for title, header, rows in sections:
        print_table(title, header, rows)
    if args.markdown:
        lines = ["# Cost model of the chunked op on an H200 (benchmarks/cost_model.py)", ""]
        for title, header, rows in sections:
            lines += [f"**{title}**", "", "| " + " | ".join(header) + " |"]
            lines += ["|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
            lines.append("")
        args.markdown.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
