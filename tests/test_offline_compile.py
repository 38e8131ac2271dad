"""The offline GPU compile check (benchmarks/offline_compile.py): every Triton kernel compiled for
sm_90 and sm_80 without a GPU, failing on a spill, on too much shared memory, or on a
matrix-product kernel without tensor-core instructions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "offline_compile.py"
pytest.importorskip("triton")
sys.path.insert(0, str(ROOT / "benchmarks"))


def compile_check(tmp_path, *args, timeout=1200):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json", str(tmp_path / "facts.json")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout,
    )  # fmt: skip
    facts = json.loads((tmp_path / "facts.json").read_text()) if out.returncode in (0, 1) else []
    return out, facts


def test_ptxas_report_is_read_and_a_stack_frame_is_no_spill():
    from offline_compile import Facts, _judge, ptxas_report

    log = (
        "ptxas info    : Function properties for k\n"
        "    32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 168 registers, used 1 barriers, 32 bytes cumulative stack size\n"
    )
    report = ptxas_report(log)
    assert report == dict(registers=168, stack=32, spill_stores=0, spill_loads=0)
    sass = dict.fromkeys(("HGMMA", "HMMA", "FFMA", "LDL", "STL", "LDS", "STS"), 0)
    f = Facts("_pass1_kernel", "c", 90, 4, {}, {"PREC": 1}, 1024, **report, compile_s=0, sass=sass)
    _judge(f)
    assert f.problems == ["no tensor-core instructions in a matrix-product kernel"]
    spilled = Facts("_states_bwd_kernel", "c", 90, 4, {}, {}, 0, 255, 8, 8, 4, 0, sass=sass)
    _judge(spilled)
    assert spilled.problems == ["spills: 8 B stored / 4 B loaded"]
    with pytest.raises(RuntimeError, match="no ptxas report"):
        ptxas_report("")


@pytest.mark.slow
def test_the_chunked_kernels_compile_clean_for_sm90(tmp_path):
    """One launch-site sweep (the chunked op's forward and backward, paper head, bf16 products,
    document resets) on sm_90: every kept config spill-free, every product kernel on HGMMA; the
    forward's output is the fused kernel (pass 1 runs in the backward's recompute)."""
    out, facts = compile_check(tmp_path, "--tier", "smoke", "--jobs", "1")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    kernels = {f["kernel"] for f in facts}
    expected = {"_output_kernel", "_pass1_kernel", "_states_fwd_kernel", "_states_bwd_kernel"}
    expected |= {f"_pass{i}_bwd_{part}_kernel" for i in (1, 2) for part in ("lag", "state")}
    assert expected <= kernels
    from offline_compile import NO_TENSOR_CORES  # the scans, flags and decay tables

    for f in facts:
        assert f["spill_stores"] == 0 and f["shared"] <= 232448, f
        if f["kernel"] not in NO_TENSOR_CORES:
            assert f["sass"]["HGMMA"] > 0, f
    assert "0 with problems" in out.stdout


@pytest.mark.slow
def test_every_kernel_compiles_clean_for_sm90_and_sm80(tmp_path):
    """The CI tier: every kernel (chunked, selective, decode) at every config its autotuner may
    pick, the paper head and the 128-wide heads, both masks, the GPU default precision, on sm_90
    and sm_80 (~4 minutes on 2 cores)."""
    out, facts = compile_check(tmp_path)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert len(facts) > 300 and "0 with problems" in out.stdout
