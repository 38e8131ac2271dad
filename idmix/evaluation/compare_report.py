"""The mixer comparison's report (``compare.py`` runs the study): ``compare.md`` /
``compare.json`` (per mixer: parameters, validation perplexity mean ± spread over seeds, by
context length, the k×/1× ratio, the ratio to the reference mixer, the learning-rate sweep, the
output-RMS and SSM-gradient diagnostics) and the plots ``compare_curves.png`` and
``compare_context.png``."""

from __future__ import annotations

import statistics
from pathlib import Path

from omegaconf import OmegaConf

from ..io.files import atomic_write_json, atomic_write_text
from ..training.plots import line_plot
from .compare import mean_spread
from .report import markdown_table


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
            "ppl": {L: mean_spread([r["ppl"][L] for r in runs]) for L in lengths},
            "ratio_long": mean_spread([r["ppl"][k] / r["ppl"][one] for r in runs]),
            "vs_reference": statistics.fmean(r["ppl"][one] for r in runs) / ref,
            "seeds": [r["seed"] for r in runs],
        }
        rows.append(row)
    return rows


def write_report(cfg, results, out: Path) -> str:
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
