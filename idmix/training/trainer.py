"""The pretraining loop behind ``recipes/pretrain_interdomain.py`` (and every run of
``recipes/compare_mixers.py``): one process, or FSDP2 across the processes torchrun starts,
optionally with each sequence split over ``context_parallel_size`` of them.

Packed documents with positions restarting at each document (the recurrent state resets there);
a step/token budget; AdamW with the SSM parameter group; linear warmup then cosine to a floor;
gradient accumulation and clipping; bf16 autocast, per-block torch.compile and activation
checkpointing as options; periodic validation perplexity; atomic, exactly resumable checkpoints
in a run directory this run owns (``run_dir.py``). Progress and metric logging are callbacks
(``callbacks.py``), and so is anything a caller adds: ``train(cfg, callbacks=[…])``.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import datasets
import torch
from omegaconf import DictConfig, OmegaConf
from torchtune import config, training
from torchtune.modules import TransformerSelfAttentionLayer

from ..io import checkpoint as ckpt
from ..io.config_checks import fail, resolved
from ..io.model_description import plain_description, saved_model_description
from ..io.run_dir import claim_run_dir, stamp_run_id
from ..parallel import ContextParallel
from . import distributed
from .callbacks import Callback, MetricLoggers, ProgressBar
from .optim import param_groups, warmup_cosine
from .outputs import export_final_model, summary_text, write_run_results
from .packing import PackedStream, cycling_documents, streaming_documents
from .pretrain_config import check_pretrain_config


class Trainer:
    """``Trainer(cfg, callbacks)``: checks the config and claims ``output_dir`` (rank 0 locks
    it; every rank learns the run id); ``setup()`` builds model, tokenizer, optimizer, schedule
    and data, and resumes when asked; ``train()`` runs to the budget (or ``steps_this_run``),
    checkpoints and writes the results; ``cleanup()`` releases everything (always call it)."""

    def __init__(self, cfg: DictConfig, callbacks: list[Callback] | tuple = ()):
        check_pretrain_config(cfg)
        self.cfg = cfg
        self.callbacks = [ProgressBar(), *callbacks, *_configured_callbacks(cfg)]
        self.world, self.rank, self.device = distributed.join(torch.device(cfg.device))
        self.distributed = self.world > 1
        cp = cfg.get("context_parallel_size") or 1
        if self.world % cp:
            fail(f"context_parallel_size={cp} does not divide the {self.world} processes")
        self.layout = distributed.layout(self.world, self.rank, cp)
        self.out = Path(cfg.output_dir)
        self.tokens_per_micro = cfg.batch_size * cfg.seq_len
        self.accum = self._accumulation()
        self.tokens_per_step = self.tokens_per_micro * self.accum * self.layout.dp_world
        self.total_steps = self._budget("max_steps", "max_tokens")
        self.warmup_steps = self._budget("warmup_steps", "warmup_tokens")
        self.claim = None
        self.run_id = self._claim_run_dir()

    # configuration checks ---------------------------------------------------------------------
    def _claim_run_dir(self) -> str | None:
        """Rank 0 locks output_dir for this run (run_dir.py) and every rank learns the run id
        (None when resuming a run from before run.json: ``_resume`` stamps it); a refusal is
        raised on every rank."""
        cfg = self.cfg

        def claim():
            self.claim = claim_run_dir(self.out, cfg.resume_from_checkpoint, cfg.overwrite)
            for note in self.claim.notes:
                print(note, flush=True)
            try:
                if cfg.resume_from_checkpoint and ckpt.latest_checkpoint(self.out) is None:
                    fail(f"resume_from_checkpoint=True but {str(self.out)!r} has no checkpoint")
            except BaseException:
                self.claim.release()
                raise
            return self.claim.run_id

        return ckpt.on_rank0(claim)

    def _accumulation(self) -> int:
        cfg = self.cfg
        if cfg.get("global_batch_tokens"):
            per = self.tokens_per_micro * self.layout.dp_world
            if cfg.global_batch_tokens % per:
                fail(
                    f"global_batch_tokens={cfg.global_batch_tokens} is not a multiple of "
                    f"batch_size*seq_len*(world / context_parallel_size) = {per}"
                )
            return cfg.global_batch_tokens // per
        return cfg.gradient_accumulation_steps

    def _budget(self, steps_key: str, tokens_key: str) -> int:
        tokens = self.cfg.get(tokens_key)
        steps = math.ceil(tokens / self.tokens_per_step) if tokens else self.cfg.get(steps_key)
        if steps is None:
            fail(f"{steps_key} / {tokens_key}: expected a positive budget, got {steps}")
        return int(steps)

    # set-up -----------------------------------------------------------------------------------
    def _build_model(self, split: dict):
        """cfg.model, built for a split sequence when split holds its ``context_parallel``."""
        try:
            return config.instantiate(self.cfg.model, **split)
        except TypeError as e:
            if split and "context_parallel" in str(e):
                fail(
                    f"model: {self.cfg.model.get('_component_')} takes no context_parallel, "
                    "which context_parallel_size > 1 passes it (idmix.models.decoder does)"
                )
            raise

    def setup(self) -> None:
        cfg = self.cfg
        path = cfg.tokenizer.get("path")
        if path is not None and not Path(path).is_file():
            fail(f"tokenizer.path: no such file {path!r}")
        split = {}
        if self.layout.cp_world > 1:  # the layers are built for this rank's slice of a sequence
            group = distributed.context_parallel_group(
                self.world, self.layout.cp_world, self.device
            )
            split = {"context_parallel": ContextParallel(group)}
        if self.distributed:  # every rank builds the one-process model (then its own stream)
            torch.manual_seed(cfg.seed)
            self.model = self._build_model(split)
            training.set_seed(seed=cfg.seed)  # seed + rank
        else:
            training.set_seed(seed=cfg.seed)
            self.model = self._build_model(split)
        max_len = getattr(self.model, "max_seq_len", None)
        if max_len is not None and cfg.seq_len > max_len:
            fail(f"seq_len={cfg.seq_len} exceeds the model's max_seq_len={max_len}")
        self.tokenizer = config.instantiate(cfg.tokenizer)
        vocab = self.model.output.out_features if hasattr(self.model, "output") else None
        if vocab is not None and self.tokenizer.vocab_size > vocab:
            fail(f"tokenizer vocab_size {self.tokenizer.vocab_size} exceeds the model's {vocab}")
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
        loggers = [config.instantiate(c) for c in cfg.metric_loggers] if self.rank == 0 else []
        self.callbacks.append(MetricLoggers(loggers, cfg.log_every_n_steps))
        self.step, self.history = 0, []
        if cfg.resume_from_checkpoint:
            self._resume()
        elif self.rank == 0:
            OmegaConf.save(cfg, self.out / "config.yaml", resolve=True)  # plain data

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
            rank=self.layout.dp_rank,  # the ranks of one context-parallel group share rows
            world=self.layout.dp_world,
        )

    def _resume(self) -> None:
        path = ckpt.latest_checkpoint(self.out)
        saved_model = saved_model_description(self.out / "config.yaml")
        model = plain_description(resolved(self.cfg.model), "config: model")
        if saved_model != model:
            fail(
                f"the checkpoint in {str(self.out)!r} was written by model {saved_model}, but "
                f"this config builds {model}"
            )
        extra = ckpt.load_checkpoint(path, self.model, self.optimizer, self.run_id)
        self.scheduler.load_state_dict(extra["scheduler"])
        self.train_stream.load_state_dict(extra["data"])
        self.step, self.history = extra["step"], extra["history"]
        if self.run_id is None:  # a run from before run.json: stamped only now, once resumed,
            # with its checkpoint's id (or a new one for a run from before run ids)
            self.run_id = ckpt.on_rank0(lambda: stamp_run_id(self.out, extra.get("run_id")))
        self._log_line(f"resumed from {path} at step {self.step}")

    # training ---------------------------------------------------------------------------------
    def _emit(self, event: str, *args) -> None:
        for callback in self.callbacks:
            getattr(callback, event)(self, *args)

    def _autocast(self):
        if self.cfg.dtype == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _loss(self, tokens, positions) -> torch.Tensor:
        tokens, positions = tokens.to(self.device), positions.to(self.device)
        inputs, labels, positions = tokens[:, :-1], tokens[:, 1:], positions[:, :-1]
        if self.layout.cp_world > 1:  # this rank's slice (equal slices: the mean of the
            # ranks' losses is the loss of the whole sequence)
            inputs, labels, positions = map(self.layout.slice, (inputs, labels, positions))
        with self._autocast():
            logits = self.model(inputs, input_pos=positions)
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())

    def _mean_across_ranks(self, value: float) -> float:
        return distributed.mean_across_ranks(value, self.world, self.device)

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
        self._emit("on_after_backward", self.step + 1)
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
        self._emit("on_train_start")
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
            self._emit("on_step_end", record)
            if self._due(cfg.save_every_n_steps):
                self.save()
        self._emit("on_train_end")
        self.elapsed = time.perf_counter() - t_start
        self.tokens_seen = (self.step - first_step) * self.tokens_per_step
        if not self._due(cfg.save_every_n_steps):
            self.save()
        write_run_results(self.out, self.history, self.rank)
        if self.step == self.total_steps:
            hf = cfg.get("hf_export", True)  # output_dir/hf/ (idmix.hf), on unless false
            export_final_model(self.out, self.model, resolved(cfg.model), self.tokenizer, hf)
        self.summary()

    def save(self) -> None:
        extra = {
            "step": self.step,
            "scheduler": self.scheduler.state_dict(),
            "data": self.train_stream.state_dict(),
            "history": self.history,
        }
        ckpt.save_checkpoint(
            self.out, self.step, self.model, self.optimizer, extra, self.run_id,
            on_stage=lambda stage, step: self._emit("on_checkpoint", stage, step),
        )  # fmt: skip

    def _log_line(self, text: str) -> None:
        if self.rank == 0:
            print(text, flush=True)

    def summary(self) -> None:
        self._log_line(
            summary_text(
                self.out, self.history, self.step, self.world, self.tokens_seen, self.elapsed
            )
        )

    def cleanup(self) -> None:
        for callback in self.callbacks:
            callback.close()
        if self.claim is not None:
            self.claim.release()
        distributed.leave(self.world)


def _configured_callbacks(cfg: DictConfig) -> list[Callback]:
    """The config's ``callbacks:`` nodes, instantiated; each must make a Callback."""
    made = []
    for i, node in enumerate(cfg.get("callbacks") or []):
        callback = config.instantiate(node)
        if not isinstance(callback, Callback):
            fail(
                f"callbacks[{i}]: {node._component_} made a {type(callback).__name__}, expected "
                "an idmix.training.callbacks.Callback"
            )
        made.append(callback)
    return made


def train(cfg: DictConfig, callbacks: list[Callback] | tuple = ()) -> Trainer:
    """What the pretraining recipe runs: set-up (resuming when asked), training to the budget,
    clean-up (also after an error). Returns the finished trainer (its model, history, …)."""
    trainer = Trainer(cfg, callbacks)
    try:
        trainer.setup()
        trainer.train()
    finally:
        trainer.cleanup()
    return trainer


PretrainRecipe = Trainer  # the name of this class while it lived in recipes/ (before issue 31)
