"""A run owns its output_dir (``idmix.io.run_dir``): one run at a time, a stale lock from a
killed run is taken over, ``overwrite=True`` moves the previous run aside in one rename (never a
directory holding a live run, the working directory or home), a resume continues only the run
the directory holds, and a failed one writes no run id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from idmix.io.run_dir import LOCK, RUN_FILE, claim_run_dir, read_run_id
from idmix.training.trainer import train
from tests.test_recipe import CONFIGS, QUICK, ROOT, build_recipe, history, tune_run


def test_a_second_claim_is_refused_while_the_first_holds(tmp_path):
    first = claim_run_dir(tmp_path / "run", resume=False, overwrite=False)
    with pytest.raises(ValueError, match=r"output_dir: .* is in use by another run \(pid \d+"):
        claim_run_dir(tmp_path / "run", resume=True, overwrite=False)
    first.release()
    again = claim_run_dir(tmp_path / "run", resume=True, overwrite=False)
    assert again.run_id == first.run_id == read_run_id(tmp_path / "run") and not again.notes
    again.release()


def test_a_lock_held_by_another_process_is_refused_and_a_killed_ones_taken_over(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from idmix.io.run_dir import claim_run_dir
            claim = claim_run_dir({str(run)!r}, resume=False, overwrite=False)
            print("held", flush=True)
            time.sleep(120)
        """)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=rf"in use by another run \(pid {holder.pid} "):
            claim_run_dir(run, resume=True, overwrite=False)
    finally:
        holder.kill()  # as kill -9 would: the lock file keeps the holder's record
        holder.wait()
    claim = claim_run_dir(run, resume=True, overwrite=False)
    assert any(f"pid {holder.pid}" in n and "ended without releasing" in n for n in claim.notes)
    claim.release()
    assert (run / LOCK).read_text() == ""  # a clean release empties it


def test_overwrite_moves_the_previous_run_aside(tmp_path):
    run = tmp_path / "run"
    old = claim_run_dir(run, resume=False, overwrite=False)
    (run / "model_final.pt").write_bytes(b"run A")
    old.release()
    new = claim_run_dir(run, resume=False, overwrite=True)
    assert new.run_id != old.run_id and new.moved_to.parent == tmp_path
    assert new.moved_to.name.startswith("run.replaced-")
    assert (new.moved_to / "model_final.pt").read_bytes() == b"run A"
    assert json.loads((new.moved_to / RUN_FILE).read_text())["run_id"] == old.run_id
    assert sorted(p.name for p in run.iterdir()) == [LOCK, RUN_FILE]
    new.release()


@pytest.mark.parametrize("kind", ["file", "under_a_file"])
def test_an_output_dir_that_cannot_be_a_directory_is_named(tmp_path, kind):
    (tmp_path / "f").write_text("x")
    out = tmp_path / "f" if kind == "file" else tmp_path / "f" / "run"
    expected = "is a file, not a directory" if kind == "file" else "cannot create"
    with pytest.raises(ValueError, match=rf"config: output_dir: .*{expected}"):
        claim_run_dir(out, resume=False, overwrite=False)


def test_overwrite_then_resume_continues_the_new_run_not_the_old(tmp_path):
    """Issue 30's sequence: run A, then overwrite=True with another lr and seed stopped early,
    then a resume: it continues run B; run A is kept whole beside it."""
    run = tmp_path / "run"
    a = ["max_steps=2", "save_every_n_steps=2", "eval_every_n_steps=0"]
    tune_run(tmp_path, f"output_dir={run}", *a)
    model_a = (run / "model_final.pt").read_bytes()
    b = ["max_steps=2", "save_every_n_steps=2", "eval_every_n_steps=0", "optimizer.lr=1e-3",
         "seed=7"]  # fmt: skip
    out = tune_run(tmp_path, f"output_dir={run}", *b, "overwrite=True", "steps_this_run=1")
    assert "moved the previous run to" in out.stdout
    (aside,) = tmp_path.glob("run.replaced-*")
    assert (aside / "model_final.pt").read_bytes() == model_a
    assert not (run / "model_final.pt").exists() and len(history(run)) == 1
    out = tune_run(tmp_path, f"output_dir={run}", *b, "resume_from_checkpoint=True")
    assert "resumed from" in out.stdout and "step_000001" in out.stdout
    records = history(run)
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["lr"] == pytest.approx(1e-3 * 1 / 20)  # run B's lr, warmup 20
    final = torch.load(run / "model_final.pt", weights_only=True)
    assert final["model"].keys()


