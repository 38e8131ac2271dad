"""ExecuTorch: the one-token decode step (``deploy.export_programs``' decode program, state as
explicit inputs and outputs) lowered to the XNNPACK backend, saved as a ``.pte`` file and run by
ExecuTorch's runtime.

Only the decode step: its graph is plain ATen ops, which XNNPACK and ExecuTorch's portable
kernels cover. The prefill runs the chunked scan through idmix's own custom op, for which
ExecuTorch has no kernel; a deployment prefills with the exported program (or feeds the prompt
through the decode step, one token at a time).

Modes: fp32 and torchao's int8_dynamic_int4 (``deploy.quantize_linears``; XNNPACK runs its
int4 weights as packed 4-bit GEMMs) lower and decode token-exact against their exported
programs. torchao's int8 ``Int8Tensor`` modes do not (``aten._int_mm`` is outside the core ATen
opset that ExecuTorch accepts; weight-only lowers but its tokens drift), and the ``pt2e``
programs are quantised for x86/oneDNN, not XNNPACK: :data:`EXECUTORCH_MODES`.
``executorch`` is imported on first use only.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..io.files import atomic_write

EXECUTORCH_MODES = ("fp32", "int8_dynamic_int4")


def save_executorch(program: torch.export.ExportedProgram, path) -> Path:
    """Lower program to ExecuTorch with the XNNPACK partitioner (operators it does not take run
    on ExecuTorch's portable kernels) and write the ``.pte`` file atomically."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    buffer = lowered.to_executorch().buffer
    return atomic_write(path, lambda tmp: Path(tmp).write_bytes(buffer))


def load_executorch(path):
    """A callable with the saved program's call convention (tensors in, tuple of tensors out),
    run by ExecuTorch's runtime from a :func:`save_executorch` file."""
    from executorch.runtime import Runtime

    if not Path(path).is_file():
        raise ValueError(f"path: no such file {str(path)!r}")
    method = Runtime.get().load_program(Path(path)).load_method("forward")

    def run(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(method.execute(list(inputs)))  # fresh tensors: safe to feed back

    return run
