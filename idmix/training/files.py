"""Atomic file writes: a crash mid-write never leaves a partial file where a good one was."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """write(tmp) fills a temporary file beside path (same suffix), then it replaces path in
    one rename. Concurrent writers (ranks) each use their own temporary name."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=1))
