"""The measurements behind ``recipes/quantize_interdomain.py`` (its docstring and
docs/evaluation.md say what is measured): the config's checks and result files, and per
mode one row of sizes, validation perplexity, greedy decode speed and agreement with the eager
model of each saved program kind (exported, AOTInductor, ExecuTorch). The table is
``quantize_report.py``."""

from __future__ import annotations

import io
import statistics
import time
from pathlib import Path

import torch
from torchtune import config
from tqdm import tqdm

from .. import generate
from ..generation import release_caches
from ..io.checkpoint import load_exported_model, safe_load
from ..io.config_checks import boolean, check_components, check_keys
from ..io.model_description import plain_description
from .deploy import (
    QUANT_MODES,
    Decode,
    Prefill,
    causal_mask,
    export_programs,
    greedy_with_programs,
    linear_weight_bytes,
    load_program,
    load_quantized_model,
    quantize_linears,
    save_program,
    save_quantized_model,
)
from .edge import EXECUTORCH_MODES, load_executorch, save_executorch
from .extrapolation import perplexity_by_context, token_stream
from .pt2e import (
    PT2E_MODES,
    QuantizedScorer,
    agreement,
    quantize_program,
    teacher_forced_logits,
)
from .pt2e import weight_bytes as program_weight_bytes

KEYS = {
    "checkpoint", "tokenizer", "dataset", "modes", "seq_len", "eval_tokens", "prompt_len",
    "new_tokens", "targets", "aoti", "seed", "output_dir", "overwrite", "calibration_batches",
    "executorch",
}  # fmt: skip
# the linear layers' weights at least this much smaller than fp32's (issue: quantised export)
MIN_LINEAR_SIZE_RATIO = {"int8_dynamic_int4": 3.5}
MODES = (*QUANT_MODES, *PT2E_MODES)


def check_config(cfg) -> None:
    check_keys(cfg, KEYS)
    for key in ("overwrite", "aoti", "executorch"):
        boolean(cfg, key)
    check_components(cfg)
    unknown = sorted(set(cfg.modes) - set(MODES))
    if unknown or not cfg.modes:
        raise ValueError(f"config: modes: expected a list from {MODES}, got {list(cfg.modes)}")


def result_names(cfg) -> list[str]:
    """Every file a run writes that a finished run must not lose to the next one."""
    return [
        program_file(m, p, k)
        for m in ("fp32", *cfg.modes)
        for p in ("prefill", "decode")
        for k in ("exported", "aoti", "executorch")
    ] + [f"{m}_model.pt" for m in cfg.modes if m in QUANT_MODES]


def weight_bytes(model) -> int:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell()


TIMING_ROUNDS = 5  # greedy runs per timing; one run here varies by 2-4x from run to run


def timed(fn) -> tuple[torch.Tensor, float]:
    """(fn's output, the median seconds of TIMING_ROUNDS calls)."""
    secs = []
    for _ in range(TIMING_ROUNDS):
        t0 = time.perf_counter()
        out = fn()
        secs.append(time.perf_counter() - t0)
    return out, statistics.median(secs)


def reloaded_matches(model, name, model_config, prompt, out) -> bool:
    """Save a quantised model as {name}_model.pt, load it back safely, compare its logits."""
    path = save_quantized_model(out / f"{name}_model.pt", model, model_config, name)
    with torch.no_grad():
        return bool(torch.equal(load_quantized_model(path)(prompt), model(prompt)))


def measure(model, name, cfg, stream, prompt, out) -> dict:
    """One row of the report; writes the model's exported (and AOT-compiled) programs."""
    P, S = cfg.prompt_len, cfg.prompt_len + cfg.new_tokens
    row = {"weights_bytes": weight_bytes(model), "linear_bytes": linear_weight_bytes(model)}
    row["val_ppl"] = perplexity_by_context(model, stream, [cfg.seq_len], cfg.eval_tokens)[
        cfg.seq_len
    ]
    new, secs = timed(lambda: generate(model, prompt.tolist(), cfg.new_tokens, temperature=0))
    tokens = torch.tensor(new)
    row["eager_tok_s"] = cfg.new_tokens / secs
    forced = torch.cat([prompt, tokens], 1)[:, :S]
    eager = (Prefill(model, 1, S), Decode(model, 1, S))  # the eager model, programs' convention
    ref, _ = teacher_forced_logits(*eager, forced, P, S)
    release_caches(model)
    programs = export_programs(model, 1, P, S)
    check_saved(row, name, programs, cfg, prompt, out, tokens, forced, ref)
    return row


