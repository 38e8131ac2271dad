"""Triton kernels vs the PyTorch paths: on CPU under the interpreter (fresh process, small
shapes), and on a GPU when one is present (marked gpu)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from idmix.functional import empty_state, interdomain_decode_step, readout_gram

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("triton")


def run_checks(device: str, *extra: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests/kernel_checks.py"), device, *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=3600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "kernel checks passed" in out.stdout


def test_kernels_interpreted_on_cpu():
    """Every check but the per-token-decay ones and the poisoned repeat (those:
    tests/test_kernels_selective.py, so two test workers share the interpreter's time)."""
    run_checks("cpu", "--first-half")


@pytest.mark.slow
def test_kernels_interpreted_on_cpu_at_the_paper_head_size():
    """T = 1100, R = D = M = 64 under the interpreter (minutes): against the torch backend
    (outputs, states, every gradient) and the literal recurrence on sampled positions."""
    run_checks("cpu", "--large")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_kernels_on_gpu():
    run_checks("cuda")


def test_backend_choice_and_errors():
    q = torch.randn(1, 2, 3)
    lam = torch.full((2, 4), 0.5 + 0j)
    G = readout_gram(torch.randn(2, 4, 4, dtype=torch.complex64))
    state = empty_state(1, 2, 4, 3, 3)
    o, _ = interdomain_decode_step(q, q, q, lam, lam, G, state)  # CPU default: torch
    assert o.shape == (1, 2, 3)
    with pytest.raises(ValueError, match="backend: expected one of"):
        interdomain_decode_step(q, q, q, lam, lam, G, state, backend="cuda")
