"""The files q passes through from an interdomain layer's readout down to the first Triton
kernel, traced (not read): every Python frame in ``idmix/`` or ``kernels/`` entered or resumed
on the way, collapsed to changes of file. A "return" is a change back to a file the path had
already left on its way down (the unwinding after the kernel is not counted).

    TRITON_INTERPRET=1 python benchmarks/call_path.py

The layer runs its training path on the Triton backend (the GPU's path, here under the
interpreter), once untraced first so that imports and caches are not counted; the path starts
where the readout calls the op and ends at the first frame in ``kernels/``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (str(ROOT / "idmix"), str(ROOT / "kernels"))
KERNELS = str(ROOT / "kernels")


def trace_to_first_kernel() -> list[str]:
    """The repository files visited, one entry per change of file, from the readout's call of
    interdomain_attention to the first kernel."""
    from idmix.modules import InterdomainAttention

    layer = InterdomainAttention(64, 2, num_modes=8, chunk_size=16, backend="triton")
    x = torch.randn(1, 32, 64, requires_grad=True)
    layer(x)  # warm: imports, compiled pieces and resolved backends are not on the path
    files: list[str] = []
    state = {"on": False, "done": False}

    def profile(frame, event, arg):
        name = frame.f_code.co_filename
        if state["done"] or not name.startswith(SOURCES):
            return
        if not state["on"]:
            if event == "call" and frame.f_code.co_name == "interdomain_attention":
                state["on"] = True
                files.extend([str(ROOT / "idmix/modules/readouts.py"), name])
            return
        if files[-1] != name:
            files.append(name)
        if name.startswith(KERNELS):
            state["done"] = True

    sys.setprofile(profile)
    try:
        layer(x)
    finally:
        sys.setprofile(None)
    return [str(Path(f).relative_to(ROOT)) for f in files]


def summarise(path: list[str]) -> tuple[int, int]:
    """(distinct files, returns to a file already left)."""
    seen, returns = set(), 0
    for f in path:
        returns += f in seen
        seen.add(f)
    return len(seen), returns


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("run with TRITON_INTERPRET=1 (the Triton path on this CPU)")
    path = trace_to_first_kernel()
    print(" -> ".join(path))
    files, returns = summarise(path)
    print(f"{files} files, {returns} returns to a file already left")


if __name__ == "__main__":
    main()
