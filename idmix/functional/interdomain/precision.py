"""The `precision=` choice of the chunked paths: at what precision their matrix products multiply.

- "ieee": fp32 operands, IEEE fp32 multiply-adds (the CPU default, and fp64 inputs always);
- "tf32": operands rounded to TF32 (10 mantissa bits), fp32 accumulation: the tensor cores'
  TF32 mode on a GPU;
- "bf16": operands rounded to bf16 (7 mantissa bits), fp32 accumulation: the tensor cores' bf16
  mode;
- "auto": ``GPU_DEFAULT`` for CUDA tensors, "ieee" otherwise.

Only the operands of products are rounded: decays, states and every accumulator stay fp32,
and so does each product's result. The same rule holds in every engine, so the PyTorch path
computes what the Triton kernels compute (to summation order): on CUDA its GEMMs run on the
tensor cores at that precision, on CPU the rounding is emulated (operands rounded, then an fp32
GEMM), which is how docs/precision.md measured each choice's error against the fp64 reference.
"""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("auto", "ieee", "tf32", "bf16")
# The GPU default, chosen from the errors measured against the fp64 reference at T = 4K and 64K
# (docs/precision.md, benchmarks/precision_error.py): TF32 keeps every output, state and gradient
# within 7e-4 of the fp64 result (below what bf16 inputs alone cost, 1.7e-3 and up). The unfused
# kernels are bound by their fp32 intermediates' traffic, so bf16 products buy little speed today
# for 1.4-2x the error of bf16 inputs; fused, the op is compute-bound (benchmarks/roofline.py)
# and this choice is to be made again on the fused kernels' measurement.
GPU_DEFAULT = "tf32"


def check_precision(precision) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")


def resolve_precision(precision: str, x: torch.Tensor) -> str:
    """The concrete precision ("ieee", "tf32" or "bf16") for inputs like x."""
    check_precision(precision)
    if x.dtype == torch.float64:
        if precision not in ("auto", "ieee"):
            raise ValueError(
                f"precision: {precision!r} rounds fp32 products; fp64 inputs compute in fp64 "
                "(use 'auto' or 'ieee')"
            )
        return "ieee"
    if precision == "auto":
        return GPU_DEFAULT if x.is_cuda else "ieee"
    return precision


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """x (fp32) rounded to TF32 (10 mantissa bits), to nearest with ties away from zero: what
    the kernels do before a TF32 product (kernels/tiles.py ``operand``; left alone, the tensor
    cores would truncate the low 13 bits)."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def rounded(x: torch.Tensor, precision: str) -> torch.Tensor:
    """x as a product operand at precision (fp32 values)."""
    if precision == "bf16":
        return x.to(torch.bfloat16).to(x.dtype)
    if precision == "tf32":
        return round_tf32(x.float()).to(x.dtype)
    return x


@contextlib.contextmanager
def _cuda_tf32():
    """cuBLAS in TF32 mode for the duration (a process-wide flag, restored on exit)."""
    flags = torch.backends.cuda.matmul
    before = flags.allow_tf32
    flags.allow_tf32 = True
    try:
        yield
    finally:
        flags.allow_tf32 = before


def matmul(a: torch.Tensor, b: torch.Tensor, precision: str = "ieee") -> torch.Tensor:
    """a @ b with operands at precision and an fp32 (a's dtype) result."""
    if precision == "ieee":
        return a @ b
    if a.is_cuda:
        if precision == "bf16":
            return _bf16_matmul(a.to(torch.bfloat16), b.to(torch.bfloat16), a.dtype)
        with _cuda_tf32():
            return a @ b
    return rounded(a, precision) @ rounded(b, precision)


def _bf16_matmul(a16: torch.Tensor, b16: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bf16 operands, fp32 accumulation and result (cuBLAS's out_dtype GEMMs)."""
    if a16.dim() == 2 and b16.dim() == 2:
        return torch.mm(a16, b16, out_dtype=dtype)
    batch = torch.broadcast_shapes(a16.shape[:-2], b16.shape[:-2])
    a3 = a16.expand(*batch, *a16.shape[-2:]).reshape(-1, *a16.shape[-2:])
    b3 = b16.expand(*batch, *b16.shape[-2:]).reshape(-1, *b16.shape[-2:])
    return torch.bmm(a3, b3, out_dtype=dtype).view(*batch, a16.shape[-2], b16.shape[-1])


def baddbmm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, precision: str = "ieee"):
    """acc + a @ b (3-D, batched), operands at precision, fp32 accumulation."""
    if precision == "ieee":
        return torch.baddbmm(acc, a, b)
    if a.is_cuda and precision == "bf16":
        return torch.baddbmm(acc, a.to(torch.bfloat16), b.to(torch.bfloat16), out_dtype=acc.dtype)
    if a.is_cuda:
        with _cuda_tf32():
            return torch.baddbmm(acc, a, b)
    return torch.baddbmm(acc, rounded(a, precision), rounded(b, precision))
