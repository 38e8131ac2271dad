"""The one collective context parallelism needs, differentiable: an all-gather whose backward
sums each rank's gradients back to the rank that contributed the tensor, and a count of the
bytes each rank puts into it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class Traffic:
    """Bytes this rank contributed to all-gathers (``forward``) and to the gradient all-reduces
    of their backward (``backward``), by label."""

    forward: dict[str, int] = field(default_factory=dict)
    backward: dict[str, int] = field(default_factory=dict)

    def add(self, direction: str, label: str, nbytes: int) -> None:
        book = getattr(self, direction)
        book[label] = book.get(label, 0) + nbytes


_TRAFFIC: list[Traffic] = []


@contextlib.contextmanager
def count_traffic():
    """Within the block, every ``all_gather_with_grad`` adds its payload to the Traffic
    yielded (the backward's all-reduce too, if backward runs inside the block)."""
    traffic = Traffic()
    _TRAFFIC.append(traffic)
    try:
        yield traffic
    finally:
        _TRAFFIC.remove(traffic)


def _count(direction: str, label: str, x: torch.Tensor) -> None:
    for traffic in _TRAFFIC:
        traffic.add(direction, label, x.numel() * x.element_size())


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, label):
        ctx.group, ctx.label = group, label
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        _count("forward", label, x)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad):
        # the gradient of rank j's tensor is the sum over ranks of what each rank's loss says
        # about it (gloo has no reduce-scatter: an all-reduce, then this rank's row)
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        _count("backward", ctx.label, grad)
        return grad[dist.get_rank(ctx.group)], None, None


def all_gather_with_grad(x: torch.Tensor, group=None, label: str = "state") -> torch.Tensor:
    """x: (...) on every rank of group (same shape and dtype) -> (world, ...), row j rank j's.
    Differentiable: the backward hands each rank the sum of all ranks' gradients for its row."""
    return _AllGather.apply(x, group, label)
