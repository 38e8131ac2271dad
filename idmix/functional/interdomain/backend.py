"""``backend=`` resolved once per call into the object that supplies the segment primitives.

"torch": PyTorch, eager; "inductor": the same PyTorch pieces compiled by torch.compile (their
glue fused around the GEMMs); "triton": the kernels of ``idmix_kernels`` (CUDA, or on CPU the
Triton interpreter); "auto": triton for CUDA tensors where it is installed, else torch. This is
the only place the Triton-vs-torch decision is made (the decode step asks ``takes_triton``).
"""

from __future__ import annotations

import functools
import importlib
from typing import NamedTuple

import torch

from .chunk_torch import TorchChunkOps
from .compiled import compiled, have_cxx
from .selective_torch import SelectiveTorchOps
from .selective_triton import SelectiveTritonOps
from .validation import check_backend


class Backend(NamedTuple):
    """name: "torch", "inductor" or "triton"; chunk: the shared-decay primitives
    (``chunk_torch``'s interface; None for "triton", whose shared-decay path is its own op,
    ``chunked_kernels``); selective: the per-token ones (``selective_torch``'s);
    compile_pieces: whether the shared pieces run compiled by Inductor."""

    name: str
    chunk: object
    selective: object
    compile_pieces: bool

    def run(self, piece):
        """The piece function as this backend runs it: compiled once per process and input
        shape for "inductor" (static shapes: a run at one length meets at most three, a full
        segment, a shorter last one and the ragged tail; not fullgraph, so that past Dynamo's
        recompile limit it runs eagerly with torch's warning instead of failing), else as is
        with the backend's primitives."""
        if self.compile_pieces:
            return compiled(piece, dynamic=False)
        return functools.partial(piece, ops=self.chunk)


@functools.cache
def _kernels():
    """The idmix_kernels module, or None where it (or triton) is not installed."""
    try:
        return importlib.import_module("idmix_kernels")
    except ImportError:
        return None


def kernels_module():
    """The idmix_kernels module (raises the ImportError that says why when it is missing)."""
    kernels = _kernels()
    return importlib.import_module("idmix_kernels") if kernels is None else kernels


def _wants_triton(backend: str, x: torch.Tensor) -> bool:
    if backend != "auto":
        return backend == "triton"
    return x.is_cuda and _kernels() is not None


def takes_triton(backend: str, x: torch.Tensor) -> bool:
    """ "triton": always (checked: on CPU only under the interpreter); "auto": for CUDA tensors
    when the kernels are installed."""
    check_backend(backend, x)
    return _wants_triton(backend, x)


def shared_on_kernels(backend: str, x: torch.Tensor) -> bool:
    """Whether the shared-decay chunked path runs on the kernels (``chunked_kernels``) for
    inputs like x: as ``resolve_backend`` would pick "triton", without building the backend (so
    that torch.compile traces it as a plain condition)."""
    if backend == "inductor" or not _wants_triton(backend, x):
        return False
    if x.dtype == torch.float64:
        if backend == "triton":
            raise ValueError(
                "backend='triton': the kernels compute in fp32; fp64 inputs take 'torch'"
            )
        return False
    return True


_TORCH = Backend("torch", TorchChunkOps, SelectiveTorchOps, False)
_INDUCTOR = Backend("inductor", TorchChunkOps, SelectiveTorchOps, True)


def resolve_backend(backend: str, x: torch.Tensor) -> Backend:
    """The Backend for inputs like x (the entry points have checked the name). The kernels
    compute in fp32: fp64 inputs take torch ("triton" refuses them)."""
    if backend == "inductor":
        if not x.is_cuda and not have_cxx():
            raise RuntimeError("backend: 'inductor' on CPU needs a C++ compiler (g++ or clang++)")
        return _INDUCTOR
    if not shared_on_kernels(backend, x):
        return _TORCH
    return Backend("triton", None, SelectiveTritonOps(kernels_module()), False)
