"""The modern linear baselines (GLA, Mamba-2, Gated DeltaNet, Mamba-3) and hybrid stacks at the CPU
sizes.

Each baseline is matched to ``interdomain_{tiny,small}``: its recurrent state per layer holds
the same number of floats (within 5%) and the model the same number of parameters (within
±1%). The heads are the interdomain model's (4 of d/4); GLA and Gated DeltaNet take keys of
d/4 and values of 2d/4 per head, Mamba-2 and Mamba-3 their standard expand 2 with the state
width N that matches the state; every baseline's mixer is wider than interdomain's, so its
SwiGLU width (``intermediate_dim``) is narrower, chosen to match the parameters.
docs/baselines.md has the table; tests/test_baselines.py checks both matches.

Hybrids put softmax attention in every k-th layer (``decoder(softmax_every=k)``): one in two at
``tiny`` (2 layers), one in four at ``small`` (4 layers).
"""

from __future__ import annotations

from .configs import _cpu, _named

# (mixer, scale): the mixer options and SwiGLU width that match interdomain_<scale>
MATCHED = {
    ("gla", "tiny"): {"value_dim": 64, "intermediate_dim": 208},
    ("gla", "small"): {"value_dim": 128, "intermediate_dim": 432},
    ("mamba2", "tiny"): {"expand": 2, "state_dim": 32, "intermediate_dim": 280},
    ("mamba2", "small"): {"expand": 2, "state_dim": 64, "intermediate_dim": 560},
    ("gated_deltanet", "tiny"): {"value_dim": 64, "intermediate_dim": 216},
    ("gated_deltanet", "small"): {"value_dim": 128, "intermediate_dim": 432},
    ("mamba3", "tiny"): {"expand": 2, "state_dim": 32, "intermediate_dim": 280},
    ("mamba3", "small"): {"expand": 2, "state_dim": 64, "intermediate_dim": 560},
}
# the hybrid's softmax layers: every k-th at each scale
HYBRID_EVERY = {"tiny": 2, "small": 4}
# (mixer, scale) of a hybrid: the SwiGLU width that matches interdomain_<scale> (None: the
# default width is within ±1% already)
HYBRID_WIDTH = {
    ("interdomain", "tiny"): None,
    ("interdomain", "small"): None,
    ("gla", "tiny"): 304,
    ("gla", "small"): 520,
    ("mamba2", "tiny"): 336,
    ("mamba2", "small"): 616,
    ("gated_deltanet", "tiny"): 304,
    ("gated_deltanet", "small"): 520,
}


def _baseline(mixer: str, scale: str, overrides: dict):
    return _cpu(mixer, scale, {**MATCHED[mixer, scale], **overrides})


def _hybrid(mixer: str, scale: str, overrides: dict):
    options = {k: v for k, v in MATCHED.get((mixer, scale), {}).items() if k != "intermediate_dim"}
    width = HYBRID_WIDTH[mixer, scale]
    sizes = {} if width is None else {"intermediate_dim": width}
    return _cpu(
        mixer, scale, {**options, **sizes, "softmax_every": HYBRID_EVERY[scale], **overrides}
    )


@_named
def gla_tiny(**overrides):
    """Gated Linear Attention, tiny, matched to interdomain_tiny (state and parameters)."""
    return _baseline("gla", "tiny", overrides)


@_named
def gla_small(**overrides):
    """Gated Linear Attention, small, matched to interdomain_small (state and parameters)."""
    return _baseline("gla", "small", overrides)


@_named
def mamba2_tiny(**overrides):
    """Mamba-2 (SSD), tiny, matched to interdomain_tiny (state and parameters)."""
    return _baseline("mamba2", "tiny", overrides)


@_named
def mamba2_small(**overrides):
    """Mamba-2 (SSD), small, matched to interdomain_small (state and parameters)."""
    return _baseline("mamba2", "small", overrides)


@_named
def gated_deltanet_tiny(**overrides):
    """Gated DeltaNet, tiny, matched to interdomain_tiny (state and parameters)."""
    return _baseline("gated_deltanet", "tiny", overrides)


@_named
def gated_deltanet_small(**overrides):
    """Gated DeltaNet, small, matched to interdomain_small (state and parameters)."""
    return _baseline("gated_deltanet", "small", overrides)


@_named
def mamba3_tiny(**overrides):
    """Mamba-3 (SISO), tiny, matched to interdomain_tiny (state and parameters)."""
    return _baseline("mamba3", "tiny", overrides)


@_named
def mamba3_small(**overrides):
    """Mamba-3 (SISO), small, matched to interdomain_small (state and parameters)."""
    return _baseline("mamba3", "small", overrides)


@_named
def hybrid_interdomain_tiny(**overrides):
    """Interdomain with softmax attention in layer 1 of 2 (tiny; parameters as interdomain's)."""
    return _hybrid("interdomain", "tiny", overrides)


@_named
def hybrid_interdomain_small(**overrides):
    """Interdomain with softmax attention in layer 3 of 4 (small; parameters as interdomain's)."""
    return _hybrid("interdomain", "small", overrides)


@_named
def hybrid_gla_tiny(**overrides):
    """GLA with softmax attention in layer 1 of 2 (tiny; parameters as interdomain_tiny's)."""
    return _hybrid("gla", "tiny", overrides)


@_named
def hybrid_gla_small(**overrides):
    """GLA with softmax attention in layer 3 of 4 (small; parameters as interdomain_small's)."""
    return _hybrid("gla", "small", overrides)


@_named
def hybrid_mamba2_tiny(**overrides):
    """Mamba-2 with softmax attention in layer 1 of 2 (tiny; parameters as interdomain_tiny's)."""
    return _hybrid("mamba2", "tiny", overrides)


@_named
def hybrid_mamba2_small(**overrides):
    """Mamba-2 with softmax attention in layer 3 of 4 (small; parameters as interdomain_small's)."""
    return _hybrid("mamba2", "small", overrides)


@_named
def hybrid_gated_deltanet_tiny(**overrides):
    """Gated DeltaNet with softmax attention in layer 1 of 2 (tiny; parameters as
    interdomain_tiny's)."""
    return _hybrid("gated_deltanet", "tiny", overrides)


@_named
def hybrid_gated_deltanet_small(**overrides):
    """Gated DeltaNet with softmax attention in layer 3 of 4 (small; parameters as
    interdomain_small's)."""
    return _hybrid("gated_deltanet", "small", overrides)


__all__ = [  # the builders only (idmix.models.__all__ lists what configs may name)
    "gla_tiny",
    "gla_small",
    "mamba2_tiny",
    "mamba2_small",
    "gated_deltanet_tiny",
    "gated_deltanet_small",
    "mamba3_tiny",
    "mamba3_small",
    "hybrid_interdomain_tiny",
    "hybrid_interdomain_small",
    "hybrid_gla_tiny",
    "hybrid_gla_small",
    "hybrid_mamba2_tiny",
    "hybrid_mamba2_small",
    "hybrid_gated_deltanet_tiny",
    "hybrid_gated_deltanet_small",
]
