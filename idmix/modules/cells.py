"""Named mixers: the paper's layer, its S4D-only baseline and the six 125M ablation cells of
Table 4, all one SSMMixer with a different (input path, readout, RoPE) setting."""

from __future__ import annotations

from .mixer import SSMMixer

ABLATION_CELLS = {
    # name: (input_path, readout, use_rope)                     paper Table 4 row
    "full": ("dual_kv", "query", True),  # Full Interdomain
    "full_no_rope": ("dual_kv", "query", False),  # Full, no RoPE
    "single_input_query": ("generic", "query", True),  # Single input + Q-cond. proj.
    "s4d_only": ("generic", "linear", False),  # S4D-only
    "s4d_only_rope": ("generic", "linear", True),  # S4D-only + RoPE
    "dual_kv_linear": ("dual_kv", "linear", True),  # Dual KV input + linear proj.
}


class InterdomainAttention(SSMMixer):
    """The paper's practical layer (DESIGN.md §1): dual KV input, query-conditioned readout.

    Options: use_rope (default on), gate (σ(W_g x) ⊙ o, default off), readout_convention
    "conj" (default) or "product", num_modes M (default 64), chunk_size of the training path.
    """

    def __init__(self, embed_dim: int, num_heads: int, **kwargs):
        super().__init__(embed_dim, num_heads, input_path="dual_kv", readout="query", **kwargs)


class S4DMixer(SSMMixer):
    """The S4D-only baseline (paper §6): generic [a, b] projections, each with SC and N+b, the
    same complex S4D core with full per-head C, and a linear readout: per channel
    y = Re(wᵀ C X) with one real w ∈ Rᴹ per head, the a- and b-half outputs summed, then a
    d×d C_out, then W_O. Iso-state with InterdomainAttention; H·M more parameters per layer."""

    def __init__(self, embed_dim: int, num_heads: int, *, use_rope: bool = False, **kwargs):
        super().__init__(
            embed_dim,
            num_heads,
            input_path="generic",
            readout="linear",
            use_rope=use_rope,
            **kwargs,
        )


def ablation_cell(name: str, embed_dim: int, num_heads: int, **kwargs) -> SSMMixer:
    """One of ``ABLATION_CELLS`` as a mixer; extra kwargs go to SSMMixer."""
    if name not in ABLATION_CELLS:
        raise ValueError(f"name: expected one of {sorted(ABLATION_CELLS)}, got {name!r}")
    input_path, readout, use_rope = ABLATION_CELLS[name]
    return SSMMixer(
        embed_dim, num_heads, input_path=input_path, readout=readout, use_rope=use_rope, **kwargs
    )
