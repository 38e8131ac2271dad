"""Make ``tune run recipes/<name>.py`` run this project's recipes (docs/design.md §9).

torchtune's wheel installs a top-level package named ``recipes`` whose ``__init__`` raises, and
``tune run recipes/x.py`` imports the module ``recipes.x`` with the working directory appended
to ``sys.path`` *after* site-packages, so torchtune's package shadows ours. This module is
imported at interpreter start-up by ``idmix-recipes.pth`` (the standard ``.pth`` start-up hook)
and puts one finder first on ``sys.meta_path``. It answers only for the top-level name
``recipes``, and only when the working directory holds an idmix ``recipes/`` folder (marked by
``recipes/.idmix-recipes``); everything else, torchtune's own recipes included, imports as usual.
Only the standard library is imported here.

That import by ``tune run`` is the only one: the recipes import nothing from ``recipes`` (each
is a leaf over ``idmix``; ``python recipes/<name>.py --config …`` needs no hook).
``tests/test_recipe_leaves.py`` fails once torchtune stops shipping its ``recipes`` package:
then delete this module and its line in ``idmix-recipes.pth``.
"""

from __future__ import annotations

import importlib.util
import os
import sys

MARKER = ".idmix-recipes"


class ProjectRecipesFinder:
    """Resolves ``recipes`` to ./recipes when ./recipes/.idmix-recipes exists."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "recipes":
            return None
        folder = os.path.join(os.getcwd(), "recipes")
        if not os.path.isfile(os.path.join(folder, MARKER)):
            return None
        return importlib.util.spec_from_file_location(
            "recipes", os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
        )


def install() -> None:
    if not any(f is ProjectRecipesFinder for f in sys.meta_path):
        sys.meta_path.insert(0, ProjectRecipesFinder)


install()
