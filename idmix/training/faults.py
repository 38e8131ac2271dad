"""Crash injection for the kill-9 resume tests: with IDMIX_KILL_AT="<point>@<step>" in the
environment, the process SIGKILLs itself at that point of that step (no cleanup, no flush: as a
node failure would). Unset, it costs one dictionary lookup."""

from __future__ import annotations

import os
import signal

ENV = "IDMIX_KILL_AT"
# mid_step: after backward, before the optimizer step; mid_checkpoint: shards written, the
# per-rank extra state not yet; before_rename: the checkpoint complete under its temporary name;
# before_pointer: renamed, `latest` not yet updated.
POINTS = ("mid_step", "mid_checkpoint", "before_rename", "before_pointer")


def kill_point(point: str, step: int) -> None:
    if os.environ.get(ENV) == f"{point}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)
