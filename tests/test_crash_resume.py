"""Kill -9 at the worst moments, resume each time: the run ends loss-for-loss identical to a
straight one, and a partial checkpoint is never picked up. The kills come from a test-only
trainer callback (``tests/faults.py``), installed by running the recipe through its runner."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import torch

from idmix.io.checkpoint import latest_checkpoint
from tests.faults import POINTS

ROOT = Path(__file__).resolve().parent.parent
TUNE = str(Path(sys.executable).with_name("tune"))
FAULTS = str(ROOT / "tests" / "faults.py")
COMMON = ["seq_len=32", "batch_size=2", "max_steps=10", "warmup_steps=2", "eval_every_n_steps=0",
          "save_every_n_steps=2", "log_every_n_steps=1"]  # fmt: skip
# one crash per point, each in the run resumed after the previous one
CHAIN = ["mid_step@3", "mid_checkpoint@4", "before_rename@6", "before_pointer@8"]


def tune_run(run: Path, *extra, kill_at: str | None = None) -> subprocess.CompletedProcess:
    """`tune run` of the recipe, or (kill_at) the same recipe file through tests/faults.py."""
    recipe = "recipes/pretrain_interdomain.py"
    launch = [TUNE, "run", recipe] if kill_at is None else [sys.executable, FAULTS, kill_at, recipe]
    cmd = [*launch, "--config", "recipes/configs/tiny_interdomain.yaml", f"output_dir={run}"]
    cmd += [*COMMON, *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def losses(run: Path) -> list[tuple[int, float, float]]:
    return [(h["step"], h["loss"], h["lr"]) for h in json.loads((run / "history.json").read_text())]


def test_the_chain_covers_every_point():
    assert {c.split("@")[0] for c in CHAIN} == set(POINTS)


def test_kill_9_at_every_point_then_resume_matches_a_straight_run(tmp_path):
    straight = tmp_path / "straight"
    assert tune_run(straight).returncode == 0
    run = tmp_path / "crashed"
    resume = []
    for point in CHAIN:
        out = tune_run(run, *resume, kill_at=point)
        assert out.returncode == -signal.SIGKILL, (point, out.returncode, out.stderr[-2000:])
        latest = latest_checkpoint(run)
        assert (
            latest is not None
            and (latest / "extra_rank0.pt").is_file()
            and (latest / ".metadata").is_file()
        )
        step = int(point.split("@")[1])
        expected = {"mid_step": step - 1, "mid_checkpoint": step - 2, "before_rename": step - 2,
                    "before_pointer": step - 2}[point.split("@")[0]]  # fmt: skip
        assert latest.name == f"step_{expected:06d}", (point, latest.name)
        resume = ["resume_from_checkpoint=True"]
    out = tune_run(run, *resume)
    assert out.returncode == 0, out.stderr[-3000:]
    assert losses(run) == losses(straight)
    a, b = (torch.load(r / "model_final.pt", weights_only=True)["model"] for r in (run, straight))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
