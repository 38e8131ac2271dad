"""The mixer registry: name -> builder ``(embed_dim, num_heads, **options) -> nn.Module``, the
one table ``idmix.models.decoder(mixer=<name>)`` and configs (``model.mixer=s4d``) read.

Each entry says which options it takes, so a config typo fails naming the key; the softmax
and linear baselines (GLA, Mamba-2, Gated DeltaNet, Mamba-3) take the SSM options too and drop those
they do not share (one config line can switch mixers).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

from torch import nn

from .cells import ABLATION_CELLS, ablation_cell
from .compose import SSM_OPTIONS, InterdomainAttention, S4DMixer
from .delta_core import DeltaInterdomainAttention
from .gated_deltanet import GatedDeltaNet
from .gla import GatedLinearAttention
from .mamba2 import Mamba2
from .mamba3 import Mamba3
from .mamba3_core import Mamba3CoreInterdomainAttention
from .selective import SelectiveInterdomainAttention
from .softmax import SoftmaxAttention

MixerBuilder = Callable[..., nn.Module]  # (embed_dim, num_heads, **options) -> mixer


class MixerEntry(NamedTuple):
    """build: a MixerBuilder; options: the option names it accepts (None: any, the builder
    checks); keeps: the accepted ones it is given (None: all), the rest dropped."""

    build: MixerBuilder
    options: frozenset[str] | None = None
    keeps: frozenset[str] | None = None


# the linear baselines' own options; the SSM options a config may set for all mixers are
# accepted and dropped, except the shared ones each keeps (chunk_size, norm_eps, dt_min/max)
_SHARED = frozenset({"chunk_size", "norm_eps"})
_LINEAR = _SHARED | {"key_dim", "value_dim", "conv_size"}

MIXERS: dict[str, MixerEntry] = {
    "interdomain": MixerEntry(InterdomainAttention, SSM_OPTIONS),
    "s4d": MixerEntry(S4DMixer, SSM_OPTIONS),
    "selective_interdomain": MixerEntry(SelectiveInterdomainAttention, SSM_OPTIONS),
    "interdomain_mamba3": MixerEntry(Mamba3CoreInterdomainAttention, SSM_OPTIONS),
    "interdomain_delta": MixerEntry(DeltaInterdomainAttention, SSM_OPTIONS),
    "softmax": MixerEntry(
        SoftmaxAttention, SSM_OPTIONS, frozenset({"rope_base", "use_rope", "context_parallel"})
    ),
    **{
        name: MixerEntry(partial(ablation_cell, name), SSM_OPTIONS - set(parts))
        for name, parts in ABLATION_CELLS.items()
    },
    **{
        name: MixerEntry(cls, SSM_OPTIONS | options, options)
        for name, (cls, options) in {
            "gla": (GatedLinearAttention, _LINEAR | {"gate_rank"}),
            "mamba2": (Mamba2, _SHARED | {"expand", "state_dim", "conv_size", "dt_min", "dt_max"}),
            "gated_deltanet": (GatedDeltaNet, _LINEAR | {"dt_min", "dt_max"}),
            "mamba3": (
                Mamba3,
                _SHARED | {"expand", "state_dim", "rope_fraction", "dt_min", "dt_max"},
            ),
        }.items()
    },
}


def register_mixer(name: str, build: MixerBuilder, options=None) -> MixerBuilder:
    """Add a mixer under name (options: the option names it accepts, None for any); returns
    build. Registering another builder under a taken name is an error."""
    if name in MIXERS and MIXERS[name].build is not build:
        raise ValueError(f"name: mixer {name!r} is already registered ({MIXERS[name].build})")
    MIXERS[name] = MixerEntry(build, None if options is None else frozenset(options))
    return build


def resolve_mixer(name: str, options: dict) -> tuple[MixerBuilder, dict]:
    """(builder, the options it is given) for the mixer registered under name; an unknown name
    or option is an error naming it."""
    if name not in MIXERS:
        raise ValueError(
            f"mixer: expected one of {sorted(MIXERS)} or {{'_component_': 'module.builder'}}, "
            f"got {name!r}"
        )
    entry = MIXERS[name]
    unknown = sorted(set(options) - entry.options) if entry.options is not None else []
    if unknown:
        raise ValueError(
            f"mixer options: unknown {unknown} for mixer {name!r}; known: {sorted(entry.options)}"
        )
    if entry.keeps is not None:
        options = {k: v for k, v in options.items() if k in entry.keeps}
    return entry.build, options
