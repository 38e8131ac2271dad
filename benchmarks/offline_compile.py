"""Compile every Triton kernel of idmix for an H100/H200 (sm_90) and an A100 (sm_80) on a machine
without a GPU, and report what the hardware would be handed: shared memory, registers, spills,
and the tensor-core (HMMA/HGMMA) against fp32 FMA instruction counts of each kernel at every
config its autotuner may pick.

    python benchmarks/offline_compile.py               # the CI tier (a few minutes, cold cache)
    python benchmarks/offline_compile.py --tier full   # every precision, shape and chunk length
    python benchmarks/offline_compile.py --fla         # also flash-linear-attention's chunk_gla
                                                       # forward kernels (if installed), beside ours
    python benchmarks/offline_compile.py --json out.json

How: the op's own launch sites run on CPU tensors of the real shapes, with a stand-in Triton
driver that reports the GPU target, and every launch becomes a compile of each autotune config
(JITFunction.run with warmup=True): the signatures, specialisations (16-byte alignment,
integers equal to 1) and constexprs are those a real launch would produce. The kernels' outputs
are never written, so nothing downstream is checked here; correctness is the interpreter
tests' job (tests/kernel_checks.py). Exits 1 when a kernel at any config spills, needs more
shared memory than the device has, or lacks tensor-core instructions where its work is a matrix
product at a tensor-core precision. A kernel that is meant to stay off the tensor cores (the
chunk scan, the decode step: elementwise and matrix-vector work) is listed as such.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver as triton_driver  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
# per-block limits (bytes of shared memory a kernel may ask for; the SM holds 1 KB more per
# resident block) and per-SM register file, from NVIDIA's tuning guides
DEVICES = {
    90: dict(name="sm_90 (H100/H200)", max_shared=232448, sm_shared=233472, regs=65536),
    80: dict(name="sm_80 (A100)", max_shared=166912, sm_shared=167936, regs=65536),
}
# kernels whose work is not a matrix product: elementwise recurrences and matrix-vector steps,
# the non-finite flags and the decay tables
NO_TENSOR_CORES = {
    "_states_bwd_kernel", "_decode_step_kernel", "_grads_kernel", "_flags_kernel",
    "_tables_fwd_kernel", "_tables_bwd_kernel",
}  # fmt: skip
SASS_OPS = ("HGMMA", "HMMA", "FFMA", "LDL", "STL", "LDS", "STS")


@dataclass
class Facts:
    """What one compiled kernel variant asks of the device."""

    kernel: str
    case: str
    arch: int
    num_warps: int
    config: dict
    constexprs: dict
    shared: int
    registers: int
    stack: int
    spill_stores: int
    spill_loads: int
    compile_s: float
    sass: dict = field(default_factory=dict)
    programs_per_sm: int = 0
    problems: list = field(default_factory=list)


class OfflineDriver:
    """A stand-in for Triton's active driver: reports a GPU target and launches nothing."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)
        self.arch = arch
        self.utils = self

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return self.arch  # a device id per target keeps the targets' kernel caches apart

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_device_properties(self, device=None):
        d = DEVICES[self.arch]
        return dict(max_shared_mem=d["max_shared"], multiprocessor_count=132, max_num_regs=65536)

    def get_device_capability(self, device=None):
        return divmod(self.arch, 10)

    def is_active(self):
        return True


_REPORTS: dict[int, tuple[str, float]] = {}  # id(compiled kernel) -> (ptxas log, seconds)


