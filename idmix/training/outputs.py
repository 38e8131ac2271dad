"""What recipes leave in their output directory: result files that are never replaced by
accident, and a training run's results (``history.json``, ``loss_curve.png``,
``model_final.pt``, ``hf/``) and summary line."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path

from ..io import checkpoint as ckpt
from ..io.files import atomic_write_json
from ..io.model_description import plain_description
from ..io.trust import trusting_own_builders
from .plots import plot_history


def fresh_outputs(output_dir, names: Iterable[str], overwrite: bool) -> Path:
    """output_dir (created) after checking that none of its result files exist unless
    overwrite: a finished result is never replaced by accident."""
    out = Path(output_dir)
    existing = [n for n in names if (out / n).exists()]
    if existing and not overwrite:
        raise ValueError(
            f"config: output_dir {str(out)!r} already holds {existing}; pass overwrite=True to "
            "replace them or choose another output_dir"
        )
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_run_results(out: Path, history: list[dict], rank: int) -> None:
    """history.json and loss_curve.png of a run (rank 0 writes them)."""
    if rank == 0:
        atomic_write_json(out / "history.json", history)
        plot_history(history, out / "loss_curve.png", Path(out).name)


def export_final_model(out: Path, model, model_config: dict, tokenizer=None, hf=True) -> None:
    """model_final.pt: the full state dict and the plain model config (loads without the run's
    config; ``checkpoint.load_exported_model``); with hf, also ``hf/`` from it (rank 0)."""
    model_config = plain_description(model_config, "config: model")
    ckpt.export_model(out / "model_final.pt", model, model_config)
    if hf:
        with trusting_own_builders(model_config):  # the run has just built them
            ckpt.on_rank0(lambda: _export_hf(out, tokenizer))


def _export_hf(out: Path, tokenizer) -> None:
    """out/hf by ``idmix.hf.convert.convert_run``; skipped, saying so, without transformers."""
    if importlib.util.find_spec("transformers") is None:
        print("no hf/ directory: transformers is not installed (pip install 'idmix[hf]')")
        return
    from ..hf.convert import convert_run

    convert_run(out, tokenizer)


def summary_text(out, history: list[dict], step: int, world: int, tokens: int, seconds: float):
    """The summary a run prints at its end: steps, tokens and their rate, first and last loss,
    validation perplexity, and where the results are."""
    first, last = history[0], history[-1]
    vals = [h["val_ppl"] for h in history if "val_ppl" in h]
    rate = tokens / seconds if seconds else float("nan")
    return (
        "\nsummary: "
        f"steps {step} | world {world} | tokens this run {tokens:,} | "
        f"{rate:,.0f} tokens/s | loss {first['loss']:.3f} (step {first['step']}) -> "
        f"{last['loss']:.3f} (step {last['step']})"
        + (f" | val ppl best {min(vals):.2f}, final {vals[-1]:.2f}" if vals else "")
        + f"\nrun directory: {out} (model_final.pt, hf/, checkpoints/, logs/, history.json, "
        "loss_curve.png)"
    )
