"""The process group of a run launched by torchrun (``tune run --nproc_per_node N``): joining
it, each rank's device, averages across ranks and the context-parallel layout (a 2-D mesh of
data-parallel groups × context-parallel groups). One process needs none of it."""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import torch.distributed as dist
from torchtune import utils


def join(device: torch.device) -> tuple[int, int, torch.device]:
    """(world, rank, this rank's device): joins the process group torchrun announces (NCCL for
    CUDA, gloo for CPU tensors) and, on GPUs, picks this machine's GPU for the rank."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        cuda = device.type == "cuda"
        dist.init_process_group("cuda:nccl,cpu:gloo" if cuda else "gloo")
    world, rank = utils.get_world_size_and_rank()
    if world > 1 and device.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))  # this machine's GPUs
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    return world, rank, device


class Layout(NamedTuple):
    """Rank r of world = dp × cp: data-parallel rank r // cp (which rows it reads) and
    context-parallel rank r % cp (which slice of each row it holds)."""

    dp_world: int
    dp_rank: int
    cp_world: int
    cp_rank: int

    def slice(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, ...) -> this rank's contiguous slice of T / cp positions."""
        n = x.shape[1] // self.cp_world
        return x[:, self.cp_rank * n : (self.cp_rank + 1) * n]


def layout(world: int, rank: int, cp: int) -> Layout:
    return Layout(world // cp, rank // cp, cp, rank % cp)


def context_parallel_group(world: int, cp: int, device: torch.device):
    """The context-parallel process group of this rank, from a (dp, cp) device mesh: ranks
    r·cp … r·cp + cp − 1 split one sequence."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (world // cp, cp), mesh_dim_names=("dp", "cp"))
    return mesh["cp"].get_group()


def mean_across_ranks(value: float, world: int, device: torch.device) -> float:
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / world


def leave(world: int) -> None:
    if world > 1 and dist.is_initialized():
        dist.destroy_process_group()
