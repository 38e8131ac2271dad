"""The paper's optimiser set-up: AdamW with an SSM parameter group (LR capped, no weight
decay) and linear warmup then cosine decay to a floor."""

from __future__ import annotations

import math

import torch


def ssm_parameters(model: torch.nn.Module) -> set[int]:
    """ids of the parameters of the SSM group (paper §5: the "N+b" head norms and Δ, A, C of
    the S4D core): those of every module that declares ``param_group = "ssm"``."""
    return {
        id(p)
        for m in model.modules()
        if getattr(m, "param_group", None) == "ssm"
        for p in m.parameters()
    }


def param_groups(model: torch.nn.Module, lr: float, weight_decay: float, ssm_lr_cap: float):
    """[default group, SSM group (lr = min(lr, ssm_lr_cap), weight decay 0)]. 1-d parameters
    outside the SSM group (RMSNorm scales) get no weight decay either."""
    ssm, decay, no_decay = [], [], []
    in_ssm_group = ssm_parameters(model)
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if id(p) in in_ssm_group:
            ssm.append(p)
        elif p.dim() < 2:
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [
        {"params": decay, "lr": lr, "weight_decay": weight_decay},
        {"params": no_decay, "lr": lr, "weight_decay": 0.0},
        {"params": ssm, "lr": min(lr, ssm_lr_cap), "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def warmup_cosine(optimizer, warmup_steps: int, total_steps: int, min_lr: float):
    """LambdaLR: linear warmup from 0 over warmup_steps, then cosine from each group's peak down
    to min_lr at total_steps (constant after)."""
    peaks = [g["lr"] for g in optimizer.param_groups]

    def factor(peak):
        def f(step):
            if step < warmup_steps:
                return (step + 1) / warmup_steps
            progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
            floor = min(min_lr / peak, 1.0)
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        return f

    return torch.optim.lr_scheduler.LambdaLR(optimizer, [factor(p) for p in peaks])
