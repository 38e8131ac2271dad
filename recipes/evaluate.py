"""Evaluate a checkpoint with lm-evaluation-harness.

    tune run recipes/evaluate.py --config recipes/configs/eval_tiny.yaml [key=value …]

The model is ``idmix.evaluation.lm_eval_model.IdmixLM`` (lm-eval name ``idmix``) on a
``model_final.pt`` export. Tasks come from lm-eval's registry or from ``include_path`` (the
offline Shakespeare tasks in ``recipes/eval_tasks``); ``perplexity_dataset`` (any dataset
component, e.g. ``idmix.io.corpus.text_corpus`` on your own files) adds the task
``corpus_perplexity``: lm-eval's rolling perplexity over its documents. Writes
``results.json`` (lm-eval's output) and ``results.md`` (lm-eval's table, then one headline
metric per task and their mean, the paper's Table 7 layout) to output_dir.
"""

from __future__ import annotations

import json
import sys

import torch
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager
from lm_eval.utils import handle_non_serializable, make_table
from omegaconf import DictConfig, OmegaConf
from torchtune import config

from idmix.evaluation.lm_eval_model import IdmixLM
from idmix.evaluation.lm_eval_tasks import CORPUS_TASK, corpus_task, headline
from idmix.evaluation.report import markdown_table
from idmix.io.checkpoint import load_exported_model
from idmix.io.config_checks import boolean, check_components, check_keys
from idmix.io.files import atomic_write_text
from idmix.training.outputs import fresh_outputs

KEYS = {
    "checkpoint", "tokenizer", "tasks", "include_path", "num_fewshot", "limit", "batch_size",
    "max_length", "device", "seed", "output_dir", "overwrite", "headline_metrics",
    "perplexity_dataset",
}  # fmt: skip
RESULTS = ("results.json", "results.md")


@config.parse
def main(cfg: DictConfig) -> None:
    check_keys(cfg, KEYS)
    boolean(cfg, "overwrite")
    check_components(cfg)
    extra = cfg.get("perplexity_dataset")
    if not cfg.tasks and not extra:
        raise ValueError(
            "config: tasks: expected a non-empty list of lm-eval task names (or a "
            "perplexity_dataset)"
        )
    out = fresh_outputs(cfg.output_dir, RESULTS, cfg.overwrite)
    torch.manual_seed(cfg.seed)
    model = load_exported_model(cfg.checkpoint, cfg.device)
    lm = IdmixLM(model, config.instantiate(cfg.tokenizer), cfg.batch_size, cfg.max_length)
    tasks = list(cfg.tasks or [])
    specs = tasks + ([corpus_task(extra, cfg.limit)] if extra else [])
    tasks += [CORPUS_TASK] if extra else []
    results = simple_evaluate(
        model=lm,
        tasks=specs,
        num_fewshot=cfg.num_fewshot,
        limit=cfg.limit,
        task_manager=TaskManager(include_path=cfg.include_path),
        log_samples=False,
        random_seed=cfg.seed,
        numpy_random_seed=cfg.seed,
        torch_random_seed=cfg.seed,
        fewshot_random_seed=cfg.seed,
    )
    metrics = OmegaConf.to_container(cfg.headline_metrics) if cfg.headline_metrics else {}
    rows = headline(results["results"], tasks, metrics)
    accuracies = [v for _, m, v in rows if m in ("acc", "acc_norm", "exact_match")]
    if accuracies:
        rows.append(("mean of accuracies", "", sum(accuracies) / len(accuracies)))
    table = make_table(results) + "\n" + markdown_table(("task", "metric", "value"), rows)
    text = json.dumps(results, indent=1, default=handle_non_serializable)
    atomic_write_text(out / "results.json", text)
    atomic_write_text(out / "results.md", table)
    print(table)
    print(f"results: {out / 'results.json'}, {out / 'results.md'}")


if __name__ == "__main__":
    sys.exit(main())
