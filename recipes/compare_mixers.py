"""Compare token mixers at one token budget: the paper's Tables 2 and 4 at CPU scale.

    tune run recipes/compare_mixers.py --config recipes/configs/compare_tiny.yaml

Every mixer entry is trained by the pretraining trainer (``idmix.training.trainer``, what
``recipes/pretrain_interdomain.py`` runs; in this process) on the same data, tokenizer, budget
and seeds; only ``model`` and the peak learning rate differ. An entry with several learning
rates (``lrs``) is swept on the first seed and the rate with the lowest *training* loss over the
last tenth of the steps is kept for every seed (the validation split is never used to choose).
Each finished model is then scored on the same validation tokens at 1×…k× the training length,
and its mixers are probed (output RMS by position, SSM gradient sizes). Writes to
``output_dir``:

- ``compare.md`` / ``compare.json``: per mixer, parameters, val perplexity mean ± spread over
  seeds, perplexity by context length and its k×/1× ratio, ratio to the reference mixer;
- ``compare_curves.png``: validation loss against training tokens and against wall-clock;
- ``compare_context.png``: perplexity against evaluation context length;
- ``runs/<mixer>/lr<lr>/seed<seed>/``: each run's own directory (checkpoints, history, and
  ``record.json``: its parameters, tail training loss, validation points, scores and config).

Runs already finished in ``output_dir`` with the same config are reused, unfinished ones are
resumed, so an interrupted study continues where it stopped. With ``records_dir`` every record
is also written to ``records_dir/<mixer>/lr<lr>/seed<seed>/record.json`` and read from there
first: a folder kept in git carries a long study across machines without its checkpoints.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig
from torchtune import config

from idmix.evaluation.compare import KEYS, OPTIONAL_KEYS, RESULTS, check_config, study
from idmix.evaluation.compare_report import write_report
from idmix.training.outputs import fresh_outputs

__all__ = ["KEYS", "OPTIONAL_KEYS", "main"]


@config.parse
def main(cfg: DictConfig) -> None:
    check_config(cfg)
    out = fresh_outputs(cfg.output_dir, RESULTS, cfg.overwrite)
    results = study(cfg, out)
    print(write_report(cfg, results, out))
    print(f"results: {', '.join(str(out / n) for n in RESULTS)}")


if __name__ == "__main__":
    sys.exit(main())
