"""Train small models of each mixer on the synthetic recall probes, then measure them.

    tune run recipes/train_recall.py --config recipes/configs/recall_tiny.yaml
    tune run recipes/train_recall.py --config recipes/configs/recall_mqar.yaml

``mixers`` lists registered mixer names, or ``{name: {option: value}}`` for a mixer with its own
model options (a baseline's state matched to the others'). Training cycles through the `train`
settings (task, seq_len, size range), one per step, at a size drawn uniformly from the range.
Every mixer is trained once per learning rate in `lrs`; the rate with the best mean exact match
on a validation draw (its own generator seed) is kept, and its scores on a separate test draw
are reported (the sweep-and-report-the-best practice of MQAR benchmarks, without choosing on
the reported rows). Exact match is teacher-forced argmax,
which equals greedy decoding of the whole answer. Writes recall.{md,json,png} to output_dir, and
each (mixer, rate)'s record to ``output_dir/runs/<mixer>/lr<lr>/record.json`` (and to
``records_dir`` when set): a study stopped part-way, or moved to another machine with its
records, reuses every finished rate.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig
from torchtune import config

from idmix.evaluation.recall_study import (
    KEYS,
    OPTIONAL_KEYS,
    RESULTS,
    check_config,
    mixer_entries,
    plot,
    report,
    sweep,
)
from idmix.io.files import atomic_write_json, atomic_write_text
from idmix.training.outputs import fresh_outputs

__all__ = ["KEYS", "OPTIONAL_KEYS", "main"]


@config.parse
def main(cfg: DictConfig) -> None:
    train_settings, eval_settings = check_config(cfg)
    out = fresh_outputs(cfg.output_dir, RESULTS, cfg.overwrite)
    results = {
        name: sweep(cfg, out, name, options, train_settings, eval_settings)
        for name, options in mixer_entries(cfg).items()
    }
    table = report(cfg, results, eval_settings)
    atomic_write_text(out / "recall.md", table)
    atomic_write_json(out / "recall.json", results)
    plot(cfg, results, eval_settings, out)
    print(table)
    print(f"results: {', '.join(str(out / n) for n in RESULTS)}")


if __name__ == "__main__":
    sys.exit(main())
