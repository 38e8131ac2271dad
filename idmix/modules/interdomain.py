"""Interdomain Attention, the paper's practical layer (docs/design.md §1): the dual KV input path
and the query-conditioned readout, ``ssm_mixer``'s default parts."""

from __future__ import annotations

from .compose import ssm_mixer
from .mixer import SSMMixer


def InterdomainAttention(embed_dim: int, num_heads: int, **options) -> SSMMixer:  # noqa: N802
    """Builder (named like the layer it builds): an ``SSMMixer`` with input halves
    [ξ(SC(W_K x)), W_V x] and readout o = Re(Γᴴ U ξ(q)).

    Options (``SSMArgs``): use_rope (default on), gate (σ(W_g x) ⊙ o, default off),
    readout_convention "conj" (default) or "product", num_modes M (default 64), chunk_size of
    the training path, feature_map (default ξ), num_state_groups, rope_position, dt_min,
    dt_max, a_init, calibration, output_norm, value_conv, rope_base, norm_eps, backend of the
    core op ("auto", "torch", "triton", or "inductor": its segment math compiled on first use),
    precision of its matrix products ("auto", "ieee", "tf32", "bf16": docs/precision.md).
    """
    return ssm_mixer(embed_dim, num_heads, **options)