def measure_pt2e(base, name, cfg, stream, prompt, out) -> dict:
    """One row for a PT2E mode (``idmix.evaluation.pt2e``): calibration windows come from
    the stream after the evaluated tokens; the converted programs are the eager model."""
    P, S = cfg.prompt_len, cfg.prompt_len + cfg.new_tokens
    start = cfg.eval_tokens + 1
    windows = stream[start : start + cfg.calibration_batches * cfg.seq_len].view(-1, cfg.seq_len)
    scorer = QuantizedScorer(base, name, windows)
    ppl = perplexity_by_context(scorer, stream, [cfg.seq_len], cfg.eval_tokens, batch_size=1)
    row = {"val_ppl": ppl[cfg.seq_len]}
    fp32 = export_programs(base, 1, P, S)
    mask = causal_mask(1, S)[:, :P]
    prefills = [(w[None, :P], torch.arange(P)[None], mask) for w in windows]
    steps = []
    for w in windows[:, :S]:  # decode inputs (with states) from the fp32 programs
        steps += teacher_forced_logits(*(p.module() for p in fp32), w[None], P, S)[1]
    programs = quantize_program(fp32[0], name, prefills), quantize_program(fp32[1], name, steps)
    row["weights_bytes"] = program_weight_bytes(programs[1])
    eager = tuple(p.module() for p in programs)
    new, secs = timed(lambda: greedy_with_programs(*eager, prompt, cfg.new_tokens, S))
    row["eager_tok_s"] = cfg.new_tokens / secs
    forced = torch.cat([prompt, new], 1)[:, :S]
    ref, _ = teacher_forced_logits(*eager, forced, P, S)
    check_saved(row, name, programs, cfg, prompt, out, new, forced, ref)
    return row


def check_saved(row, name, programs, cfg, prompt, out, tokens, forced, ref) -> None:
    """Save, reload, time and compare each kind of program (exported; AOTInductor with
    aoti=true; with executorch=true, for EXECUTORCH_MODES, the decode step lowered to
    ExecuTorch/XNNPACK after the exported prefill): greedy tokens against the eager model's
    (exact), and teacher-forced logits against ref (top-1 agreement ≥ 99% and max |Δlogit| ≤
    1e-2 of the logit range, the criterion where int8 kernels cannot be bit-identical). Fills
    row in place."""
    P, S = cfg.prompt_len, cfg.prompt_len + cfg.new_tokens
    for kind in kinds(cfg, name):
        loaded = [
            saved_and_loaded(row, program, out, name, part, kind)
            for part, program in zip(("prefill", "decode"), programs, strict=True)
        ]
        greedy_with_programs(*loaded, prompt, 2, S)  # warm-up (first calls allocate)
        got, secs = timed(lambda p=loaded: greedy_with_programs(*p, prompt, cfg.new_tokens, S))
        row[f"{kind}_tok_s"] = cfg.new_tokens / secs
        a = agreement(teacher_forced_logits(*loaded, forced, P, S)[0], ref)
        row[f"{kind}_agreement"] = a
        row[f"{kind}_exact"] = bool(torch.equal(got, tokens))
        row[f"{kind}_matches_eager"] = row[f"{kind}_exact"] or (
            a["top1"] >= 0.99 and a["max_dlogit_over_range"] <= 1e-2
        )


def kinds(cfg, name: str) -> list[str]:
    """The kinds of saved program a mode's row measures."""
    return (
        ["exported"]
        + ["aoti"] * bool(cfg.aoti)
        + ["executorch"] * bool(cfg.executorch and name in EXECUTORCH_MODES)
    )


def saved_and_loaded(row, program, out, name: str, part: str, kind: str):
    """Write one program as kind and load it back (ExecuTorch's prefill: the exported one)."""
    if kind == "executorch" and part == "prefill":
        return load_program(out / program_file(name, part, "exported"))
    path = out / program_file(name, part, kind)
    if kind == "executorch":
        save_executorch(program, path)
    else:
        save_program(program, path, aoti=kind == "aoti")
    row[f"{kind}_{part}_file_bytes"] = path.stat().st_size
    return (
        load_executorch(path) if kind == "executorch" else load_program(path, aoti=kind == "aoti")
    )


def program_file(name: str, part: str, kind: str) -> str:
    suffix = {"exported": ".pt2", "aoti": ".aoti.pt2", "executorch": ".pte"}[kind]
    return f"{name}_{part}{suffix}"


def measure_all(cfg) -> tuple[dict, int]:
    """({mode: row} for fp32 and every mode, the model's width), the programs written to
    output_dir."""
    out = Path(cfg.output_dir)
    torch.manual_seed(cfg.seed)
    base = load_exported_model(cfg.checkpoint, "cpu")
    model_config = plain_description(
        safe_load(cfg.checkpoint)["model_config"], f"checkpoint {str(cfg.checkpoint)!r}"
    )
    stream = token_stream(config.instantiate(cfg.dataset), config.instantiate(cfg.tokenizer))
    prompt = stream[: cfg.prompt_len][None]
    rows = {}
    for name in tqdm(["fp32", *cfg.modes], desc="modes"):
        if name in PT2E_MODES:
            rows[name] = measure_pt2e(base, name, cfg, stream, prompt, out)
            continue
        model = base if name == "fp32" else quantize_linears(base, name)
        rows[name] = measure(model, name, cfg, stream, prompt, out)
        if name != "fp32":
            rows[name]["saved_pt_matches"] = reloaded_matches(
                model, name, model_config, prompt, out
            )
    return rows, base.tok_embeddings.weight.shape[1]
