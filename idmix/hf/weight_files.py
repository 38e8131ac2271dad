"""The weight files of a saved directory, resolved inside it, and what their headers hold.

A directory holds ``model.safetensors`` or ``model.safetensors.index.json`` and the shards it
names, never both and no other ``*.safetensors`` (transformers would load one of them, or all
of them, and a check of the other would be worthless). Every weight file is a regular file
directly inside the directory: an index entry is a plain file name (no ``..``, no separator, no
absolute path) and a symbolic link is refused, wherever it points. Pickled weights are refused
unread. Errors are ValueErrors naming the file and the entry, and quote nothing read from
outside the directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors import SafetensorError, safe_open

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
PREFIX = "model."


def _regular(file: Path) -> None:
    if file.is_symlink():
        raise ValueError(
            f"{file}: a symbolic link; weight files must be regular files inside the directory"
        )
    if not file.is_file():
        raise ValueError(f"{file}: missing (or not a regular file)")


def _shard_names(index: Path) -> dict[str, str]:
    """The index's weight_map (tensor key -> shard file name), each name checked to be a
    plain ``*.safetensors`` file name."""
    _regular(index)
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ValueError(f"{index}: expected JSON with a weight_map") from None
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index}: weight_map: expected an object of tensor name -> file name")
    for key, name in weight_map.items():
        plain = isinstance(name, str) and name == os.path.basename(name) and "\\" not in name
        if not (plain and name.endswith(".safetensors")):
            raise ValueError(
                f"{index}: weight_map[{key!r}] = {name!r}: expected the name of a "
                "*.safetensors shard inside the directory (no '..', path separator or "
                "absolute path)"
            )
    return weight_map


def weight_files(path: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files transformers loads from directory path (checked as the module
    docstring says), sorted, and the index's weight_map (None for a single file)."""
    names = sorted(os.listdir(path))
    if INDEX in names and SINGLE in names:
        raise ValueError(
            f"{path}: holds both {SINGLE} and {INDEX}; keep one (transformers would load "
            f"{SINGLE} whatever the index says)"
        )
    if INDEX in names:
        weight_map = _shard_names(path / INDEX)
        expected = sorted(set(weight_map.values()))
    elif SINGLE in names:
        weight_map, expected = None, [SINGLE]
    else:
        pickles = [n for n in names if n.endswith(PICKLES)]
        if pickles:
            raise ValueError(
                f"{path}: refusing {pickles}: idmix models load weights only from "
                f"{SINGLE} (a pickle can run code when it is loaded, so it is not read); "
                "convert a model_final.pt with `python -m idmix.hf.convert`"
            )
        raise ValueError(f"{path}: no {SINGLE} (nor {INDEX})")
    extra = sorted({n for n in names if n.endswith(".safetensors")} - set(expected))
    if extra:
        raise ValueError(
            f"{path}: unexpected weight files {extra[:3]}: the directory must hold {SINGLE} "
            f"alone, or {INDEX} and exactly the shards it names"
        )
    for name in expected:
        _regular(path / name)
    return [path / name for name in expected], weight_map


def _header(file: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """key -> (shape, safetensors dtype name such as "F32") from one file's header."""
    try:
        with safe_open(str(file), framework="pt") as f:
            return {
                key: (tuple(f.get_slice(key).get_shape()), f.get_slice(key).get_dtype())
                for key in f.keys()  # noqa: SIM118 (safe_open is not a mapping)
            }
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{file}: not a readable safetensors file ({type(e).__name__})") from None


def tensor_specs(path: Path) -> dict[str, tuple[tuple[int, ...], str, str]]:
    """state-dict key (without the ``model.`` prefix) -> (shape, dtype name, file name) of
    every tensor of directory path, read from the headers; with an index, each tensor must be
    in the shard the index names, once."""
    files, weight_map = weight_files(path)
    specs: dict[str, tuple[tuple[int, ...], str, str]] = {}
    for file in files:
        for key, (shape, dtype) in _header(file).items():
            if weight_map is not None and weight_map.get(key) != file.name:
                raise ValueError(
                    f"{file}: holds {key!r}, which {INDEX} puts in "
                    f"{weight_map.get(key, 'no shard')!r}"
                )
            specs[key.removeprefix(PREFIX)] = (shape, dtype, file.name)
    if weight_map is not None:
        absent = sorted(k for k in weight_map if k.removeprefix(PREFIX) not in specs)
        if absent:
            raise ValueError(
                f"{path / INDEX}: names {absent[:3]}, which no shard holds ({len(absent)} in all)"
            )
    return specs
