"""The prepared GPU run (benchmarks/gpu_check.sh) on CPU: its --dry-run takes the benchmark's
and the profile's steps through the Triton interpreter at tiny sizes and writes both reports."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("triton")


def test_gpu_check_dry_run_writes_the_report(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": __import__("sys").executable}
    out = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = (tmp_path / "dry_run.md").read_text()
    for heading in ("## Training path", "## Decode step", "## Models decoding", "## Autotune"):
        assert heading in report
    for model in ("interdomain_tiny", "softmax_tiny"):  # the models table's dry-run stand-ins
        assert f"| {model} | 2 | 24 |" in report
    assert "| 128 | 1 |" in report  # the dry run's one length, one row
    profile = (tmp_path / "dry_run_profile.md").read_text()
    for heading in ("## Forward+backward, T = 128, B = 1", "## Decode step"):
        assert heading in profile
    assert "idmix::chunked_kernels_backward" in profile  # the op's own backward, timed by name
    assert "first call, with autotuning" in profile
