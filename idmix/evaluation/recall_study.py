"""The recall study behind ``recipes/train_recall.py`` (its docstring and docs/evaluation.md
say what it measures): the config's checks, a small model trained per mixer and learning rate on the
probes of ``recall.py``, the rate kept on a validation draw, exact match on a test draw, and the
report (``recall.md``, ``recall.png``). Each (mixer, rate) is kept as a record (``records.py``) in
``output_dir/runs/`` and ``records_dir`` when set, and reused from there."""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from torchtune import config
from tqdm import tqdm

from ..io.config_checks import (
    boolean,
    check_components,
    check_keys,
    integer,
    number,
    numbers,
    one_of,
)
from ..models.state_size import recurrent_state_floats
from ..training.optim import param_groups, warmup_cosine
from ..training.plots import line_plot
from . import recall
from .records import read_record, record_homes, write_record
from .report import markdown_table

KEYS = {
    "model", "mixers", "vocab_size", "train", "evaluate", "batch_size", "steps", "lrs",
    "warmup_steps", "weight_decay", "ssm_lr_cap", "eval_examples", "seed", "device",
    "output_dir", "overwrite", "records_dir",
}  # fmt: skip
OPTIONAL_KEYS = {"records_dir"}  # a second home for every run's record (e.g. kept in git)
NOT_RUN_SETTINGS = {"output_dir", "overwrite", "records_dir", "mixers", "lrs"}
RESULTS = ("recall.md", "recall.json", "recall.png")
SIZED = ("mqar", "phonebook")  # passkey's difficulty is its seq_len
LABELS = {"mqar": "MQAR", "phonebook": "phonebook", "passkey": "passkey"}
X_AXIS = {"mqar": "key-value pairs", "phonebook": "entries", "passkey": "context length"}


def _setting(entry, where: str, sized_as: type) -> tuple[str, int, object]:
    """(task, seq_len, size) of one `train`/`evaluate` entry, checked."""
    check_keys(entry, ("task", "seq_len", "size"), where)
    task = one_of(entry, "task", recall.TASKS, where=f"{where}.")
    seq_len = integer(entry, "seq_len", 16, where=f"{where}.")
    if task not in SIZED:
        return task, seq_len, None
    if sized_as is not list:
        return task, seq_len, integer(entry, "size", 1, where=f"{where}.")
    size = entry.get("size")
    size = list(size) if isinstance(size, ListConfig) else size
    if not _is_range(size):
        raise ValueError(f"{where}.size: expected [lo, hi] with 1 ≤ lo ≤ hi, got {size!r}")
    return task, seq_len, tuple(size)


def _is_range(size) -> bool:
    return (
        isinstance(size, list)
        and len(size) == 2
        and all(isinstance(n, int) for n in size)
        and 1 <= size[0] <= size[1]
    )


def settings(cfg) -> tuple[list, list]:
    """The checked `train` and `evaluate` settings."""
    for key in ("train", "evaluate"):
        if not cfg.get(key):
            raise ValueError(f"config: {key}: expected a non-empty list of settings")
    train = [_setting(e, f"train[{i}]", list) for i, e in enumerate(cfg.train)]
    evaluate = [_setting(e, f"evaluate[{i}]", int) for i, e in enumerate(cfg.evaluate)]
    return train, evaluate


def check(cfg, model, train, evaluate) -> None:
    if model.output.out_features < cfg.vocab_size:
        raise ValueError(
            f"model: vocab_size {model.output.out_features} < the probes' vocab_size "
            f"{cfg.vocab_size}"
        )
    for i, (task, seq_len, size) in enumerate(train):
        if task == "mqar" and 4 * size[1] > seq_len + 1:
            raise ValueError(f"train[{i}]: {size[1]} pairs need {4 * size[1]} tokens > seq_len")
    for task, seq_len, _ in train + evaluate:
        if seq_len > model.max_seq_len:
            raise ValueError(f"{task}: seq_len {seq_len} > the model's max_seq_len")


def label(task: str, seq_len: int, size) -> str:
    return str(seq_len) if size is None else f"{size}@{seq_len}"


