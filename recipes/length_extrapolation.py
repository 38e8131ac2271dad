"""Validation perplexity against context length for several checkpoints (Table 2's shape).

    tune run recipes/length_extrapolation.py --config recipes/configs/length_extrapolation_tiny.yaml

Scores the same validation tokens at each context length (train_seq_len × multiples) for each
model; writes length_extrapolation.{md,json,png} to output_dir.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig
from torchtune import config
from tqdm import tqdm

from idmix.evaluation.extrapolation import perplexity_by_context, token_stream
from idmix.evaluation.report import markdown_table
from idmix.io.checkpoint import load_exported_model
from idmix.io.config_checks import boolean, check_components, check_keys
from idmix.io.files import atomic_write_json, atomic_write_text
from idmix.training.outputs import fresh_outputs
from idmix.training.plots import line_plot

KEYS = {
    "checkpoints", "tokenizer", "dataset", "train_seq_len", "multiples", "num_tokens",
    "batch_size", "device", "output_dir", "overwrite",
}  # fmt: skip
NAME = "length_extrapolation"
RESULTS = (f"{NAME}.md", f"{NAME}.json", f"{NAME}.png")


@config.parse
def main(cfg: DictConfig) -> None:
    check_keys(cfg, KEYS)
    boolean(cfg, "overwrite")
    check_components(cfg)
    if not cfg.checkpoints:
        raise ValueError("config: checkpoints: expected a mapping name -> model_final.pt path")
    lengths = [cfg.train_seq_len * m for m in cfg.multiples]
    out = fresh_outputs(cfg.output_dir, RESULTS, cfg.overwrite)
    stream = token_stream(config.instantiate(cfg.dataset), config.instantiate(cfg.tokenizer))
    ppl = {}
    for name, path in tqdm(cfg.checkpoints.items(), desc="models"):
        model = load_exported_model(path, cfg.device)
        ppl[name] = perplexity_by_context(model, stream, lengths, cfg.num_tokens, cfg.batch_size)
    header = ["model", *(f"{L} ({m}×)" for L, m in zip(lengths, cfg.multiples, strict=True))]
    header.append("max/min")
    rows = [
        [name, *(p[L] for L in lengths), max(p.values()) / min(p.values())]
        for name, p in ppl.items()
    ]
    table = (
        f"Validation perplexity by context length (trained at {cfg.train_seq_len}; "
        f"{cfg.num_tokens:,} tokens scored at each length)\n\n" + markdown_table(header, rows)
    )
    atomic_write_text(out / f"{NAME}.md", table)
    atomic_write_json(out / f"{NAME}.json", {"lengths": lengths, "perplexity": ppl})
    line_plot(
        {"validation": {name: (lengths, [p[L] for L in lengths]) for name, p in ppl.items()}},
        out / f"{NAME}.png",
        title=f"Length extrapolation (trained at {cfg.train_seq_len} tokens)",
        xlabel="evaluation context length (tokens)",
        ylabel="validation perplexity",
        logx=True,
        logy=True,
    )
    print(table)
    print(f"results: {', '.join(str(out / n) for n in RESULTS)}")


if __name__ == "__main__":
    sys.exit(main())
