"""Checks on a saved directory before transformers loads it: its weight files resolved inside
it (``weight_files``), and every tensor the config builds present, of the right shape and
dtype, or an error naming the config field that does not fit."""

from __future__ import annotations

from pathlib import Path

import torch

from idmix.io.model_description import compare_shapes, meta_model

from .configuration import description
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
    specs = tensor_specs(path)
    found = {k: shape for k, (shape, _, _) in specs.items()}
    where = f"{path}/config.json (builder {config.builder!r}, overrides {config.overrides})"
    builder, kwargs = description(config.builder, config.overrides)
    model = meta_model(builder, kwargs, found, where)
    compare_shapes(model, found, where, fix="overrides.")
    _check_dtypes(specs, model, config, where)