def train(model, cfg, lr: float, train_settings, g, pick: random.Random, desc: str) -> float:
    """cfg.steps AdamW steps cycling through the settings; returns the mean loss of the last
    10% of steps."""
    optimizer = torch.optim.AdamW(param_groups(model, lr, cfg.weight_decay, cfg.ssm_lr_cap))
    scheduler = warmup_cosine(optimizer, cfg.warmup_steps, cfg.steps, lr / 10)
    losses, tokens, t0 = [], 0, time.perf_counter()
    bar = tqdm(range(cfg.steps), desc=desc)
    for step in bar:
        task, seq_len, size = train_settings[step % len(train_settings)]
        n = pick.randint(*size) if size else 0
        batch = recall.make_batch(task, cfg.batch_size, seq_len, n, g, cfg.vocab_size)
        loss = recall.answer_loss(model, batch, cfg.device)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        tokens += batch.inputs.numel()
        tok_s = tokens / (time.perf_counter() - t0)
        bar.set_postfix(loss=f"{loss.item():.3f}", task=task, tok_s=f"{tok_s:.0f}")
    tail = losses[-max(1, len(losses) // 10) :]
    return sum(tail) / len(tail)


@torch.no_grad()
def evaluate(model, cfg, eval_settings, seed: int) -> dict[str, dict[str, float]]:
    """{task: {label: exact match}} on eval_examples rows per setting, drawn from seed."""
    model.eval()
    g = torch.Generator().manual_seed(seed)
    scores: dict[str, dict[str, float]] = {}
    for task, seq_len, size in eval_settings:
        batch = recall.make_batch(task, cfg.eval_examples, seq_len, size or 0, g, cfg.vocab_size)
        logits = model(batch.inputs.to(cfg.device)).cpu()
        scores.setdefault(task, {})[label(task, seq_len, size)] = recall.exact_match(logits, batch)
    model.train()
    return scores


def _mean(scores: dict[str, dict[str, float]]) -> float:
    return statistics.fmean(v for s in scores.values() for v in s.values())


def mixer_entries(cfg) -> dict[str, dict]:
    """{mixer name: its own model options} of the `mixers` list, whose entries are a registered
    name or a one-key mapping {name: {option: value}} (e.g. ``{gla: {value_dim: 128}}``, to match
    a baseline's state to the others'); checked."""
    entries = {}
    for i, entry in enumerate(cfg.get("mixers") or []):
        if isinstance(entry, str):
            name, options = entry, {}
        elif isinstance(entry, DictConfig) and len(entry) == 1:
            name, options = next(iter(entry.items()))
            if not isinstance(options, DictConfig):
                raise ValueError(f"mixers[{i}].{name}: expected a mapping of model options")
            options = OmegaConf.to_container(options, resolve=True)
        else:
            raise ValueError(
                f"mixers[{i}]: expected a mixer name or {{name: {{options}}}}, got {entry!r}"
            )
        if name in entries:
            raise ValueError(f"mixers[{i}]: {name!r} is listed twice")
        entries[name] = options
    if not entries:
        raise ValueError("config: mixers: expected a non-empty list of mixer names")
    return entries


def sweep(cfg, out: Path, mixer: str, options: dict, train_settings, eval_settings) -> dict:
    """`mixer` (with its model `options`) at every lr, each trained or read from its record;
    keeps the best on the validation draw and reports its test draw."""
    runs = {lr: _recorded_run(cfg, out, mixer, options, lr, train_settings, eval_settings)
            for lr in cfg.lrs}  # fmt: skip
    best = max(runs, key=lambda lr: (runs[lr]["val"], -runs[lr]["loss"]))
    return {
        "lr": best,
        "options": options,
        "parameters": runs[best]["parameters"],
        "state_floats": runs[best]["state_floats"],
        "final_train_loss": runs[best]["loss"],
        "sweep": {str(lr): {"val": r["val"], "loss": r["loss"]} for lr, r in runs.items()},
        "scores": runs[best]["scores"],
    }


def _recorded_run(cfg, out: Path, mixer, options, lr, train_settings, eval_settings) -> dict:
    """One (mixer, rate): its record ({loss, val, scores on the test draw, parameters,
    state_floats, config}) read back when one holds the same run, else trained and kept."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    run_config = {k: v for k, v in plain.items() if k not in NOT_RUN_SETTINGS}
    run_config.update(mixer=mixer, options=options, lr=lr)
    where = Path("".join([mixer, *(f"_{k}-{v}" for k, v in sorted(options.items()))]), f"lr{lr:g}")
    homes = record_homes(out / "runs", cfg.get("records_dir"), where)
    record = read_record(homes, run_config, cfg.overwrite)
    if record is not None:
        return record
    torch.manual_seed(cfg.seed)
    model = config.instantiate(cfg.model, mixer=mixer, **options).to(cfg.device)
    check(cfg, model, train_settings, eval_settings)
    g = torch.Generator().manual_seed(cfg.seed)
    loss = train(model, cfg, lr, train_settings, g, random.Random(cfg.seed), f"{mixer} {lr:g}")
    record = {
        "loss": loss,
        "val": _mean(evaluate(model, cfg, eval_settings, cfg.seed + 2)),
        "scores": evaluate(model, cfg, eval_settings, cfg.seed + 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "state_floats": recurrent_state_floats(model),
        "config": run_config,
    }
    write_record(homes, record)
    return record


def report(cfg, results: dict, eval_settings) -> str:
    table = (
        f"Exact-match accuracy on {cfg.eval_examples} test rows per cell (size@seq_len), "
        f"{cfg.steps} training steps, probe vocabulary {cfg.vocab_size}; each mixer at the "
        "learning rate with the best mean exact match on a separate validation draw.\n\n"
        + markdown_table(
            ["mixer", "model options", "parameters", "state floats per layer"],
            [
                [m, r["options"] or "–", r["parameters"], _state(r["state_floats"])]
                for m, r in results.items()
            ],
        )
    )
    for task in dict.fromkeys(t for t, _, _ in eval_settings):
        cells = list(next(iter(results.values()))["scores"][task])
        rows = [[m, r["lr"], *(r["scores"][task][c] for c in cells)] for m, r in results.items()]
        table += f"\n{LABELS[task]}\n\n" + markdown_table(["mixer", "lr", *cells], rows)
    rates = list(next(iter(results.values()))["sweep"])
    rows = [
        [m, *(f"{r['sweep'][lr]['val']:.3f} ({r['sweep'][lr]['loss']:.3f})" for lr in rates)]
        for m, r in results.items()
    ]
    table += (
        "\nSweep: mean validation exact match (final training loss) by learning rate\n\n"
        + markdown_table(["mixer", *rates], rows)
    )
    return table


def _state(per_layer: list) -> str:
    """A model's per-layer state floats, e.g. "16,384 ×2" or "8,192 / KV"."""
    parts = ["KV" if n is None else f"{n:,}" for n in per_layer]
    return f"{parts[0]} ×{len(parts)}" if len(set(parts)) == 1 else " / ".join(parts)


def plot(cfg, results: dict, eval_settings, out) -> None:
    panels = {}
    for task, seq_len, size in eval_settings:
        x = seq_len if size is None else size
        for mixer, r in results.items():
            xs, ys = panels.setdefault(LABELS[task], {}).setdefault(
                f"{mixer} (lr {r['lr']:g})", ([], [])
            )
            xs.append(x)
            ys.append(r["scores"][task][label(task, seq_len, size)])
    line_plot(
        panels,
        out / "recall.png",
        title=f"Recall probes ({cfg.steps} steps, vocabulary {cfg.vocab_size})",
        xlabel={LABELS[t]: X_AXIS[t] for t in recall.TASKS},
        ylabel="exact match",
        logx=True,
    )


def check_config(cfg) -> tuple[list, list]:
    """Every key and number of the config, before anything runs; returns the checked `train`
    and `evaluate` settings."""
    check_keys(cfg, KEYS)
    boolean(cfg, "overwrite")
    check_components(cfg)
    mixer_entries(cfg)
    train_settings, eval_settings = settings(cfg)
    numbers(cfg, "lrs", 0, low_open=True, expected="a list of positive rates")
    for key in ("batch_size", "steps", "eval_examples"):
        integer(cfg, key, 1)
    integer(cfg, "warmup_steps", 0)
    integer(cfg, "seed", 0)
    number(cfg, "weight_decay", 0)
    number(cfg, "ssm_lr_cap", 0, low_open=True)
    recall.Vocabulary(cfg.vocab_size)  # checks it
    return train_settings, eval_settings
