"""Config checks shared by the recipes."""

from __future__ import annotations

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
