"""Atomic file writes: a crash mid-write never leaves a partial file where a good one was, and a
full disk is reported as ENOSPC naming the path, with the partial file removed."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path

# how torch's zip writer (torch.save) reports a failed write: a RuntimeError without errno
_FAILED_WRITE = ("No space left", "unexpected pos", "file write failed", "basic_ios::clear")


def disk_full(e: BaseException) -> bool:
    """Whether e is a write that failed for want of space (an OSError with ENOSPC, or torch's
    zip writer's RuntimeError)."""
    if isinstance(e, OSError):
        return e.errno == errno.ENOSPC
    return isinstance(e, RuntimeError) and any(s in str(e) for s in _FAILED_WRITE)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """write(tmp) fills a temporary file beside path (same suffix), then it replaces path in
    one rename. Concurrent writers (ranks) each use their own temporary name. On a full disk:
    OSError(ENOSPC) naming path, the temporary file removed, a previous file at path intact."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except Exception as e:
        if not disk_full(e):
            raise
        kept = f"the previous {path.name} is intact" if path.exists() else "nothing replaced"
        raise OSError(
            errno.ENOSPC,
            f"no space left on device while writing {str(path)!r}: the partial file was "
            f"removed and {kept}",
            str(path),
        ) from e
    finally:
        tmp.unlink(missing_ok=True)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=1))
