"""A saved model description is plain data: no route that loads one (model_final.pt, a
quantised model, an HF config.json, a resumed config.yaml) resolves, interpolates or
instantiates it, imports a module it chooses, or allocates the sizes it claims before they are
checked against the weights. Each attack here ran code, read the environment or allocated on
the loaders before this rule."""

from __future__ import annotations

import time

import pytest
import torch

from idmix.io import checkpoint as ckpt
from idmix.io.model_description import (
    build_described,
    check_description,
    plain_description,
    saved_model_description,
)
from tests.helpers import tiny_model

PAYLOAD = "import pathlib; pathlib.Path('{marker}').write_text('ran')\ndef build(*a, **k): pass\n"


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A module `pwned` in the working directory (and on sys.path, as torchtune puts it) that
    writes a marker file when imported; returns the marker's path."""
    marker = tmp_path / "ran.txt"
    (tmp_path / "pwned.py").write_text(PAYLOAD.format(marker=marker))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return marker


def export(path, config, model=None):
    model = model or tiny_model("interdomain")[0]
    torch.save({"model": model.state_dict(), "model_config": config}, path)
    return path


@pytest.mark.parametrize(
    "crafted",
    [
        {"norm_eps": "${oc.env:IDMIX_TEST_SECRET}"},
        {"norm_eps": "x ${ oc.env : IDMIX_TEST_SECRET}"},
        {"x": "oc.env", "norm_eps": "${${x}:IDMIX_TEST_SECRET}"},  # a resolver name interpolated
        # two harmless-looking halves that torchtune's second resolve pass joined into a resolver
        {"a": "$", "mixer": "${a}{oc.create:{_component_: pwned.build}}"},
        {"mixer": {"_component_": "pwned.build"}},  # a nested component, untrusted
        {"mixer": "pwned.build"},  # a dotted mixer, untrusted
        {"norm_eps": {"_component_": "pwned.build"}},  # a component where data belongs
        {"_component_": "pwned.build"},
    ],
)
def test_a_crafted_export_runs_no_code_and_reads_no_environment(tmp_path, planted, monkeypatch,
                                                                crafted):  # fmt: skip
    monkeypatch.setenv("IDMIX_TEST_SECRET", "hunter2")
    config = {**tiny_model("interdomain")[1], **crafted}
    path = export(tmp_path / "m.pt", config)
    with pytest.raises(ValueError) as err:
        ckpt.load_exported_model(path)
    assert "hunter2" not in str(err.value) and not planted.exists()
    assert "model_config" in str(err.value)  # names the field


def test_the_same_attacks_reach_no_quantised_model(tmp_path, planted):
    from idmix.evaluation.deploy import load_quantized_model, quantize_linears, save_quantized_model

    model, config = tiny_model("interdomain")
    crafted = {**config, "a": "$", "mixer": "${a}{oc.create:{_component_: pwned.build}}"}
    path = save_quantized_model(tmp_path / "q.pt", quantize_linears(model, "int8_dynamic"),
                                crafted, "int8_dynamic")  # fmt: skip
    with pytest.raises(ValueError, match="model_config.mixer holds an interpolation"):
        load_quantized_model(path)
    assert not planted.exists()


def test_argument_types_follow_the_builders_signature(tmp_path):
    config = tiny_model("interdomain")[1]
    for key, value, expected in [
        ("num_heads", "2", "expected int"),
        ("num_layers", True, "expected int"),
        ("norm_eps", [1e-6], "expected float"),
    ]:
        with pytest.raises(ValueError, match=f"model_config.{key}: {expected}"):
            check_description(plain_description({**config, key: value}, "f"), "f")
    with pytest.raises(ValueError, match="model_config.bogus: .*no such argument"):
        check_description({"_component_": "idmix.models.swiglu_hidden_dim", "bogus": 1}, "f")


@pytest.mark.parametrize(
    "crafted, field",
    [
        ({"num_layers": 10**8}, "num_layers"),  # a Python module per layer, even on meta
        ({"embed_dim": 2**40, "num_heads": 2}, "embed_dim"),
        ({"vocab_size": 2**40}, "vocab_size"),
        ({"_component_": "idmix.models.interdomain_1_3b"}, "vocab_size"),  # 1.3B, tiny weights
    ],
)
def test_absurd_sizes_are_named_before_anything_is_allocated(tmp_path, crafted, field):
    model, config = tiny_model("interdomain")
    if crafted.get("_component_"):
        config = {}
    start = time.perf_counter()
    with pytest.raises(ValueError, match=f"^{field}: the weights have"):
        build_described({**config, **crafted}, model.state_dict(), "f")
    assert time.perf_counter() - start < 30  # built on meta, not allocated (or hung)


def test_older_files_still_load(tmp_path, monkeypatch):
    """A mixer node of older exports ({"_component_": builder, **options}) reads as the flat
    form; a trusted one loads and builds the same model."""
    from examples.relu_feature_map import relu_interdomain  # noqa: F401 (importable)

    name = "examples.relu_feature_map.relu_interdomain"
    desc = plain_description({"_component_": "idmix.models.decoder", "num_modes": 2,
                              "mixer": {"_component_": name, "num_modes": 4}}, "f")  # fmt: skip
    assert desc == {"_component_": "idmix.models.decoder", "mixer": name, "num_modes": 4}
    with pytest.raises(ValueError, match="IDMIX_TRUSTED_BUILDERS"):
        check_description(desc, "f")
    monkeypatch.setenv("IDMIX_TRUSTED_BUILDERS", name)
    assert check_description(desc, "f")[1]["mixer"] == name


def test_a_resumed_config_yaml_is_read_as_data(tmp_path, planted, monkeypatch):
    monkeypatch.setenv("IDMIX_TEST_SECRET", "hunter2")
    path = tmp_path / "config.yaml"
    path.write_text(
        "a: $\nmodel:\n  _component_: idmix.models.interdomain_tiny\n"
        '  norm_eps: "${a}{oc.create:{_component_: pwned.build}}"\n'
    )
    with pytest.raises(ValueError, match="model_config.norm_eps holds an interpolation") as err:
        saved_model_description(path)
    assert "hunter2" not in str(err.value) and not planted.exists()
    path.write_text("model: !!python/object/apply:os.getpid []\n")
    with pytest.raises(ValueError, match="not a readable YAML config"):
        saved_model_description(path)