@contextlib.contextmanager
def compile_only(arch: int, on_compile, declared: bool = False):
    """Within: every Triton launch compiles (each autotune config its pruning keeps, or every
    declared one) for `arch` and launches nothing; on_compile(jit_fn, compiled_kernel, seconds,
    ptxas log) is called for each new compile."""
    original_run, original_tune = JITFunction.run, Autotuner.run
    seen = set()

    def run(self, *args, grid, warmup, **kwargs):
        t0 = time.perf_counter()
        log = io.StringIO()
        with contextlib.redirect_stdout(log):  # ptxas -v's report (knobs.nvidia.dump_ptxas_log)
            kernel = original_run(self, *args, grid=grid, warmup=True, **kwargs)
        # a kernel compiled earlier in this process (another case) comes from Triton's cache
        report = _REPORTS.setdefault(id(kernel), (log.getvalue(), time.perf_counter() - t0))
        if id(kernel) not in seen:
            seen.add(id(kernel))
            on_compile(self, kernel, report[1], report[0])
        return kernel

    def tune(self, *args, **kwargs):
        kwargs.pop("warmup", None)
        self.nargs = dict(zip(self.arg_names, args, strict=False))
        for config in self.configs if declared else self.prune_configs(kwargs):
            self.fn.run(*args, warmup=True, **kwargs, **config.all_kwargs())
        self.nargs = None

    previous = triton_driver._active
    triton.knobs.compilation.always_compile = True  # every compile runs ptxas and reports
    triton.knobs.nvidia.dump_ptxas_log = True
    triton_driver.set_active(OfflineDriver(arch))
    JITFunction.run, Autotuner.run = run, tune
    try:
        yield
    finally:
        JITFunction.run, Autotuner.run = original_run, original_tune
        triton_driver._active = previous


def inspect_cubin(cubin: bytes) -> tuple[dict, dict]:
    """(resource usage {REG, STACK, LOCAL, SHARED}, SASS opcode counts) from cuobjdump."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run(
            [BIN / "cuobjdump", "-res-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
        sass = subprocess.run(
            [BIN / "cuobjdump", "-sass", f.name], capture_output=True, text=True, check=True
        ).stdout
    usage = {k: int(v) for k, v in re.findall(r"(REG|STACK|LOCAL|SHARED):(\d+)", res)}
    ops = Counter(
        op.split(".")[0]
        for op in re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+([A-Z][A-Z0-9_.]*)", sass, re.M)
    )
    return usage, {k: ops.get(k, 0) for k in SASS_OPS}


def programs_per_sm(arch: int, shared: int, registers: int, num_warps: int) -> int:
    d = DEVICES[arch]
    threads = 32 * num_warps
    by_regs = d["regs"] // max(1, registers * threads)
    by_shared = d["sm_shared"] // (shared + 1024) if shared else 32
    return max(0, min(by_regs, by_shared, 2048 // threads, 32))


def ptxas_report(log: str) -> dict:
    """Registers, stack frame and spill bytes from ptxas -v's report of one kernel."""
    frame = re.search(
        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log
    )
    regs = re.search(r"Used (\d+) registers", log)
    if not (frame and regs):
        raise RuntimeError(f"no ptxas report in the compile log: {log[-300:]!r}")
    stack, stores, loads = (int(x) for x in frame.groups())
    return dict(registers=int(regs.group(1)), stack=stack, spill_stores=stores, spill_loads=loads)


def facts_of(fn, kernel, seconds: float, log: str, arch: int, case: str) -> Facts:
    usage, sass = inspect_cubin(kernel.asm["cubin"])
    report = ptxas_report(log)
    meta = kernel.metadata
    src = kernel.src
    constexprs = {
        fn.arg_names[k[0]]: v
        for k, v in getattr(src, "constants", {}).items()
        if isinstance(v, (int, bool, str)) and fn.arg_names[k[0]].isupper()
    }
    config = {k: v for k, v in constexprs.items() if k in ("BM",)}
    facts = Facts(
        kernel=fn.__name__,
        case=case,
        arch=arch,
        num_warps=meta.num_warps,
        config=config,
        constexprs={k: v for k, v in constexprs.items() if k not in config},
        shared=meta.shared,
        **report,
        compile_s=round(seconds, 2),
        sass=sass,
    )
    facts.programs_per_sm = programs_per_sm(arch, facts.shared, facts.registers, facts.num_warps)
    _judge(facts)
    return facts


def _judge(f: Facts) -> None:
    """A stack frame alone is not a spill: libdevice's sin/cos keep a 32-byte array for the
    Payne-Hanek reduction of huge arguments (the selective kernels' phases stay below L·π)."""
    if f.spill_stores or f.spill_loads:
        f.problems.append(f"spills: {f.spill_stores} B stored / {f.spill_loads} B loaded")
    if f.shared > DEVICES[f.arch]["max_shared"]:
        f.problems.append(f"shared memory {f.shared} B > {DEVICES[f.arch]['max_shared']} B")
    tensor_core_precision = f.constexprs.get("PREC", 0) in (1, 2)
    if (
        f.kernel not in NO_TENSOR_CORES
        and tensor_core_precision
        and not (f.sass["HMMA"] or f.sass["HGMMA"])
    ):
        f.problems.append("no tensor-core instructions in a matrix-product kernel")


