"""`tune run recipes/compare_mixers.py` at toy size: two mixers, two seeds, one learning-rate
sweep; the table, JSON and plots; an interrupted study reuses its finished runs; bad configs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from idmix.evaluation.compare import rate_beyond_edge

ROOT = Path(__file__).resolve().parent.parent
TUNE = str(Path(sys.executable).with_name("tune"))
PNG = b"\x89PNG\r\n\x1a\n"


def toy_config(tmp_path: Path, **changes) -> Path:
    """compare_tiny.yaml shrunk to seconds: 1-layer models, 3 steps of 2 × 32 tokens."""
    c = OmegaConf.load(ROOT / "recipes" / "configs" / "compare_tiny.yaml")
    c.output_dir = str(tmp_path / "study")
    c.seeds = [0, 1]
    c.training.update(seq_len=32, batch_size=2, max_tokens=None, max_steps=3, warmup_steps=1,
                      eval_every_n_steps=3, eval_batches=1)  # fmt: skip
    c.context_tokens, c.context_multiples, c.diagnostic_rows = 256, [1, 2], 1
    c.reference = "softmax"
    c.extend_sweep = 1
    c.mixers = {
        "interdomain": {"model": {"_component_": "idmix.models.interdomain_tiny", "num_layers": 1},
                        "lrs": [1e-3, 3e-3]},
        "softmax": {"model": {"_component_": "idmix.models.softmax_tiny", "num_layers": 1},
                    "lr": 3e-3},
    }  # fmt: skip
    for key, value in changes.items():
        OmegaConf.update(c, key, value, merge=False)
    path = tmp_path / "compare.yaml"
    OmegaConf.save(c, path)
    return path


def run(config: Path, *overrides):
    cmd = [TUNE, "run", "recipes/compare_mixers.py", "--config", str(config), *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_compare_writes_table_json_and_plots_then_reuses_runs(tmp_path):
    out = run(toy_config(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    study = tmp_path / "study"
    md = (study / "compare.md").read_text()
    assert "| interdomain |" in md and "| softmax |" in md and " ± " in md
    assert "Learning-rate sweep" in md and "Mixer output RMS" in md and "core.C_re" in md
    data = json.loads((study / "compare.json").read_text())
    inter = data["results"]["interdomain"]
    # a sweep of two rates always has its best at an edge: extend_sweep=1 adds the next one
    assert sorted(map(float, inter["sweep"]))[::2] in ([3.3e-4, 3e-3], [1e-3, 9e-3])
    assert [r["seed"] for r in inter["runs"]] == [0, 1]  # both seeds at the chosen rate
    assert len({r["lr"] for r in inter["runs"]}) == 1
    for r in inter["runs"]:
        assert set(r["ppl"]) == {"32", "64"} and all(v > 1 for v in r["ppl"].values())
        assert "elapsed_s" in r["history"][-1]
    summary = {row["mixer"]: row for row in data["summary"]}
    assert summary["softmax"]["vs_reference"] == pytest.approx(1.0)
    for name in ("compare_curves.png", "compare_context.png"):
        assert (study / name).read_bytes()[:8] == PNG
    # 4 sweep/seed runs for interdomain + 2 for softmax, each in its own directory
    assert len(list((study / "runs").glob("*/lr*/seed*/model_final.pt"))) == 6
    # a second run with overwrite reuses every finished run instead of training again: from
    # its record, or from its checkpoint where the record is gone (then scored again)
    (study / "runs" / "softmax" / "lr0.003" / "seed1" / "record.json").unlink()
    again = run(toy_config(tmp_path), "overwrite=True")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("reusing the recorded run") == 5
    assert again.stdout.count("reusing the finished run") == 1
    assert json.loads((study / "compare.json").read_text())["summary"] == data["summary"]


def test_a_study_resumes_from_its_records_alone_and_refuses_a_record_of_another_run(tmp_path):
    records = tmp_path / "records"
    config = toy_config(tmp_path, records_dir=str(records), seeds=[0], extend_sweep=0)
    first = run(config)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert len(list(records.glob("*/lr*/seed0/record.json"))) == 3
    study = tmp_path / "study"
    summary = json.loads((study / "compare.json").read_text())["summary"]
    shutil.rmtree(study)  # another machine: the records alone, no checkpoint
    again = run(config)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("reusing the recorded run") == 3
    assert not (study / "runs").exists()  # nothing trained
    assert json.loads((study / "compare.json").read_text())["summary"] == summary
    other = run(config, "training.warmup_steps=2", "output_dir=" + str(tmp_path / "other"))
    assert other.returncode != 0
    assert "records a run with another config" in other.stderr
    assert str(records / "interdomain" / "lr0.001" / "seed0" / "record.json") in other.stderr


def test_rate_beyond_edge_continues_the_spacing_only_from_an_edge():
    rates = [1e-3, 3e-3, 6e-3]
    assert rate_beyond_edge(rates, 6e-3) == 1.2e-2
    assert rate_beyond_edge(rates, 1e-3) == 3.3e-4
    assert rate_beyond_edge(rates, 3e-3) is None
    assert rate_beyond_edge([3e-3], 3e-3) is None


@pytest.mark.parametrize(
    "change, message",
    [
        ({"reference": "mamba"}, "reference 'mamba' is not one of the mixers"),
        ({"mixers.softmax.lrs": [1e-3]}, "exactly one of lr or lrs"),
        ({"training.optimizer.lr": 1e-3}, "set the rate per mixer"),
        ({"seeds": [0, 0]}, "distinct seeds"),
        ({"extend_sweep": -1}, "extend_sweep: expected an integer >= 0"),
        ({"training.oops": 1}, "config.training: unknown keys ['oops']"),
    ],
)
def test_compare_rejects_bad_configs(tmp_path, change, message):
    out = run(toy_config(tmp_path, **change))
    assert out.returncode != 0 and message in out.stderr, out.stderr[-2000:]
