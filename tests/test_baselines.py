"""The linear baselines and hybrids at the CPU sizes: matched state and parameters, the
hybrids' layer placement, and the study's configs and prose corpus."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from idmix import models
from idmix.io.corpus import python_docs
from idmix.models.baselines import HYBRID_EVERY
from idmix.models.state_size import recurrent_state_floats
from idmix.modules import SoftmaxAttention

BASELINES = ["gla", "mamba2", "gated_deltanet", "mamba3"]
SCALES = ["tiny", "small"]


def params(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def reference():
    return {s: getattr(models, f"interdomain_{s}")() for s in SCALES}


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("mixer", BASELINES)
def test_baselines_match_interdomain_in_state_and_parameters(reference, mixer, scale):
    model, ref = getattr(models, f"{mixer}_{scale}")(), reference[scale]
    states, ref_states = recurrent_state_floats(model), recurrent_state_floats(ref)
    assert len(states) == len(ref_states)
    for got, want in zip(states, ref_states, strict=True):
        assert abs(got / want - 1) <= 0.05, (got, want)
    assert abs(params(model) / params(ref) - 1) <= 0.01, (params(model), params(ref))


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("mixer", ["interdomain", "gla", "mamba2", "gated_deltanet"])
def test_hybrids_place_softmax_every_kth_layer_at_matched_parameters(reference, mixer, scale):
    model = getattr(models, f"hybrid_{mixer}_{scale}")()
    every = HYBRID_EVERY[scale]
    kinds = [isinstance(layer.attn, SoftmaxAttention) for layer in model.layers]
    assert kinds == [i % every == every - 1 for i in range(len(model.layers))]
    assert abs(params(model) / params(reference[scale]) - 1) <= 0.01
    logits = model(torch.randint(0, 4096, (1, 9)))
    assert logits.shape == (1, 9, 4096) and torch.isfinite(logits).all()


@pytest.mark.parametrize("every", [1, 3, True, "2"])
def test_softmax_every_out_of_range_is_refused_by_name(every):
    with pytest.raises(ValueError, match="softmax_every"):
        models.interdomain_tiny(softmax_every=every)


def test_the_study_config_names_a_builder_and_the_same_sweep_for_every_entry():
    """...and every entry, with its overrides, within ±1% of interdomain_tiny's parameters."""
    from torchtune import config

    from idmix.evaluation.compare import check_config

    cfg = OmegaConf.load("recipes/configs/compare_baselines_tiny.yaml")
    check_config(cfg)
    reference = sum(p.numel() for p in models.interdomain_tiny().parameters())
    for name, entry in cfg.mixers.items():
        assert list(entry.lrs) == list(cfg.sweep), name
        module, _, builder = entry.model._component_.rpartition(".")
        assert module == "idmix.models" and builder in models.MODEL_BUILDERS, name
        params = sum(p.numel() for p in config.instantiate(entry.model).parameters())
        assert abs(params / reference - 1) <= 0.01, (name, params)


def test_the_future_work_config_sweeps_the_new_entries_and_fixes_the_old_at_their_rates():
    """The new entries sweep compare_baselines_tiny.yaml's rates; interdomain and softmax run at
    the rates its sweep chose on every corpus (docs/baselines.md), so their rows join its
    table; every entry within ±1% of interdomain_tiny's parameters."""
    from torchtune import config

    from idmix.evaluation.compare import check_config

    cfg = OmegaConf.load("recipes/configs/compare_future_work_tiny.yaml")
    check_config(cfg)
    baselines = OmegaConf.load("recipes/configs/compare_baselines_tiny.yaml")
    assert list(cfg.sweep) == list(baselines.sweep) and cfg.training == baselines.training
    chosen = {"interdomain": [1.2e-2], "softmax": [1.0e-3]}
    reference = sum(p.numel() for p in models.interdomain_tiny().parameters())
    for name, entry in cfg.mixers.items():
        assert list(entry.lrs) == chosen.get(name, list(cfg.sweep)), name
        params = sum(p.numel() for p in config.instantiate(entry.model).parameters())
        assert abs(params / reference - 1) <= 0.01, (name, params)


def test_the_future_work_recall_config_matches_recall_baselines_and_interdomains_state():
    """Its probes, steps, rates and model are recall_baselines_tiny.yaml's; every mixer holds
    the interdomain model's recurrent state per layer (the Mamba-3 core plus its carried token)."""
    from idmix.evaluation.recall_study import check_config, mixer_entries
    from idmix.models.state_size import recurrent_state_floats

    cfg = OmegaConf.load("recipes/configs/recall_future_work_tiny.yaml")
    check_config(cfg)
    ref = OmegaConf.load("recipes/configs/recall_baselines_tiny.yaml")
    for key in ("model", "train", "evaluate", "steps", "lrs", "seed", "batch_size"):
        assert cfg[key] == ref[key], key
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("_component_")
    state = recurrent_state_floats(models.decoder(mixer="interdomain", **model))
    carried = 2 * model["num_heads"] * 2 * (model["embed_dim"] // model["num_heads"])
    for name, options in mixer_entries(cfg).items():
        got = recurrent_state_floats(models.decoder(mixer=name, **model, **options))
        extra = carried if name == "interdomain_mamba3" else 0
        assert got == [s + extra for s in state], name


def test_the_small_study_config_holds_every_entry_within_one_percent_of_interdomain_small():
    from torchtune import config

    from idmix.evaluation.compare import check_config

    cfg = OmegaConf.load("recipes/configs/compare_baselines_small.yaml")
    check_config(cfg)
    reference = sum(p.numel() for p in models.interdomain_small().parameters())
    for name, entry in cfg.mixers.items():
        params = sum(p.numel() for p in config.instantiate(entry.model).parameters())
        assert abs(params / reference - 1) <= 0.01, (name, params)


def test_the_prose_corpus_splits_by_name_and_holds_english_text():
    train, val = python_docs("train"), python_docs("validation")
    assert len(train) > 10 * len(val) > 0
    assert not set(train["source"]) & set(val["source"])
    assert python_docs("validation")["text"] == val["text"]  # fixed, not drawn
    text = " ".join(val["text"])
    assert text.count(" the ") > 500
    with pytest.raises(ValueError, match="split"):
        python_docs("test")


@pytest.mark.parametrize("mixer", BASELINES)
def test_an_exported_baseline_loads_back_equal(tmp_path, mixer):
    """model_final.pt of each baseline goes through the loader (and its old-name upgrades)."""
    from idmix.io.checkpoint import export_model, load_exported_model

    model = getattr(models, f"{mixer}_tiny")()
    path = tmp_path / "model_final.pt"
    export_model(path, model, {"_component_": f"idmix.models.{mixer}_tiny"})
    loaded = load_exported_model(path)
    tokens = torch.randint(0, 4096, (1, 12))
    torch.testing.assert_close(loaded(tokens), model.eval()(tokens))
