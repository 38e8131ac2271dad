"""Files written before the parts redesign renamed the mixer's attributes (tests/fixtures/
pre_rename, by d250f07's code: ``branch_a``, ``norm_a``, ``ssm``, ``c_out``, ``out_norm``) load
into today's models, by load_state_dict and by the DCP resume, and give the same outputs: to
fp32 rounding (the fixtures' own machine gave them bit for bit; another CPU's float reduction
order moves logits of |x| ≤ 0.6 by ≤ 5.1e-7, measured on an AMX host; a misplaced tensor moves
them by ~0.1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from examples.relu_feature_map import relu_interdomain
from examples.selective_per_mode import selective_per_mode
from examples.silu_gated_mixer import silu_gated_interdomain
from idmix.models import decoder
from idmix.modules import upgrade_state_dict

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


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_old_state_dicts_load_with_the_same_logits(name):
    old = torch.load(OLD / f"{name}.pt", weights_only=True)
    assert any(r in k for k in old["state_dict"] for r in RENAMED)  # the fixture has old names
    model = decoder(**TOY, **BUILDS[name]).eval()
    model.load_state_dict(dict(old["state_dict"]))  # strict: every key found, none left over
    with torch.no_grad():
        torch.testing.assert_close(model(old["tokens"]), old["logits"], rtol=0, atol=LOGITS_ATOL)
    # the same through upgrade_state_dict (what load_exported_model does before its checks)
    upgraded = upgrade_state_dict(dict(old["state_dict"]))
    assert sorted(upgraded) == sorted(model.state_dict())


def test_old_training_checkpoint_resumes_model_and_optimizer_exactly():
    """The DCP checkpoint (model + AdamW state under the old names) resumes: the next step gives
    the logits the old code gave."""
    from idmix.io.checkpoint import latest_checkpoint, load_checkpoint
    from idmix.training.optim import param_groups

    run = OLD / "dcp_run"
    expected = json.loads((run / "expected.json").read_text())
    model = decoder(**expected["config"])
    opt = torch.optim.AdamW(param_groups(model, 1e-2, 0.1, 1e-3))
    assert load_checkpoint(latest_checkpoint(run), model, opt)["step"] == 2
    seq = (torch.arange(14) * 7 % 32)[None]
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(seq[:, :-1]).flatten(0, 1), seq[0, 1:])
    loss.backward()
    opt.step()
    with torch.no_grad():
        got = model(seq[:, :-1]).double().flatten()[:64]
    assert got.tolist() == pytest.approx(expected["logits_after_step_3"], rel=1e-6, abs=1e-7)
