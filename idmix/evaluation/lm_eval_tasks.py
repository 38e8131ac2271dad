"""lm-evaluation-harness pieces of ``recipes/evaluate.py``: the task ``corpus_perplexity``
(rolling perplexity over any dataset component's documents) and the headline metric per task
(the paper's Table 7 layout)."""

from __future__ import annotations

import itertools

import datasets
from torchtune import config

CORPUS_TASK = "corpus_perplexity"


def headline(results: dict, tasks: list[str], metrics: dict) -> list[tuple[str, str, float]]:
    """(task, metric, value) for each task: metrics[task] if given, else the first of acc,
    exact_match, word_perplexity that the task reports."""
    rows = []
    for task in tasks:
        found = results.get(task, {})
        for metric in (metrics.get(task), "acc", "exact_match", "word_perplexity"):
            key = next((k for k in found if metric and k.split(",")[0] == metric), None)
            if key is not None:
                rows.append((task, metric, float(found[key])))
                break
    return rows


def corpus_task(dataset_cfg, limit: int | None) -> dict:
    """An lm-eval task config: rolling perplexity (word, byte, bits per byte) over the
    documents of a dataset component (its first `limit` when given, e.g. for a stream)."""
    ds = config.instantiate(dataset_cfg)
    texts = [row["text"] for row in itertools.islice(ds, limit)]
    if not texts:
        raise ValueError("perplexity_dataset: expected documents, got an empty dataset")
    docs = datasets.DatasetDict({"test": datasets.Dataset.from_dict({"text": texts})})
    return {
        "task": CORPUS_TASK,
        "custom_dataset": lambda **_: docs,
        "test_split": "test",
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": "{{text}}",
        "should_decontaminate": False,
        "metric_list": [
            {"metric": m} for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")
        ],
        "metadata": {"version": 1.0},
    }
