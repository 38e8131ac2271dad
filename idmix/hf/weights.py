"""Checks on a saved directory before transformers loads it: safetensors only (pickled weight
files are refused unread), and weight shapes that fit the config, or an error naming the
config field that does not."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

PICKLES = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")
PREFIX = "model."
# (state-dict key, dimension, the decoder argument that sets it)
FIELDS = (
    ("tok_embeddings.weight", 0, "vocab_size"),
    ("tok_embeddings.weight", 1, "embed_dim"),
    ("layers.0.mlp.w1.weight", 0, "intermediate_dim"),
    ("layers.0.attn.key_norm.bias", 1, "num_heads"),  # d_h = embed_dim / num_heads
    ("layers.0.attn.core.log_A_real", 0, "num_state_groups"),
    ("layers.0.attn.core.log_A_real", 1, "num_modes"),
)
_LAYER = re.compile(r"^layers\.(\d+)\.")


def safetensors_files(path: Path) -> list[Path]:
    """The weight files of a directory (one file, or the shards of its index); refuses a
    directory whose only weights are pickles."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / s for s in shards]
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    pickles = sorted(p.name for pattern in PICKLES for p in path.glob(pattern))
    if pickles:
        raise ValueError(
            f"{path}: refusing {pickles}: idmix models load weights only from "
            "model.safetensors (a pickle can run code when it is loaded, so it is not read); "
            "convert a model_final.pt with `python -m idmix.hf.convert`"
        )
    raise ValueError(f"{path}: no model.safetensors (nor model.safetensors.index.json)")


def file_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """state-dict key (without the ``model.`` prefix) -> shape, read from the headers."""
    shapes = {}
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                shapes[key.removeprefix(PREFIX)] = tuple(f.get_slice(key).get_shape())
    return shapes


def check_weights(path: Path, config) -> None:
    """The weights in path fit the model config builds (built on the meta device: shapes
    only), or a ValueError naming the config field behind the first difference."""
    with torch.device("meta"):
        model = config.build()
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = file_shapes(path)
    if expected == found:
        return
    where = f"{path}/config.json (builder {config.builder!r}, overrides {config.overrides})"
    for key, dim, field in FIELDS:
        if key in expected and key in found and expected[key][dim] != found[key][dim]:
            got, want = found[key][dim], expected[key][dim]
            if field == "num_heads":  # the file holds d_h; say it as a head count
                d = expected["tok_embeddings.weight"][1]
                got, want = d // got, d // want
            raise ValueError(
                f"{field}: the weights have {field} = {got} ({key} {found[key]}), but {where} "
                f"builds {want}; set overrides.{field} = {got}"
            )
    layers = [{int(m[1]) for k in d if (m := _LAYER.match(k))} for d in (found, expected)]
    if len(layers[0]) != len(layers[1]):
        raise ValueError(
            f"num_layers: the weights have {len(layers[0])} layers, but {where} builds "
            f"{len(layers[1])}; set overrides.num_layers = {len(layers[0])}"
        )
    missing, unexpected = sorted(expected.keys() - found), sorted(found.keys() - expected)
    wrong = sorted(k for k in expected.keys() & found.keys() if expected[k] != found[k])
    raise ValueError(
        f"mixer: the weights do not fit the mixer {where} builds (its name or options): "
        f"missing {missing[:3]}, unexpected {unexpected[:3]}, other shapes "
        + ", ".join(f"{k}: weights {found[k]} vs model {expected[k]}" for k in wrong[:3])
    )
