"""Recipes are files, not a library: tests load one by its path (as ``tune run`` and
``python recipes/<name>.py`` run it), never as the package ``recipes``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def load_recipe(name: str):
    """The module of recipes/<name>.py, loaded from its file (its ``__main__`` block not run)."""
    spec = importlib.util.spec_from_file_location(f"idmix_recipe_{name}", RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
