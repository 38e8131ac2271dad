"""Files written before the SSM mixer's parameters took their current names, converted once:

    python -m idmix.io.upgrade OLD NEW

OLD is a ``model_final.pt`` export, a state-dict file, one DCP checkpoint directory or a whole
run directory (every checkpoint with its optimiser state, every export; its other files copied
as they are). OLD is only read; NEW must not exist and appears complete or not at all.

Two renames are undone: the composition redesign moved the S4D-only ``mode_weights`` into its
readout, and the parts redesign gave the mixer's attributes their constructor's names
(``OLD_MODULES``). The library's loaders refuse a file of the old layout with this command in
the message (:func:`refuse_old_layout`); they rename nothing themselves."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import torch

OLD_MODULES = {  # attribute of the old SSM mixer -> its name now
    "branch_a": "key_branch",
    "branch_b": "value_branch",
    "norm_a": "key_norm",
    "norm_b": "value_norm",
    "ssm": "core",
    "c_out": "head_mix",
    "out_norm": "output_norm",
}
COMMAND = "python -m idmix.io.upgrade OLD NEW"


def _old_mixers(keys) -> set[tuple[str, ...]]:
    """The module paths of the old-layout SSM mixers among keys (parameter FQNs), recognised by
    what only they had: an ``ssm`` core, a ``branch_a`` or a ``mode_weights`` of their own."""
    found = set()
    for key in keys:
        parts = tuple(key.split("."))
        for i, part in enumerate(parts[:-1]):
            if part in ("ssm", "branch_a"):
                found.add(parts[:i])
        if parts[-1] == "mode_weights" and parts[-2:-1] != ("readout",):
            found.add(parts[:-1])
    return found


def current_names(keys) -> dict[str, str]:
    """{old key: current key} for the parameters of old-layout mixers among keys; empty for a
    current file. Another module that uses an old name as its own (an ``out_norm`` of a mixer
    without an ``ssm`` core) keeps it."""
    keys = list(keys)
    mixers = _old_mixers(keys)
    names = {}
    for key in keys:
        parts = tuple(key.split("."))
        for n in range(len(parts) - 1, -1, -1):
            if parts[:n] not in mixers:
                continue
            rest = parts[n:]
            if rest == ("mode_weights",):
                names[key] = ".".join(parts[:n] + ("readout", "mode_weights"))
            elif len(rest) > 1 and rest[0] in OLD_MODULES:
                names[key] = ".".join(parts[:n] + (OLD_MODULES[rest[0]],) + rest[1:])
            break
    clash = sorted(set(names.values()) & (set(keys) - set(names)))
    if clash:
        raise ValueError(f"the file holds both old and current names (e.g. {clash[0]!r})")
    return names


def refuse_old_layout(keys, source: str) -> None:
    """ValueError naming the conversion command when keys hold old-layout names."""
    old = sorted(current_names(keys))
    if old:
        raise ValueError(
            f"{source} was written before the SSM mixer's parameters were renamed ({old[0]!r}, "
            f"{len(old)} in all); convert it once with `{COMMAND}` and load NEW"
        )


def renamed(obj, names: dict[str, str]):
    """obj (nested dicts/lists of state) with every key or string found in names replaced."""
    if isinstance(obj, dict):
        return {
            names.get(k, k) if isinstance(k, str) else k: renamed(v, names) for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [names.get(x, x) if isinstance(x, str) else renamed(x, names) for x in obj]
    return obj


def _is_state_dict(obj) -> bool:
    return isinstance(obj, dict) and bool(obj) and all(torch.is_tensor(v) for v in obj.values())


def upgrade_file(old: Path, new: Path) -> int:
    """A torch.save file (read with weights_only=True) written again with every state dict in it
    (the file itself, or one level down: an export's ``model``) under current names; returns how
    many keys moved."""
    from .checkpoint import safe_load

    saved = safe_load(old)
    moved = 0
    parts = {None: saved} if _is_state_dict(saved) else saved if isinstance(saved, dict) else {}
    for field, state in parts.items():
        if _is_state_dict(state):
            names = current_names(state)
            moved += len(names)
            state = renamed(state, names)
            if field is None:
                saved = state
            else:
                saved[field] = state
    torch.save(saved, new)
    return moved


def _nested(metadata) -> dict:
    """An empty state of a DCP checkpoint's layout: tensors of the stored shapes and dtypes,
    None for byte items (the loader fills both), nested as it was saved."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    root: dict = {}
    for key, path in metadata.planner_data.items():
        node = root
        for part in path[:-1]:
            node = node.setdefault(part, {})
        item = metadata.state_dict_metadata[key]
        node[path[-1]] = (
            torch.empty(item.size, dtype=item.properties.dtype)
            if isinstance(item, TensorStorageMetadata)
            else None
        )
    return _lists(root)


def _lists(node):
    """Dicts keyed 0..n-1 (saved lists: the optimiser's param_groups) back to lists."""
    if not isinstance(node, dict):
        return node
    node = {k: _lists(v) for k, v in node.items()}
    if node and all(isinstance(k, int) for k in node) and sorted(node) == list(range(len(node))):
        return [node[i] for i in range(len(node))]
    return node


def upgrade_checkpoint(old: Path, new: Path) -> int:
    """A DCP checkpoint directory (model + optimiser, its manifest verified) written again under
    current names at new, with its extra files and a new manifest; returns how many keys moved."""
    import torch.distributed.checkpoint as dcp

    from . import manifest
    from .checkpoint import _single_process_notice_dropped, safe_load
    from .dcp_reader import RestrictedReader, TensorsOnlyPlanner, read_dcp_metadata

    found = manifest.verify(old)
    extra_files = sorted(old.glob("extra_rank*.pt"))
    if found is None:  # written before manifests: the run id and step are in the extra state
        extra = safe_load(old / "extra_rank0.pt")
        found = {"run_id": extra.get("run_id", old.parent.parent.name), "step": extra["step"]}
    state = _nested(read_dcp_metadata(old))
    with _single_process_notice_dropped():
        dcp.load(state, storage_reader=RestrictedReader(str(old)), planner=TensorsOnlyPlanner())
    names = current_names(state.get("model", {}))
    new.mkdir(parents=True)
    with _single_process_notice_dropped():
        dcp.save(renamed(state, names), checkpoint_id=str(new))
    for path in extra_files:
        shutil.copy2(path, new / path.name)
    manifest.write_manifest(new, found["run_id"], found["step"])
    return len(names)


def upgrade_run(old: Path, new: Path) -> int:
    """Every checkpoint directory and ``.pt`` file under old converted into the same place under
    new, every other file copied; links refused. Returns how many keys moved in all."""
    moved = 0
    new.mkdir(parents=True)
    for entry in sorted(old.iterdir()):
        target = new / entry.name
        if entry.is_symlink():
            raise ValueError(
                f"{str(entry)!r} is a symbolic link; a run is copied only from "
                "plain files inside it"
            )
        if entry.is_dir():
            is_checkpoint = (entry / ".metadata").is_file()
            moved += (upgrade_checkpoint if is_checkpoint else upgrade_run)(entry, target)
        elif not entry.is_file():
            raise ValueError(f"{str(entry)!r} is not a regular file or directory; not copied")
        elif entry.suffix == ".pt":
            moved += upgrade_file(entry, target)
        else:
            shutil.copy2(entry, target)
    return moved


def upgrade(old, new) -> int:
    """OLD (a file, a checkpoint or a run directory) converted to NEW, which must not exist;
    written beside NEW first and renamed into place, so NEW is complete or absent. Returns how
    many parameter keys (counted once per file) moved."""
    old, new = Path(old), Path(os.path.abspath(new))
    if not old.exists() or old.is_symlink():
        raise ValueError(f"OLD: no such file or directory (or a link): {str(old)!r}")
    if new.exists() or new.is_symlink():
        raise ValueError(f"NEW: {str(new)!r} exists; nothing a user saved is replaced")
    tmp = new.with_name(f".{new.name}.upgrade-{os.getpid()}")
    try:
        if old.is_file():
            moved = upgrade_file(old, tmp)
        elif (old / ".metadata").is_file():
            moved = upgrade_checkpoint(old, tmp)
        else:
            moved = upgrade_run(old, tmp)
        os.replace(tmp, new)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp)
        elif tmp.exists():
            tmp.unlink()
    return moved


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m idmix.io.upgrade", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("old", help="a model_final.pt or state-dict file, a checkpoint or a run")
    parser.add_argument("new", help="where the converted copy goes (must not exist)")
    args = parser.parse_args(argv)
    try:
        moved = upgrade(args.old, args.new)
    except ValueError as e:
        sys.exit(f"error: {e}")
    print(f"{args.new}: written, {moved} parameter names moved to the current layout")


if __name__ == "__main__":
    main()
