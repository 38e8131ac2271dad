"""What the training loop tells the outside world, as callbacks: the progress bar and the metric
loggers are two; a caller adds its own (``Trainer(cfg, callbacks=[…])``, or the config's
``callbacks:`` list of ``_component_`` nodes; the kill-9 tests install one that SIGKILLs the
process at a chosen moment: ``tests/faults.py``).

Events, in the order a step fires them (every method is optional; the base class's do nothing):

- ``on_train_start(trainer)``: after set-up (and any resume), before the first step;
- ``on_after_backward(trainer, step)``: step's gradients are accumulated, the optimizer has not
  stepped (``trainer.step`` is still step - 1);
- ``on_step_end(trainer, record)``: the step's record (loss, lr, grad_norm, tokens/s, elapsed,
  validation when due) is in ``trainer.history``;
- ``on_checkpoint(trainer, stage, step)`` while checkpoint step is saved, at each stage of
  ``checkpoint.STAGES`` (``"shards_written"`` on every rank; ``"complete"`` and ``"renamed"``
  on rank 0);
- ``on_train_end(trainer)``: the last step of this run is done (its final checkpoint, results
  and summary follow);
- ``close()``: always, at clean-up (also after an error).
"""

from __future__ import annotations

import sys

from tqdm import tqdm


class Callback:
    def on_train_start(self, trainer) -> None:
        pass

    def on_after_backward(self, trainer, step: int) -> None:
        pass

    def on_step_end(self, trainer, record: dict) -> None:
        pass

    def on_checkpoint(self, trainer, stage: str, step: int) -> None:
        pass

    def on_train_end(self, trainer) -> None:
        pass

    def close(self) -> None:
        pass


class ProgressBar(Callback):
    """tqdm on rank 0: loss, tokens/s and lr of the last step."""

    def __init__(self):
        self.bar = None

    def on_train_start(self, trainer) -> None:
        self.bar = tqdm(
            total=trainer.total_steps, initial=trainer.step, disable=trainer.rank != 0,
            unit="step", dynamic_ncols=True, file=sys.stdout,
        )  # fmt: skip

    def on_step_end(self, trainer, record: dict) -> None:
        self.bar.set_postfix(
            loss=f"{record['loss']:.3f}",
            tok_s=f"{record['tokens_per_s']:.0f}",
            lr=f"{record['lr']:.2e}",
        )
        self.bar.update(1)

    def on_train_end(self, trainer) -> None:
        self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class MetricLoggers(Callback):
    """torchtune metric loggers (``metric_loggers`` in the config) on rank 0: every
    ``every``-th step's record, and every record with a validation loss."""

    def __init__(self, loggers: list, every: int):
        self.loggers, self.every = loggers, every

    def on_step_end(self, trainer, record: dict) -> None:
        if (self.every and trainer.step % self.every == 0) or "val_loss" in record:
            for logger in self.loggers:
                logger.log_dict(record, step=trainer.step)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
        self.loggers = []