def test_a_second_run_on_a_busy_output_dir_stops_before_touching_it(tmp_path):
    run = tmp_path / "run"  # build_recipe's output_dir
    holder = claim_run_dir(run, resume=False, overwrite=False)
    try:
        with pytest.raises(ValueError, match=r"is in use by another run"):
            build_recipe(tmp_path, "max_steps=2", "overwrite=True")
        assert sorted(p.name for p in run.iterdir()) == [LOCK, RUN_FILE]
    finally:
        holder.release()


def test_a_resume_claim_writes_no_run_id(tmp_path):
    """A run from before run ids (no run.json) gets one only once its resume succeeded
    (``Trainer._resume``): the claim alone, which a failed resume may end at, writes nothing."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("x: 1\n")  # an older idmix's run: no run.json
    claim = claim_run_dir(run, resume=True, overwrite=False)
    assert claim.run_id is None and not (run / RUN_FILE).exists()
    claim.release()


def _run(tmp_path, *overrides):
    """A one-step run in tmp_path/run (what the recipe does: set-up, training, clean-up)."""
    dotlist = [f"output_dir={tmp_path / 'run'}", *QUICK, "max_steps=1", "eval_every_n_steps=0",
               "hf_export=false", *overrides]  # fmt: skip
    cfg = OmegaConf.load(CONFIGS / "tiny_interdomain.yaml")
    return train(OmegaConf.merge(cfg, OmegaConf.from_dotlist(dotlist)))


def test_a_failed_resume_never_writes_run_json_and_a_good_one_keeps_the_checkpoints_id(tmp_path):
    run = tmp_path / "run"
    run_id = _run(tmp_path).run_id
    (run / RUN_FILE).unlink()  # a run whose run.json is gone (or from before run ids)
    step = run / "checkpoints" / "step_000001"
    (step / "extra_rank0.pt").rename(tmp_path / "extra_rank0.pt")
    with pytest.raises(ValueError, match=r"extra_rank0.pt' is missing"):
        _run(tmp_path, "max_steps=2", "resume_from_checkpoint=True")
    assert not (run / RUN_FILE).exists()
    (tmp_path / "extra_rank0.pt").rename(step / "extra_rank0.pt")
    resumed = _run(tmp_path, "max_steps=2", "resume_from_checkpoint=True")
    assert resumed.step == 2 and resumed.run_id == run_id == read_run_id(run)


class Killed(BaseException):
    """What kill -9 would do to the process at that moment."""


def test_overwrite_moves_the_previous_run_in_one_rename(tmp_path, monkeypatch):
    """A kill after the first move out of the run directory: with one rename the run has
    already moved whole (a move entry by entry would split it across two directories)."""
    run = tmp_path / "run"
    old = claim_run_dir(run, resume=False, overwrite=False)
    for name in ("config.yaml", "history.json", "model_final.pt"):
        (run / name).write_text(name)
    old.release()
    moves = []
    for name in ("rename", "replace"):
        real = getattr(os, name)

        def move(src, dst, real=real):
            if Path(dst).resolve().parent != run.resolve():  # out of the run directory
                if moves:
                    raise Killed
                moves.append(src)
            return real(src, dst)

        monkeypatch.setattr(os, name, move)
    new = claim_run_dir(run, resume=False, overwrite=True)
    monkeypatch.undo()
    moved = {LOCK, RUN_FILE, "config.yaml", "history.json", "model_final.pt"}
    assert {p.name for p in new.moved_to.iterdir()} == moved
    new.release()


def test_overwrite_refuses_a_directory_holding_a_live_run(tmp_path):
    """overwrite=True on a parent of a running run's directory: refused, nothing moved (the
    live run's lock is held through a second open file description, as another process's)."""
    study = tmp_path / "study"
    live = claim_run_dir(study / "runs" / "a", resume=False, overwrite=False)
    try:
        with pytest.raises(ValueError, match=r"holds a live run in .*runs/a.* \(pid \d+"):
            claim_run_dir(study, resume=False, overwrite=True)
        assert (study / "runs" / "a" / RUN_FILE).is_file()
        assert not list(tmp_path.glob("study.replaced-*"))
    finally:
        live.release()
    again = claim_run_dir(study, resume=False, overwrite=True)  # a finished run moves along
    assert (again.moved_to / "runs" / "a" / RUN_FILE).is_file()
    again.release()


def test_overwrite_refuses_the_working_directory_its_parents_and_home(tmp_path, monkeypatch):
    work = tmp_path / "project" / "sub"
    work.mkdir(parents=True)
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    for out in (".", "..", work, tmp_path, tmp_path / "home"):
        with pytest.raises(ValueError, match=r"overwrite=True would move it aside, so it is "):
            claim_run_dir(Path(out), resume=False, overwrite=True)
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "project"]
