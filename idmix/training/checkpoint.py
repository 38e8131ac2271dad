"""Checkpoints of a training run: sharded (torch.distributed.checkpoint, FSDP2 or one process),
written atomically, resumable exactly; and a plain single-file export for evaluation.

Layout of a run directory::

    checkpoints/step_000100/   DCP shards of model + optimizer, and extra_rank{r}.pt (step,
                               scheduler, data position, RNG of rank r)
    checkpoints/latest         the name of the newest complete checkpoint
    model_final.pt             {"model": full state dict, "model_config": …} for eval/generation

A checkpoint is written under a temporary name and renamed once every rank has finished, and
``latest`` is replaced atomically afterwards: a crash mid-save leaves the previous checkpoint
and pointer intact.
"""

from __future__ import annotations

import os
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
    torch.save({**extra, "rng": rng_state()}, tmp / f"extra_rank{_rank()}.pt")
    _barrier()
    if _rank() == 0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        atomic_write_text(root / "latest", final.name + "\n")
    _barrier()
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if path.is_dir() else None


def load_checkpoint(path: Path, model, optimizer) -> dict:
    """Restore model and optimizer in place; returns this rank's extra dict (RNG restored)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    extra_path = Path(path) / f"extra_rank{_rank()}.pt"
    if not extra_path.is_file():
        raise FileNotFoundError(
            f"resume: {extra_path} is missing (was the run saved with a different world size?)"
        )
    extra = torch.load(extra_path, weights_only=False)
    set_rng_state(extra.pop("rng"))
    return extra


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
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if "model" not in saved or "model_config" not in saved:
        raise ValueError(f"config: checkpoint {str(path)!r} is not a model_final.pt export")
    model = config.instantiate(DictConfig(saved["model_config"]))
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
