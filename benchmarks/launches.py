"""Every launch one call of the chunked op makes on the GPU route, counted on a CPU.

Nothing runs: the inputs are meta tensors, every PyTorch op is caught at dispatch (a
TorchDispatchMode that also walks into idmix's custom ops) and every Triton launch at the
interpreter's entry (``InterpretedFunction.run``, replaced, so no kernel executes). The call is
put on the path a CUDA tensor takes: backend "triton", segments sized as on CUDA, and the host
value checks that only a CPU tensor gets (``idmix.debug.check_values``) turned off, so that
what they guard runs, as it does on a GPU.

Each launch is a ``Launch``: its kind ("triton" or "torch"), name, grid (Triton), the bytes it
moves through HBM and the multiply-adds of its matrix products, counted from its arguments.
A PyTorch op that is a view, an allocation or a composite of others launches nothing and is
left out; its children are counted. ``benchmarks/cost_model.py`` turns the list into time.
Beside the launches, the bytes the call allocates: every tensor an op returns that is not a view
or one of its inputs (the kernels' outputs and scratch included), summed over the call, an upper
bound on what it holds at once.

    TRITON_INTERPRET=1 python benchmarks/launches.py --B 1 --T 16384 --H 4   # the table
    ... --precision bf16   # bf16 products: the same launches, the chunk-start states in bf16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table  # noqa: E402


class Launch(NamedTuple):
    kind: str  # "triton" or "torch"
    name: str
    grid: tuple  # programs per axis (Triton), () for PyTorch
    nbytes: int  # bytes read and written in HBM (per-token tensors; see _traffic)
    macs: int  # multiply-adds of matrix products
    ints: dict  # the integer arguments by name (Triton); for a PyTorch scan, its length


# Ops that launch nothing: metadata, views, allocations (their children, if any, are counted).
_NO_KERNEL = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
    "detach", "alias", "resolve_conj", "resolve_neg", "_reshape_alias", "set_", "result_type",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "_to_copy_meta",
}  # fmt: skip


def _launches_nothing(func) -> bool:
    name = func.__name__.split(".")[0]
    return func.is_view or name in _NO_KERNEL


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _gemm_macs(name: str, args, out) -> int:
    """Multiply-adds of a matrix product op (mm, bmm, baddbmm, addmm, _scaled/out_dtype forms)."""
    if not any(name.startswith(p) for p in ("mm", "bmm", "baddbmm", "addmm", "addbmm", "matmul")):
        return 0
    mats = [a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 2]
    a, b = mats[-2], mats[-1]
    batch = math.prod(a.shape[:-2]) if a.dim() == 3 else 1
    return batch * a.shape[-2] * a.shape[-1] * b.shape[-1]


class _Recorder(TorchDispatchMode):
    """Records every PyTorch op that launches a kernel, and walks into idmix::* custom ops."""

    def __init__(self, launches: list[Launch]):
        super().__init__()
        self.launches = launches
        self.allocated = 0  # bytes of every fresh tensor the ops returned

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "idmix":
            from torch._library.custom_ops import OPDEFS

            opdef = OPDEFS[func._schema.name]
            with self:
                return opdef._init_fn(*args, **kwargs)
        out = func(*args, **kwargs)
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        # aten.to is marked a view (it may return its input), but a cast is a kernel and a copy
        cast = func.__name__.split(".")[0] == "to" and out is not args[0]
        if cast or not func.is_view:
            self.allocated += sum(_nbytes(t) for t in outs if not any(t is i for i in ins))
        if _launches_nothing(func) and not cast:
            return out
        name = func.__name__.split(".")[0]
        extra = {"scan": args[0].shape[args[1]]} if name == "cummax" else {}
        in_bytes = sum(_nbytes(t) for t in ins)
        out_bytes = sum(_nbytes(t) for t in outs if not any(t is i for i in ins))
        self.launches.append(
            Launch("torch", name, (), in_bytes + out_bytes, _gemm_macs(name, args, out), extra)
        )
        return out


# The SMs of an H100 or H200 SXM, which the chunk-state scans split T to fill
# (kernels/scan_splits.py)
SMS = 132
# The fused output kernel's mode block on sm_90 (kernels/chunk_output.py's autotune space; the
# interpreter runs the smallest block of every space, 8)
OUTPUT_BM_SM90 = 16


# Multiply-adds per program of each chunk kernel, from its integer arguments (L, R, D, M, N)
# and its grid: the tile products as written in kernels/ (chunk_intra*.py, chunk_states.py).
def _chunk_macs(name, a, programs):
    L, M2 = a.get("L", 0), 2 * a.get("M", 0)
    R, D = a.get("R", 0), a.get("D", 0)
    blocks = -(-M2 // (2 * OUTPUT_BM_SM90))  # the fused output kernel's mode blocks
    per_chunk = {
        "_pass1_kernel": L * L * R + L * R * M2 + L * L * M2,
        "_pass2_kernel": L * M2 * L + L * L * D + L * M2 * D,
        # p's products run once per block of BM output modes
        "_output_kernel": L * L * R
        + blocks * (L * R * M2 + L * L * M2)
        + L * M2 * M2
        + L * L * M2
        + L * M2 * D
        + L * L * D,
        # each forms w̃ = Ĝ p on chip (the lag kernel twice)
        "_pass2_bwd_lag_kernel": 2 * L * D * L + 3 * L * L * M2 + 2 * L * M2 * M2,
        "_pass2_bwd_state_kernel": 2 * L * D * M2 + L * M2 * M2,
        # each forms dp = dw̃ Ĝ on chip
        "_pass1_bwd_lag_kernel": 3 * L * R * L + 2 * L * L * M2 + L * M2 * M2,
        "_pass1_bwd_state_kernel": 3 * L * R * M2 + L * M2 * M2,
    }
    if name in per_chunk:
        return per_chunk[name] * programs
    if name == "_states_fwd_kernel":  # one program per (b, h, split, channel, mode block)
        rows = programs // (a.get("_cblocks", 1) * a.get("_mblocks", 1) * a.get("SPLITS", 1))
        return a["N"] * a["C"] * L * M2 * rows
    return 0


# What a split scan's first launch (PHASE 1: the split ends) leaves alone
_SPLIT_ENDS_SKIP = {"st_ptr", "poison_ptr", "ginc_ptr"}


def _traffic(named: dict, tokens: int) -> int:
    """HBM bytes of a Triton launch: every tensor argument with at least one value per
    token·head is read or written once (one passed as two arguments, once); per-head tables
    (decays, Ĝ) stay in L2."""
    skip = _SPLIT_ENDS_SKIP if named.get("PHASE") == 1 else set()
    tensors = {
        id(t): t
        for k, t in named.items()
        if isinstance(t, torch.Tensor) and t.numel() >= tokens and k not in skip
    }
    return sum(_nbytes(t) for t in tensors.values())


# The engine's cuBLAS GEMMs: on meta tensors numerics takes its CPU branch, which emulates bf16
# operands in fp32; on CUDA, at precision "bf16", each fp32 operand is first cast to bf16 (a
# kernel and a copy) and the GEMM reads bf16 (the same launches otherwise).
_GEMMS = ("matmul", "baddbmm")


def _as_on_cuda(gemm):
    def on_cuda(*args, **kwargs):
        *tensors, precision = args
        if precision != "bf16":
            return gemm(*args, **kwargs)
        *acc, a, b = tensors
        out = torch.bmm(a.to(torch.bfloat16), b.to(torch.bfloat16), out_dtype=torch.float32)
        if not acc:
            return out
        with _disable_current_modes():  # baddbmm's add is the GEMM's epilogue: no launch
            return out + acc[0]

    return on_cuda


@contextlib.contextmanager
def gpu_route(launches: list[Launch], tokens: int):
    """Run the chunked op as on a CUDA tensor, recording its launches and skipping the kernels;
    yields the recorder (its ``allocated`` bytes)."""
    import importlib

    from triton.runtime.interpreter import InterpretedFunction

    def interdomain(*names):  # the modules of those names the checked-out code has
        found = []
        for name in names:
            with contextlib.suppress(ImportError):
                found.append(importlib.import_module(f"idmix.functional.interdomain.{name}"))
        return found

    # this code keeps the segment sizes in shared.py; aa05976 (the cost model's fit) in chunked.py
    shared = next(m for m in interdomain("shared", "chunked") if hasattr(m, "SEGMENT_TOKENS"))

    def cuda_segment_tokens(q, L):
        per_row = shared.GPU_SEGMENT_TOKEN_HEADS // max(1, q.shape[0] * q.shape[2])
        return max(L, max(shared.SEGMENT_TOKENS, per_row) // L * L)

    def record(self, *args, grid, warmup, **kwargs):
        names = self.arg_names
        named = dict(zip(names, args, strict=False)) | kwargs
        ints = {k: v for k, v in named.items() if isinstance(v, int) and not k.startswith("s_")}
        g = grid(named) if callable(grid) else grid
        g = tuple(g) + (1,) * (3 - len(g))
        if "C" not in ints and "R" in ints and "D" in ints:
            ints["C"] = ints["R"] + ints["D"]
        ints["_cblocks"], ints["_mblocks"] = g[1], g[2]
        programs = math.prod(g)
        name = self.fn.__name__
        launches.append(
            Launch(
                "triton", name, g, _traffic(named, tokens), _chunk_macs(name, ints, programs), ints
            )
        )

    autocast = torch.autocast

    def meta_autocast(device_type, *args, **kwargs):  # autocast has no meta device
        if device_type == "meta":
            return contextlib.nullcontext()
        return autocast(device_type, *args, **kwargs)

    patches = [(torch, "autocast", meta_autocast), (InterpretedFunction, "run", record)]
    for engine in interdomain("triton_engine"):
        patches += [(engine, name, _as_on_cuda(getattr(engine, name))) for name in _GEMMS]
    patches += [
        (module, "check_values", lambda x: False)
        for module in interdomain("numerics", "nonfinite", "validation")
        if hasattr(module, "check_values")
    ]
    with contextlib.suppress(ImportError):  # code before the split scans has none
        splits = importlib.import_module("idmix_kernels.scan_splits")
        patches += [(splits, "target_programs", lambda device: SMS)]
    modules = interdomain("driver", "triton_engine", "chunked_op", "chunked_kernels")
    patches += [(m, "segment_tokens", cuda_segment_tokens) for m in modules]
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
    for obj, attr, value in patches:
        setattr(obj, attr, value)
    try:
        with _Recorder(launches) as recorder:
            yield recorder
    finally:
        for obj, attr, value in saved:
            setattr(obj, attr, value)


def op_inputs(B, T, H, R=64, D=64, M=64, dtype=torch.bfloat16, device="meta"):
    """q, k, v (B, T, H, ·) in dtype and the op's fp32 parameters, all requiring grad."""
    from idmix.functional import discretize_real, log_uniform_dt, s4d_inv_init

    torch.manual_seed(0)
    q, k, v = (torch.randn(B, T, H, F, dtype=dtype) for F in (R, R, D))
    lam_ri, beta_ri = discretize_real(torch.exp(log_uniform_dt(H)), *s4d_inv_init(H, M))
    G_hat = torch.randn(H, 2 * M, 2 * M) / (2 * M)
    tensors = [q, k, v, lam_ri, beta_ri, G_hat]
    return [t.to(device).requires_grad_() for t in tensors]


