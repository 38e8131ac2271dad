"""Checks on a saved directory before transformers loads it: its weight files resolved inside
it (``weight_files``), and every tensor the config builds present, of the right shape and
dtype, or an error naming the config field that does not fit."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from .weight_files import PREFIX, tensor_specs

# safetensors' names of the dtypes a state dict holds
DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
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


def float_dtype(config) -> torch.dtype:
    """The floating dtype config.json names (``dtype``; float32 when absent)."""
    dtype = getattr(config, "dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point and dtype in DTYPE_NAMES):
        raise ValueError(
            f"dtype: config.json says {config.dtype!r}; expected one of "
            "'float32', 'bfloat16', 'float16', 'float64'"
        )
    return dtype


def _check_dtypes(found: dict, model, config, where: str) -> None:
    """Each tensor in the dtype the model holds it in: config's floating dtype for floating
    tensors, the model's own for the others."""
    floating = float_dtype(config)
    for key, tensor in model.state_dict().items():
        want = floating if tensor.dtype.is_floating_point else tensor.dtype
        want = DTYPE_NAMES.get(want, str(want))
        _, got, file = found[key]
        if got != want:
            raise ValueError(
                f"dtype: {file} holds {PREFIX}{key} as {got}, but {where} builds it as {want} "
                "(config.json's dtype for floating tensors)"
            )


def check_weights(path: Path, config) -> None:
    """Every tensor the model config builds (on the meta device: shapes only) is in path's
    weight files with its shape and dtype, and nothing else is, or a ValueError naming the
    config field (or the file) behind the first difference."""
    if getattr(config, "transformers_weights", None) is not None:
        raise ValueError(
            "transformers_weights: config.json names a weight file; idmix directories load "
            "model.safetensors or the shards of model.safetensors.index.json only"
        )
    with torch.device("meta"):
        model = config.build()
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    specs = tensor_specs(path)
    found = {k: shape for k, (shape, _, _) in specs.items()}
    where = f"{path}/config.json (builder {config.builder!r}, overrides {config.overrides})"
    if expected == found:
        _check_dtypes(specs, model, config, where)
        return
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
    if missing and not unexpected and not wrong:
        raise ValueError(
            f"{path}: the weight files lack {missing[:3]} ({len(missing)} in all), which {where} "
            "builds; a missing weight is never left uninitialised"
        )
    raise ValueError(
        f"mixer: the weights do not fit the mixer {where} builds (its name or options): "
        f"missing {missing[:3]}, unexpected {unexpected[:3]}, other shapes "
        + ", ".join(f"{k}: weights {found[k]} vs model {expected[k]}" for k in wrong[:3])
    )
