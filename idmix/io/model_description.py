"""A saved model's description as plain data, and the model built from it with no code chosen by
the file.

A description is ``{"_component_": builder, **keyword values}``: the dotted name of a trusted
builder (``trust.py``) and its arguments, each a number, string, boolean, None or a list of
them. A custom mixer is the dotted name of its (trusted) builder in ``mixer``. Nothing is
interpolated, resolved or instantiated: the builder is looked up by name and called once the
description, its argument types and (when weights are given) the sizes they imply have been
checked, first on the meta device, so a crafted file can neither run code nor allocate.
"""

from __future__ import annotations

import importlib
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import nn

from .trust import TRUSTED_BUILDERS_ENV, trusted_builders

PLAIN = (bool, int, float, str, type(None))
_LAYER = re.compile(r"^layers\.(\d+)\.")
# (state-dict key, dimension, the decoder argument that sets it): named in size errors
FIELDS = (
    ("tok_embeddings.weight", 0, "vocab_size"),
    ("tok_embeddings.weight", 1, "embed_dim"),
    ("layers.0.mlp.w1.weight", 0, "intermediate_dim"),
    ("layers.0.attn.key_norm.bias", 1, "num_heads"),  # d_h = embed_dim / num_heads
    ("layers.0.attn.core.log_A_real", 0, "num_state_groups"),
    ("layers.0.attn.core.log_A_real", 1, "num_modes"),
)


def _plain_value(value, where: str, source: str):
    """value if it is plain data (lists of it included), else a ValueError naming where."""
    if isinstance(value, list | tuple):
        return [_plain_value(v, f"{where}[{i}]", source) for i, v in enumerate(value)]
    if not isinstance(value, PLAIN):
        raise ValueError(
            f"{source}: {where}: expected a number, string, boolean, None or a list of them, got "
            f"{type(value).__name__}"
        )
    if isinstance(value, str) and "${" in value:
        raise ValueError(
            f"{source}: {where} holds an interpolation ('${{'); a saved model description is "
            "plain data and is never resolved (the value is not shown)"
        )
    return value


def plain_description(config, source: str) -> dict:
    """The description a (resolved) model config or a file holds, as plain data: a dict with
    a string ``_component_`` and plain keyword values. A ``mixer`` node of older files
    (``{"_component_": "pkg.builder", **options}``) becomes ``mixer="pkg.builder"`` with its
    options beside it (what the decoder does with it). Anything else is a ValueError naming
    the key."""
    if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
        raise ValueError(f"{source}: model_config: expected a dict of builder arguments")
    desc = dict(config)
    builder = desc.get("_component_")
    if not isinstance(builder, str) or not builder:
        raise ValueError(
            f"{source}: model_config._component_: expected the dotted name of a builder, got "
            f"{type(builder).__name__}"
        )
    mixer = desc.get("mixer")
    if isinstance(mixer, Mapping):
        options = dict(mixer)
        desc["mixer"] = options.pop("_component_", None)
        if not isinstance(desc["mixer"], str):
            raise ValueError(f"{source}: model_config.mixer._component_: expected a dotted name")
        desc.update(options)  # the node's options win, as in decoder's mixer_factory
    return {k: _plain_value(v, f"model_config.{k}", source) for k, v in desc.items()}


def _trusted(name: str, where: str, source: str, trusted: set[str]) -> None:
    if name not in trusted:
        raise ValueError(
            f"{source}: {where} names {name!r}, which is not one of idmix.models; if it is your "
            f"own builder, add it to ${TRUSTED_BUILDERS_ENV}"
        )


def _lookup(name: str, where: str, source: str) -> Callable:
    module, _, attr = name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{source}: {where}: cannot import {name!r} ({e})") from None
    if not callable(found):
        raise ValueError(f"{source}: {where}: {name!r} is not a builder")
    return found


def _fits(value, hint) -> bool:
    """Whether plain value fits a type hint (hints beyond plain types accept nothing)."""
    origin = typing.get_origin(hint)
    if hint is typing.Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin in (list, tuple) or hint in (list, tuple):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return isinstance(value, list) and all(
            len(args) == 0 or any(_fits(v, a) for a in args) for v in value
        )
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (bool, str, type(None)):
        return isinstance(value, hint)
    return False


def _hint_name(hint) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _signature_hints(builder: Callable) -> tuple[dict, bool]:
    """({argument: type hint} of builder, and of ``decoder`` when builder forwards **kwargs to
    it (idmix's named builders), whether unknown names pass on (to a mixer))."""
    from ..models import decoder

    hints, open_ended = {}, False
    for fn in (builder, decoder):
        params = inspect.signature(fn).parameters.values()
        found = typing.get_type_hints(fn)
        hints.update({p.name: found.get(p.name, typing.Any) for p in params
                      if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)})  # fmt: skip
        open_ended = any(p.kind is p.VAR_KEYWORD for p in params)
        if not (open_ended and fn.__module__.startswith("idmix.models")):
            break
    return hints, open_ended


