"""The pretraining config: its keys and the checks every setting passes before anything runs
(``recipes/configs/tiny_*.yaml`` and ``paper_*.yaml``; docs/training.md)."""

from __future__ import annotations

import torch
from omegaconf import DictConfig, ListConfig

from ..io.config_checks import (
    boolean,
    check_components,
    check_keys,
    fail,
    integer,
    number,
    numbers,
    one_of,
)

KEYS = {
    "output_dir", "overwrite", "resume_from_checkpoint", "seed", "device", "dtype", "model",
    "tokenizer", "dataset", "validation_dataset", "seq_len", "batch_size",
    "gradient_accumulation_steps", "global_batch_tokens", "max_steps", "max_tokens",
    "warmup_steps", "warmup_tokens", "min_lr", "optimizer", "clip_grad_norm", "compile",
    "enable_activation_checkpointing", "log_every_n_steps", "eval_every_n_steps",
    "eval_batches", "save_every_n_steps", "steps_this_run", "metric_loggers", "hf_export",
    "context_parallel_size", "callbacks",
}  # fmt: skip
OPTIMIZER_KEYS = {"lr", "betas", "eps", "weight_decay", "ssm_lr_cap"}
# the boolean keys and their value when absent (None: required); hf_export writes output_dir/hf/
BOOLEANS = {
    "overwrite": None, "resume_from_checkpoint": None, "compile": None,
    "enable_activation_checkpointing": None, "hf_export": True,
}  # fmt: skip
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def check_pretrain_config(cfg) -> None:
    """Unknown keys, the dtype, every boolean, component name and numeric setting (each error
    names its key)."""
    unknown = sorted(set(cfg.keys()) - KEYS)
    if unknown:
        fail(f"unknown keys {unknown}; known keys: {sorted(KEYS)}")
    unknown = sorted(set(cfg.optimizer.keys()) - OPTIMIZER_KEYS)
    if unknown:
        fail(f"unknown optimizer keys {unknown}; known: {sorted(OPTIMIZER_KEYS)}")
    one_of(cfg, "dtype", DTYPES)
    for key, default in BOOLEANS.items():
        boolean(cfg, key, default=default)
    check_components(cfg)
    check_callbacks(cfg)
    for key in ("seq_len", "batch_size", "log_every_n_steps", "eval_batches"):
        integer(cfg, key, 1)
    check_context_parallel(cfg)
    integer(cfg, "seed", 0)
    if cfg.get("global_batch_tokens") is None:
        integer(cfg, "gradient_accumulation_steps", 1)
    for key in ("global_batch_tokens", "max_steps", "max_tokens", "steps_this_run"):
        integer(cfg, key, 1, optional=True)
    for key in ("warmup_steps", "warmup_tokens"):
        integer(cfg, key, 0, optional=True)
    for key in ("eval_every_n_steps", "save_every_n_steps"):
        integer(cfg, key, 0)
    opt = cfg.optimizer
    lr = number(opt, "lr", 0, low_open=True, where="optimizer.")
    number(opt, "eps", 0, low_open=True, where="optimizer.")
    number(opt, "weight_decay", 0, where="optimizer.")
    number(opt, "ssm_lr_cap", 0, low_open=True, where="optimizer.")
    numbers(opt, "betas", 0, 1, where="optimizer.", length=2, expected="two numbers in [0, 1)",
            high_open=True)  # fmt: skip
    number(cfg, "min_lr", 0, lr)
    number(cfg, "clip_grad_norm", 0, low_open=True, optional=True)


def check_callbacks(cfg, where: str = "") -> None:
    """callbacks (absent or null: none): a list of ``{_component_: dotted.name, ...}`` nodes,
    each instantiated by the Trainer into an ``idmix.training.callbacks.Callback``."""
    value = cfg.get("callbacks")
    if value is None:
        return
    if not isinstance(value, ListConfig):
        fail(f"{where}callbacks: expected a list of {{_component_: ...}} nodes, got {value!r}")
    for i, node in enumerate(value):
        if not isinstance(node, DictConfig) or "_component_" not in node:
            fail(f"{where}callbacks[{i}]: expected a node with a _component_, got {node!r}")


def check_context_parallel(cfg) -> None:
    """context_parallel_size (absent: 1): each sequence split over that many ranks, in equal
    slices of seq_len / N positions (>= 3, the short conv's history); no per-block compile or
    activation checkpointing."""
    if cfg.get("context_parallel_size") is None:
        return
    cp = integer(cfg, "context_parallel_size", 1)
    if cfg.seq_len % cp or cfg.seq_len // cp < 3:
        fail(
            f"context_parallel_size={cp}: seq_len={cfg.seq_len} must split into {cp} equal "
            "slices of at least 3 positions"
        )
    for key in ("compile", "enable_activation_checkpointing"):  # both re-run or split the
        if cp > 1 and cfg.get(key):  # layers, whose exchanges must run in one order
            fail(f"{key}: not supported with context_parallel_size={cp}")


def check_training_section(section, set_per_run, where: str) -> None:
    """A pretraining config without the keys another recipe sets per run (compare_mixers): its
    keys, booleans and component names."""
    check_keys(section, KEYS - set(set_per_run), where)
    prefix = f"{where.removeprefix('config.')}."  # errors read "config: training.<key>: …"
    for key, default in BOOLEANS.items():
        if key not in set_per_run:
            boolean(section, key, prefix, default)
    check_components(section, prefix)
    check_callbacks(section, prefix)
