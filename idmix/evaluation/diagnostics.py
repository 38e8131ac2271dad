"""Diagnostics of a trained decoder's token mixers (the science study's instruments).

- ``output_rms_by_position``: RMS of each mixer's output (the input of its ``output_proj``,
  i.e. before W_O) in position bins — a layer whose output grows with position meets
  magnitudes past the training length that it never saw in training.
- ``ssm_gradient_stats``: per SSM parameter tensor (C, Δ, A, the head norms), the RMS of the
  parameter and of its gradient on one batch — do gradients reach the S4D core, and at what
  size relative to the weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..training.optim import ssm_parameters


def _mixers(model):
    return [layer.attn for layer in model.layers]


@torch.no_grad()
def output_rms_by_position(
    model, tokens: torch.Tensor, bins: Sequence[tuple[int, int]]
) -> list[list[float]]:
    """tokens: (B, T) ids, scored as B independent rows; bins: [(start, end), …] within T.
    Returns rms[layer][bin]: the root mean square of the mixer output over the bin's positions
    (all rows, all channels)."""
    T = tokens.shape[1]
    for a, b in bins:
        if not 0 <= a < b <= T:
            raise ValueError(f"bins: ({a}, {b}) is not a non-empty range within [0, {T}]")
    sq: dict[int, torch.Tensor] = {}

    def hook(i):
        def record(_module, inputs):
            sq[i] = inputs[0].detach().float().pow(2).mean(dim=(0, 2))  # (T,)

        return record

    handles = [
        m.output_proj.register_forward_pre_hook(hook(i)) for i, m in enumerate(_mixers(model))
    ]
    was_training = model.training
    model.eval()
    try:
        model(tokens.to(next(model.parameters()).device))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return [[sq[i][a:b].mean().sqrt().item() for a, b in bins] for i in range(len(sq))]


def ssm_gradient_stats(model, tokens: torch.Tensor) -> dict[str, dict[str, float]]:
    """tokens: (B, T + 1) ids. One forward/backward of the next-token loss (gradients are
    cleared afterwards). Returns {parameter group: {"param_rms", "grad_rms", "ratio"}} for the
    S4D core's tensors and the SSM input norms, averaged over layers; {} for models without
    an S4D core (softmax)."""
    device = next(model.parameters()).device
    tokens = tokens.to(device)
    in_group = ssm_parameters(model)  # the optimiser's SSM group
    named = {name: p for name, p in model.named_parameters() if id(p) in in_group}
    if not named:
        return {}
    model.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
    groups: dict[str, list[tuple[float, float]]] = {}
    for name, p in named.items():
        key = name.split(".attn.", 1)[-1]  # e.g. "core.C_re", "key_norm.bias"
        g = torch.zeros_like(p) if p.grad is None else p.grad
        groups.setdefault(key, []).append(
            (p.detach().float().pow(2).mean().sqrt().item(), g.float().pow(2).mean().sqrt().item())
        )
    model.zero_grad(set_to_none=True)
    stats = {}
    for key, values in sorted(groups.items()):
        p_rms = sum(v[0] for v in values) / len(values)
        g_rms = sum(v[1] for v in values) / len(values)
        stats[key] = {"param_rms": p_rms, "grad_rms": g_rms, "ratio": g_rms / max(p_rms, 1e-30)}
    return stats
