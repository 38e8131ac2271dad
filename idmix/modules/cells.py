"""The six 125M ablation cells of the paper's Table 4: (input path, readout, RoPE) settings of
``ssm_mixer``."""

from __future__ import annotations

from .compose import ssm_mixer
from .mixer import SSMMixer

ABLATION_CELLS = {
    # name: (dual_kv, query_readout, use_rope)                  paper Table 4 row
    "full": (True, True, True),  # Full Interdomain
    "full_no_rope": (True, True, False),  # Full, no RoPE
    "single_input_query": (False, True, True),  # Single input + Q-cond. proj.
    "s4d_only": (False, False, False),  # S4D-only
    "s4d_only_rope": (False, False, True),  # S4D-only + RoPE
    "dual_kv_linear": (True, False, True),  # Dual KV input + linear proj.
}


def ablation_cell(name: str, embed_dim: int, num_heads: int, **options) -> SSMMixer:
    """One of ``ABLATION_CELLS`` as a mixer; options go to ``ssm_mixer``."""
    if name not in ABLATION_CELLS:
        raise ValueError(f"name: expected one of {sorted(ABLATION_CELLS)}, got {name!r}")
    dual_kv, query_readout, use_rope = ABLATION_CELLS[name]
    return ssm_mixer(
        embed_dim,
        num_heads,
        dual_kv=dual_kv,
        query_readout=query_readout,
        use_rope=use_rope,
        **options,
    )
