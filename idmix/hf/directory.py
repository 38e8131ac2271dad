"""The Hugging Face directories the converter writes, and replacing one without losing another.

A directory the converter writes carries a marker file (``.idmix-hf``, a small JSON).
``overwrite`` replaces only such a directory, one an older converter wrote (its two
``trust_remote_code`` files and nothing it did not write), an empty directory or a missing
path; a training run directory, or any other, is refused. The new directory is written under a
temporary name beside the target and swapped in (the old one renamed aside, the new one renamed
in, the old one removed), so a failure at any point leaves the previous directory as it was.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from safetensors import SafetensorError

from idmix.io.run_dir import LOCK, RUN_FILE

MARKER = ".idmix-hf"
WRITTEN_BY = "idmix.hf.convert"
# every file converters before the marker wrote, and the two that only they wrote
LEGACY_FILES = {
    "config.json",
    "model.safetensors",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "configuration_idmix.py",
    "modeling_idmix.py",
}
LEGACY_SIGNATURE = {"configuration_idmix.py", "modeling_idmix.py"}
RUN_ENTRIES = (RUN_FILE, "checkpoints", LOCK)  # any of them makes a training run directory
_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how safetensors reports an I/O error


def _is_marker(path: Path) -> bool:
    if path.is_symlink() or not path.is_file() or path.stat().st_size > 4096:
        return False
    try:
        return json.loads(path.read_text()).get("written_by") == WRITTEN_BY
    except (ValueError, AttributeError, UnicodeDecodeError):
        return False


def check_replaceable(out: Path, overwrite: bool) -> None:
    """out may be written: a missing path or an empty directory, or, with overwrite, a
    directory the converter wrote; otherwise a ValueError naming out and why."""
    where = f"out_dir: {str(out)!r}"
    if out.is_symlink():
        raise ValueError(f"{where} is a symbolic link; give the directory itself")
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"{where} is a file, not a directory")
    names = sorted(os.listdir(out))
    run = [n for n in RUN_ENTRIES if n in names]
    if run:
        raise ValueError(
            f"{where} is a training run directory (it holds {run}) and is never replaced; "
            "write the Hugging Face directory to its hf/ subdirectory or another path"
        )
    if not names:
        return
    if not overwrite:
        raise ValueError(f"{where} exists; pass overwrite=True (--overwrite) to replace it")
    odd = [n for n in names if (out / n).is_symlink() or not (out / n).is_file()]
    if odd:
        raise ValueError(
            f"{where} holds {odd[:3]}, which the converter never writes (it writes plain files "
            "only); refusing to replace it"
        )
    if _is_marker(out / MARKER) or LEGACY_SIGNATURE <= set(names) <= LEGACY_FILES:
        return
    raise ValueError(
        f"{where} was not written by {WRITTEN_BY} (no {MARKER} marker) and holds {names[:5]}; "
        "refusing to replace it: remove it yourself or choose another out_dir"
    )


def _errno(error: BaseException) -> int | None:
    """The OS error number of an OSError, or of an I/O error safetensors raised."""
    if isinstance(error, OSError):
        return error.errno
    if isinstance(error, SafetensorError) and (m := _OS_ERROR.search(str(error))):
        return int(m[1])
    return None


def write_dir(out: Path, write: Callable[[Path], None], overwrite: bool) -> Path:
    """Run write(tmp) on a new directory beside out, add the marker, check out again
    (check_replaceable) and swap tmp in for it. On any failure tmp is removed and out is as it
    was; a failed write with an OS error number (a full disk: ENOSPC) is an OSError with that
    number naming out. Returns out."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        tmp.mkdir()
        write(tmp)
        (tmp / MARKER).write_text(json.dumps({"written_by": WRITTEN_BY}) + "\n")
        check_replaceable(out, overwrite)
        aside = _swap(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        code = _errno(e)
        if code is None:
            raise
        kept = "the previous directory is intact" if out.exists() else "nothing was written"
        raise OSError(
            code,
            f"{os.strerror(code)} while writing the Hugging Face directory (the partial "
            f"directory was removed; {kept})",
            str(out),
        ) from e
    if aside is not None:
        shutil.rmtree(aside)
    return out


def _swap(tmp: Path, out: Path) -> Path | None:
    """tmp renamed to out; an existing out is renamed aside first (returned, for removal)."""
    if not out.exists():
        os.rename(tmp, out)
        return None
    aside = out.with_name(f"{out.name}.replaced-{uuid.uuid4().hex[:8]}")
    os.rename(out, aside)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(aside, out)
        raise
    return aside
