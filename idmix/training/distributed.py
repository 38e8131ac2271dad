"""The process group of a run launched by torchrun (``tune run --nproc_per_node N``): joining
it, each rank's device, and averages across ranks. One process needs none of it."""

from __future__ import annotations

import os

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


def mean_across_ranks(value: float, world: int, device: torch.device) -> float:
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / world


def leave(world: int) -> None:
    if world > 1 and dist.is_initialized():
        dist.destroy_process_group()
