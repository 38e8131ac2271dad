"""A model's layers on a sequence split across the ranks of a process group.

Rank r holds the contiguous positions [s_r, s_r + T_r) of every row. What crosses a slice
boundary, and how:

- the recurrent state of an interdomain / selective layer: one all-gather of each rank's
  (final state from zero, decay product) (``interdomain_attention_context_parallel``);
- the short convolutions' history: each rank's last W − 1 conv inputs (zeroed before its last
  document start) are all-gathered, and rank r reads rank r − 1's (a halo of (B, W−1, C));
- positions (RoPE): s_r + t when the model gets no ``input_pos``; given positions (packed
  documents) are the slice's own and are used as they are;
- softmax attention: every rank's keys, values and document starts are all-gathered (equal
  slices only) and each rank attends from its queries with the global causal and document
  mask. PyTorch's ring ``context_parallel`` for SDPA needs CUDA devices; this is its CPU
  equivalent (memory O(T) keys per rank, not O(T / world)).

Every exchange is differentiable (``all_gather_with_grad``), and each depends on the one
before it (a zero-weight link), so the backward's gradient all-reduces run in one order on
every rank (the reverse of the forward's), whatever each rank's graph looks like.

A model is built for it: ``idmix.models.decoder(…, context_parallel=ContextParallel(group))``
(every named builder passes it on) gives each layer the ContextParallel as a part, the query
readouts the split-sequence op. Other mixers (S4D-only, the linear baselines) are refused by
layer; decoding caches are refused (CP is for training and prefill of one long sequence).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist

from ..functional.collectives import all_gather_with_grad
from ..functional.context_parallel import interdomain_attention_context_parallel
from ..functional.short_conv import short_conv_with_resets


class ContextParallel:
    """The process group a model's sequence is split over, and the exchanges its layers make.

    group: a ``torch.distributed`` process group (None: the default group)."""

    def __init__(self, group=None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "group: context parallelism needs an initialised torch.distributed process "
                "group (torch.distributed.init_process_group)"
            )
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self._lengths: dict[int, list[int]] = {}
        self._last = None  # the latest differentiable gather of this forward pass

    def new_pass(self, *_) -> None:
        """Forget the previous forward pass's gathers (a forward pre-hook of the model)."""
        self._last = None

    def gather(self, x: torch.Tensor, label: str) -> torch.Tensor:
        """x on every rank -> (world, ...), differentiable; a floating x is first linked to the
        previous gather of this pass (x + 0·last), so that the gathers' backward all-reduces
        run in the reverse order of the forward on every rank."""
        if not x.is_floating_point():
            return all_gather_with_grad(x, self.group, label)
        if self._last is not None:
            x = x + 0 * self._last.to(x.dtype)
        gathered = all_gather_with_grad(x, self.group, label)
        if torch.is_grad_enabled():
            self._last = gathered.flatten()[0]
        return gathered

    def lengths(self, T: int, device) -> list[int]:
        """Every rank's slice length, given this rank's T (one all-gather of an int per
        distinct T, memoised)."""
        if T not in self._lengths:
            mine = torch.tensor([T], device=device)
            self._lengths[T] = all_gather_with_grad(mine, self.group, "lengths").flatten().tolist()
        return self._lengths[T]

    def start(self, T: int, device) -> int:
        """s_r, this rank's first position."""
        return sum(self.lengths(T, device)[: self.rank])

    def positions(self, input_pos, B: int, T: int, device):
        """input_pos as given, or the global positions s_r + t as (B, T)."""
        if input_pos is not None:
            return input_pos
        start = self.start(T, device)
        return torch.arange(start, start + T, device=device).expand(B, T)

    def op(self):
        """The chunked interdomain op over this group (what a query readout runs when its mixer
        has a ContextParallel)."""
        return partial(interdomain_attention_context_parallel, group=self.group, gather=self.gather)

    def conv_halo(self, h: torch.Tensor, reset, weight: torch.Tensor) -> torch.Tensor:
        """The previous rank's last W − 1 conv inputs (B, W−1, C), zeros on rank 0; h (B, T, C)
        this rank's conv inputs (T >= W − 1), reset (B, T) or None, weight (C, W)."""
        W = weight.shape[1]
        if h.shape[1] < W - 1:
            raise ValueError(
                f"x: a context-parallel slice of {h.shape[1]} positions is shorter than the "
                f"short conv's history (kernel {W}: {W - 1} positions); use slices of >= {W - 1}"
            )
        tail = h[:, h.shape[1] - (W - 1) :]
        if reset is not None:  # zeros before the slice's last document start (the conv's cache)
            tail = short_conv_with_resets(tail, weight, None, reset[:, -(W - 1) :])[1]
        gathered = self.gather(tail, "conv_halo")  # (world, B, W-1, C)
        return torch.zeros_like(tail) if self.rank == 0 else gathered[self.rank - 1]

    def gather_sequence(self, x: torch.Tensor, label: str) -> torch.Tensor:
        """x (B, T_r, ...) on every rank (equal T_r) -> (B, Σ T_r, ...) in rank order."""
        lengths = self.lengths(x.shape[1], x.device)
        if len(set(lengths)) > 1:
            raise ValueError(
                f"x: {label} gathers equal slices only; the ranks hold {lengths} positions"
            )
        return self.gather(x, label).transpose(0, 1).flatten(1, 2)
