"""The six 125M ablation cells of the paper's Table 4: each a choice of input path, readout and
RoPE for ``ssm_mixer``."""

from __future__ import annotations

from .compose import ssm_mixer
from .inputs import dual_kv_inputs, generic_inputs
from .mixer import SSMMixer
from .readouts import LinearReadout, QueryReadout

_FULL = {"inputs": dual_kv_inputs, "readout": QueryReadout}
_S4D = {"inputs": generic_inputs, "readout": LinearReadout}
ABLATION_CELLS = {  # name: parts; the paper's Table 4 row
    "full": {**_FULL, "use_rope": True},  # Full Interdomain
    "full_no_rope": {**_FULL, "use_rope": False},  # Full, no RoPE
    "single_input_query": {**_S4D, "readout": QueryReadout, "use_rope": True},  # + Q-cond. proj.
    "s4d_only": {**_S4D, "use_rope": False},  # S4D-only
    "s4d_only_rope": {**_S4D, "use_rope": True},  # S4D-only + RoPE
    "dual_kv_linear": {**_FULL, "readout": LinearReadout, "use_rope": True},  # Dual KV + linear
}


def ablation_cell(name: str, embed_dim: int, num_heads: int, **options) -> SSMMixer:
    """One of ``ABLATION_CELLS`` as a mixer; options go to ``ssm_mixer``."""
    if name not in ABLATION_CELLS:
        raise ValueError(f"name: expected one of {sorted(ABLATION_CELLS)}, got {name!r}")
    fixed = sorted(set(options) & set(ABLATION_CELLS[name]))
    if fixed:
        raise ValueError(f"{fixed[0]}: set by the cell {name!r}; choose another cell")
    return ssm_mixer(embed_dim, num_heads, **ABLATION_CELLS[name], **options)