def count(B, T, H, R=64, D=64, M=64, dtype=torch.bfloat16, precision="ieee", reset=False):
    """(forward launches, backward launches, {"forward", "backward": bytes allocated}) of one
    forward+backward of the chunked op on the GPU route. precision "ieee" stands for "tf32" (on
    CUDA a flag, the same launches and buffers); "bf16" stores the chunk-start states in bf16."""
    import idmix.functional as F

    q, k, v, lam_ri, beta_ri, G_hat = op_inputs(B, T, H, R, D, M, dtype)
    starts = torch.zeros(B, T, dtype=torch.bool, device="meta") if reset else None
    tokens = B * T * H
    fwd, bwd = [], []
    kwargs = dict(backend="triton", precision=precision, reset=starts)
    if hasattr(F, "interdomain_attention_real"):  # aa05976's entry (the cost model's fit)
        op = F.interdomain_attention_real
    else:
        op, kwargs = F.interdomain_attention, kwargs | dict(output_final_state=True)
    with gpu_route(fwd, tokens) as forward:
        o, _ = op(q, k, v, lam_ri, beta_ri, G_hat, **kwargs)
    do = torch.empty_like(o)
    with gpu_route(bwd, tokens) as backward:
        torch.autograd.backward(o, do)
    return fwd, bwd, {"forward": forward.allocated, "backward": backward.allocated}


