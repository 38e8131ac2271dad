"""`tune run recipes/compare_mixers.py` at toy size: two mixers, two seeds, one learning-rate
sweep; the table, JSON and plots; an interrupted study reuses its finished runs; bad configs."""

from __future__ import annotations

import json
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
    # a second run with overwrite reuses every finished run instead of training again
    again = run(toy_config(tmp_path), "overwrite=True")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("reusing the finished run") == 6


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
