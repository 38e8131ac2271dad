"""Checkpoints of a training run: sharded (torch.distributed.checkpoint, FSDP2 or one process),
written atomically, resumable exactly; and a plain single-file export for evaluation.

Layout of a run directory::

    run.json                   the run id (``run_dir.py``: the run's lock, overwrite moving
                               the previous run aside)
    checkpoints/step_000100/   DCP shards of model + optimizer, extra_rank{r}.pt (step,
                               scheduler, data position, RNG of rank r, run id) and
                               manifest.json (size and SHA-256 of every file, run id, step)
    checkpoints/latest         the name of the newest complete checkpoint (a plain file:
                               neither it nor a step directory is followed as a link)
    model_final.pt             {"model": full state dict, "model_config": plain dict} for
                               eval/generation; loaded with weights_only=True, its builder
                               checked against idmix.models (``load_exported_model``)

A checkpoint is written under a temporary name of its run and renamed once every rank has
finished and its manifest is written, and ``latest`` is replaced atomically afterwards: a crash
or a full disk mid-save leaves the previous checkpoint and pointer intact (a full disk also
removes the partial directory). Loading runs no code from the files (``dcp_reader.py``: an
allow-list for DCP's metadata pickle, tensors-only byte items, ``weights_only`` for the rest)
and verifies the manifest first, naming a damaged file and the newest intact step. A checkpoint
this version writes (its ``extra_rank0.pt`` holds the run id) must have its manifest; one from
before manifests loads with a note.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import random
import re
import shutil
import stat
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from . import manifest
from .dcp_reader import RestrictedReader, TensorsOnlyPlanner, read_dcp_metadata
from .files import atomic_write, atomic_write_text, disk_full
from .upgrade import refuse_old_layout

STEP_NAME = re.compile(r"step_\d{6,}")
SINGLE_PROCESS_NOTICE = (
    r"torch\.distributed is (disabled, )?unavailable or uninitialized, assuming the intent is to "
    r"(save|load) in a single process"
)
# what save_checkpoint reports to on_stage(stage, step): the DCP shards written, extra state not
# yet (every rank); complete under the temporary name; renamed, `latest` not yet (rank 0)
STAGES = ("shards_written", "complete", "renamed")


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def _single_process_notice_dropped():
    """DCP's save and load with exactly their notice that one process saves or loads dropped (a
    UserWarning at every checkpoint of a one-process run, even with no_dist=True); every other
    warning is kept."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=SINGLE_PROCESS_NOTICE, category=UserWarning)
        yield


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


def on_rank0(fn):
    """fn() on rank 0, its ValueError/OSError raised on every rank (others would wait)."""
    error = None
    if _rank() == 0:
        try:
            result = fn()
        except (ValueError, OSError) as e:
            error, result = e, None
    else:
        result = None
    if dist.is_initialized():
        box = [None if error is None else (type(error), str(error)), result]
        dist.broadcast_object_list(box, src=0)
        if _rank() != 0:
            error = None if box[0] is None else box[0][0](box[0][1])
            result = box[1]
    if error is not None:
        raise error
    return result


def _cause(e: BaseException) -> BaseException:
    """The first rank's exception inside DCP's CheckpointException wrapper (else e)."""
    if isinstance(e, CheckpointException) and e.failures:
        return next(iter(e.failures.values()))[0]
    return e


