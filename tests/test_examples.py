"""Every mixer in examples/ (one file each, no library edit) builds, trains a step, decodes
token by token exactly like its forward pass, compiles whole, and is selected in a config by
``model.mixer._component_=…`` alone (the recipe's config instantiated in process; one short
run of the recipe itself)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import assert_rel

ROOT = Path(__file__).resolve().parent.parent
TUNE = str(Path(sys.executable).with_name("tune"))
CONFIG = ROOT / "recipes" / "configs" / "tiny_interdomain.yaml"
D, H, M = 32, 4, 8
EXAMPLES = {  # name: the mixer builder a config names
    "relu_feature_map": "examples.relu_feature_map.relu_interdomain",
    "silu_gated_mixer": "examples.silu_gated_mixer.silu_gated_interdomain",
    "selective_per_mode": "examples.selective_per_mode.selective_per_mode",
}


def builder(name):
    module, _, attr = EXAMPLES[name].rpartition(".")
    return getattr(importlib.import_module(module), attr)


def tune_config(*overrides):
    """The config ``tune run … --config tiny_interdomain.yaml <overrides>`` gives the recipe."""
    from torchtune.config._parse import TuneRecipeArgumentParser
    from torchtune.config._utils import _merge_yaml_and_cli_args

    args = TuneRecipeArgumentParser().parse_known_args(["--config", str(CONFIG), *overrides])
    return _merge_yaml_and_cli_args(*args)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_trains_decodes_like_forward_and_compiles(name):
    torch.manual_seed(0)
    mixer = builder(name)(D, H, num_modes=M, chunk_size=8)
    x = torch.randn(2, 19, D)
    # one optimiser step moves every parameter
    before = {n: p.detach().clone() for n, p in mixer.named_parameters()}
    opt = torch.optim.AdamW(mixer.parameters(), lr=1e-2)
    mixer(x).square().mean().backward()
    opt.step()
    for n, p in mixer.named_parameters():
        assert not torch.equal(p, before[n]), f"{n} did not train"
    mixer.eval()
    with torch.no_grad():
        ref = mixer(x)
        mixer.setup_cache(2, torch.float32)
        steps = [  # the O(1) decode step, one position at a time
            mixer(x[:, t : t + 1], input_pos=torch.full((2, 1), t)) for t in range(x.shape[1])
        ]
    assert_rel(torch.cat(steps, 1), ref, 1e-5, f"{name}: decode vs forward")
    mixer.reset_cache()
    mixer.cache_enabled = False
    compiled = torch.compile(mixer, fullgraph=True)
    with torch.no_grad():
        assert_rel(compiled(x), ref, 1e-5, f"{name}: compiled vs eager")


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_config_override_alone_selects_the_example(name):
    """model.mixer._component_=<builder> on the tiny config: the builder's sizes and mixer
    options reach the example's mixer, and every other part is the library's (at one seed, the
    same parameters as interdomain_tiny's, but for what the new part changes)."""
    from torchtune import config

    from idmix.models import interdomain_tiny

    cfg = tune_config(f"model.mixer._component_={EXAMPLES[name]}")
    torch.manual_seed(0)
    model = config.instantiate(cfg.model)
    torch.manual_seed(0)
    reference = interdomain_tiny()
    attn, ref_attn = model.layers[0].attn, reference.layers[0].attn
    assert (attn.embed_dim, attn.num_modes, attn.core.dt_min) == (128, 16, 1e-2)
    assert attn.rope_last_base == ref_attn.rope_last_base == 10000.0  # CPU_SSM_DEFAULTS arrived
    want = reference.state_dict()
    got = model.state_dict()
    new = sorted(set(got) - set(want))
    assert (
        new
        == {
            "relu_feature_map": [],
            "silu_gated_mixer": [f"layers.{i}.attn.gate.proj.weight" for i in (0, 1)],
            "selective_per_mode": [f"layers.{i}.attn.readout.dt_weight" for i in (0, 1)],
        }[name]
    )
    if name != "silu_gated_mixer":  # (its gate draws from the RNG, so the later weights move)
        differ = {
            k.split(".attn.")[-1]
            for k in want
            if not torch.allclose(got[k], want[k], rtol=1e-5, atol=0)
        }
        # φ changes the outputs the init calibration of C measures; a zero dt_weight does not
        # (the per-token path's rounding moves C by < 1e-6 relative)
        assert differ == ({"core.C_re", "core.C_im"} if name == "relu_feature_map" else set())


def test_the_override_trains_with_the_recipe_and_its_export_loads(tmp_path, monkeypatch):
    from idmix.io.checkpoint import load_exported_model

    run = tmp_path / "relu"
    cmd = [TUNE, "run", "recipes/pretrain_interdomain.py", "--config", str(CONFIG)]
    cmd += [f"model.mixer._component_={EXAMPLES['relu_feature_map']}", f"output_dir={run}"]
    cmd += ["max_steps=3", "seq_len=64", "batch_size=2", "eval_every_n_steps=3", "eval_batches=1"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    history = json.loads((run / "history.json").read_text())
    assert len(history) == 3 and all(torch.isfinite(torch.tensor(h["loss"])) for h in history)
    with pytest.raises(ValueError, match="examples.relu_feature_map.relu_interdomain"):
        load_exported_model(run / "model_final.pt")  # a file may not choose code to run…
    monkeypatch.setenv("IDMIX_TRUSTED_BUILDERS", EXAMPLES["relu_feature_map"])
    model = load_exported_model(run / "model_final.pt")  # …unless you trust it
    assert model.layers[0].attn.key_branch.feature_map.__name__ == "relu_l2"
