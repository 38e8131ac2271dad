"""`tune run` of the evaluation and deployment recipes on tiny exports: each writes its table,
JSON and plot (or programs), and never replaces a finished result without overwrite=True."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers import save_tiny_export
from tests.recipe_files import load_recipe

ROOT = Path(__file__).resolve().parent.parent
TUNE = str(Path(sys.executable).with_name("tune"))


def tune_run(recipe, config, *overrides):
    cmd = [TUNE, "run", f"recipes/{recipe}.py", "--config", f"recipes/configs/{config}.yaml"]
    out = subprocess.run([*cmd, *overrides], cwd=ROOT, capture_output=True, text=True, timeout=600)
    return out


CONFIGS_OF = {
    "evaluate": ["eval_tiny", "eval_paper_suite", "eval_own_data"],
    "length_extrapolation": ["length_extrapolation_tiny", "length_extrapolation_own_data"],
    "train_recall": [
        "recall_tiny",
        "recall_mqar",
        "recall_baselines_tiny",
        "recall_future_work_tiny",
    ],
    "quantize_interdomain": ["quantize_tiny", "quantize_own_data"],
    "generate": ["generate_tiny"],
    "compare_mixers": [
        "compare_tiny",
        "compare_small",
        "compare_baselines_tiny",
        "compare_baselines_small",
        "compare_future_work_tiny",
    ],
}


@pytest.mark.parametrize("recipe, configs", CONFIGS_OF.items())
def test_configs_set_exactly_the_recipe_keys(recipe, configs):
    module = load_recipe(recipe)
    for name in configs:
        cfg = OmegaConf.load(ROOT / "recipes" / "configs" / f"{name}.yaml")
        optional = getattr(module, "OPTIONAL_KEYS", set())
        assert module.KEYS - optional <= set(cfg.keys()) <= module.KEYS, name


def test_every_config_is_checked_against_its_recipe():
    """Pretraining configs (tiny_*, paper_*) are built in tests/test_recipe.py; the rest here."""
    names = {p.stem for p in (ROOT / "recipes" / "configs").glob("*.yaml")}
    others = {n for n in names if not n.startswith(("tiny_", "paper_"))}
    assert others == {c for configs in CONFIGS_OF.values() for c in configs}


def ok(out):
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


def test_evaluate_recipe_and_no_silent_overwrite(tmp_path):
    path = tmp_path / "model_final.pt"
    save_tiny_export(path)
    args = (f"checkpoint={path}", "limit=2", f"output_dir={tmp_path / 'eval'}")
    stdout = ok(tune_run("evaluate", "eval_tiny", *args))
    assert "shakespeare_next_line" in stdout and "mean of accuracies" in stdout
    results = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert set(results) >= {"shakespeare_next_line", "shakespeare_scenes"}
    before = (tmp_path / "eval" / "results.md").read_bytes()
    again = tune_run("evaluate", "eval_tiny", *args)
    assert again.returncode != 0 and "overwrite=True" in again.stderr
    assert (tmp_path / "eval" / "results.md").read_bytes() == before


def test_length_extrapolation_recipe(tmp_path):
    paths = {}
    for mixer in ("interdomain", "softmax", "s4d"):
        paths[mixer] = tmp_path / f"{mixer}.pt"
        save_tiny_export(paths[mixer], mixer)
    out_dir = tmp_path / "extrapolation"
    stdout = ok(
        tune_run(
            "length_extrapolation",
            "length_extrapolation_tiny",
            *(f"checkpoints.{m}={p}" for m, p in paths.items()),
            "train_seq_len=16",
            "multiples=[1,2,8]",
            "num_tokens=256",
            f"output_dir={out_dir}",
        )
    )
    assert "| 16 (1×) | 32 (2×) | 128 (8×) |" in stdout
    ppl = json.loads((out_dir / "length_extrapolation.json").read_text())["perplexity"]
    assert set(ppl) == set(paths) and all(len(p) == 3 for p in ppl.values())
    assert (out_dir / "length_extrapolation.png").stat().st_size > 10_000


def test_train_recall_recipe(tmp_path):
    out_dir = tmp_path / "recall"
    args = (
        "model.embed_dim=32",
        "model.num_heads=2",
        "model.num_layers=1",
        "model.num_modes=4",
        "mixers=[interdomain, softmax, {gla: {value_dim: 32}}]",
        "batch_size=2",
        "steps=3",
        "warmup_steps=1",
        "lrs=[1e-3,3e-3]",
        "train=[{task: mqar, seq_len: 32, size: [2, 4]}, {task: passkey, seq_len: 64}]",
        "evaluate=[{task: mqar, seq_len: 32, size: 4},"
        " {task: phonebook, seq_len: 128, size: 16},"
        " {task: passkey, seq_len: 32}, {task: passkey, seq_len: 128}]",
        "eval_examples=4",
        f"output_dir={out_dir}",
    )
    stdout = ok(tune_run("train_recall", "recall_tiny", *args))
    assert "MQAR" in stdout and "Sweep: mean validation exact match" in stdout
    results = json.loads((out_dir / "recall.json").read_text())
    assert set(results) == {"interdomain", "softmax", "gla"}
    # the entry's own option reaches its model: 2 heads × 16 keys × 32 values (default 16)
    assert results["gla"]["options"] == {"value_dim": 32}
    assert results["gla"]["state_floats"] == [1024] and results["softmax"]["state_floats"] == [None]
    assert "| gla | {'value_dim': 32} |" in stdout and "1,024 ×1" in stdout
    assert set(results["softmax"]["scores"]["phonebook"]) == {"16@128"}
    assert set(results["softmax"]["scores"]["passkey"]) == {"32", "128"}
    assert set(results["softmax"]["sweep"]) == {"0.001", "0.003"}
    assert results["softmax"]["lr"] in (1e-3, 3e-3)
    assert (out_dir / "recall.png").stat().st_size > 10_000
    # every (mixer, options, rate) is kept as a record: a study moved elsewhere with them alone
    # reuses all six and reports the same; one with other settings refuses them
    records = sorted(p.relative_to(out_dir) for p in out_dir.glob("runs/*/*/record.json"))
    assert len(records) == 6 and Path("runs/gla_value_dim-32/lr0.003/record.json") in records
    (tmp_path / "records").mkdir()
    shutil.move(out_dir / "runs", tmp_path / "records" / "runs")
    shutil.rmtree(out_dir)
    elsewhere = (
        *args[:-1],
        f"output_dir={out_dir}",
        f"records_dir={tmp_path / 'records' / 'runs'}",
    )
    again = ok(tune_run("train_recall", "recall_tiny", *elsewhere))
    assert again.count("reusing the recorded run") == 6
    assert json.loads((out_dir / "recall.json").read_text()) == results
    other = tune_run("train_recall", "recall_tiny", *elsewhere[:-2], "steps=4",
                     f"output_dir={tmp_path / 'other'}", elsewhere[-1])  # fmt: skip
    assert other.returncode != 0 and "records a run with another config" in other.stderr


@pytest.mark.parametrize(
    "override, message",
    [
        ("train=[{task: copy, seq_len: 64}]", "train\\[0\\].task: expected one of"),
        ("train=[{task: mqar, seq_len: 64, size: 4}]", "train\\[0\\].size: expected \\[lo, hi\\]"),
        (
            "train=[{task: mqar, seq_len: 64, size: [2, 20]}]",
            "train\\[0\\]: 20 pairs need 80 tokens",
        ),
        (
            "evaluate=[{task: mqar, seq_len: 64, size: [4]}]",
            "evaluate\\[0\\].size: expected an integer >= 1",
        ),
        ("vocab_size=8192", "model: vocab_size 512 < the probes' vocab_size 8192"),
        ("lrs=[]", "lrs: expected a list of positive rates"),
        ("mixers=[gla, gla]", "mixers\\[1\\]: 'gla' is listed twice"),
        ("mixers=[{gla: 3}]", "mixers\\[0\\].gla: expected a mapping of model options"),
        ("mixers=[[gla]]", "mixers\\[0\\]: expected a mixer name or"),
        ("lrs=[1e-3,-1]", "lrs\\[1\\]: expected a finite number in \\(0, inf\\), got -1"),
    ],
)
def test_train_recall_rejects_bad_settings(tmp_path, override, message):
    out = tune_run(
        "train_recall", "recall_tiny", override, "model.vocab_size=512", "steps=1",
        f"output_dir={tmp_path}",
    )  # fmt: skip
    assert out.returncode != 0 and re.search(message, out.stderr), out.stderr[-2000:]


@pytest.mark.parametrize(
    "change, message",
    [({"batch_size": "abc"}, r"batch_size: expected an integer >= 1, got 'abc'"),
     ({"ssm_lr_cap": 0}, r"ssm_lr_cap: expected a finite number in \(0, inf\), got 0"),
     ({"warmup_steps": -1}, r"warmup_steps: expected an integer >= 0, got -1")],
)  # fmt: skip
def test_train_recall_range_checks_every_number(tmp_path, change, message):
    """In process (the recipe's function under @config.parse), before any training."""
    from omegaconf import OmegaConf

    main = load_recipe("train_recall").main

    cfg = OmegaConf.load(ROOT / "recipes" / "configs" / "recall_tiny.yaml")
    cfg = OmegaConf.merge(cfg, {"output_dir": str(tmp_path), **change})
    with pytest.raises(ValueError, match=message):
        main.__wrapped__(cfg)
    assert not any(tmp_path.iterdir())


BOOL = "expected true or false, got"
COMPONENT = r"_component_: expected a dotted name \(text\), got"


@pytest.mark.parametrize(
    "recipe, config, change, message",
    [("evaluate", "eval_tiny", {"overwrite": "false"}, f"overwrite: {BOOL} 'false'"),
     ("length_extrapolation", "length_extrapolation_tiny", {"overwrite": 0},
      f"overwrite: {BOOL} 0"),
     ("train_recall", "recall_tiny", {"overwrite": "no"}, f"overwrite: {BOOL} 'no'"),
     ("quantize_interdomain", "quantize_tiny", {"aoti": "false"}, f"aoti: {BOOL} 'false'"),
     ("compare_mixers", "compare_tiny", {"overwrite": "false"}, f"overwrite: {BOOL} 'false'"),
     ("compare_mixers", "compare_tiny", {"training": {"compile": "false"}},
      f"config: training.compile: {BOOL} 'false'"),
     ("generate", "generate_tiny", {"compile": "true"}, f"compile: {BOOL} 'true'"),
     ("evaluate", "eval_tiny", {"tokenizer": {"_component_": ["a.b"]}},
      rf"config: tokenizer.{COMPONENT} \['a.b'\]"),
     ("compare_mixers", "compare_tiny", {"mixers": {"s4d": {"model": {"_component_": 3}}}},
      f"config: mixers.s4d.model.{COMPONENT} 3")],
)  # fmt: skip
def test_booleans_and_components_are_checked_before_anything_runs(
    tmp_path, recipe, config, change, message
):
    """A boolean given as text or a number (a non-empty string would read as true) and a
    component that is not a dotted name are named, in process, before anything is written."""
    cfg = OmegaConf.load(ROOT / "recipes" / "configs" / f"{config}.yaml")
    if "output_dir" in cfg:
        cfg.output_dir = str(tmp_path / "out")
    with pytest.raises(ValueError, match=message):
        load_recipe(recipe).main.__wrapped__(OmegaConf.merge(cfg, change))
    assert not (tmp_path / "out").exists()


def test_quantize_recipe(tmp_path):
    path = tmp_path / "model_final.pt"
    save_tiny_export(path)
    out_dir = tmp_path / "quantized"
    stdout = ok(
        tune_run(
            "quantize_interdomain",
            "quantize_tiny",
            f"checkpoint={path}",
            "seq_len=64",
            "eval_tokens=256",
            "prompt_len=8",
            "new_tokens=8",
            "calibration_batches=1",
            "aoti=false",  # AOTInductor packages: tests/test_deploy.py, tests/test_pt2e.py
            f"output_dir={out_dir}",
        )
    )
    assert "int8_weight_only" in stdout and "int8_dynamic" in stdout
    report = json.loads((out_dir / "quantize_report.json").read_text())
    for mode in ("int8_weight_only", "int8_dynamic", "int8_dynamic_int4"):
        assert report[mode]["exported_matches_eager"] is True
        assert report[mode]["size_ratio"] > 1.2
        assert (out_dir / f"{mode}_decode.pt2").is_file()
        assert report[mode]["saved_pt_matches"] is True
    assert report["int8_dynamic_int4"]["linear_size_ratio"] > 3  # per row at the toy width
    assert report["int8_dynamic_int4"]["pte_size_ratio"] > 1  # packed int4 in the .pte
    for mode in ("fp32", "int8_dynamic_int4"):  # the decode step in ExecuTorch, after the prefill
        assert report[mode]["executorch_matches_eager"] is True, report[mode]
        assert (out_dir / f"{mode}_decode.pte").is_file()
    assert "executorch_tok_s" not in report["int8_dynamic"]
    for mode in ("x86_int8_dynamic", "x86_int8_static"):  # PT2E: agreement, not bit-equality
        assert report[mode]["exported_matches_eager"] is True, report[mode]
        assert report[mode]["size_ratio"] > 1.2
        assert abs(report[mode]["ppl_delta_pct"]) < 10
        assert (out_dir / f"{mode}_decode.pt2").is_file()
    bad = tune_run("quantize_interdomain", "quantize_tiny", f"checkpoint={path}", "modes=[int4]")
    assert bad.returncode != 0 and "modes: expected a list from" in bad.stderr
