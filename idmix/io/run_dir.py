"""A training run owns its output directory: an advisory lock held for the run's lifetime, a
run id (``run.json``) stamped into every checkpoint, and ``overwrite`` moving the previous run
aside instead of deleting or mixing with it.

The lock is ``flock`` on ``<output_dir>/.run.lock``, so the kernel releases it when the holder
dies (kill -9 included); the file is never deleted (deleting a lock file races with a second
opener), only emptied on a clean release, so a non-empty file found unlocked is a stale lock
from a run that was killed.

``overwrite`` moves the whole directory aside in one rename (a kill at any moment leaves the
previous run whole, in one place), and refuses a directory that holds a live run anywhere below
it, or whose move would take the working directory, the home directory or ``/`` along. The run
id is stamped when a fresh run starts; a resume keeps it, and a run from before run ids gets
one only once its resume has succeeded (``stamp_run_id``), so a failed resume writes nothing.
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
    """What claiming a run directory found and did (rank 0 holds the lock's file handle);
    run_id is None when resuming a run from before run ids (see ``stamp_run_id``)."""

    run_id: str | None
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


def _locked(path: Path, mode: str, busy: str):
    """path opened and flock'ed (exclusive); when another process holds it, raises with busy
    and the holder."""
    f = open(path, mode)  # noqa: SIM115 (held by the caller)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = _holder(f.read())
        f.close()
        _fail(f"{busy} ({holder}); wait for it or choose another")
    return f


def _lock(out: Path, run_id: str | None):
    """(open lock file, stale-lock note or None); raises when another process holds it."""
    f = _locked(out / LOCK, "a+", f"{str(out)!r} is in use by another run")
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
    if path.is_symlink():
        _fail(f"{str(path)!r} is a symbolic link; a run's files are read only inside it")
    if not path.is_file():
        return None
    try:
        run_id = json.loads(path.read_text())["run_id"]
    except (ValueError, KeyError, TypeError):
        _fail(f"{str(path)!r} is not a run file")
    if not isinstance(run_id, str):
        _fail(f"{str(path)!r} is not a run file")
    return run_id


def stamp_run_id(out: Path, run_id: str | None = None) -> str:
    """Write output_dir/run.json with run_id (None: a new one); returns the id."""
    run_id = run_id or uuid.uuid4().hex[:12]
    atomic_write_json(Path(out) / RUN_FILE, {"run_id": run_id})
    return run_id


def _check_movable(out: Path) -> None:
    """Refuse to move aside a directory that holds the working directory, the home directory
    or is the filesystem root (output_dir=. with overwrite would move the whole project)."""
    real = out.resolve()
    for inside, what in ((Path.cwd(), "the working directory"), (Path.home(), "your home")):
        if inside.resolve().is_relative_to(real):
            _fail(
                f"{str(out)!r} is or holds {what}; overwrite=True would move it aside, so it is "
                "refused: choose a directory of its own for the run"
            )


def _live_runs_below(out: Path) -> list:
    """The lock files of every run directory below out, each flock'ed by this process (held
    while out moves, so none can start meanwhile); raises naming one a live process holds."""
    held = []
    try:
        for parent, _, files in os.walk(out):  # links are not followed
            if LOCK in files and Path(parent) != out:
                busy = f"{str(out)!r} holds a live run in {parent!r} (overwrite=True moves it)"
                held.append(_locked(Path(parent) / LOCK, "r", busy))
        return held
    except BaseException:
        for f in held:
            f.close()
        raise


def _move_aside(out: Path) -> Path:
    """Rename out to a sibling <name>.replaced-<time>[-n] (one rename: the run moves whole)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = out.with_name(f"{out.name}.replaced-{stamp}")
    n = 1
    while os.path.lexists(aside):
        aside, n = out.with_name(f"{out.name}.replaced-{stamp}-{n}"), n + 1
    try:
        os.rename(out, aside)
    except OSError as e:
        _fail(f"cannot move {str(out)!r} aside to {str(aside)!r} ({e.strerror})")
    return aside


def _replace(out: Path, claim: RunClaim) -> None:
    """Move the previous run in out aside and lock the new, empty out for claim."""
    below = _live_runs_below(out)
    try:
        claim.moved_to = _move_aside(out)
    finally:
        for f in below:
            f.close()
    claim.release()  # the lock moved with the previous run
    claim.notes.append(f"output_dir: moved the previous run to {claim.moved_to}")
    out.mkdir()
    claim._lock, _ = _lock(out, claim.run_id)


def claim_run_dir(out: Path, resume: bool, overwrite: bool) -> RunClaim:
    """Lock output_dir for this run. A directory with a previous run needs resume (continue it,
    keeping its run id) or overwrite (move it aside, start a new run id); never both."""
    out = Path(out)
    if resume and overwrite:
        _fail("resume_from_checkpoint=True and overwrite=True contradict each other; pass one")
    if overwrite:
        _check_movable(out)
    _writable_dir(out)
    run_id = read_run_id(out) if resume else uuid.uuid4().hex[:12]
    handle, note = _lock(out, run_id)
    claim = RunClaim(run_id=run_id, notes=[note] if note else [], _lock=handle)
    try:
        if resume:
            return claim
        if any(p.name != LOCK for p in out.iterdir()):
            if not overwrite:
                _fail(
                    f"{str(out)!r} already holds a run; pass resume_from_checkpoint=True to "
                    "continue it or overwrite=True to move it aside and start over"
                )
            _replace(out, claim)
        stamp_run_id(out, claim.run_id)
        return claim
    except BaseException:
        claim.release()
        raise
