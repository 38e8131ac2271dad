"""A study's finished runs kept as small JSON records (``record.json``: what the report needs of
a run, and the config it ran with), so a study resumes from its records alone, on another
machine, without checkpoints (``records_dir`` in the compare and recall configs)."""

from __future__ import annotations

import json
from pathlib import Path

from ..io.files import atomic_write_json


def record_homes(runs: Path, records_dir: str | None, where: Path) -> list[Path]:
    """Where one run's record lives: records_dir/where (read first) when set, and
    runs/where, beside its checkpoints."""
    homes = [runs / where / "record.json"]
    return [Path(records_dir) / where / "record.json", *homes] if records_dir else homes


def read_record(homes: list[Path], run_config: dict, overwrite: bool) -> dict | None:
    """The first record among homes that holds the run with run_config (plain data), or None.
    A record of another config is an error unless overwrite (the run then trains again and
    replaces it)."""
    for path in homes:
        if not path.is_file():
            continue
        record = json.loads(path.read_text())
        if record.get("config") == run_config:
            print(f"reusing the recorded run {path}", flush=True)
            return record
        if not overwrite:
            raise ValueError(
                f"config: {str(path)!r} records a run with another config; pass "
                "overwrite=True to train it again or choose another records_dir/output_dir"
            )
    return None


def write_record(homes: list[Path], record: dict) -> None:
    """record (with its "config") into every home, atomically."""
    for path in homes:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, record)
