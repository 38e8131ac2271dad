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
- ``runs/<mixer>/lr<lr>/seed<seed>/``: each run's own directory (checkpoints, history).

Runs already finished in ``output_dir`` with the same config are reused, unfinished ones are
resumed, so an interrupted study continues where it stopped.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from torchtune import config

from idmix.evaluation.diagnostics import output_rms_by_position, ssm_gradient_stats
from idmix.evaluation.extrapolation import perplexity_by_context, token_stream
from idmix.evaluation.report import markdown_table
from idmix.training import checkpoint as ckpt
from idmix.training.config_checks import check_keys
from idmix.training.files import atomic_write_json, atomic_write_text
from idmix.training.outputs import fresh_outputs
from idmix.training.plots import line_plot
from idmix.training.pretrain_config import check_training_section
from idmix.training.trainer import Trainer

KEYS = {
    "output_dir", "overwrite", "device", "seeds", "tokenizer", "dataset", "validation_dataset",
    "mixers", "reference", "training", "context_multiples", "context_tokens", "eval_batch_size",
    "diagnostic_rows",
}  # fmt: skip
MIXER_KEYS = {"model", "lr", "lrs"}
# what this recipe sets in each run's pretraining config; `training` holds the rest
SET_PER_RUN = {
    "output_dir", "overwrite", "resume_from_checkpoint", "seed", "device", "model", "tokenizer",
    "dataset", "validation_dataset",
}  # fmt: skip
RESULTS = ("compare.md", "compare.json", "compare_curves.png", "compare_context.png")
SELECTION_TAIL = 0.1  # the last tenth of the training steps picks the learning rate


def _check(cfg: DictConfig) -> None:
    check_keys(cfg, KEYS)
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
    if 1 not in cfg.context_multiples:
        raise ValueError("config: context_multiples must include 1 (the training length)")


