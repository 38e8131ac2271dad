"""`tune run recipes/generate.py`: streams from a single-file checkpoint; bad input is named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from idmix.models import interdomain_tiny

ROOT = Path(__file__).resolve().parent.parent
TUNE = str(Path(sys.executable).with_name("tune"))


def run(*overrides):
    cmd = [TUNE, "run", "recipes/generate.py", "--config", "recipes/configs/generate_tiny.yaml"]
    return subprocess.run([*cmd, *overrides], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_generate_streams_from_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "model_final.pt"
    config = {"_component_": "idmix.models.interdomain_tiny"}
    torch.save({"model": interdomain_tiny().state_dict(), "model_config": config}, path)
    out = run(f"checkpoint={path}", "max_new_tokens=12", "temperature=0")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ROMEO.\n")
    assert "12 tokens" in out.stdout and "tokens/s" in out.stdout and "peak RSS" in out.stdout


def test_generate_names_a_missing_or_mismatched_checkpoint(tmp_path):
    out = run(f"checkpoint={tmp_path / 'nope.pt'}")
    assert out.returncode != 0 and "checkpoint: no such file" in out.stderr
    path = tmp_path / "bad.pt"
    sd = interdomain_tiny().state_dict()
    sd.pop("output.weight")
    torch.save(
        {"model": sd, "model_config": {"_component_": "idmix.models.interdomain_tiny"}}, path
    )
    out = run(f"checkpoint={path}")
    assert out.returncode != 0 and "the weights lack ['output.weight']" in out.stderr


def test_generate_names_an_empty_prompt_and_a_tokenizer_the_model_does_not_fit(tmp_path):
    """In process (the recipe's function under @config.parse): the checks before decoding."""
    import pytest
    from omegaconf import OmegaConf

    from tests.recipe_files import load_recipe

    main = load_recipe("generate").main

    cfg = OmegaConf.load(ROOT / "recipes" / "configs" / "generate_tiny.yaml")
    with pytest.raises(ValueError, match=r"prompt: expected non-empty text, got ''"):
        main.__wrapped__(OmegaConf.merge(cfg, {"prompt": ""}))
    path = tmp_path / "small_vocab.pt"
    config = {"_component_": "idmix.models.interdomain_tiny", "vocab_size": 256}
    torch.save({"model": interdomain_tiny(vocab_size=256).state_dict(), "model_config": config},
               path)  # fmt: skip
    with pytest.raises(ValueError, match=r"tokenizer: its vocab_size 4096 exceeds the model's 256"):
        main.__wrapped__(OmegaConf.merge(cfg, {"checkpoint": str(path)}))
