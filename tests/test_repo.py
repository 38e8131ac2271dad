"""The README's promise: its first two commands are exactly what CI runs first."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.S)
    assert block, "README.md must open with a bash block"
    commands = [c for c in block.group(1).strip().splitlines() if c.strip()]
    assert len(commands) == 2, commands
    ci = [
        c
        for c in (ROOT / ".ci/run").read_text().splitlines()
        if c.strip() and not c.startswith(("#", "set ", "cd "))
    ]
    assert ci[:2] == commands
    # after them, CI may run further tiers of the suite (the slow compile goldens), nothing else
    assert all(c.startswith("python -m pytest ") for c in ci[2:]), ci[2:]


def test_core_imports_only_torch():
    """idmix/ must not import torchtune, torchao, lm-eval or transformers (only idmix.hf, when
    imported itself) at import time, and the functional core not even tensordict (a GPU
    machine may have only torch and triton)."""
    import subprocess
    import sys

    heavy = "('torchtune', 'torchao', 'lm_eval', 'datasets', 'tensordict', 'transformers')"
    code = (
        f"import sys, idmix.functional; bad = [m for m in {heavy} if m in sys.modules]; "
        "import idmix; idmix.generate; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_readme_and_docs_python_examples_run():
    """Every ```python block of the README and of docs/ runs as written."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    ran = 0
    for page in pages:
        for code in re.findall(r"```python\n(.*?)```", page.read_text(), re.S):
            exec(compile(code, str(page.relative_to(ROOT)), "exec"), {})
            ran += 1
    assert ran >= 3


def test_readme_is_a_landing_page():
    """The one-line description before the commands, at most 150 lines, and every relative
    link pointing at a file of the repository."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert readme.index("Interdomain Attention") < readme.index("```bash")
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_design_citations_point_into_the_repository():
    """Docstrings and docs cite docs/design.md by section (no notes outside the repository), and
    every cited section exists."""
    import subprocess

    files = subprocess.run(
        ["git", "ls-files", "*.py", "*.md", "*.yaml"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    design = (ROOT / "docs" / "design.md").read_text()
    sections = set(re.findall(r"^## (\d+)\.", design, flags=re.M))
    for name in files:
        text = (ROOT / name).read_text()
        outside = re.escape("DESIGN" + ".md") + "|" + re.escape("paper-" + "notes")
        assert not re.search(outside, text), f"{name} cites design notes outside the repository"
        for cited in re.findall(r"docs/design\.md §(\d+)", text):
            assert cited in sections, f"{name} cites docs/design.md §{cited}"


def test_torchtune_imports_against_the_pinned_torchao():
    """The start-up hook (tools/recipes-hook/_idmix_torchtune_compat.py) lets torchtune 0.6.1
    import against torchao 0.17; the two names it supplies refuse to run, naming why; its
    finder on sys.meta_path survives importlib.invalidate_caches() (trust_remote_code calls it)."""
    import subprocess
    import sys

    code = (
        "import importlib; importlib.invalidate_caches()\n"
        "import torchtune.training, torchao, torchao.quantization as q\n"
        "assert torchao.__version__.startswith('0.17'), torchao.__version__\n"
        "try:\n"
        "    q.int4_weight_only()\n"
        "except NotImplementedError as e:\n"
        "    assert 'removed in torchao 0.16' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('int4_weight_only ran')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]


def package_imports() -> dict[str, set[str]]:
    """idmix's packages and top-level modules -> the others each imports (any import, at any
    depth of a file, relative or absolute)."""
    import ast

    edges: dict[str, set[str]] = {}
    for path in (ROOT / "idmix").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts  # ("idmix", unit, ...)
        unit = parts[1] if len(parts) > 1 and parts[1] != "__init__" else "idmix"
        module = list(parts[:-1] if parts[-1] == "__init__" else parts)
        package = module if parts[-1] == "__init__" else module[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                anchor = package[: len(package) - node.level + 1] if node.level else []
                names = [".".join([*anchor, *([node.module] if node.module else [])])]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                target = name.split(".")
                if target[0] == "idmix" and len(target) > 1 and target[1] != unit:
                    edges.setdefault(unit, set()).add(target[1])
    return edges


def test_no_import_cycle_between_packages():
    """The packages (and top-level modules) of idmix import one way: io under training, hf and
    evaluation; no path leads back to where it started."""
    edges = package_imports()
    assert "training" not in edges.get("hf", set()) and "training" not in edges.get("io", set())

    def cycle_from(start, node, seen):
        for nxt in edges.get(node, ()):
            if nxt == start:
                return [*seen, nxt]
            if nxt not in seen:
                found = cycle_from(start, nxt, [*seen, nxt])
                if found:
                    return found
        return None

    for unit in edges:
        assert cycle_from(unit, unit, [unit]) is None, cycle_from(unit, unit, [unit])
