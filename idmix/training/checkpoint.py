"""Checkpoints of a training run: sharded (torch.distributed.checkpoint, FSDP2 or one process),
written atomically, resumable exactly; and a plain single-file export for evaluation.

Layout of a run directory::

    checkpoints/step_000100/   DCP shards of model + optimizer, and extra_rank{r}.pt (step,
                               scheduler, data position, RNG of rank r)
    checkpoints/latest         the name of the newest complete checkpoint
    model_final.pt             {"model": full state dict, "model_config": plain dict} for
                               eval/generation; loaded with weights_only=True, its builder
                               checked against idmix.models (``load_exported_model``)

A checkpoint is written under a temporary name and renamed once every rank has finished, and
``latest`` is replaced atomically afterwards: a crash mid-save leaves the previous checkpoint
and pointer intact.
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from .faults import kill_point
from .files import atomic_write, atomic_write_text


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


def save_checkpoint(run_dir: Path, step: int, model, optimizer, extra: dict) -> Path:
    """Write checkpoints/step_{step}; extra (per rank, picklable) goes to extra_rank{r}.pt."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f".step_{step:06d}.tmp"
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    kill_point("mid_checkpoint", step)
    torch.save({**extra, "rng": rng_state()}, tmp / f"extra_rank{_rank()}.pt")
    _barrier()
    if _rank() == 0:
        kill_point("before_rename", step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        kill_point("before_pointer", step)
        atomic_write_text(root / "latest", final.name + "\n")
    _barrier()
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if path.is_dir() else None


def _legacy_names(path: Path, model_keys) -> dict[str, str]:
    """{current name: name in the checkpoint} for the parameters a checkpoint written before the
    composition redesign holds under their old names (``idmix.modules.mixer.RENAMED_KEYS``)."""
    from ..modules.mixer import RENAMED_KEYS

    stored = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    names = {}
    for key in model_keys:
        for old, new in RENAMED_KEYS.items():
            legacy = key[: -len(new)] + old
            if key.endswith(new) and f"model.{key}" not in stored and f"model.{legacy}" in stored:
                names[key] = legacy
    return names


def _renamed(obj, names: dict[str, str]):
    """obj (nested dicts/lists of state) with every key or string found in names replaced."""
    if isinstance(obj, dict):
        return {
            names.get(k, k) if isinstance(k, str) else k: _renamed(v, names) for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [names.get(x, x) if isinstance(x, str) else _renamed(x, names) for x in obj]
    return obj


def load_checkpoint(path: Path, model, optimizer) -> dict:
    """Restore model and optimizer in place; returns this rank's extra dict (RNG restored).
    Checkpoints from before the composition redesign load too (renamed parameters)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    names = _legacy_names(path, model_sd)
    state = _renamed({"model": model_sd, "optim": optim_sd}, names)
    dcp.load(state, checkpoint_id=str(path))
    state = _renamed(state, {new: old for old, new in names.items()})
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


# Builders a model_final.pt may name: idmix's own, and the dotted names in this variable (your
# own builders, comma-separated). A file's config is data, so it may not choose arbitrary code.
TRUSTED_BUILDERS_ENV = "IDMIX_TRUSTED_BUILDERS"


def safe_load(path):
    """torch.load with weights_only=True (tensors and plain data only: loading never runs code
    from the file); a file that needs more is refused with an error naming it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(
            f"checkpoint {str(path)!r} holds Python objects beyond tensors and plain data (a file "
            "from an older idmix, or not from idmix), and loading those can run code. Re-export "
            "it with this version, or load it with torch.load(weights_only=False) yourself if "
            f"you trust where it came from. ({str(e).splitlines()[0]})"
        ) from None


def _trusted_builders() -> set[str]:
    import idmix.models

    names = {f"idmix.models.{n}" for n in idmix.models.__all__}
    names -= {
        "idmix.models.MODEL_BUILDERS",
        "idmix.models.init_weights_",
        "idmix.models.CPU_SCALES",
        "idmix.models.CPU_SSM_DEFAULTS",
    }
    extra = os.environ.get(TRUSTED_BUILDERS_ENV, "")
    return names | {n.strip() for n in extra.split(",") if n.strip()}


def check_model_config(node, source: str, trusted: set[str] | None = None) -> None:
    """Every ``_component_`` in a saved model config (nested ones too) must be a trusted
    builder: ``config.instantiate`` would call whatever a file names."""
    trusted = _trusted_builders() if trusted is None else trusted
    if isinstance(node, dict):
        component = node.get("_component_")
        if component is not None and component not in trusted:
            raise ValueError(
                f"{source}: model_config names the builder {component!r}, which is not one of "
                f"idmix.models; if it is your own, add it to ${TRUSTED_BUILDERS_ENV}"
            )
        for value in node.values():
            check_model_config(value, source, trusted)
    elif isinstance(node, list):
        for value in node:
            check_model_config(value, source, trusted)


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
    """The model of an :func:`export_model` file, built from its config, in eval mode."""
    from omegaconf import DictConfig
    from torchtune import config

    if not Path(path).is_file():
        raise ValueError(f"config: checkpoint: no such file {str(path)!r}")
    saved = safe_load(path)
    if not isinstance(saved, dict) or "model" not in saved or "model_config" not in saved:
        raise ValueError(f"config: checkpoint {str(path)!r} is not a model_final.pt export")
    from ..modules import upgrade_state_dict

    check_model_config(saved["model_config"], f"checkpoint {str(path)!r}")
    model = config.instantiate(DictConfig(saved["model_config"]))
    upgrade_state_dict(saved["model"])  # exports from before the composition redesign
    check_compatible(model, saved["model"], f"checkpoint {str(path)!r}")
    model.load_state_dict(saved["model"])
    return model.to(device).eval()


def check_compatible(model, state_dict: dict, source: str) -> None:
    """Raise a clear error when a checkpoint does not fit the model (names or shapes)."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in state_dict.items()}
    missing, unexpected = (
        sorted(expected.keys() - found.keys()),
        sorted(found.keys() - expected.keys()),
    )
    wrong = [k for k in expected.keys() & found.keys() if expected[k] != found[k]]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {missing[:3]}{'…' if len(missing) > 3 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:3]}{'…' if len(unexpected) > 3 else ''}")
        if wrong:
            k = wrong[0]
            parts.append(
                f"{len(wrong)} shape mismatches, e.g. {k}: model {expected[k]} vs {found[k]}"
            )
        raise ValueError(f"{source}: checkpoint does not match the model ({'; '.join(parts)})")