def check_description(desc: dict, source: str) -> tuple[Callable, dict]:
    """(builder, keyword arguments) of a :func:`plain_description`, its builder (and a dotted
    ``mixer``) trusted and each argument of the builder's signature of its annotated type."""
    trusted = trusted_builders()
    kwargs = dict(desc)
    name = kwargs.pop("_component_")
    _trusted(name, "model_config._component_", source, trusted)
    builder = _lookup(name, "model_config._component_", source)
    mixer = kwargs.get("mixer")
    if isinstance(mixer, str) and "." in mixer:
        _trusted(mixer, "model_config.mixer", source, trusted)
    elif isinstance(mixer, str):
        from ..modules import resolve_mixer

        try:
            resolve_mixer(mixer, {})
        except ValueError as e:
            raise ValueError(f"{source}: model_config.{e}") from None
    hints, open_ended = _signature_hints(builder)
    for key, value in kwargs.items():
        if key not in hints:
            if not open_ended:
                raise ValueError(f"{source}: model_config.{key}: {name} has no such argument")
            continue
        if key == "mixer" and isinstance(value, str):
            continue  # a registered name or a trusted dotted builder (the decoder resolves it)
        if not _fits(value, hints[key]):
            raise ValueError(
                f"{source}: model_config.{key}: expected {_hint_name(hints[key])}, got {value!r}"
            )
    return builder, kwargs


def _layer_count(shapes: Mapping) -> int:
    return len({int(m[1]) for k in shapes if (m := _LAYER.match(k))})


def check_given_sizes(kwargs: dict, shapes: Mapping, where: str) -> None:
    """The sizes a description gives (the layer count, ``FIELDS``) equal the weights' ``shapes``
    ({key: shape}): checked before anything is built (a meta build of 10^8 layers hangs)."""
    given = {"num_layers": _layer_count(shapes)}
    given.update({field: shapes[key][dim] for key, dim, field in FIELDS
                  if field != "num_heads" and key in shapes})  # fmt: skip
    for field, found in given.items():
        if isinstance(kwargs.get(field), int) and kwargs[field] != found:
            raise ValueError(
                f"{field}: the weights have {field} = {found}, but {where} says {kwargs[field]}"
            )


def meta_model(builder: Callable, kwargs: dict, shapes: Mapping, where: str) -> nn.Module:
    """builder(**kwargs) on the meta device (nothing allocated), after
    :func:`check_given_sizes`."""
    check_given_sizes(kwargs, shapes, where)
    try:
        with torch.device("meta"):
            return builder(**kwargs)
    except RuntimeError as e:  # e.g. a size past what a tensor can describe
        raise ValueError(f"{where}: model_config does not build ({e})") from None


def compare_shapes(model: nn.Module, shapes: Mapping, where: str, fix: str = "") -> None:
    """model's tensors are exactly those ``shapes`` ({key: shape}) describes, or a ValueError
    naming the builder argument behind the first difference (and, with fix, e.g.
    ``"overrides."``, what to set: ``; set overrides.<field> = <value>``)."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {k: tuple(s) for k, s in shapes.items()}
    if expected == found:
        return
    for key, dim, field in FIELDS:
        if key in expected and key in found and expected[key][dim] != found[key][dim]:
            got, want = found[key][dim], expected[key][dim]
            if field == "num_heads":  # the file holds d_h; say it as a head count
                d = expected["tok_embeddings.weight"][1]
                got, want = d // got, d // want
            raise ValueError(
                f"{field}: the weights have {field} = {got} ({key} {found[key]}), but {where} "
                f"builds {want}" + (f"; set {fix}{field} = {got}" if fix else "")
            )
    layers = _layer_count(found)
    if _layer_count(expected) != layers:
        raise ValueError(
            f"num_layers: the weights have {layers} layers, but {where} builds "
            f"{_layer_count(expected)}" + (f"; set {fix}num_layers = {layers}" if fix else "")
        )
    missing, unexpected = sorted(expected.keys() - found), sorted(found.keys() - expected)
    wrong = sorted(k for k in expected.keys() & found.keys() if expected[k] != found[k])
    if missing and not unexpected and not wrong:
        raise ValueError(
            f"the weights lack {missing[:3]} ({len(missing)} in all), which {where} builds; a "
            "missing weight is never left uninitialised"
        )
    raise ValueError(
        f"mixer: the weights do not fit the mixer {where} builds (its name or options): "
        f"missing {missing[:3]}, unexpected {unexpected[:3]}, other shapes "
        + ", ".join(f"{k}: weights {found[k]} vs model {expected[k]}" for k in wrong[:3])
    )


def build_described(config, state_dict: dict, source: str) -> nn.Module:
    """The model a saved description builds, for state_dict: the description checked, the
    parameter names against the old layout, then its sizes against state_dict's shapes on the
    meta device, then built (weights not loaded here)."""
    from .upgrade import refuse_old_layout

    builder, kwargs = check_description(plain_description(config, source), source)
    refuse_old_layout(state_dict, source)
    shapes = {k: v.shape for k, v in state_dict.items()}
    meta = meta_model(builder, kwargs, shapes, source)
    compare_shapes(meta, shapes, source)
    return builder(**kwargs)


def read_yaml_data(path) -> dict:
    """A YAML file as plain data (safe_load: no tags; ``${…}`` stays text, never resolved)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(
            f"{str(path)!r}: not a readable YAML config ({type(e).__name__})"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r}: not a YAML mapping")
    return data


def saved_model_description(path) -> dict:
    """The plain description in the ``model`` section of a run's ``config.yaml``."""
    data = read_yaml_data(path)
    if "model" not in data:
        raise ValueError(f"{str(path)!r}: no model section")
    return plain_description(data["model"], str(path))
