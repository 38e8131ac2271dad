"""The composition redesign changed structure, not numbers: every named tiny builder (and each
Table 4 cell at the tiny scale) builds the parameters and logits recorded before it
(tests/data/builder_fingerprints.json), and model_final.pt files written before it load and
give the same logits (tests/data/legacy_exports)."""

from __future__ import annotations

import json

import pytest
import torch

from idmix.io.checkpoint import load_exported_model
from idmix.modules import upgrade_state_dict
from tests import fingerprints as fp

RECORDED = json.loads(fp.FILE.read_text())


@pytest.mark.parametrize("name", fp.BUILDERS + fp.CELLS)
def test_same_seed_builds_the_same_parameters_and_logits(name):
    got, want = fp.fingerprint(fp.build(name)), RECORDED[name]
    # names as recorded, up to the documented renames (the S4D-only w moved into its readout)
    recorded = upgrade_state_dict(dict(want["params"]))
    assert sorted(got["params"]) == sorted(recorded), "parameter names changed"
    for param, (shape, total, abs_total, samples) in recorded.items():
        g_shape, g_total, g_abs, g_samples = got["params"][param]
        assert g_shape == shape, param
        assert g_samples == pytest.approx(samples, rel=1e-6, abs=1e-7), param
        assert (g_total, g_abs) == pytest.approx((total, abs_total), rel=1e-6, abs=1e-6), param
    total, abs_total, samples = want["logits"]
    assert got["logits"][2] == pytest.approx(samples, rel=1e-5, abs=1e-5)
    assert got["logits"][:2] == pytest.approx([total, abs_total], rel=1e-5, abs=1e-3)


@pytest.mark.parametrize("mixer", fp.LEGACY_MIXERS)
def test_exports_written_before_the_redesign_load_with_the_same_logits(mixer):
    model = load_exported_model(fp.LEGACY / f"{mixer}.pt")
    want = json.loads((fp.LEGACY / "logits.json").read_text())[mixer]
    with torch.no_grad():
        got = model(fp.legacy_tokens()).double().flatten()
    assert got.tolist() == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_training_checkpoints_written_before_the_redesign_resume_exactly():
    """A DCP checkpoint of an S4D-only model written by the pre-redesign code (its w was
    ``attn.mode_weights``; tests/data/legacy_checkpoint) resumes model and optimiser: the next
    step gives the logits the old code gave."""
    from pathlib import Path

    from idmix.io.checkpoint import latest_checkpoint, load_checkpoint
    from idmix.models import decoder
    from idmix.training.optim import param_groups

    run = Path(fp.__file__).parent / "data" / "legacy_checkpoint"
    expected = json.loads((run / "expected.json").read_text())
    model = decoder(**expected["config"])
    opt = torch.optim.AdamW(param_groups(model, 1e-2, 0.1, 1e-3))
    extra = load_checkpoint(latest_checkpoint(run), model, opt)
    assert extra["step"] == 2
    tokens = (torch.arange(26) * 7 % 64)[None]
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[0, 1:])
    loss.backward()
    opt.step()
    with torch.no_grad():
        got = model(tokens[:, :-1]).double().flatten()[:64]
    assert got.tolist() == pytest.approx(expected["logits_after_step_3"], rel=1e-5, abs=1e-6)
