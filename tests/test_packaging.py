"""A non-editable install (a wheel) holds every package: the list in pyproject.toml matches the
packages on disk, and each one imports from the built wheel, not from this checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def packages_on_disk() -> set[str]:
    found = {"idmix_kernels"}
    for init in (ROOT / "idmix").rglob("__init__.py"):
        found.add(".".join(init.parent.relative_to(ROOT).parts))
    return found


def test_pyproject_lists_every_package():
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    assert listed == packages_on_disk()


def test_every_package_imports_from_the_built_wheel(tmp_path):
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("idmix-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    names = sorted(packages_on_disk() - {"idmix_kernels"})  # triton-free imports
    script = (
        "import importlib, sys\n"
        f"sys.path.insert(0, {str(site)!r})\n"
        f"for name in {names!r}:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({str(site)!r}), (name, module.__file__)\n"
        "import idmix.evaluation.recall, idmix.evaluation.deploy, idmix.evaluation.lm_eval_model\n"
        "print('ok', len(sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-3000:]
    kernels = site / "idmix_kernels"
    assert {p.name for p in kernels.glob("*.py")} >= {
        "__init__.py",
        "chunk_states.py",
        "decode_step.py",
        "tiles.py",
    }
