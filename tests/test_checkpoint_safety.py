"""Loading a model_final.pt never runs code from the file: tensors and plain data only
(weights_only=True), and the builder its config names must be one of idmix.models (or one the
user trusts through IDMIX_TRUSTED_BUILDERS)."""

from __future__ import annotations

import pytest
import torch

from idmix.io.checkpoint import load_exported_model, safe_load
from idmix.io.trust import TRUSTED_BUILDERS_ENV
from tests.helpers import save_tiny_export, tiny_model


class RunsCode:
    """A pickle payload that creates a file when unpickled."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_an_export_round_trips(tmp_path):
    model = save_tiny_export(tmp_path / "m.pt")
    loaded = load_exported_model(tmp_path / "m.pt")
    x = torch.randint(0, 64, (1, 8))
    assert torch.equal(model(x), loaded(x))


def test_pickled_objects_are_refused_without_running(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"model": {}, "model_config": RunsCode(marker)}, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match=r"holds Python objects beyond tensors and plain data"):
        load_exported_model(tmp_path / "evil.pt")
    assert not marker.exists()
    with pytest.raises(ValueError, match=r"evil.pt"):
        safe_load(tmp_path / "evil.pt")
    assert not marker.exists()


@pytest.mark.parametrize(
    "config",
    [
        {"_component_": "builtins.open", "file": "x", "mode": "w"},
        {
            "_component_": "idmix.models.decoder",
            "norm": {"_component_": "os.system", "command": "true"},
        },
    ],
)
def test_a_config_naming_other_code_is_refused(tmp_path, config):
    torch.save({"model": {}, "model_config": config}, tmp_path / "m.pt")
    with pytest.raises(
        ValueError,
        match=r"model_config\.(_component_ names 'builtins.open'|norm: "
        r"expected a number, string, boolean, None or a list of them, got dict)",
    ):
        load_exported_model(tmp_path / "m.pt")


def test_a_trusted_builder_of_ones_own_loads(tmp_path, monkeypatch):
    model, config = tiny_model("interdomain")
    config = {**config, "_component_": "tests.helpers.decoder_alias"}
    torch.save({"model": model.state_dict(), "model_config": config}, tmp_path / "m.pt")
    with pytest.raises(ValueError, match=TRUSTED_BUILDERS_ENV):
        load_exported_model(tmp_path / "m.pt")
    monkeypatch.setenv(TRUSTED_BUILDERS_ENV, "tests.helpers.decoder_alias")
    x = torch.randint(0, 64, (1, 8))
    assert torch.equal(load_exported_model(tmp_path / "m.pt")(x), model(x))
