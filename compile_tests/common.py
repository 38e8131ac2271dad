"""Shared checks: an entry point compiled with fullgraph=True equals eager, outputs and grads."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten

from tests.helpers import assert_rel


def _float_tensors(tree) -> list[torch.Tensor]:
    """Float leaves of tree; complex ones as their real views."""
    leaves, _ = tree_flatten(tree)
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    return [
        torch.view_as_real(t) if t.is_complex() else t
        for t in tensors
        if t.is_floating_point() or t.is_complex()
    ]


def scalar_loss(out) -> torch.Tensor:
    """A fixed, position-dependent weighting of every float output, summed (so that every
    output element gets a distinct gradient)."""
    total = 0
    for t in _float_tensors(out):
        if t.requires_grad:
            w = torch.linspace(-1, 1, t.numel(), dtype=t.dtype, device=t.device).view_as(t)
            total = total + (t * w).sum()
    return total


def run(fn, args: list, grads: bool):
    """fn(*args) and, if grads, the gradients of scalar_loss w.r.t. the args requiring grad."""
    out = fn(*args)
    if not grads:
        return _float_tensors(out), []
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    return _float_tensors(out), list(torch.autograd.grad(scalar_loss(out), leaves))


def fresh(args: list) -> list:
    """Copies of the tensor args (detached leaves keep requires_grad)."""
    return [
        a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
        for a in args
    ]


def assert_matches(compiled_fn, eager_fn, make_args, grads: bool, tol: float = 1e-5):
    """compiled_fn and eager_fn agree on outputs (and gradients) for the same arguments."""
    args = make_args()
    out_e, g_e = run(eager_fn, fresh(args), grads)
    out_c, g_c = run(compiled_fn, fresh(args), grads)
    assert len(out_e) == len(out_c)
    for i, (a, b) in enumerate(zip(out_c, out_e, strict=True)):
        assert_rel(a, b, tol, f"output {i}")
    for i, (a, b) in enumerate(zip(g_c, g_e, strict=True)):
        assert_rel(a, b, tol, f"gradient {i}")