def _run_config(cfg: DictConfig, name: str, lr: float, seed: int, run_dir: Path) -> DictConfig:
    run = OmegaConf.merge(
        cfg.training,
        {
            "output_dir": str(run_dir),
            "overwrite": bool(cfg.overwrite),
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
        if _comparable(OmegaConf.load(saved)) == _comparable(run_cfg):
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


def _comparable(run_cfg: DictConfig) -> dict:
    """A run's config without the keys that say how to start it."""
    d = OmegaConf.to_container(run_cfg, resolve=True)
    for key in ("resume_from_checkpoint", "overwrite"):
        d.pop(key, None)
    return d


def _tail_loss(history: list[dict]) -> float:
    n = max(1, math.ceil(len(history) * SELECTION_TAIL))
    return statistics.fmean(h["loss"] for h in history[-n:])


def _mean_spread(values: list[float]) -> tuple[float, float]:
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


def _study(cfg: DictConfig, out: Path) -> dict:
    tokenizer = config.instantiate(cfg.tokenizer)
    stream = token_stream(config.instantiate(cfg.validation_dataset), tokenizer)
    lengths = [int(cfg.training.seq_len) * m for m in cfg.context_multiples]
    results = {}
    for name, entry in cfg.mixers.items():
        lrs = list(entry.lrs) if "lrs" in entry else [entry.lr]
        first, sweep = {}, {}
        for lr in lrs:  # the sweep, on the first seed
            run = _train_run(cfg, out, name, lr, cfg.seeds[0])
            sweep[lr], first[lr] = _tail_loss(run["history"]), run
        best = min(sweep, key=sweep.get)
        runs = [first[best]] + [_train_run(cfg, out, name, best, s) for s in cfg.seeds[1:]]
        for run in runs:
            run.update(_evaluate(run.pop("model"), cfg, stream, lengths))
        results[name] = {"lr": best, "sweep": sweep, "runs": runs}
    return results


def _train_run(cfg, out: Path, name: str, lr: float, seed: int) -> dict:
    run_dir = out / "runs" / name / f"lr{lr:g}" / f"seed{seed}"
    model, history, tokens_per_step, params = _train(
        _run_config(cfg, name, lr, seed, run_dir), run_dir
    )
    return {"seed": seed, "lr": lr, "history": history, "params": params,
            "tokens_per_step": tokens_per_step, "model": model}  # fmt: skip


def _summaries(cfg, results) -> list[dict]:
    lengths = [str(cfg.training.seq_len * m) for m in cfg.context_multiples]
    k = lengths[cfg.context_multiples.index(max(cfg.context_multiples))]
    one = lengths[cfg.context_multiples.index(1)]
    ref = statistics.fmean(r["ppl"][one] for r in results[cfg.reference]["runs"])
    rows = []
    for name, res in results.items():
        runs = res["runs"]
        row = {
            "mixer": name,
            "params": runs[0]["params"],
            "lr": res["lr"],
            "ppl": {L: _mean_spread([r["ppl"][L] for r in runs]) for L in lengths},
            "ratio_long": _mean_spread([r["ppl"][k] / r["ppl"][one] for r in runs]),
            "vs_reference": statistics.fmean(r["ppl"][one] for r in runs) / ref,
            "seeds": [r["seed"] for r in runs],
        }
        rows.append(row)
    return rows


def _write(cfg, results, out: Path) -> str:
    rows = _summaries(cfg, results)
    lengths = [str(cfg.training.seq_len * m) for m in cfg.context_multiples]
    one = lengths[cfg.context_multiples.index(1)]
    kmax = max(cfg.context_multiples)

    def pm(ms):
        return f"{ms[0]:.2f} ± {ms[1]:.2f}"

    header = ["mixer", "params", "lr", f"val ppl ({one})", *(f"{L}" for L in lengths[1:]),
              f"{kmax}×/1×", f"vs {cfg.reference}"]  # fmt: skip
    table = [
        [r["mixer"], f"{r['params']:,}", f"{r['lr']:g}", pm(r["ppl"][one]),
         *(pm(r["ppl"][L]) for L in lengths[1:]), pm(r["ratio_long"]), f"{r['vs_reference']:.3f}"]
        for r in rows
    ]  # fmt: skip
    first = next(iter(results.values()))["runs"][0]
    tokens = first["history"][-1]["step"] * first["tokens_per_step"]
    text = (
        f"# Mixer comparison\n\n{tokens:,} training tokens per run, sequence length "
        f"{cfg.training.seq_len}, seeds {list(cfg.seeds)}; perplexity on the same "
        f"{cfg.context_tokens:,} validation tokens at each context length (mean ± half the "
        "range over seeds).\n\n" + markdown_table(header, table)
    )
    sweeps = [[n, ", ".join(f"{lr:g}: {v:.4f}" for lr, v in r["sweep"].items())]
              for n, r in results.items() if len(r["sweep"]) > 1]  # fmt: skip
    if sweeps:
        text += (
            "\nLearning-rate sweep (first seed; mean training loss over the last tenth of the "
            "steps, lowest kept):\n\n" + markdown_table(["mixer", "lr: loss"], sweeps)
        )
    bins = first["rms_bins"]
    rms_rows = [
        [
            name,
            i,
            *(statistics.fmean(r["rms"][i][b] for r in res["runs"]) for b in range(len(bins))),
        ]
        for name, res in results.items()
        for i in range(len(res["runs"][0]["rms"]))
    ]
    text += (
        "\nMixer output RMS (before W_O) by position, per layer (mean over seeds):\n\n"
        + markdown_table(["mixer", "layer", *(f"{a}-{b}" for a, b in bins)], rms_rows)
    )
    grad_rows = [
        [name, key, s["param_rms"], s["grad_rms"], s["ratio"]]
        for name, res in results.items()
        for key, s in res["runs"][0]["grads"].items()
    ]
    if grad_rows:
        text += (
            "\nSSM parameters and their gradients on one validation batch (first seed, mean "
            "over layers):\n\n"
            + markdown_table(["mixer", "parameter", "RMS", "grad RMS", "grad/param"], grad_rows)
        )
    atomic_write_text(out / "compare.md", text)
    atomic_write_json(
        out / "compare.json",
        {"config": OmegaConf.to_container(cfg), "summary": rows, "results": results},
    )
    _plots(cfg, results, out, lengths)
    return text


def _plots(cfg, results, out: Path, lengths) -> None:
    by_tokens, by_time = {}, {}
    for name, res in results.items():
        for r in res["runs"]:
            val = [h for h in r["history"] if "val_loss" in h]
            label = f"{name} (seed {r['seed']})"
            by_tokens[label] = ([h["step"] * r["tokens_per_step"] for h in val],
                                [h["val_loss"] for h in val])  # fmt: skip
            by_time[label] = ([h["elapsed_s"] for h in val], [h["val_loss"] for h in val])
    line_plot(
        {"against training tokens": by_tokens, "against training wall-clock": by_time},
        out / "compare_curves.png",
        title="Validation loss",
        xlabel={"against training tokens": "tokens", "against training wall-clock": "seconds"},
        ylabel="validation loss (nats/token)",
    )
    ctx = {
        name: ([int(L) for L in lengths],
               [statistics.fmean(r["ppl"][L] for r in res["runs"]) for L in lengths])
        for name, res in results.items()
    }  # fmt: skip
    line_plot(
        {"perplexity by context": ctx},
        out / "compare_context.png",
        title=f"Perplexity by evaluation context (trained at {cfg.training.seq_len})",
        xlabel="evaluation context length (tokens)",
        ylabel="validation perplexity",
        logx=True,
        logy=True,
    )


@config.parse
def main(cfg: DictConfig) -> None:
    _check(cfg)
    out = fresh_outputs(cfg.output_dir, RESULTS, cfg.overwrite)
    results = _study(cfg, out)
    print(_write(cfg, results, out))
    print(f"results: {', '.join(str(out / n) for n in RESULTS)}")


if __name__ == "__main__":
    sys.exit(main())
