"""Pretraining recipe for idmix models (Interdomain Attention and its baselines).

    tune run recipes/pretrain_interdomain.py --config recipes/configs/tiny_interdomain.yaml
    tune run --nproc_per_node 2 recipes/pretrain_interdomain.py --config … [key=value …]

One process, or FSDP2 across processes (gloo on CPU, NCCL on GPUs). Packed documents with
positions restarting at each document (the recurrent state resets there); a step/token budget;
AdamW with the SSM parameter group; linear warmup then cosine to a floor; gradient
accumulation and clipping; bf16 autocast, per-block torch.compile and activation checkpointing
as options; periodic validation perplexity; atomic, exactly resumable checkpoints.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from pathlib import Path

import datasets
import torch
import torch.distributed as dist
from omegaconf import DictConfig, ListConfig, OmegaConf
from torchtune import config, training, utils
from torchtune.modules import TransformerSelfAttentionLayer
from tqdm import tqdm

from idmix.training import checkpoint as ckpt
from idmix.training.faults import kill_point
from idmix.training.files import atomic_write_json
from idmix.training.optim import param_groups, warmup_cosine
from idmix.training.packing import PackedStream, cycling_documents, streaming_documents
from idmix.training.plots import plot_history
from idmix.training.run_dir import claim_run_dir
from recipes._common import integer, number

KEYS = {
    "output_dir", "overwrite", "resume_from_checkpoint", "seed", "device", "dtype", "model",
    "tokenizer", "dataset", "validation_dataset", "seq_len", "batch_size",
    "gradient_accumulation_steps", "global_batch_tokens", "max_steps", "max_tokens",
    "warmup_steps", "warmup_tokens", "min_lr", "optimizer", "clip_grad_norm", "compile",
    "enable_activation_checkpointing", "log_every_n_steps", "eval_every_n_steps",
    "eval_batches", "save_every_n_steps", "steps_this_run", "metric_loggers",
}  # fmt: skip
OPTIMIZER_KEYS = {"lr", "betas", "eps", "weight_decay", "ssm_lr_cap"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _resolved(section) -> dict:
    """A config section as plain data, interpolations (e.g. ${tokenizer.vocab_size}) resolved."""
    return OmegaConf.to_container(section, resolve=True)


def _fail(msg: str):
    raise ValueError(f"config: {msg}")


def _check_numbers(cfg) -> None:
    """Every numeric setting in range before anything runs (each error names its key)."""
    for key in ("seq_len", "batch_size", "log_every_n_steps", "eval_batches"):
        integer(cfg, key, 1)
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
    betas = opt.get("betas")
    if not isinstance(betas, ListConfig | list | tuple) or len(betas) != 2:
        _fail(f"optimizer.betas: expected two numbers in [0, 1), got {betas!r}")
    named = {f"betas[{i}]": b for i, b in enumerate(betas)}
    for key in named:
        number(named, key, 0, 1, high_open=True, where="optimizer.")
    number(cfg, "min_lr", 0, lr, where="")
    number(cfg, "clip_grad_norm", 0, low_open=True, optional=True)


class PretrainRecipe:
    def __init__(self, cfg: DictConfig):
        unknown = sorted(set(cfg.keys()) - KEYS)
        if unknown:
            _fail(f"unknown keys {unknown}; known keys: {sorted(KEYS)}")
        unknown = sorted(set(cfg.optimizer.keys()) - OPTIMIZER_KEYS)
        if unknown:
            _fail(f"unknown optimizer keys {unknown}; known: {sorted(OPTIMIZER_KEYS)}")
        if cfg.dtype not in DTYPES:
            _fail(f"dtype: expected one of {sorted(DTYPES)}, got {cfg.dtype!r}")
        _check_numbers(cfg)
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        # launched by torchrun (tune run --nproc_per_node N): join the process group first
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
            cuda = self.device.type == "cuda"
            dist.init_process_group("cuda:nccl,cpu:gloo" if cuda else "gloo")
        self.world, self.rank = utils.get_world_size_and_rank()
        self.distributed = self.world > 1
        if self.distributed:
            if self.device.type == "cuda":
                local = int(os.environ.get("LOCAL_RANK", self.rank))  # this machine's GPUs
                self.device = torch.device("cuda", local % torch.cuda.device_count())
                torch.cuda.set_device(self.device)
        self.out = Path(cfg.output_dir)
        self.tokens_per_micro = cfg.batch_size * cfg.seq_len
        self.accum = self._accumulation()
        self.tokens_per_step = self.tokens_per_micro * self.accum * self.world
        self.total_steps = self._budget("max_steps", "max_tokens")
        self.warmup_steps = self._budget("warmup_steps", "warmup_tokens")
        self.claim = None
        self.run_id = self._claim_run_dir()

    # configuration checks ---------------------------------------------------------------------
    def _claim_run_dir(self) -> str:
        """Rank 0 locks output_dir for this run (run_dir.py) and every rank learns the run id;
        a refusal is raised on every rank."""
        cfg = self.cfg

        def claim():
            self.claim = claim_run_dir(self.out, cfg.resume_from_checkpoint, cfg.overwrite)
            for note in self.claim.notes:
                print(note, flush=True)
            if cfg.resume_from_checkpoint and ckpt.latest_checkpoint(self.out) is None:
                self.claim.release()
                _fail(f"resume_from_checkpoint=True but {str(self.out)!r} has no checkpoint")
            return self.claim.run_id

        return ckpt.on_rank0(claim)

    def _accumulation(self) -> int:
        cfg = self.cfg
        if cfg.get("global_batch_tokens"):
            per = self.tokens_per_micro * self.world
            if cfg.global_batch_tokens % per:
                _fail(
                    f"global_batch_tokens={cfg.global_batch_tokens} is not a multiple of "
                    f"batch_size*seq_len*world = {per}"
                )
            return cfg.global_batch_tokens // per
        return cfg.gradient_accumulation_steps

    def _budget(self, steps_key: str, tokens_key: str) -> int:
        tokens = self.cfg.get(tokens_key)
        steps = math.ceil(tokens / self.tokens_per_step) if tokens else self.cfg.get(steps_key)
        if steps is None:
            _fail(f"{steps_key} / {tokens_key}: expected a positive budget, got {steps}")
        return int(steps)

    # set-up -----------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        path = cfg.tokenizer.get("path")
        if path is not None and not Path(path).is_file():
            _fail(f"tokenizer.path: no such file {path!r}")
        training.set_seed(seed=cfg.seed)
        self.model = config.instantiate(cfg.model)
        max_len = getattr(self.model, "max_seq_len", None)
        if max_len is not None and cfg.seq_len > max_len:
            _fail(f"seq_len={cfg.seq_len} exceeds the model's max_seq_len={max_len}")
        self.tokenizer = config.instantiate(cfg.tokenizer)
        vocab = self.model.output.out_features if hasattr(self.model, "output") else None
        if vocab is not None and self.tokenizer.vocab_size > vocab:
            _fail(f"tokenizer vocab_size {self.tokenizer.vocab_size} exceeds the model's {vocab}")
        self.model.to(self.device)
        if cfg.enable_activation_checkpointing:
            training.set_activation_checkpointing(
                self.model, auto_wrap_policy={TransformerSelfAttentionLayer}
            )
        if self.distributed:
            training.shard_model(
                self.model,
                [lambda name, m: isinstance(m, TransformerSelfAttentionLayer)],
                cpu_offload=False,
            )
        if cfg.compile:
            for layer in self.model.layers:
                layer.compile(fullgraph=True)
        opt = cfg.optimizer
        self.optimizer = torch.optim.AdamW(
            param_groups(self.model, opt.lr, opt.weight_decay, opt.ssm_lr_cap),
            betas=tuple(opt.betas),
            eps=opt.eps,
            fused=False,
        )
        self.scheduler = warmup_cosine(
            self.optimizer, self.warmup_steps, self.total_steps, cfg.min_lr
        )
        self.train_stream = self._stream(cfg.dataset, seed=cfg.seed)
        self.loggers = [config.instantiate(c) for c in cfg.metric_loggers] if self.rank == 0 else []
        self.step, self.history = 0, []
        if cfg.resume_from_checkpoint:
            self._resume()
        elif self.rank == 0:
            OmegaConf.save(cfg, self.out / "config.yaml")

    def _documents(self, dataset_cfg, seed):
        ds = config.instantiate(dataset_cfg)
        tok = self.tokenizer
        if isinstance(ds, datasets.IterableDataset):
            return streaming_documents(
                ds, lambda text: tok.encode(text, add_bos=False, add_eos=False)
            )
        encode_batch = getattr(tok, "encode_batch", None) or (
            lambda texts: [tok.encode(t, add_bos=False, add_eos=False) for t in texts]
        )
        return cycling_documents(list(ds["text"]), encode_batch, seed)

    def _stream(self, dataset_cfg, seed) -> PackedStream:
        return PackedStream(
            self._documents(dataset_cfg, seed),
            self.cfg.seq_len,
            self.tokenizer.eos_id,
            rank=self.rank,
            world=self.world,
        )

    def _resume(self) -> None:
        path = ckpt.latest_checkpoint(self.out)
        saved = OmegaConf.load(self.out / "config.yaml")  # YAML: plain data
        ckpt.check_no_resolvers(
            OmegaConf.to_container(saved, resolve=False), str(self.out / "config.yaml")
        )
        saved_model, model = _resolved(saved.model), _resolved(self.cfg.model)
        if saved_model != model:
            _fail(
                f"the checkpoint in {str(self.out)!r} was written by model {saved_model}, but "
                f"this config builds {model}"
            )
        extra = ckpt.load_checkpoint(path, self.model, self.optimizer, self.run_id)
        self.scheduler.load_state_dict(extra["scheduler"])
        self.train_stream.load_state_dict(extra["data"])
        self.step, self.history = extra["step"], extra["history"]
        self._log_line(f"resumed from {path} at step {self.step}")

    # training ---------------------------------------------------------------------------------
    def _autocast(self):
        if self.cfg.dtype == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _loss(self, tokens, positions) -> torch.Tensor:
        tokens, positions = tokens.to(self.device), positions.to(self.device)
        with self._autocast():
            logits = self.model(tokens[:, :-1], input_pos=positions[:, :-1])
        return torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), tokens[:, 1:].flatten()
        )

    def _mean_across_ranks(self, value: float) -> float:
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.item() / self.world

    @torch.no_grad()
    def validate(self) -> float:
        """Mean loss over the first eval_batches batches of the validation split."""
        self.model.eval()
        stream = self._stream(self.cfg.validation_dataset, seed=0)
        losses = [
            self._loss(*stream.next_batch(self.cfg.batch_size)).item()
            for _ in range(self.cfg.eval_batches)
        ]
        self.model.train()
        return self._mean_across_ranks(sum(losses) / len(losses))

    def _optimizer_step(self) -> dict:
        """One step: accumulation, clipping, AdamW, schedule. Returns the step's record."""
        t0 = time.perf_counter()
        loss_sum = 0.0
        for _ in range(self.accum):
            loss = self._loss(*self.train_stream.next_batch(self.cfg.batch_size)) / self.accum
            loss.backward()
            loss_sum += loss.item()
        kill_point("mid_step", self.step + 1)  # crash tests only (IDMIX_KILL_AT)
        max_norm = self.cfg.clip_grad_norm
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), math.inf if max_norm is None else max_norm
        )
        if isinstance(grad_norm, torch.distributed.tensor.DTensor):
            grad_norm = grad_norm.full_tensor()
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        seconds = time.perf_counter() - t0
        elapsed = self.history[-1].get("elapsed_s", 0.0) if self.history else 0.0
        return {
            "loss": self._mean_across_ranks(loss_sum),
            "lr": lr,
            "grad_norm": float(grad_norm),
            "tokens_per_s": self.tokens_per_step / seconds,
            "elapsed_s": elapsed + seconds,  # training time so far (validation excluded)
        }

    def _due(self, every: int) -> bool:
        return bool(every) and self.step % every == 0

    def train(self) -> None:
        cfg = self.cfg
        self.model.train()
        bar = tqdm(
            total=self.total_steps, initial=self.step, disable=self.rank != 0, unit="step",
            dynamic_ncols=True, file=sys.stdout,
        )  # fmt: skip
        t_start, first_step = time.perf_counter(), self.step
        stop_at = self.total_steps
        if cfg.get("steps_this_run"):
            stop_at = min(stop_at, self.step + int(cfg.steps_this_run))
        while self.step < stop_at:
            record = self._optimizer_step()
            if self._due(cfg.eval_every_n_steps) or (
                cfg.eval_every_n_steps and self.step == self.total_steps
            ):
                record["val_loss"] = self.validate()
                record["val_ppl"] = math.exp(record["val_loss"])
            self.history.append({"step": self.step, **record})
            bar.set_postfix(
                loss=f"{record['loss']:.3f}",
                tok_s=f"{record['tokens_per_s']:.0f}",
                lr=f"{record['lr']:.2e}",
            )
            bar.update(1)
            if self._due(cfg.log_every_n_steps) or "val_loss" in record:
                for logger in self.loggers:
                    logger.log_dict(record, step=self.step)
            if self._due(cfg.save_every_n_steps):
                self.save()
        bar.close()
        self.elapsed = time.perf_counter() - t_start
        self.tokens_seen = (self.step - first_step) * self.tokens_per_step
        if not self._due(cfg.save_every_n_steps):
            self.save()
        self._write_results()
        self.summary()

    def _write_results(self) -> None:
        if self.rank == 0:
            atomic_write_json(self.out / "history.json", self.history)
            plot_history(self.history, self.out / "loss_curve.png", Path(self.out).name)
        if self.step == self.total_steps:
            model_config = _resolved(self.cfg.model)  # plain values: loads without the config
            ckpt.export_model(self.out / "model_final.pt", self.model, model_config)

    def save(self) -> None:
        extra = {
            "step": self.step,
            "scheduler": self.scheduler.state_dict(),
            "data": self.train_stream.state_dict(),
            "history": self.history,
        }
        ckpt.save_checkpoint(self.out, self.step, self.model, self.optimizer, extra, self.run_id)

    def _log_line(self, text: str) -> None:
        if self.rank == 0:
            print(text, flush=True)

    def summary(self) -> None:
        first, last = self.history[0], self.history[-1]
        vals = [h["val_ppl"] for h in self.history if "val_ppl" in h]
        rate = self.tokens_seen / self.elapsed if self.elapsed else float("nan")
        self._log_line(
            "\nsummary: "
            f"steps {self.step} | world {self.world} | tokens this run {self.tokens_seen:,} | "
            f"{rate:,.0f} tokens/s | loss {first['loss']:.3f} (step {first['step']}) -> "
            f"{last['loss']:.3f} (step {last['step']})"
            + (f" | val ppl best {min(vals):.2f}, final {vals[-1]:.2f}" if vals else "")
            + f"\nrun directory: {self.out} (model_final.pt, checkpoints/, logs/, history.json, "
            "loss_curve.png)"
        )

    def cleanup(self) -> None:
        for logger in getattr(self, "loggers", []):
            logger.close()
        if self.claim is not None:
            self.claim.release()
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    recipe = PretrainRecipe(cfg)
    try:
        recipe.setup()
        recipe.train()
    finally:
        recipe.cleanup()


if __name__ == "__main__":
    sys.exit(recipe_main())
