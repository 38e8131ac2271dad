"""The S4D-only baseline (paper §6), composed from parts by ``ssm_mixer``."""

from __future__ import annotations

from .compose import ssm_mixer
from .inputs import generic_inputs
from .mixer import SSMMixer
from .readouts import LinearReadout


def S4DMixer(embed_dim: int, num_heads: int, *, use_rope: bool = False, **options) -> SSMMixer:  # noqa: N802
    """Builder (named like the layer it builds): generic [a, b] projections, each with SC and
    N+b, the same complex S4D core with full per-head C, and a linear readout: per channel
    y = Re(wᵀ C X) with one real w ∈ Rᴹ per head, the a- and b-half outputs summed, then a d×d
    C_out (``head_mix``), then W_O. Iso-state with InterdomainAttention; H·M more parameters
    per layer. Options as for ``ssm_mixer`` (no RoPE by default)."""
    return ssm_mixer(
        embed_dim,
        num_heads,
        inputs=generic_inputs,
        readout=LinearReadout,
        use_rope=use_rope,
        **options,
    )
