"""A training run owns its output directory: an advisory lock held for the run's lifetime, a
run id (``run.json``) stamped into every checkpoint, and ``overwrite`` moving the previous run
aside instead of deleting or mixing with it.

The lock is ``flock`` on ``<output_dir>/.run.lock``, so the kernel releases it when the holder
dies (kill -9 included); the file is never deleted (deleting a lock file races with a second
opener), only emptied on a clean release, so a non-empty file found unlocked is a stale lock
from a run that was killed.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .files import atomic_write_json

LOCK = ".run.lock"
RUN_FILE = "run.json"


def _fail(msg: str):
    raise ValueError(f"config: output_dir: {msg}")


def _holder(text: str) -> str:
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']}, run {info['run_id']}, since {info['since']}"
    except (ValueError, KeyError, TypeError):
        return "an unknown process"


@dataclass
class RunClaim:
    """What claiming a run directory found and did (rank 0 holds the lock's file handle)."""

    run_id: str
    notes: list[str] = field(default_factory=list)
    moved_to: Path | None = None
    _lock: object = None

    def release(self) -> None:
        """Empty the lock file (a clean end) and drop the lock."""
        if self._lock is not None:
            self._lock.truncate(0)
            self._lock.close()
            self._lock = None


def _writable_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        _fail(f"{str(out)!r} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _fail(f"cannot create {str(out)!r} ({e.strerror})")
    if not os.access(out, os.W_OK | os.X_OK):
        _fail(f"{str(out)!r} is not writable")


def _lock(out: Path, run_id: str):
    """(open lock file, stale-lock note or None); raises when another process holds it."""
    f = open(out / LOCK, "a+")  # noqa: SIM115 (held for the run's lifetime)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = _holder(f.read())
        f.close()
        _fail(f"{str(out)!r} is in use by another run ({holder}); wait for it or choose another")
    f.seek(0)
    previous = f.read()
    note = None
    if previous.strip():
        note = f"output_dir: a previous run ({_holder(previous)}) ended without releasing its "
        note += "lock (killed?); this run takes it over"
    f.truncate(0)
    info = {"pid": os.getpid(), "host": socket.gethostname(), "run_id": run_id}
    f.write(json.dumps({**info, "since": time.strftime("%Y-%m-%d %H:%M:%S")}))
    f.flush()
    return f, note


def read_run_id(out: Path) -> str | None:
    """The run id in output_dir/run.json, or None (a run from before run ids)."""
    path = Path(out) / RUN_FILE
    if not path.is_file():
        return None
    try:
        run_id = json.loads(path.read_text())["run_id"]
    except (ValueError, KeyError, TypeError):
        _fail(f"{str(path)!r} is not a run file")
    if not isinstance(run_id, str):
        _fail(f"{str(path)!r} is not a run file")
    return run_id


def _move_aside(out: Path, entries: list[Path]) -> Path:
    """Move every entry of out into a sibling directory <name>.replaced-<time>[-n]."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = out.with_name(f"{out.name}.replaced-{stamp}")
    n = 1
    while aside.exists():
        aside, n = out.with_name(f"{out.name}.replaced-{stamp}-{n}"), n + 1
    aside.mkdir()
    for entry in entries:
        os.replace(entry, aside / entry.name)
    return aside


def claim_run_dir(out: Path, resume: bool, overwrite: bool) -> RunClaim:
    """Lock output_dir for this run. A directory with a previous run needs resume (continue it,
    keeping its run id) or overwrite (move it aside, start a new run id); never both."""
    out = Path(out)
    if resume and overwrite:
        _fail("resume_from_checkpoint=True and overwrite=True contradict each other; pass one")
    _writable_dir(out)
    fresh_id = uuid.uuid4().hex[:12]
    handle, note = _lock(out, fresh_id)
    claim = RunClaim(run_id=fresh_id, notes=[note] if note else [], _lock=handle)
    try:
        entries = sorted(p for p in out.iterdir() if p.name != LOCK)
        if resume:
            known = read_run_id(out)
            if known is None:  # a run from before run ids: it gets one now, kept from here on
                atomic_write_json(out / RUN_FILE, {"run_id": fresh_id})
            claim.run_id = known or fresh_id
            return claim
        if entries and not overwrite:
            _fail(
                f"{str(out)!r} already holds a run; pass resume_from_checkpoint=True to continue "
                "it or overwrite=True to move it aside and start over"
            )
        if entries:
            claim.moved_to = _move_aside(out, entries)
            claim.notes.append(f"output_dir: moved the previous run to {claim.moved_to}")
        atomic_write_json(out / RUN_FILE, {"run_id": claim.run_id})
        return claim
    except BaseException:
        claim.release()
        raise