def save_checkpoint(
    run_dir: Path, step: int, model, optimizer, extra: dict, run_id: str, on_stage=None
) -> Path:
    """Write checkpoints/step_{step} for run run_id; extra (per rank, plain data) goes to
    extra_rank{r}.pt; on_stage(stage, step) is called at each of ``STAGES``. On a full disk:
    OSError(ENOSPC) naming the path, the partial directory removed, the previous checkpoint and
    ``latest`` untouched."""
    on_stage = on_stage or (lambda stage, step: None)
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f".step_{step:06d}.tmp-{run_id}"
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    try:
        with _single_process_notice_dropped():
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
        on_stage("shards_written", step)
        extra = {**extra, "run_id": run_id, "rng": rng_state()}
        torch.save(extra, tmp / f"extra_rank{_rank()}.pt")
        _barrier()
        if _rank() == 0:
            manifest.write_manifest(tmp, run_id, step)
            on_stage("complete", step)
            if final.exists():  # this run's own, from before a resume to an earlier step
                shutil.rmtree(final)
            os.replace(tmp, final)
    except BaseException as e:
        if _rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if disk_full(_cause(e)):
            previous = latest_checkpoint(run_dir)
            kept = (
                f"the previous checkpoint {str(previous)!r} is intact"
                if previous
                else ("there is no earlier checkpoint")
            )
            raise OSError(
                errno.ENOSPC,
                f"no space left on device while writing checkpoint step {step} under "
                f"{str(root)!r}: the partial checkpoint was removed and {kept}",
                str(tmp),
            ) from e
        raise
    if _rank() == 0:
        on_stage("renamed", step)
        atomic_write_text(root / "latest", final.name + "\n")
    _barrier()
    return final


def _refuse_link(path: Path) -> None:
    if path.is_symlink():
        raise ValueError(
            f"{str(path)!r} is a symbolic link; a run's checkpoints are read only inside it, so "
            "it is refused"
        )


