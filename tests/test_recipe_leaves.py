"""Recipes are thin leaves: each imports idmix and its dependencies, never another recipe or a
shared recipes module, so each runs as a plain script; and the one reason the `recipes` start-up
hook (tools/recipes-hook) still exists is pinned, so that it goes when the reason does."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "recipes").glob("*.py"))
# what a recipe may import besides the standard library
ALLOWED = {"idmix", "torch", "torchtune", "omegaconf", "tqdm", "datasets", "lm_eval"}
MAX_LINES = 400
MAX_RECIPE_LINES = 130  # parse the config, build from idmix, run, write


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


def test_recipes_are_thin_and_import_only_idmix_and_its_dependencies():
    for path in RECIPES:
        if path.name == "__init__.py":
            continue
        tops = {name.split(".")[0] for name in imported_modules(path)}
        assert "" not in tops, f"{path.name}: a relative import"
        other = tops - ALLOWED - set(sys.stdlib_module_names) - {"__future__"}
        assert not other, f"{path.name} imports {sorted(other)}: recipes import only idmix"
        lines = len(path.read_text().splitlines())
        assert lines <= MAX_RECIPE_LINES, f"{path.name}: {lines} lines; move its logic to idmix"


def test_training_and_evaluation_files_stay_small():
    """What recipes are built from: one job per file."""
    paths = [
        *(ROOT / "idmix" / "training").glob("*.py"),
        *(ROOT / "idmix" / "evaluation").glob("*.py"),
    ]
    for path in sorted(paths):
        lines = len(path.read_text().splitlines())
        assert lines <= MAX_LINES, f"{path.name}: {lines} lines; split it by job"


CHILD = r"""
import json, runpy, sys
import _idmix_recipes
sys.meta_path.remove(_idmix_recipes.ProjectRecipesFinder)  # the `recipes` hook, off
for path in sys.argv[1:]:
    runpy.run_path(path, run_name="recipe")  # everything but its __main__ block
print(json.dumps(sorted(m for m in sys.modules if m == "recipes" or m.startswith("recipes."))))
"""


def test_every_recipe_loads_without_the_recipes_hook(tmp_path):
    """From a directory that is not the repository, with the hook's finder removed: nothing
    named `recipes` is imported (tests/faults.py runs the pretraining recipe this way, to the
    end, in tests/test_crash_resume.py)."""
    paths = [str(p) for p in RECIPES if p.name != "__init__.py"]
    out = subprocess.run([sys.executable, "-c", CHILD, *paths], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_the_recipes_hook_is_still_needed():
    """`tune run recipes/x.py` runs the module `recipes.x` (runpy.run_module) with the working
    directory appended to sys.path, after site-packages, where torchtune 0.6.1 installs a
    top-level package `recipes` whose __init__ raises. Without the hook that package wins for
    every recipe, however little it imports. When this fails (torchtune no longer ships it),
    delete tools/recipes-hook/_idmix_recipes.py and its line in idmix-recipes.pth."""
    import importlib.machinery

    site = [p for p in sys.path if p.endswith("site-packages")]
    spec = importlib.machinery.PathFinder.find_spec("recipes", site)
    assert spec is not None and "torchtune" in Path(spec.origin).read_text()
