"""A model built for a sequence split across gloo ranks (``decoder(context_parallel=…)``): the
loss, every parameter's gradient and a few optimiser steps equal the single-process model's,
for interdomain, a hybrid with softmax layers and the selective (per-token decay) layer, with
documents starting at and across a slice boundary; unsupported mixers and decoding caches are
refused by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from examples.selective_per_mode import PerModeSelectiveReadout
from idmix import models
from idmix.modules import GatedLinearAttention as GLA
from idmix.modules import InterdomainAttention, ssm_mixer
from idmix.parallel import ContextParallel
from tests.distributed import run_ranks

# fp32, measured: loss ≤ 1.2e-7 relative, gradients ≤ 8.0e-6 relative to the largest entry of
# each parameter's gradient (log_dt of the unpacked interdomain model; ≤ 1.3e-6 elsewhere; the
# CPU's float reduction order moves it: 1.1e-6 on an AVX-512 host, 8.0e-6 on an AMX host), at
# each of three steps (compared at equal parameters: the split model is reset to the
# reference's after each AdamW step, so fp32 noise does not compound).
LOSS_TOL, GRAD_TOL = 1e-6, 2e-5
T = 48


def _model(name, **split):
    torch.manual_seed(0)
    builder = {
        "interdomain": models.interdomain_tiny,
        "hybrid": models.hybrid_interdomain_tiny,  # layer 1 softmax: gathered K/V
        "selective": models.selective_interdomain_tiny,  # per-token decays
    }
    return builder[name](chunk_size=8, **split)


def _train_equal(rank, world, name, packed):
    ref = _model(name)
    cp_model = _model(name, context_parallel=ContextParallel())
    for (n, p), q in zip(ref.named_parameters(), cp_model.parameters(), strict=True):
        assert torch.equal(p, q), n  # the same layers, parameter for parameter
    g = torch.Generator().manual_seed(1)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    a, b = rank * T // world, (rank + 1) * T // world
    for step in range(3):
        tokens = torch.randint(0, 4096, (2, T + 1), generator=g)
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        pos = None
        if packed:  # documents starting at a slice boundary and inside the next slice
            starts = [0, T // world, T // world + 5]
            ends = starts[1:] + [T]
            pos = torch.cat([torch.arange(e - s) for s, e in zip(starts, ends, strict=True)])
            pos = pos.expand(2, T)
        full = F.cross_entropy(ref(inputs, input_pos=pos).flatten(0, 1), labels.flatten())
        logits = cp_model(inputs[:, a:b], input_pos=None if pos is None else pos[:, a:b])
        part = F.cross_entropy(logits.flatten(0, 1), labels[:, a:b].flatten(), reduction="sum")
        part = part / labels.numel()
        opt.zero_grad()
        cp_model.zero_grad()
        full.backward()
        part.backward()
        total = part.detach().clone()
        dist.all_reduce(total)
        assert abs(total.item() / full.item() - 1) <= LOSS_TOL, (step, total.item(), full.item())
        for (n, p), q in zip(ref.named_parameters(), cp_model.parameters(), strict=True):
            grad = q.grad.clone()
            dist.all_reduce(grad)
            err = (grad - p.grad).abs().max() / p.grad.abs().max().clamp_min(1e-30)
            assert err <= GRAD_TOL, f"step {step} {n}: relative error {err:.2e}"
        opt.step()  # both models move to the reference's new parameters: each step compares
        cp_model.load_state_dict(ref.state_dict())  # at equal parameters, no drift


@pytest.mark.parametrize(
    "name, packed",
    [("interdomain", False), ("hybrid", True),
     pytest.param("selective", True, marks=pytest.mark.slow)],  # its per-token path: ~40 s
)  # fmt: skip
def test_split_model_trains_like_one_process(name, packed):
    run_ranks(2, _train_equal, name, packed)


class _NotBuiltForSplits(PerModeSelectiveReadout):
    """A user's readout whose from_args ignores args.context_parallel."""

    @classmethod
    def from_args(cls, args):
        return super().from_args(dataclasses.replace(args, context_parallel=None))


def _refusals(rank, world):
    cp = ContextParallel()
    with pytest.raises(ValueError, match=r"context_parallel: the linear \(S4D-only\) readout"):
        models.s4d_tiny(context_parallel=cp)
    with pytest.raises(ValueError, match=r"layers\[0\]\.attn: GatedDeltaNet has no context-par"):
        models.gated_deltanet_tiny(context_parallel=cp)
    with pytest.raises(ValueError, match=r"layers\[1\]\.attn: GatedLinearAttention has no"):
        models.interdomain_tiny(mixer=lambda i: GLA(128, 4) if i else InterdomainAttention(
            128, 4, context_parallel=cp), context_parallel=cp)  # fmt: skip
    with pytest.raises(ValueError, match=r"context_parallel: _NotBuiltForSplits was not built"):
        ssm_mixer(8, 2, num_modes=4, readout=_NotBuiltForSplits, context_parallel=cp)
    model = models.interdomain_tiny(context_parallel=cp)
    model.setup_caches(batch_size=1, dtype=torch.float32, decoder_max_seq_len=8)
    with pytest.raises(RuntimeError, match="setup_cache: a context-parallel layer"):
        model.layers[0].attn(torch.zeros(1, 4, 128))
    model = models.interdomain_tiny(context_parallel=cp)
    with pytest.raises(ValueError, match="shorter than the short conv"):
        model(torch.zeros(1, 2, dtype=torch.long))


def test_unsupported_mixers_and_caches_are_refused():
    run_ranks(2, _refusals)
