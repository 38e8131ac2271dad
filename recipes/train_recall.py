"""Train small models of each mixer on the synthetic recall probes, then measure them.

    tune run recipes/train_recall.py --config recipes/configs/recall_tiny.yaml

Training cycles through train_tasks (MQAR, phonebook, passkey) at seq_len, one task per step
at a random size.
Evaluation (exact match, teacher-forced argmax ⇔ greedy): MQAR by number of pairs, phonebook
by list size, passkey by context length (beyond seq_len: extrapolation). Writes
recall.{md,json,png} to output_dir.
"""

from __future__ import annotations

import random
import sys
import time

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torchtune import config
from tqdm import tqdm

from idmix.evaluation import recall
from idmix.evaluation.report import markdown_table
from idmix.training.files import atomic_write_json, atomic_write_text
from idmix.training.optim import param_groups, warmup_cosine
from idmix.training.plots import line_plot
from recipes._common import check_keys, fresh_outputs

KEYS = {
    "model", "mixers", "train_tasks", "seq_len", "batch_size", "steps", "lr", "warmup_steps",
    "weight_decay", "ssm_lr_cap", "train_mqar_pairs", "train_phonebook_entries", "eval_mqar_pairs",
    "eval_phonebook_entries", "eval_passkey_lengths", "eval_examples", "seed", "device",
    "output_dir", "overwrite",
}  # fmt: skip
RESULTS = ("recall.md", "recall.json", "recall.png")
PHONEBOOK_ENTRY = 6  # name (2) + number (3) + SEP


def eval_points(cfg) -> list[tuple[str, int, int]]:
    """(task, size, seq_len) of every measurement; phonebook rows grow with the list."""
    points = [("mqar", n, cfg.seq_len) for n in cfg.eval_mqar_pairs]
    for n in cfg.eval_phonebook_entries:
        need = n * PHONEBOOK_ENTRY + 8
        points.append(("phonebook", n, max(cfg.seq_len, -(-need // 64) * 64)))
    points += [("passkey", L, L) for L in cfg.eval_passkey_lengths]
    return points


def check(cfg, model) -> None:
    if model.output.out_features < recall.VOCAB_SIZE:
        raise ValueError(f"model: vocab_size must be ≥ {recall.VOCAB_SIZE} (the probes' tokens)")
    if 4 * max(cfg.train_mqar_pairs) > cfg.seq_len:
        raise ValueError(f"train_mqar_pairs: {max(cfg.train_mqar_pairs)} pairs need 4× tokens")
    for task, size, seq_len in eval_points(cfg):
        if seq_len > model.max_seq_len:
            raise ValueError(f"{task} at {size}: {seq_len} tokens > max_seq_len")


def train(model, cfg, g: torch.Generator, pick: random.Random, desc: str) -> float:
    """cfg.steps AdamW steps on mixed tasks; returns the mean loss of the last 10% of steps."""
    optimizer = torch.optim.AdamW(param_groups(model, cfg.lr, cfg.weight_decay, cfg.ssm_lr_cap))
    scheduler = warmup_cosine(optimizer, cfg.warmup_steps, cfg.steps, cfg.lr / 10)
    sizes = {"mqar": cfg.train_mqar_pairs, "phonebook": cfg.train_phonebook_entries}
    losses, t0 = [], time.perf_counter()
    bar = tqdm(range(cfg.steps), desc=desc)
    for step in bar:
        task = cfg.train_tasks[step % len(cfg.train_tasks)]
        lo, hi = sizes.get(task, (0, 0))
        batch = recall.make_batch(task, cfg.batch_size, cfg.seq_len, pick.randint(lo, hi), g)
        logits = model(batch.inputs.to(cfg.device))
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.flatten().to(cfg.device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        tok_s = (step + 1) * cfg.batch_size * cfg.seq_len / (time.perf_counter() - t0)
        bar.set_postfix(loss=f"{loss.item():.3f}", task=task, tok_s=f"{tok_s:.0f}")
    tail = losses[-max(1, len(losses) // 10) :]
    return sum(tail) / len(tail)


@torch.no_grad()
def evaluate(model, cfg, g: torch.Generator) -> dict[str, dict[int, float]]:
    model.eval()
    scores: dict[str, dict[int, float]] = {t: {} for t in recall.TASKS}
    for task, size, seq_len in eval_points(cfg):
        batch = recall.make_batch(task, cfg.eval_examples, seq_len, size, g)
        logits = model(batch.inputs.to(cfg.device)).cpu()
        scores[task][size] = recall.exact_match(logits, batch)
    model.train()
    return scores


@config.parse
def main(cfg: DictConfig) -> None:
    check_keys(cfg, KEYS)
    if not cfg.train_tasks or set(cfg.train_tasks) - set(recall.TASKS):
        raise ValueError(f"config: train_tasks: expected a list from {recall.TASKS}")
    out = fresh_outputs(cfg.output_dir, RESULTS, cfg.overwrite)
    results = {}
    for mixer in cfg.mixers:
        torch.manual_seed(cfg.seed)
        model = config.instantiate(cfg.model, mixer=mixer).to(cfg.device)
        check(cfg, model)
        g = torch.Generator().manual_seed(cfg.seed)
        loss = train(model, cfg, g, random.Random(cfg.seed), desc=f"train {mixer}")
        scores = evaluate(model, cfg, torch.Generator().manual_seed(cfg.seed + 1))
        results[mixer] = {"final_train_loss": loss, **scores}
    labels = {
        "mqar": "MQAR (pairs)",
        "phonebook": "phonebook (entries)",
        "passkey": "passkey (context length)",
    }
    table = (
        f"Exact-match accuracy, {cfg.eval_examples} examples per cell; trained {cfg.steps} steps "
        f"at seq_len {cfg.seq_len} (final train loss: "
        + ", ".join(f"{m} {r['final_train_loss']:.3f}" for m, r in results.items())
        + ")\n"
    )
    for task in recall.TASKS:
        sizes = list(next(iter(results.values()))[task])
        rows = [[m, *(r[task][s] for s in sizes)] for m, r in results.items()]
        table += f"\n{labels[task]}\n\n" + markdown_table(["mixer", *map(str, sizes)], rows)
    atomic_write_text(out / "recall.md", table)
    atomic_write_json(out / "recall.json", results)
    labels = {
        "mqar": "MQAR (pairs)",
        "phonebook": "phonebook (entries)",
        "passkey": "passkey (context)",
    }
    line_plot(
        {
            labels[t]: {m: (list(r[t]), list(r[t].values())) for m, r in results.items()}
            for t in recall.TASKS
        },
        out / "recall.png",
        title=f"Recall probes (trained at {cfg.seq_len} tokens)",
        xlabel="size",
        ylabel="exact match",
        logx=True,
    )
    print(table)
    print(f"results: {', '.join(str(out / n) for n in RESULTS)}")


if __name__ == "__main__":
    sys.exit(main())
