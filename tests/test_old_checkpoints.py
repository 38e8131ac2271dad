"""Files written before the SSM mixer's parameters were renamed convert once with
``python -m idmix.io.upgrade OLD NEW`` and then load into today's models with the same outputs;
unconverted, every loader refuses them naming that command.

The files: tests/fixtures/pre_rename (by d250f07's code, before the parts redesign: ``branch_a``,
``norm_a``, ``ssm``, ``c_out``, ``out_norm``; state dicts and a DCP run), tests/data/
legacy_exports and tests/data/legacy_checkpoint (before the composition redesign: the S4D-only
``attn.mode_weights``). Logits agree to fp32 rounding (the fixtures' own machine gave them bit
for bit; another CPU's float reduction order moves logits of |x| ≤ 0.6 by ≤ 5.1e-7, measured on
an AMX host; a misplaced tensor moves them by ~0.1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from examples.relu_feature_map import relu_interdomain
from examples.selective_per_mode import selective_per_mode
from examples.silu_gated_mixer import silu_gated_interdomain
from idmix.hf.convert import convert as hf_convert
from idmix.io.checkpoint import latest_checkpoint, load_checkpoint, load_exported_model
from idmix.io.upgrade import COMMAND, current_names, upgrade
from idmix.models import decoder
from idmix.training.optim import param_groups
from tests import fingerprints as fp

OLD = Path(__file__).parent / "fixtures" / "pre_rename"
TOY = dict(
    vocab_size=32, num_layers=1, num_heads=2, embed_dim=8, max_seq_len=32, intermediate_dim=8
)
SSM = dict(num_modes=4, chunk_size=8)
BUILDS = {  # as make_fixtures.py built them
    "interdomain": dict(mixer="interdomain", gate=True, output_norm=True, value_conv=True, **SSM),
    "s4d": dict(mixer="s4d", **SSM),
    "selective_interdomain": dict(mixer="selective_interdomain", **SSM),
    "dual_kv_linear": dict(mixer="dual_kv_linear", **SSM),
    "single_input_query": dict(mixer="single_input_query", **SSM),
    "grouped": dict(mixer="interdomain", num_state_groups=1, **SSM),
    "relu_feature_map": dict(mixer=lambda i: relu_interdomain(8, 2, **SSM)),
    # it had the CPU builders' RoPE position and Δ range written in; now they are options
    "silu_gated_mixer": dict(
        mixer=lambda i: silu_gated_interdomain(8, 2, num_modes=4, rope_position="last")
    ),
    "selective_per_mode": dict(mixer=lambda i: selective_per_mode(8, 2, **SSM)),
}
LOGITS_ATOL = 2e-6
RENAMED = ("branch_a", "branch_b", "norm_a", "norm_b", ".ssm.", "c_out", "out_norm")


def _resumed_logits(run: Path, config: dict, tokens: torch.Tensor) -> list[float]:
    """Resume run's latest checkpoint (model + AdamW), take one step on tokens, and return the
    first 64 logits after it."""
    model = decoder(**config)
    opt = torch.optim.AdamW(param_groups(model, 1e-2, 0.1, 1e-3))
    assert load_checkpoint(latest_checkpoint(run), model, opt)["step"] == 2
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[0, 1:])
    loss.backward()
    opt.step()
    with torch.no_grad():
        return model(tokens[:, :-1]).double().flatten()[:64].tolist()


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_old_state_dicts_convert_and_load_with_the_same_logits(name, tmp_path):
    old = torch.load(OLD / f"{name}.pt", weights_only=True)
    assert any(r in k for k in old["state_dict"] for r in RENAMED)  # the fixture has old names
    model = decoder(**TOY, **BUILDS[name]).eval()
    with pytest.raises(RuntimeError, match="Missing key"):  # unconverted: torch's strict load
        model.load_state_dict(dict(old["state_dict"]))
    assert upgrade(OLD / f"{name}.pt", tmp_path / "new.pt") > 0
    new = torch.load(tmp_path / "new.pt", weights_only=True)
    model.load_state_dict(new["state_dict"])  # strict: every key found, none left over
    with torch.no_grad():
        torch.testing.assert_close(model(new["tokens"]), old["logits"], rtol=0, atol=LOGITS_ATOL)
    torch.testing.assert_close(new["tokens"], old["tokens"], rtol=0, atol=0)


@pytest.mark.parametrize("mixer", fp.LEGACY_MIXERS)
def test_old_exports_convert_and_load_with_the_same_logits(mixer, tmp_path):
    old = fp.LEGACY / f"{mixer}.pt"
    if mixer != "softmax":  # it has no SSM parameters: nothing to convert, and it loads as is
        with pytest.raises(ValueError, match="idmix.io.upgrade OLD NEW"):
            load_exported_model(old)
        with pytest.raises(ValueError, match="idmix.io.upgrade OLD NEW"):
            hf_convert(old, tmp_path / "hf")
        assert not (tmp_path / "hf").exists()
    upgrade(old, tmp_path / "model_final.pt")
    model = load_exported_model(tmp_path / "model_final.pt")
    want = json.loads((fp.LEGACY / "logits.json").read_text())[mixer]
    with torch.no_grad():
        got = model(fp.legacy_tokens()).double().flatten()
    assert got.tolist() == pytest.approx(want, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize(
    "run, tokens, rel, abs_",
    [  # the S4D-only model of the composition redesign; the interdomain toy of the parts one
        (Path(fp.__file__).parent / "data" / "legacy_checkpoint", 26, 1e-5, 1e-6),
        (OLD / "dcp_run", 14, 1e-6, 1e-7),
    ],
    ids=["mode_weights", "parts"],
)
def test_old_training_runs_convert_and_resume_exactly(run, tokens, rel, abs_, tmp_path):
    """A run directory (DCP checkpoint of model + AdamW state under the old names) converts with
    the command as a user types it; the converted run resumes, and the next step gives the logits
    the old code gave. The unconverted one is refused by name."""
    expected = json.loads((run / "expected.json").read_text())
    config, vocab = expected["config"], expected["config"]["vocab_size"]
    with pytest.raises(ValueError, match="idmix.io.upgrade OLD NEW"):
        _resumed_logits(run, config, torch.zeros(1, 3, dtype=torch.long))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    new = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "idmix.io.upgrade", str(run), str(new)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "parameter names moved" in done.stdout and not done.stderr, done.stderr
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # OLD only read
    assert (new / "expected.json").read_bytes() == before[run / "expected.json"]
    seq = (torch.arange(tokens) * 7 % vocab)[None]
    assert _resumed_logits(new, config, seq) == pytest.approx(
        expected["logits_after_step_3"], rel=rel, abs=abs_
    )


def test_the_command_never_replaces_and_leaves_nothing_half_written(tmp_path):
    taken = tmp_path / "taken.pt"
    taken.write_bytes(b"mine")
    with pytest.raises(ValueError, match="NEW: .* exists"):
        upgrade(OLD / "s4d.pt", taken)
    assert taken.read_bytes() == b"mine"
    with pytest.raises(ValueError, match="OLD: no such file"):
        upgrade(tmp_path / "absent.pt", tmp_path / "new.pt")
    broken = tmp_path / "broken"
    (broken / "checkpoints").mkdir(parents=True)
    (broken / "notes.txt").write_text("kept")
    (broken / "checkpoints" / "x.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="x.pt"):
        upgrade(broken, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "taken.pt"]
    (broken / "checkpoints" / "x.pt").unlink()
    os.mkfifo(broken / "pipe")  # copying it would block on a reader
    with pytest.raises(ValueError, match="pipe.*not a regular file"):
        upgrade(broken, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "taken.pt"]
    done = subprocess.run(
        [sys.executable, "-m", "idmix.io.upgrade", str(OLD / "s4d.pt"), str(taken)],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "exists" in done.stderr and COMMAND not in done.stdout


def test_only_an_old_ssm_mixer_s_names_move():
    """An old mixer is told by what only it had (an ``ssm`` core, a ``branch_a``, its own
    ``mode_weights``); a module that uses an old name as its own keeps it, a current file moves
    nothing, and a file with both names is refused."""
    own = {"layers.0.attn.out_norm.weight", "layers.0.attn.proj.weight"}
    assert current_names(own) == {}
    old = {"layers.0.attn.out_norm.weight", "layers.0.attn.ssm.log_dt"}
    assert current_names(old) == {
        "layers.0.attn.out_norm.weight": "layers.0.attn.output_norm.weight",
        "layers.0.attn.ssm.log_dt": "layers.0.attn.core.log_dt",
    }
    assert current_names({"layers.1.attn.mode_weights"}) == {
        "layers.1.attn.mode_weights": "layers.1.attn.readout.mode_weights"
    }
    current = decoder(**TOY, **BUILDS["interdomain"]).state_dict()
    assert current_names(current) == {}
    with pytest.raises(ValueError, match="both old and current names"):
        current_names({"a.ssm.log_dt", "a.core.log_dt"})
