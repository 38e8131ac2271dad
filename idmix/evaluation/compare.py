"""The mixer comparison behind ``recipes/compare_mixers.py`` (its docstring and docs/studies.md
say what it measures): the config's checks, one pretraining run per mixer,
learning rate and seed (``idmix.training.trainer``; a finished run with the same config is
reused, an unfinished one resumed), and each finished model's scores and diagnostics, kept as the
run's ``record.json`` (and in ``records_dir`` when set: a study spread over machines reuses its
records without the checkpoints). The report is ``compare_report.py``."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from torchtune import config

from ..io import checkpoint as ckpt
from ..io.config_checks import boolean, check_components, check_keys, integer
from ..io.model_description import read_yaml_data
from ..training.pretrain_config import check_training_section
from ..training.trainer import Trainer
from .diagnostics import output_rms_by_position, ssm_gradient_stats
from .extrapolation import perplexity_by_context, token_stream
from .records import read_record, record_homes, write_record

KEYS = {
    "output_dir", "overwrite", "device", "seeds", "tokenizer", "dataset", "validation_dataset",
    "mixers", "reference", "training", "context_multiples", "context_tokens", "eval_batch_size",
    "diagnostic_rows", "sweep", "extend_sweep", "records_dir",
}  # fmt: skip
# sweep: a list of rates the entries' lrs may interpolate (${sweep}); extend_sweep: how many
# rates an entry's sweep may add beyond its edges while its best rate sits at one (default 0);
# records_dir: a second home for every finished run's record.json (e.g. a folder kept in git)
OPTIONAL_KEYS = {"sweep", "extend_sweep", "records_dir"}
MIXER_KEYS = {"model", "lr", "lrs"}
# what this recipe sets in each run's pretraining config; `training` holds the rest
SET_PER_RUN = {
    "output_dir", "overwrite", "resume_from_checkpoint", "seed", "device", "model", "tokenizer",
    "dataset", "validation_dataset",
}  # fmt: skip
RESULTS = ("compare.md", "compare.json", "compare_curves.png", "compare_context.png")
SELECTION_TAIL = 0.1  # the last tenth of the training steps picks the learning rate


def check_config(cfg: DictConfig) -> None:
    check_keys(cfg, KEYS)
    boolean(cfg, "overwrite")
    check_components(cfg)
    check_training_section(cfg.training, SET_PER_RUN, "config.training")
    if not cfg.mixers:
        raise ValueError("config: mixers: expected at least one entry name -> {model, lr}")
    for name, entry in cfg.mixers.items():
        check_keys(entry, MIXER_KEYS, f"config.mixers.{name}")
        if "model" not in entry:
            raise ValueError(f"config.mixers.{name}: expected a model component")
        if ("lr" in entry) == ("lrs" in entry) or ("lrs" in entry and not entry.lrs):
            raise ValueError(f"config.mixers.{name}: expected exactly one of lr or lrs (a list)")
    if cfg.reference not in cfg.mixers:
        raise ValueError(f"config: reference {cfg.reference!r} is not one of the mixers")
    if not cfg.seeds or len(set(cfg.seeds)) != len(cfg.seeds):
        raise ValueError(f"config: seeds: expected distinct seeds, got {list(cfg.seeds)}")
    if cfg.training.get("lr") is not None or "lr" in cfg.training.get("optimizer", {}):
        raise ValueError("config.training.optimizer.lr: set the rate per mixer (lr or lrs)")
    integer(cfg, "extend_sweep", 0, "config.", optional=True)
    if 1 not in cfg.context_multiples:
        raise ValueError("config: context_multiples must include 1 (the training length)")


def _run_config(cfg: DictConfig, name: str, lr: float, seed: int, run_dir: Path) -> DictConfig:
    run = OmegaConf.merge(
        cfg.training,
        {
            "output_dir": str(run_dir),
            "overwrite": cfg.overwrite,
            "resume_from_checkpoint": False,
            "seed": seed,
            "device": cfg.device,
            "model": cfg.mixers[name].model,
            "tokenizer": cfg.tokenizer,
            "dataset": cfg.dataset,
            "validation_dataset": cfg.validation_dataset,
            "optimizer": {"lr": lr},
        },
    )
    return run


def _train(run_cfg: DictConfig, run_dir: Path):
    """Train one run, or reuse / resume it when run_dir holds the same run (a run with another
    config is replaced only with overwrite=True). Returns (model, history, tokens per step,
    number of parameters)."""
    saved = run_dir / "config.yaml"
    if saved.is_file():
        plain = OmegaConf.to_container(run_cfg, resolve=True)
        if _comparable(read_yaml_data(saved)) == _comparable(plain):  # the saved file as data
            resume = ckpt.latest_checkpoint(run_dir) is not None
            run_cfg = OmegaConf.merge(
                run_cfg, {"resume_from_checkpoint": resume, "overwrite": not resume}
            )
        elif not run_cfg.overwrite:
            raise ValueError(
                f"config: {str(run_dir)!r} holds a run with another config; pass overwrite=True "
                "to train it again or choose another output_dir"
            )
    trainer = Trainer(run_cfg)
    try:
        trainer.setup()
        if trainer.step < trainer.total_steps:
            trainer.train()
        else:
            print(f"reusing the finished run {run_dir}", flush=True)
    finally:
        trainer.cleanup()
    params = sum(p.numel() for p in trainer.model.parameters())
    return trainer.model, trainer.history, trainer.tokens_per_step, params


def _comparable(run_cfg: dict) -> dict:
    """A run's config (plain data, as its config.yaml saves it) without the keys that say how
    to start it."""
    return {k: v for k, v in run_cfg.items() if k not in ("resume_from_checkpoint", "overwrite")}


def _recorded_config(run_cfg: DictConfig) -> dict:
    """What a record must match to be reused: the run's comparable config, less where its
    checkpoints went."""
    plain = _comparable(OmegaConf.to_container(run_cfg, resolve=True))
    return {k: v for k, v in plain.items() if k != "output_dir"}


def rate_beyond_edge(rates: list[float], best: float) -> float | None:
    """The next rate past the edge of the sorted sweep ``rates`` where ``best`` sits, continuing
    the spacing of the two outermost rates (two significant digits); None when best is inside
    or the sweep has one rate."""
    if len(rates) < 2 or best not in (rates[0], rates[-1]):
        return None
    edge, neighbour = (rates[-1], rates[-2]) if best == rates[-1] else (rates[0], rates[1])
    return float(f"{edge * edge / neighbour:.2g}")


def _tail_loss(history: list[dict]) -> float:
    n = max(1, math.ceil(len(history) * SELECTION_TAIL))
    return statistics.fmean(h["loss"] for h in history[-n:])


def mean_spread(values: list[float]) -> tuple[float, float]:
    """(mean, half the min-max range): with 2-3 seeds the range says more than a std."""
    return statistics.fmean(values), (max(values) - min(values)) / 2


def _evaluate(model, cfg, stream, lengths) -> dict:
    model.eval()
    ppl = perplexity_by_context(
        model, stream, lengths, cfg.context_tokens, batch_size=cfg.eval_batch_size
    )
    longest = max(lengths)
    rows = stream[: cfg.diagnostic_rows * longest + 1]
    seq = cfg.training.seq_len
    bins = [(0, seq)] + [(L // 2, L) for L in lengths if L > seq]
    rms = output_rms_by_position(model, rows[:-1].view(cfg.diagnostic_rows, longest), bins)
    grads = ssm_gradient_stats(model, stream[: 2 * (seq + 1)].view(2, seq + 1))
    model.train()
    return {
        "ppl": {str(k): v for k, v in ppl.items()},
        "rms_bins": bins,
        "rms": rms,
        "grads": grads,
    }


def study(cfg: DictConfig, out: Path) -> dict:
    tokenizer = config.instantiate(cfg.tokenizer)
    stream = token_stream(config.instantiate(cfg.validation_dataset), tokenizer)
    lengths = [int(cfg.training.seq_len) * m for m in cfg.context_multiples]

    def run(name: str, lr: float, seed: int) -> dict:
        return _recorded_run(cfg, out, name, lr, seed, lambda model: _evaluate(
            model, cfg, stream, lengths))  # fmt: skip

    results = {}
    for name, entry in cfg.mixers.items():
        lrs = list(entry.lrs) if "lrs" in entry else [entry.lr]
        first, sweep = _sweep(cfg, name, lrs, run)
        best = min(sweep, key=sweep.get)
        runs = [first[best]] + [run(name, best, s) for s in cfg.seeds[1:]]
        results[name] = {"lr": best, "sweep": sweep, "runs": runs}
    return results


def _sweep(cfg, name: str, lrs: list[float], run) -> tuple[dict, dict]:
    """The sweep on the first seed: ({lr: run record}, {lr: tail training loss}) at every rate
    of lrs, then up to cfg.extend_sweep rates past the edge while the best sits there."""
    first, sweep = {}, {}

    def try_rate(lr: float) -> None:
        first[lr] = run(name, lr, cfg.seeds[0])
        sweep[lr] = first[lr]["tail_loss"]

    for lr in lrs:
        try_rate(lr)
    for _ in range(cfg.get("extend_sweep") or 0):
        beyond = rate_beyond_edge(sorted(sweep), min(sweep, key=sweep.get))
        if beyond is None:
            break
        try_rate(beyond)
    return first, sweep


def _recorded_run(cfg, out: Path, name: str, lr: float, seed: int, evaluate) -> dict:
    """One run's record: read from its record.json (in the run's directory or records_dir) when
    one holds the same run, else trained (or resumed), scored by ``evaluate(model)`` and saved
    to both. Keeps the validation-loss points and the last step of the history."""
    where = Path(name) / f"lr{lr:g}" / f"seed{seed}"
    run_dir = out / "runs" / where
    run_cfg = _run_config(cfg, name, lr, seed, run_dir)
    recorded = _recorded_config(run_cfg)
    homes = record_homes(out / "runs", cfg.get("records_dir"), where)
    record = read_record(homes, recorded, cfg.overwrite)
    if record is not None:
        return record
    model, history, tokens_per_step, params = _train(run_cfg, run_dir)
    record = {
        "seed": seed, "lr": lr, "params": params, "tokens_per_step": tokens_per_step,
        "tail_loss": _tail_loss(history),
        "history": [h for h in history[:-1] if "val_loss" in h] + history[-1:],
        **evaluate(model), "config": recorded,
    }  # fmt: skip
    write_record(homes, record)
    return record
