"""Crash injection for the kill-9 resume tests (test-only; nothing in idmix/ or recipes/ knows
about it): a trainer callback that SIGKILLs its own process at one moment of one step (no
clean-up, no flush: as a node failure would), and a runner that runs a recipe file exactly as
``tune run`` does with that callback installed.

    python tests/faults.py mid_step@3 recipes/pretrain_interdomain.py --config … [key=value …]

The runner wraps ``idmix.training.trainer.train`` so that the recipe's own call passes the
callback, then runs the recipe file as ``__main__`` (``runpy.run_path``, as ``tune run`` runs a
built-in recipe).
"""

from __future__ import annotations

import functools
import os
import runpy
import signal
import sys

from idmix.training import trainer
from idmix.training.callbacks import Callback

# point -> where it fires: mid_step after backward, before the optimizer step; the others at a
# stage of checkpoint.save_checkpoint: mid_checkpoint, the shards written but the per-rank extra
# state not yet; before_rename, the checkpoint complete under its temporary name;
# before_pointer, renamed, `latest` not yet updated.
POINTS = {
    "mid_step": "after_backward",
    "mid_checkpoint": "shards_written",
    "before_rename": "complete",
    "before_pointer": "renamed",
}


class KillAt(Callback):
    """SIGKILL this process at ``"<point>@<step>"`` (a point of POINTS)."""

    def __init__(self, spec: str):
        point, _, step = spec.partition("@")
        if point not in POINTS or not step.isdigit():
            raise ValueError(f"kill point: expected <one of {sorted(POINTS)}>@<step>, got {spec!r}")
        self.stage, self.step = POINTS[point], int(step)

    def _maybe_kill(self, stage: str, step: int) -> None:
        if (stage, step) == (self.stage, self.step):
            os.kill(os.getpid(), signal.SIGKILL)

    def on_after_backward(self, trainer, step: int) -> None:
        self._maybe_kill("after_backward", step)

    def on_checkpoint(self, trainer, stage: str, step: int) -> None:
        self._maybe_kill(stage, step)


def run_with_kill(spec: str, recipe: str, args: list[str]) -> None:
    """Run recipe (a file) with args as its command line, a KillAt(spec) in its trainer."""
    kill = KillAt(spec)
    original = trainer.train

    @functools.wraps(original)
    def train(cfg, callbacks=()):
        return original(cfg, [*callbacks, kill])

    trainer.train = train
    sys.argv = [recipe, *args]
    runpy.run_path(recipe, run_name="__main__")


if __name__ == "__main__":
    run_with_kill(sys.argv[1], sys.argv[2], sys.argv[3:])