def as_json(launches: list[Launch]) -> list[dict]:
    """Identical launches merged, with a count: what benchmarks/cost_model.py reads."""
    merged: dict = {}
    for x in launches:
        key = json.dumps([x.kind, x.name, x.grid, x.nbytes, x.macs, x.ints], sort_keys=True)
        merged[key] = merged.get(key, 0) + 1
    rows = []
    for key, n in merged.items():
        kind, name, grid, nbytes, macs, ints = json.loads(key)
        rows.append(dict(kind=kind, name=name, grid=grid, nbytes=nbytes, macs=macs, ints=ints, n=n))
    return rows


def summary(launches: list[Launch]) -> dict:
    torch_ops = [x for x in launches if x.kind == "torch"]
    return {
        "triton": sum(x.kind == "triton" for x in launches),
        "torch": len(torch_ops),
        "torch_bytes": sum(x.nbytes for x in torch_ops),
        "triton_bytes": sum(x.nbytes for x in launches if x.kind == "triton"),
        "macs": sum(x.macs for x in launches),
    }


def _rows(launches: list[Launch], tokens: int) -> list[list[str]]:
    by = Counter()
    info = {}
    for x in launches:
        key = (x.kind, x.name, x.grid)
        by[key] += 1
        b, m = info.get(key, (0, 0))
        info[key] = (b + x.nbytes, m + x.macs)
    rows = []
    for (kind, name, grid), n in by.items():
        b, m = info[(kind, name, grid)]
        rows.append([
            kind, name, "x".join(map(str, grid)) or "-", str(n),
            f"{b / tokens:.0f}", f"{m / tokens:.0f}",
        ])  # fmt: skip
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--T", type=int, default=16384)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--reset", action="store_true", help="with a document-start mask")
    ap.add_argument("--precision", choices=("tf32", "bf16"), default="tf32")
    ap.add_argument("--json", type=Path, help="write {forward, backward: [launch]} here")
    args = ap.parse_args(argv)
    precision = "ieee" if args.precision == "tf32" else args.precision
    fwd, bwd, allocated = count(args.B, args.T, args.H, precision=precision, reset=args.reset)
    if args.json:
        data = {"forward": as_json(fwd), "backward": as_json(bwd), "allocated": allocated}
        args.json.write_text(json.dumps(data))
    tokens = args.B * args.T * args.H
    header = ["kind", "launch", "grid", "calls", "bytes/tok·head", "MACs/tok·head"]
    for title, part in (("forward", fwd), ("backward", bwd)):
        s = summary(part)
        print_table(
            f"{title} at B={args.B}, T={args.T}, H={args.H}, {args.precision}: {s['triton']} "
            "Triton launches, "
            f"{s['torch']} PyTorch kernels, {allocated[title] / tokens:.0f} B allocated per "
            "token·head",
            header,
            _rows(part, tokens),
        )
    s = summary(fwd + bwd)
    both = (allocated["forward"] + allocated["backward"]) / tokens
    print(
        f"\nforward+backward: {s['triton']} Triton launches, {s['torch']} PyTorch kernels, "
        f"{both:.0f} B allocated per token·head"
    )


if __name__ == "__main__":
    main()
