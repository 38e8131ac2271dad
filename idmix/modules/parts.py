"""The contracts of an SSM mixer's parts (docs/design.md §6), and the settings every part
factory reads.

A mixer is ``SSMMixer(input parts, core, readout, …)``; ``ssm_mixer`` builds each part with a
factory ``(SSMArgs) -> part``, so a new part is one factory and a new mixer is one call. Shapes:
B batch, T positions, H query heads, G state heads (G divides H), d_h head width, M modes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import torch
from torch import nn

from ..functional import silu_l2_feature_map

if TYPE_CHECKING:
    from ..parallel import ContextParallel


@runtime_checkable
class FeatureMap(Protocol):
    """(..., d_h) -> (..., d_h), per head (ξ, identity, or an ``nn.Module`` that trains)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class Gate(Protocol):
    """(x (..., d), o (..., d)) -> (..., d): applied to the flattened heads before W_O."""

    def __call__(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class Core(Protocol):
    """G heads × M complex modes: λ, β and the readout Gram Ĝ (``S4DCore``)."""

    num_heads: int
    num_modes: int

    def discretized(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...
    def discretized_real(self) -> tuple[torch.Tensor, torch.Tensor]: ...
    def gram(self, convention: str) -> torch.Tensor: ...
    def decoding_real(self) -> tuple[torch.Tensor, torch.Tensor]: ...
    def decoding_gram(self, convention: str) -> torch.Tensor: ...
    def snapshot_decoding(self, convention: str) -> None: ...
    def scale_readout_(self, scale: torch.Tensor) -> None: ...


@runtime_checkable
class Readout(Protocol):
    """Reads the state. q: (B, T, H, d_h) or None; a, b: (B, T, G, d_h) (normalised key and
    value halves); state: (B, G, 2·d_h, 2M) interleaved real (docs/design.md §3) or None; reset:
    (B, T) bool or None. ``c_degree``: the output's degree in C (calibration takes that root);
    ``needs_query``: whether q is read; ``prepare_decoding``: snapshot what a traced decode
    step reads (called by setup_cache and reset_cache). Optional: ``carried_modes`` (default 0),
    column pairs the cached state holds beyond the M modes (what the readout carries from one
    token to the next besides X: the Mamba-3 core's last input), so the state is (B, G, 2·d_h,
    2(M + carried_modes))."""

    c_degree: int
    needs_query: bool

    def forward(self, q, a, b, core, state=None, reset=None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (o (B, T, H, d_h), final state)."""

    def step(self, q, a, b, core, state) -> torch.Tensor:
        """One token (q, a, b without T) -> o (B, H, d_h); the state advances in place."""

    def prepare_decoding(self, core) -> None: ...


@runtime_checkable
class InputBranch(Protocol):
    """x -> per-head features with a short-conv cache (``Branch``): forward(x (B, T, d),
    positions (B, T), reset, conv_cache) -> ((B, T, heads, d_h), cache); step(x_t (B, d),
    positions (B,), conv_cache) -> ((B, heads, d_h), cache). conv_size 0: no cache."""

    num_heads: int
    head_dim: int
    conv_size: int
    out_dim: int

    def step(self, x_t, positions, conv_cache): ...


@dataclass(frozen=True)
class SSMArgs:
    """The settings of one SSM mixer; each part factory reads the ones it needs and checks the
    ones it cannot honour (the option list of ``ssm_mixer``, docs/science.md for the choices).
    gate: False, True (``SigmoidGate``) or a factory (SSMArgs) -> Gate. context_parallel: None,
    or the ``idmix.parallel.ContextParallel`` the sequence is split over (``decoder`` passes
    it): the readout is built with the split-sequence op and the mixer exchanges halos."""

    embed_dim: int
    num_heads: int
    num_modes: int = 64
    num_state_groups: int | None = None
    use_rope: bool = True
    rope_position: str = "before_feature_map"
    rope_base: float = 10000.0
    feature_map: FeatureMap = silu_l2_feature_map
    value_conv: bool = False
    norm_eps: float = 1e-6
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    a_init: str = "s4d_inv"
    readout_convention: str = "conj"
    chunk_size: int = 64
    backend: str = "auto"
    precision: str = "auto"
    calibration: str = "global"
    output_norm: bool = False
    gate: bool | Callable[[SSMArgs], Gate] = False
    context_parallel: ContextParallel | None = None

    def __post_init__(self):
        for name in ("embed_dim", "num_heads", "num_modes"):
            n = getattr(self, name)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name}: expected a positive int, got {n!r}")
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim: {self.embed_dim} is not divisible by num_heads={self.num_heads}"
            )
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(
                f"dt_min, dt_max: expected 0 < dt_min <= dt_max, got {self.dt_min}, {self.dt_max}"
            )
        if self.num_heads % self.groups:
            raise ValueError(
                f"num_state_groups: expected a divisor of num_heads={self.num_heads}, got "
                f"{self.num_state_groups!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def groups(self) -> int:
        """G, the number of state heads."""
        return self.num_state_groups or self.num_heads


class InputParts(NamedTuple):
    """What an input path factory builds: ``SSMMixer``'s keyword arguments of the same names."""

    query: nn.Module | None
    key_branch: nn.Module
    value_branch: nn.Module
    key_norm: nn.Module
    value_norm: nn.Module
    rope_last_base: float | None = None


class ReadoutParts(NamedTuple):
    """What a readout factory may build besides the readout: the S4D-only d × d head mix."""

    readout: nn.Module
    head_mix: nn.Module | None = None


InputsFactory = Callable[[SSMArgs, bool], InputParts]  # (args, query) -> parts


@runtime_checkable
class PartFactory(Protocol):
    """How ``ssm_mixer`` takes a core or a readout: a class (or any object) with
    ``from_args(SSMArgs)``; a readout factory also says whether it reads a query, before
    anything is built (``needs_query``). ``from_args`` of a readout may return ReadoutParts."""

    def from_args(self, args: SSMArgs): ...
