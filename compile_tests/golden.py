"""Golden graph counts: compare what an entry point compiles to with the checked-in record.

Regenerate on purpose (after a change that is meant to alter the graphs) with
``IDMIX_UPDATE_GOLDENS=1 python -m pytest compile_tests -m "slow or not slow"``, then review
the diff of ``goldens.json`` like any other change.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
import torch._dynamo.testing
from torch._inductor.utils import run_and_get_code

GOLDENS = Path(__file__).with_name("goldens.json")
UPDATE = os.environ.get("IDMIX_UPDATE_GOLDENS") == "1"
HOW_TO_LOOK = (
    "Look with TORCH_LOGS=graph_breaks,recompiles (breaks and recompiles) or "
    "TORCH_LOGS=graph_code,output_code (the graphs and the generated kernels). "
    "If the change is intended: IDMIX_UPDATE_GOLDENS=1 python -m pytest compile_tests "
    '-m "slow or not slow", and commit goldens.json.'
)


def counter() -> torch._dynamo.testing.CompileCounterWithBackend:
    """A CompileCounter that compiles with Inductor (counts Dynamo frames and graph ops)."""
    return torch._dynamo.testing.CompileCounterWithBackend("inductor")


def compiled(fn, cnt, dynamic: bool | None = False):
    """fn through torch.compile(fullgraph=True) with the counting Inductor backend."""
    return torch.compile(fn, backend=cnt, fullgraph=True, dynamic=dynamic)


def kernels(fn, *args, **kwargs):
    """Run a compiled fn and count what Inductor generated for it.

    Returns (output, {"fused": distinct generated C++/Triton kernels, "extern": calls to
    library kernels such as GEMMs}).
    """
    out, codes = run_and_get_code(fn, *args, **kwargs)
    source = "\n".join(codes)
    fused = set(re.findall(r"^(\w*fused\w*) = async_compile", source, re.M))
    extern = len(re.findall(r"extern_kernels\.\w+\(", source))
    return out, {"fused": len(fused), "extern": extern}


def _load() -> dict:
    return json.loads(GOLDENS.read_text()) if GOLDENS.exists() else {}


def check(name: str, observed: dict) -> None:
    """Assert observed == goldens[name]; with IDMIX_UPDATE_GOLDENS=1, record it instead."""
    if UPDATE:
        data = _load()
        data[name] = observed
        tmp = GOLDENS.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        tmp.replace(GOLDENS)
        return
    expected = _load().get(name)
    if expected is None:
        pytest.fail(f"{name}: no golden record (observed {observed}). {HOW_TO_LOOK}")
    if expected != observed:
        changed = ", ".join(
            f"{k}: {expected.get(k)} -> {observed.get(k)}"
            for k in sorted(set(expected) | set(observed))
            if expected.get(k) != observed.get(k)
        )
        pytest.fail(f"{name}: compiled graph changed ({changed}). {HOW_TO_LOOK}")
