"""Config checks shared by the recipes."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path


def check_keys(section, known: Iterable[str], where: str = "config") -> None:
    """Raise on keys of a config section that the recipe does not know (typos fail loudly)."""
    unknown = sorted(set(section.keys()) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known keys: {sorted(known)}")


def fresh_outputs(output_dir, names: Iterable[str], overwrite: bool) -> Path:
    """output_dir (created) after checking that none of its result files exist unless
    overwrite: a finished result is never replaced by accident."""
    out = Path(output_dir)
    existing = [n for n in names if (out / n).exists()]
    if existing and not overwrite:
        raise ValueError(
            f"config: output_dir {str(out)!r} already holds {existing}; pass overwrite=True to "
            "replace them or choose another output_dir"
        )
    out.mkdir(parents=True, exist_ok=True)
    return out


def integer(section, key: str, minimum: int, where: str = "", optional: bool = False):
    """section[key] as an int >= minimum (None allowed when optional), else a ValueError
    naming the key."""
    value = section.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"config: {where}{key}: expected an integer >= {minimum}, got {value!r}")
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
    """section[key] as a finite float in [low, high] (open ends as asked; None allowed when
    optional), else a ValueError naming the key."""  # fmt: skip
    value = section.get(key)
    if value is None and optional:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low)
    ok = ok and (value < high if high_open else value <= high)
    if not ok:
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        raise ValueError(
            f"config: {where}{key}: expected a finite number in {lo}{low:g}, {high:g}{hi}, "
            f"got {value!r}"
        )
    return float(value)
