"""When idmix checks values inside tensors (token ids, positions, |λ|), which needs a host sync:
in eager mode only (never inside a compiled graph, nor under ``torch.func.vmap``, whose batched
tensors have no single value), and for CPU tensors (where the sync is free) or everywhere when
the environment sets IDMIX_DEBUG=1. IDMIX_DEBUG=0 turns them off on CPU too: the path a GPU
takes, for tests that a step reads no value on the host."""

from __future__ import annotations

import os

import torch


def functorch_transforms() -> tuple[str, ...]:
    """The ``torch.func`` transforms active around this call, as functorch names them ("Vmap",
    "Grad" (grad, vjp, jacrev), "Jvp" (jvp, jacfwd), "Functionalize"); () outside any. One C
    call when none is active. (torch has no public query for this: the functorch interpreter
    stack of the pinned torch, constraints.txt.)"""
    if not torch._C._are_functorch_transforms_active():
        return ()
    return tuple(i.key().name for i in torch._C._functorch.get_interpreter_stack())


def check_values(x: torch.Tensor) -> bool:
    if torch.compiler.is_compiling() or "Vmap" in functorch_transforms():
        return False
    flag = os.environ.get("IDMIX_DEBUG")
    return flag != "0" and (x.device.type == "cpu" or flag == "1")
