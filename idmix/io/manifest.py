"""A checksum manifest per checkpoint: ``manifest.json`` lists every file of the checkpoint
directory with its size and SHA-256, and the run id and step that wrote it; a checkpoint is
intact when every listed file is there with that size and hash and nothing else is. A
checkpoint is read without following symbolic links: a link (the directory itself or any entry
in it) could lead outside the run, and is refused."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

NAME = "manifest.json"
FORMAT = 1


class DamagedCheckpointError(ValueError):
    """A checkpoint's files do not match its manifest, or are not plain files inside it."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _refuse(path: Path, what: str):
    raise DamagedCheckpointError(
        f"{str(path)!r} is {what}; a checkpoint is read only from plain files inside its "
        "directory (a link could lead outside the run)"
    )


def _listed(directory: Path) -> list[Path]:
    """The files of a checkpoint directory but its manifest, read without following links: a
    symbolic link (the directory or an entry) or anything but a regular file is refused."""
    if directory.is_symlink():
        _refuse(directory, "a symbolic link")
    entries = sorted(Path(e.path) for e in os.scandir(directory))
    for path in entries:
        if path.is_symlink():
            _refuse(path, "a symbolic link")
        if not path.is_file():
            _refuse(path, "not a regular file")
    return [p for p in entries if p.name != NAME]


def write_manifest(directory: Path, run_id: str, step: int) -> dict:
    """Hash every file of directory into directory/manifest.json; returns the manifest."""
    files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in _listed(directory)}
    manifest = {"format": FORMAT, "run_id": run_id, "step": step, "files": files}
    (directory / NAME).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _read_manifest(directory: Path) -> dict | None:
    """The manifest of a checkpoint directory whose entries are plain files, or None when it has
    none."""
    path = directory / NAME
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DamagedCheckpointError(f"{str(path)!r}: not a readable manifest ({e})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        raise DamagedCheckpointError(f"{str(path)!r}: not a checkpoint manifest")
    return manifest


def verify(directory: Path) -> dict | None:
    """Check every file of a checkpoint directory against its manifest (None: no manifest).
    Raises DamagedCheckpointError naming a link or the first missing, extra, resized or changed
    file."""
    directory = Path(directory)
    present = {p.name for p in _listed(directory)}
    manifest = _read_manifest(directory)
    if manifest is None:
        return None
    files = manifest["files"]
    missing, extra = sorted(files.keys() - present), sorted(present - files.keys())
    if missing:
        raise DamagedCheckpointError(f"{str(directory / missing[0])!r} is missing")
    if extra:
        raise DamagedCheckpointError(f"{str(directory / extra[0])!r} is not in its manifest")
    for name, expected in sorted(files.items()):
        path = directory / name
        size = path.stat().st_size
        if size != expected.get("bytes"):
            raise DamagedCheckpointError(
                f"{str(path)!r} has {size} bytes, its manifest says {expected.get('bytes')} "
                "(truncated or overwritten)"
            )
        if _sha256(path) != expected.get("sha256"):
            raise DamagedCheckpointError(
                f"{str(path)!r} does not match its SHA-256 in the manifest (corrupted)"
            )
    return manifest


def is_intact(directory: Path) -> bool:
    try:
        return verify(directory) is not None
    except (DamagedCheckpointError, OSError):
        return False