# --- the launch sites, driven at given shapes -------------------------------------------------


def chunked_case(T, H, R, D, M, L, reset: bool, precision: str, B=1, dtype=torch.bfloat16):
    """The chunked op's forward and backward on the Triton kernels (the custom ops
    ``idmix::chunked_kernels_forward`` and ``idmix::chunked_kernels_backward``, every launch of
    the GPU training path), at one shape, with q, k, v in dtype (bf16: what a bf16 model hands
    the op). T gets a ragged tail of L/2: the main chunks' scans are split along T (both
    launches, kernels/scan_splits.py), the tail's are not."""
    import idmix_kernels.scan_splits as splits

    from idmix.functional.interdomain import triton_engine as op

    T += L // 2
    with mock.patch.object(splits, "OFF_GPU_TARGET_PROGRAMS", 2**30):
        _chunked_calls(op, T, H, R, D, M, L, reset, precision, B, dtype)


def _chunked_calls(op, T, H, R, D, M, L, reset, precision, B, dtype):
    q, k = torch.empty(B, T, H, R, dtype=dtype), torch.empty(B, T, H, R, dtype=dtype)
    v = torch.empty(B, T, H, D, dtype=dtype)
    lam = torch.full((H, M, 2), 0.5)
    G = torch.empty(H, 2 * M, 2 * M)
    starts = torch.zeros(B, T, dtype=torch.bool)
    starts[:, T // 3] = True
    r = starts if reset else None
    o, Z, *saved = op.chunked_kernels_forward(q, k, v, lam, lam, G, None, None, r, L, precision)
    op.chunked_kernels_backward(
        torch.empty_like(o), torch.empty_like(Z), q, k, v, lam, lam, G, None, r, *saved, L,
        precision,
    )  # fmt: skip


def selective_case(T, H, R, D, M, reset: bool, precision: str, B=1):
    """The selective (per-token decay) path's forward and backward on its kernels."""
    from idmix.functional.interdomain.driver import selective_forward
    from idmix.functional.interdomain.selective import SELECTIVE_CHUNK

    q, k = (torch.randn(B, T, H, R, requires_grad=True) for _ in range(2))
    v = torch.randn(B, T, H, D, requires_grad=True)
    lam = torch.full((B, T, H, M, 2), 0.5, requires_grad=True)
    beta = torch.full((B, T, H, M, 2), 0.1, requires_grad=True)
    G = torch.randn(H, 2 * M, 2 * M, requires_grad=True)
    Z0 = torch.zeros(B, H, R + D, 2 * M)
    starts = torch.zeros(B, T, dtype=torch.bool)
    starts[:, T // 3] = True
    o, Z, _ = selective_forward(
        q, k, v, lam, beta, G, Z0, starts if reset else None, SELECTIVE_CHUNK, "triton", precision
    )
    (o.nan_to_num().sum() + Z.nan_to_num().sum()).backward()


def decode_case(H, R, D, M, dtype, B=1):
    """The decode step's kernel in its three phases: one program per row (as at large batch),
    then split by modes (a key launch and a value launch, as at small batch on a GPU)."""
    import idmix_kernels
    import idmix_kernels.scan_splits as splits

    q, k = torch.empty(B, H, R, dtype=dtype), torch.empty(B, H, R, dtype=dtype)
    v = torch.empty(B, H, D, dtype=dtype)
    lam = torch.full((H, M, 2), 0.5)
    state = torch.zeros(B, H, R + D, 2 * M)
    G = torch.empty(H, 2 * M, 2 * M)
    idmix_kernels.decode_step_triton(q, k, v, lam, lam, G, state)
    with mock.patch.object(splits, "OFF_GPU_TARGET_PROGRAMS", 2**30):
        idmix_kernels.decode_step_triton(q, k, v, lam, lam, G, state)


# head shapes the builders make: the paper's (d_h = 64, M = 64), the 760M's d_h = 96 padded to
# 128 tiles (R = D = 128 stands for it), and M = 32
PAPER = dict(H=16, R=64, D=64, M=64)
SHAPES = {
    "paper": PAPER,
    "M32": dict(H=16, R=64, D=64, M=32),
    "RD128": dict(H=16, R=128, D=128, M=64),
    "M128": dict(H=16, R=64, D=64, M=128),
}


def sweep(tier: str):
    """[(case name, callable, archs)] of the tier. "full": every precision, shape, both masks,
    chunk lengths 64 and 128, fp32 and bf16 decode inputs, on sm_90 and sm_80. "ci" (a few
    minutes on 2 cores): the GPU default precision at the paper shape and the 128-wide heads,
    both masks, both archs, and the other tensor-core precision at the paper shape on sm_90
    (M = 32 compiles to the same kernels as M = 64: the modes are walked in blocks)."""
    from idmix.functional.interdomain.numerics import GPU_DEFAULT

    both, hopper = (90, 80), (90,)
    other = "bf16" if GPU_DEFAULT == "tf32" else "tf32"
    if tier == "full":
        plan = [(s, p, both) for s in SHAPES for p in ("ieee", "tf32", "bf16")]
    else:
        plan = [
            ("paper", GPU_DEFAULT, both),
            ("RD128", GPU_DEFAULT, both),
            ("paper", other, hopper),
        ]
    cases = []
    for sname, prec, archs in plan:
        s = SHAPES[sname]
        for reset in (False, True):
            for L in (64, 128) if (tier == "full" and sname == "paper") else (64,):
                name = f"chunked {sname} L={L} {prec} reset={reset}"
                cases.append((name, lambda s=s, L=L, r=reset, p=prec: chunked_case(
                    8 * L, s["H"], s["R"], s["D"], s["M"], L, r, p), archs))  # fmt: skip
            name = f"selective {sname} {prec} reset={reset}"
            cases.append((name, lambda s=s, r=reset, p=prec: selective_case(
                64, s["H"], s["R"], s["D"], s["M"], r, p), archs))  # fmt: skip
    decodes = SHAPES if tier == "full" else ("paper", "RD128")
    for sname in decodes:
        s = SHAPES[sname]
        for dtype in (torch.float32, torch.bfloat16) if tier == "full" else (torch.bfloat16,):
            name = f"decode {sname} {str(dtype).split('.')[-1]}"
            run = lambda s=s, d=dtype: decode_case(s["H"], s["R"], s["D"], s["M"], d)  # noqa: E731
            cases.append((name, run, both))
    return cases


def fla_cases():
    """flash-linear-attention's chunk_gla forward at the paper's head shape (bf16, K = V = 64),
    compiled through its own launch sites the same way, as a reference beside ours. Optional:
    ``pip install --no-deps flash-linear-attention fla-core einops`` (fla is imported inside the
    stand-in driver, since it reads the device when imported)."""

    def run():
        from unittest import mock

        cuda = torch.cuda  # fla asks torch about the device when imported and around launches
        with mock.patch.multiple(
            cuda, get_device_name=lambda *a: "NVIDIA H200", get_device_capability=lambda *a: (9, 0),
            device=lambda *a: contextlib.nullcontext(), current_device=lambda: 0,
        ):  # fmt: skip
            from fla.ops.gla import chunk_gla

            B, T, H, K = 1, 1024, 16, 64
            q, k, v = (torch.randn(B, T, H, K, dtype=torch.bfloat16) for _ in range(3))
            g = -torch.rand(B, T, H, K, dtype=torch.float32)
            chunk_gla(q, k, v, g)

    return [("fla chunk_gla fwd (B=1 T=1024 H=16 K=V=64 bf16)", run, (90, 80))]


def run_cases(cases, archs, declared=False):
    results = []
    for arch in archs:
        for name, case in cases:

            def record(fn, kernel, seconds, log, name=name, arch=arch):
                results.append(facts_of(fn, kernel, seconds, log, arch, name))

            grad = contextlib.nullcontext() if "selective" in name else torch.no_grad()
            with compile_only(arch, record, declared), grad:
                try:
                    case()
                except Exception as e:  # noqa: BLE001 - a failed compile is a finding
                    f = Facts(kernel="?", case=name, arch=arch, num_warps=0, config={},
                              constexprs={}, shared=0, registers=0, stack=0, spill_stores=0,
                              spill_loads=0, compile_s=0)  # fmt: skip
                    f.problems.append(f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                    results.append(f)
    return results


def print_report(results) -> None:
    header = ["kernel", "case", "arch", "w", "cfg", "smem KB", "regs", "spill B", "HGMMA", "HMMA",
              "FFMA", "prog/SM", "s", "problems"]  # fmt: skip
    rows = []
    for f in results:
        rows.append([
            f.kernel, f.case, str(f.arch), str(f.num_warps),
            ",".join(f"{k}={v}" for k, v in f.config.items()) or "-",
            f"{f.shared / 1024:.1f}", str(f.registers),
            f"{f.spill_stores}/{f.spill_loads}",
            str(f.sass.get("HGMMA", 0)), str(f.sass.get("HMMA", 0)), str(f.sass.get("FFMA", 0)),
            str(f.programs_per_sm), f"{f.compile_s:.1f}", "; ".join(f.problems) or "ok",
        ])  # fmt: skip
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", choices=("ci", "full", "smoke"), default="ci")
    ap.add_argument("--arch", type=int, action="append", help="80 and/or 90 (default both)")
    ap.add_argument("--fla", action="store_true", help="also compile fla's chunk_gla forward")
    ap.add_argument("--json", type=Path, help="write every kernel's facts here")
    ap.add_argument(
        "--declared", action="store_true", help="every declared config, not only those kept"
    )
    ap.add_argument("--cases", help="only the cases whose name matches this regex")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compile processes")
    ap.add_argument("--shard", help=argparse.SUPPRESS)  # "i/n": this process's share
    args = ap.parse_args(argv)
    archs = args.arch or [90, 80]
    if args.tier == "smoke":  # one kernel family at one shape: the default test tier
        cases = [("chunked paper L=64 bf16 reset=True", lambda: chunked_case(
            128, 16, 64, 64, 64, 64, True, "bf16"), (90,))]  # fmt: skip
    else:
        cases = sweep(args.tier)
    if args.fla:
        cases += fla_cases()
    if args.cases:
        cases = [c for c in cases if re.search(args.cases, c[0])]
    t0 = time.perf_counter()
    jobs = [(arch, i) for arch in archs for i in range(len(cases)) if arch in cases[i][2]]
    if args.shard:
        i, n = (int(x) for x in args.shard.split("/"))
        done = {
            j: [asdict(f) for f in run_cases([cases[c][:2]], [arch], args.declared)]
            for j, (arch, c) in enumerate(jobs)
            if j % n == i
        }
        args.json.write_text(json.dumps(done))
        return 0
    results = _in_processes(argv or sys.argv[1:], min(args.jobs, len(jobs)))
    print_report(results)
    bad = [f for f in results if f.problems and not f.case.startswith("fla")]
    took = time.perf_counter() - t0
    print(f"\n{len(results)} kernel variants for {archs} in {took:.0f} s; {len(bad)} with problems")
    if args.json:
        args.json.write_text(json.dumps([asdict(f) for f in results], indent=1))
    return 1 if bad else 0


def _in_processes(argv, n: int) -> list[Facts]:
    """Run this script's sweep in n processes (ptxas is single-threaded), each on every n-th
    (arch, case) pair, and merge their facts in the sweep's order."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"{i}.json" for i in range(n)]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    *_without(argv, "--json"),
                    "--shard",
                    f"{i}/{n}",
                    "--json",
                    str(outs[i]),
                ]  # fmt: skip
            )
            for i in range(n)
        ]
        if any(p.wait() for p in procs):
            raise SystemExit("a compile process failed")
        done = {int(j): fs for o in outs for j, fs in json.loads(o.read_text()).items()}
    return [Facts(**f) for j in sorted(done) for f in done[j]]


def _without(argv, flag):
    """argv without `flag` and its value."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            out.append(a)
    return out


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    sys.exit(main())
