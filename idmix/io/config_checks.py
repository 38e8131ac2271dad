"""Config checks shared by every recipe: unknown keys, booleans, integers and numbers in range,
components named by text. Each error is a ValueError that names the key (``config: <where><key>:
expected …, got …``), raised before anything runs."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf


def fail(msg: str):
    """Raise the ValueError every config check raises: ``config: <msg>``."""
    raise ValueError(f"config: {msg}")


def resolved(section) -> dict:
    """A config section as plain data, interpolations (e.g. ${tokenizer.vocab_size}) resolved."""
    return OmegaConf.to_container(section, resolve=True)


def check_keys(section, known: Iterable[str], where: str = "config") -> None:
    """Raise on keys of a config section that the recipe does not know (typos fail loudly)."""
    unknown = sorted(set(section.keys()) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known keys: {sorted(known)}")


def boolean(section, key: str, where: str = "", default: bool | None = None) -> bool:
    """section[key] as a bool (absent: default, when one is given), else a ValueError naming
    the key: text such as "false" and numbers are refused, never read as true or false."""
    if default is not None and key not in section:
        return default
    value = section.get(key)
    if not isinstance(value, bool):
        fail(f"{where}{key}: expected true or false, got {value!r}")
    return value


def check_components(node, where: str = "") -> None:
    """Every ``_component_`` in a config, at any depth, is a dotted name (text), else a
    ValueError naming its key, before torchtune's instantiate sees it."""
    if isinstance(node, DictConfig):
        keys = [(k, f"{where}{k}") for k in node.keys()]
    elif isinstance(node, ListConfig):
        keys = [(i, f"{where.removesuffix('.')}[{i}]") for i in range(len(node))]
    else:
        return
    for key, name in keys:
        if OmegaConf.is_missing(node, key):
            continue
        value = node[key]
        if key == "_component_" and not (isinstance(value, str) and value):
            fail(f"{name}: expected a dotted name (text), got {value!r}")
        check_components(value, f"{name}.")


def integer(section, key: str, minimum: int, where: str = "", optional: bool = False):
    """section[key] as an int >= minimum (None allowed when optional), else a ValueError
    naming the key."""
    value = section.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        fail(f"{where}{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def number(
    section,
    key: str,
    low: float,
    high: float = math.inf,
    where: str = "",
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
):
    """section[key] as a finite float in [low, high] (open ends as asked, an infinite end is
    always open; None allowed when optional), else a ValueError naming the key."""  # fmt: skip
    value = section.get(key)
    if value is None and optional:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low)
    ok = ok and (value < high if high_open else value <= high)
    if not ok:
        lo = "(" if low_open or math.isinf(low) else "["
        hi = ")" if high_open or math.isinf(high) else "]"
        fail(f"{where}{key}: expected a finite number in {lo}{low:g}, {high:g}{hi}, got {value!r}")
    return float(value)


def numbers(
    section,
    key: str,
    low: float,
    high: float = math.inf,
    where: str = "",
    length: int | None = None,
    expected: str = "a non-empty list of numbers",
    **ends,
) -> list[float]:
    """section[key] as a non-empty list (of `length` items, when given) of numbers, each checked
    as :func:`number` (the error names ``key[i]``); `expected` says what the list should be."""
    values = section.get(key)
    if (
        not isinstance(values, ListConfig | list | tuple)
        or not values
        or (length is not None and len(values) != length)
    ):
        fail(f"{where}{key}: expected {expected}, got {values!r}")
    named = {f"{key}[{i}]": v for i, v in enumerate(values)}
    return [number(named, name, low, high, where=where, **ends) for name in named]


def one_of(section, key: str, choices: Sequence, where: str = "") -> object:
    """section[key], which must be one of choices."""
    value = section.get(key)
    if value not in choices:
        fail(f"{where}{key}: expected one of {sorted(choices)}, got {value!r}")
    return value
