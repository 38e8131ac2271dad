"""When idmix checks values inside tensors (token ids, positions, |λ|), which needs a host sync:
in eager mode only (never inside a compiled graph), and for CPU tensors (where the sync is free)
or everywhere when the environment sets IDMIX_DEBUG=1."""

from __future__ import annotations

import os

import torch


def check_values(x: torch.Tensor) -> bool:
    if torch.compiler.is_compiling():
        return False
    return x.device.type == "cpu" or os.environ.get("IDMIX_DEBUG") == "1"
