"""Quantise a checkpoint's linear layers with torchao, export prefill and decode with
torch.export, save, reload and measure.

    tune run recipes/quantize_interdomain.py --config recipes/configs/quantize_tiny.yaml

For fp32 and each mode (int8_weight_only, int8_dynamic): weight bytes, validation perplexity
(and its change against fp32), greedy decode tokens/s (prompt included) of the eager model
(``idmix.generate``), of the reloaded torch.export programs and (aoti=true) of their
AOTInductor-compiled packages, and whether each reproduces the eager model's greedy tokens.
Each quantised model is also saved as {mode}_model.pt (weights_only-loadable, torchao tensor
types allowlisted: ``idmix.evaluation.deploy.load_quantized_model``) and reloaded to check its
logits. Writes {model}_{prefill,decode}.pt2, {model}_{prefill,decode}.aoti.pt2,
{mode}_model.pt and quantize_report.{md,json} to output_dir.
"""

from __future__ import annotations

import io
import sys
import time

import torch
from omegaconf import DictConfig
from torchtune import config
from tqdm import tqdm

from idmix import generate
from idmix.evaluation.deploy import (
    QUANT_MODES,
    export_programs,
    greedy_with_programs,
    load_program,
    load_quantized_model,
    quantize_linears,
    save_program,
    save_quantized_model,
)
from idmix.evaluation.extrapolation import perplexity_by_context, token_stream
from idmix.evaluation.report import markdown_table
from idmix.training.checkpoint import load_exported_model, safe_load
from idmix.training.files import atomic_write_json, atomic_write_text
from recipes._common import check_keys, fresh_outputs

KEYS = {
    "checkpoint", "tokenizer", "dataset", "modes", "seq_len", "eval_tokens", "prompt_len",
    "new_tokens", "targets", "aoti", "seed", "output_dir", "overwrite",
}  # fmt: skip


def weight_bytes(model) -> int:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell()


def timed(fn) -> tuple[torch.Tensor, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def reloaded_matches(model, name, model_config, prompt, out) -> bool:
    """Save a quantised model as {name}_model.pt, load it back safely, compare its logits."""
    path = save_quantized_model(out / f"{name}_model.pt", model, model_config, name)
    with torch.no_grad():
        return bool(torch.equal(load_quantized_model(path)(prompt), model(prompt)))


def measure(model, name, cfg, stream, prompt, out) -> dict:
    """One row of the report; writes the model's exported (and AOT-compiled) programs."""
    S = cfg.prompt_len + cfg.new_tokens
    row = {"weights_bytes": weight_bytes(model)}
    row["val_ppl"] = perplexity_by_context(model, stream, [cfg.seq_len], cfg.eval_tokens)[
        cfg.seq_len
    ]
    new, secs = timed(lambda: generate(model, prompt.tolist(), cfg.new_tokens, temperature=0))
    tokens = torch.tensor(new)
    row["eager_tok_s"] = cfg.new_tokens / secs
    programs = export_programs(model, 1, cfg.prompt_len, S)
    for kind in ("exported", "aoti") if cfg.aoti else ("exported",):
        loaded = []
        for part, program in zip(("prefill", "decode"), programs, strict=True):
            path = out / program_file(name, part, kind)
            save_program(program, path, aoti=kind == "aoti")
            row[f"{kind}_{part}_file_bytes"] = path.stat().st_size
            loaded.append(load_program(path, aoti=kind == "aoti"))
        greedy_with_programs(*loaded, prompt, 2, S)  # warm-up (first calls allocate)
        got, secs = timed(lambda p=loaded: greedy_with_programs(*p, prompt, cfg.new_tokens, S))
        row[f"{kind}_tok_s"] = cfg.new_tokens / secs
        row[f"{kind}_matches_eager"] = bool(torch.equal(got, tokens))
    return row


def program_file(name: str, part: str, kind: str) -> str:
    return f"{name}_{part}{'.aoti' if kind == 'aoti' else ''}.pt2"


@config.parse
def main(cfg: DictConfig) -> None:
    check_keys(cfg, KEYS)
    unknown = sorted(set(cfg.modes) - set(QUANT_MODES))
    if unknown or not cfg.modes:
        raise ValueError(
            f"config: modes: expected a list from {QUANT_MODES}, got {list(cfg.modes)}"
        )
    names = [
        program_file(m, p, k)
        for m in ("fp32", *cfg.modes)
        for p in ("prefill", "decode")
        for k in ("exported", "aoti")
    ] + [f"{m}_model.pt" for m in cfg.modes]
    out = fresh_outputs(cfg.output_dir, [*names, "quantize_report.md"], cfg.overwrite)
    torch.manual_seed(cfg.seed)
    base = load_exported_model(cfg.checkpoint, "cpu")
    model_config = safe_load(cfg.checkpoint)["model_config"]
    stream = token_stream(config.instantiate(cfg.dataset), config.instantiate(cfg.tokenizer))
    prompt = stream[: cfg.prompt_len][None]
    rows = {}
    for name in tqdm(["fp32", *cfg.modes], desc="modes"):
        model = base if name == "fp32" else quantize_linears(base, name)
        rows[name] = measure(model, name, cfg, stream, prompt, out)
        if name != "fp32":
            rows[name]["saved_pt_matches"] = reloaded_matches(
                model, name, model_config, prompt, out
            )
    fp32 = rows["fp32"]
    table_rows = []
    for name, r in rows.items():
        r["ppl_delta_pct"] = 100 * (r["val_ppl"] / fp32["val_ppl"] - 1)
        r["size_ratio"] = fp32["weights_bytes"] / r["weights_bytes"]
        target = cfg.targets.get(name)
        r["meets_target"] = None if target is None else abs(r["ppl_delta_pct"]) <= target
        table_rows.append([
            name,
            f"{r['weights_bytes'] / 2**20:.2f}",
            f"{r['size_ratio']:.2f}×",
            r["val_ppl"],
            f"{r['ppl_delta_pct']:+.2f}%",
            "-" if target is None else f"≤{target}% {'yes' if r['meets_target'] else 'NO'}",
            f"{r['eager_tok_s']:.0f}",
            f"{r['exported_tok_s']:.0f}",
            r["exported_matches_eager"],
            f"{r['aoti_tok_s']:.0f}" if cfg.aoti else "-",
            r["aoti_matches_eager"] if cfg.aoti else "-",
            r.get("saved_pt_matches", "-"),
        ])  # fmt: skip
    header = [
        "model", "weights MiB", "smaller", "val ppl", "Δ ppl", "target", "eager tok/s",
        "exported tok/s", "reloaded = eager", "AOTI tok/s", "AOTI = eager", "saved .pt = eager",
    ]  # fmt: skip
    table = (
        f"{cfg.checkpoint}: validation perplexity on {cfg.eval_tokens:,} tokens (windows of "
        f"{cfg.seq_len}); greedy decode of {cfg.new_tokens} tokens after a {cfg.prompt_len}-token "
        "prompt, batch 1, CPU\n\n" + markdown_table(header, table_rows)
    )
    atomic_write_text(out / "quantize_report.md", table)
    atomic_write_json(out / "quantize_report.json", rows)
    print(table)
    print(f"results: {out / 'quantize_report.md'} and the .pt2 programs in {out}")


if __name__ == "__main__":
    sys.exit(main())
