"""Every mixer in examples/ (composed outside the library) builds, trains a step, decodes
token by token exactly like its forward pass, compiles whole, and trains through the
pretraining recipe with its config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from examples.relu_feature_map import relu_interdomain
from examples.selective_per_mode import selective_per_mode
from examples.silu_gated_mixer import silu_gated_interdomain
from tests.helpers import assert_rel

ROOT = Path(__file__).resolve().parent.parent
TUNE = str(Path(sys.executable).with_name("tune"))
D, H, M = 32, 4, 8
EXAMPLES = {
    "relu_feature_map": lambda: relu_interdomain(D, H, num_modes=M, chunk_size=8),
    "silu_gated_mixer": lambda: silu_gated_interdomain(D, H, num_modes=M),
    "selective_per_mode": lambda: selective_per_mode(D, H, num_modes=M, chunk_size=8),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_trains_decodes_like_forward_and_compiles(name):
    torch.manual_seed(0)
    mixer = EXAMPLES[name]()
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
def test_example_config_trains_with_the_pretraining_recipe(name, tmp_path):
    run = tmp_path / name
    cmd = [TUNE, "run", "recipes/pretrain_interdomain.py", "--config"]
    cmd += [f"examples/configs/{name}.yaml", f"output_dir={run}", "max_steps=3"]
    cmd += ["seq_len=64", "batch_size=2", "eval_every_n_steps=3", "eval_batches=1"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    history = json.loads((run / "history.json").read_text())
    assert len(history) == 3 and all(torch.isfinite(torch.tensor(h["loss"])) for h in history)