def _pointer(root: Path) -> str | None:
    """The step name in root/latest (None: no pointer), read without following a link; a
    refusal quotes nothing of the file."""
    pointer = root / "latest"
    _refuse_link(root)
    try:
        fd = os.open(pointer, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            _refuse_link(pointer)
        raise
    with os.fdopen(fd, "rb") as f:
        text = f.read(65) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    name = text.decode("ascii", "replace").strip()
    if len(text) > 64 or not STEP_NAME.fullmatch(name):
        raise ValueError(
            f"{str(pointer)!r}: what it holds is not a step directory of this run "
            "(step_NNNNNN); refusing to follow it"
        )
    return name


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``checkpoints/latest`` names, or None. The pointer may only name a
    step directory beside it (never a path elsewhere), and neither it nor that directory may
    be a symbolic link."""
    root = Path(run_dir) / "checkpoints"
    name = _pointer(root)
    if name is None:
        return None
    path = root / name
    _refuse_link(path)
    return path if path.is_dir() else None


def newest_intact(run_dir: Path, before: Path | None = None) -> Path | None:
    """The newest checkpoint of run_dir (older than before, if given) whose manifest holds."""

    def step(path: Path) -> int:
        return int(path.name[len("step_") :])

    root = Path(run_dir) / "checkpoints"
    steps = [
        p
        for p in root.glob("step_*")
        if STEP_NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink()
    ]
    for path in sorted(steps, key=step, reverse=True):
        if (before is None or step(path) < step(before)) and manifest.is_intact(path):
            return path
    return None


def _has_run_id(path: Path) -> bool:
    """Whether a checkpoint was written with a manifest: its extra_rank0.pt holds the run id
    (both came in one version, so a checkpoint from before manifests has neither)."""
    extra = path / "extra_rank0.pt"
    if not extra.is_file():
        return False
    state = safe_load(extra)
    return isinstance(state, dict) and "run_id" in state


def verify_checkpoint(path: Path, run_id: str | None) -> None:
    """Raise a ValueError naming the damaged file and the newest intact earlier step when
    path's files do not match its manifest (or it lost the manifest it was written with), or
    when it was written by another run."""
    path = Path(path)
    try:
        found = manifest.verify(path)
        if found is None and _has_run_id(path):
            raise manifest.DamagedCheckpointError(
                f"{str(path / manifest.NAME)!r} is missing (this checkpoint was written with "
                "one: its files cannot be checked without it)"
            )
    except manifest.DamagedCheckpointError as e:
        intact = newest_intact(path.parent.parent, before=path)
        hint = (
            f"the newest intact checkpoint is {intact.name}: to resume from it, write its name "
            f"into {str(path.parent / 'latest')!r}"
            if intact
            else "no earlier checkpoint of this run is intact"
        )
        raise manifest.DamagedCheckpointError(
            f"checkpoint {str(path)!r} is damaged: {e}; {hint}"
        ) from None
    if found is None:
        print(f"note: checkpoint {path} has no manifest (written before checksums): not verified")
        return
    if run_id is not None and found.get("run_id") != run_id:
        raise ValueError(
            f"checkpoint {str(path)!r} was written by run {found.get('run_id')!r}, but its "
            f"output_dir belongs to run {run_id!r}; refusing to mix two runs"
        )


def load_checkpoint(path: Path, model, optimizer, run_id: str | None = None) -> dict:
    """Restore model and optimizer in place; returns this rank's extra dict (RNG restored).
    The manifest is verified first (and the run id, if given); no file can run code. A
    checkpoint of the old parameter names is refused, naming ``idmix.io.upgrade``."""
    on_rank0(lambda: verify_checkpoint(path, run_id))
    stored = read_dcp_metadata(path).state_dict_metadata
    refuse_old_layout(
        [k.removeprefix("model.") for k in stored if k.startswith("model.")],
        f"checkpoint {str(path)!r}",
    )
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    try:
        reader = RestrictedReader(str(path))
        with _single_process_notice_dropped():
            dcp.load(state, storage_reader=reader, planner=TensorsOnlyPlanner())
    except CheckpointException as e:
        cause = _cause(e)
        if isinstance(cause, ValueError | OSError):
            raise cause from None
        raise
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    extra_path = Path(path) / f"extra_rank{_rank()}.pt"
    if not extra_path.is_file():
        raise FileNotFoundError(
            f"resume: {extra_path} is missing (was the run saved with a different world size?)"
        )
    extra = safe_load(extra_path)
    set_rng_state(extra.pop("rng"))
    return extra


_UNPICKLER = re.compile(r"Unsupported global: GLOBAL \S+|Unsupported operand \S+")


def safe_load(path):
    """torch.load with weights_only=True (tensors and plain data only: loading never runs code
    from the file); a file that needs more, or that torch.load cannot read (truncated, damaged,
    not a torch file), is refused with a ValueError naming it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as e:  # torch.load reports a damaged file in many types
        found = _UNPICKLER.search(str(e))
        first = (str(e).strip().splitlines() or [""])[0][:200]
        reason = found.group() if found else f"{type(e).__name__}: {first}"
        if isinstance(e, pickle.UnpicklingError) and "Unsupported operand" not in reason:
            raise ValueError(
                f"checkpoint {str(path)!r} holds Python objects beyond tensors and plain data (a "
                "file from an older idmix, or not from idmix), and loading those can run code. "
                "Re-export it with this version, or load it with torch.load(weights_only=False) "
                f"yourself if you trust where it came from. ({reason})"
            ) from None
        raise ValueError(
            f"checkpoint {str(path)!r} is not a file torch.save wrote, or is truncated or "
            f"damaged ({reason})"
        ) from None


def export_model(path: Path, model, model_config: dict) -> None:
    """One file with the full (unsharded) model state dict, written by rank 0."""
    sd = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if _rank() == 0:
        obj = {"model": sd, "model_config": model_config}
        atomic_write(path, lambda tmp: torch.save(obj, tmp))
    _barrier()


def load_exported_model(path, device="cpu"):
    """The model of an :func:`export_model` file, built from its plain-data description
    (``model_description``: a trusted builder, sizes checked against the weights on the meta
    device first), in eval mode."""
    from .model_description import build_described

    if not Path(path).is_file():
        raise ValueError(f"config: checkpoint: no such file {str(path)!r}")
    saved = safe_load(path)
    if not isinstance(saved, dict) or "model" not in saved or "model_config" not in saved:
        raise ValueError(f"config: checkpoint {str(path)!r} is not a model_final.pt export")
    model = build_described(saved["model_config"], saved["model"], f"checkpoint {str(path)!r}")
    model.load_state_dict(saved["model"])
    return model.to(device).eval()
