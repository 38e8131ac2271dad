"""Component builder of the paper's SSM mixers: one input path × one readout × RoPE, composed
from parts (torchtune style: this builds the parts and injects them into ``SSMMixer``).

Choices the paper leaves open or that docs/science.md studied (defaults: the paper's reading):
- rope_position: "before_feature_map" (Fig. 3: SC -> RoPE -> ξ; an absolute code, since SiLU
  does not commute with the rotation) or "last" (after ξ and N+b on the key half, after ξ on
  the query: every query-key score depends on t - s only);
- dt_min, dt_max: the log-uniform Δ range; the slowest mode's time constant is
  1/(|Re A|·dt_min) tokens and should fit inside the training context;
- a_init: "s4d_inv" (the paper's formula, n = 0..M-1), "s4d_inv_conj" (S4D's N = 2M),
  "s4d_lin";
- calibration: C rescaled at init so the core output has unit RMS, "global", "per_head" or
  "none";
- output_norm: RMSNorm over each head's output before W_O (not in the paper);
- value_conv: a short conv on the value branch too (not in the paper);
- feature_map: ξ (SiLU then L2 per head, eq. 11) or any callable (..., d_h) -> (..., d_h).
"""

from __future__ import annotations

from torch import nn

from ..functional import silu_l2_feature_map
from .branches import Branch, FeatureMap, HeadNorm
from .mixer import SigmoidGate, SSMMixer
from .readouts import LinearReadout, QueryReadout
from .ssm import S4DCore

ROPE_POSITIONS = ("before_feature_map", "last")


def _check_positive(**values) -> None:
    for name, n in values.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name}: expected a positive int, got {n!r}")


def ssm_mixer(
    embed_dim: int,
    num_heads: int,
    *,
    dual_kv: bool,
    query_readout: bool,
    use_rope: bool = True,
    feature_map: FeatureMap = silu_l2_feature_map,
    num_modes: int = 64,
    readout_convention: str = "conj",
    gate: bool = False,
    chunk_size: int = 64,
    rope_base: float = 10000.0,
    norm_eps: float = 1e-6,
    dt_min: float = 1e-3,
    dt_max: float = 1e-1,
    num_state_groups: int | None = None,
    rope_position: str = "before_feature_map",
    a_init: str = "s4d_inv",
    calibration: str = "global",
    output_norm: bool = False,
    value_conv: bool = False,
    backend: str = "auto",
    precision: str = "auto",
) -> SSMMixer:
    """dual_kv: input halves [feature_map(SC(W_K x)), W_V x] (Interdomain) instead of the
    generic [SC(W_a x), SC(W_b x)]; query_readout: o = Re(Γᴴ U ξ(q)), q = feature_map(SC(W_Q x))
    (Interdomain) instead of the linear S4D-only readout with its d × d C_out. use_rope: on the
    query and the first input half, at ``rope_position``. Both halves go through N+b and one
    per-head S4D core. Grouped state (num_state_groups G < H) needs the query readout.
    backend (query readout only): of its core op and decode step, one of
    ``idmix.functional.interdomain.validation.BACKENDS``; "inductor" compiles the training
    path's segment math with torch.compile on first use per length (the op's forward+backward
    1.2-1.3x faster on CPU, compiled model or not). precision (query readout only): of the core
    op's matrix products, "ieee", "tf32", "bf16" or "auto" (``interdomain_attention``)."""
    _check_positive(embed_dim=embed_dim, num_heads=num_heads, num_modes=num_modes)
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim: {embed_dim} is not divisible by num_heads={num_heads}")
    if not 0 < dt_min <= dt_max:
        raise ValueError(f"dt_min, dt_max: expected 0 < dt_min <= dt_max, got {dt_min}, {dt_max}")
    if rope_position not in ROPE_POSITIONS:
        raise ValueError(f"rope_position: expected one of {ROPE_POSITIONS}, got {rope_position!r}")
    H, d_h, G = num_heads, embed_dim // num_heads, num_state_groups or num_heads
    if num_heads % G or (G != num_heads and not query_readout):
        raise ValueError(
            f"num_state_groups: expected a divisor of num_heads={num_heads} (query readout "
            f"only), got {num_state_groups!r} with query_readout={query_readout}"
        )
    if backend != "auto" and not query_readout:
        raise ValueError(f"backend: the linear readout runs on PyTorch only, got {backend!r}")
    if precision != "auto" and not query_readout:
        raise ValueError(f"precision: the linear readout has no matrix products, got {precision!r}")
    rope_in_branch = use_rope and rope_position == "before_feature_map"
    readout = (
        QueryReadout(H, G, readout_convention, chunk_size, backend, precision)
        if query_readout
        else LinearReadout(H, num_modes)
    )
    query = (
        Branch(embed_dim, H, use_rope=rope_in_branch, feature_map=feature_map, rope_base=rope_base)
        if query_readout
        else None
    )
    key_branch = Branch(
        embed_dim,
        G,
        head_dim=d_h,
        use_rope=rope_in_branch,
        feature_map=feature_map if dual_kv else None,
        rope_base=rope_base,
    )
    value_branch = Branch(
        embed_dim, G, head_dim=d_h, conv=not dual_kv or value_conv, rope_base=rope_base
    )
    norms = HeadNorm(G, d_h, norm_eps), HeadNorm(G, d_h, norm_eps)
    core = S4DCore(G, num_modes, dt_min, dt_max, a_init=a_init)
    head_mix = None if query_readout else nn.Linear(embed_dim, embed_dim, bias=False)
    return SSMMixer(
        embed_dim,
        num_heads,
        query=query,
        key_branch=key_branch,
        value_branch=value_branch,
        key_norm=norms[0],
        value_norm=norms[1],
        core=core,
        readout=readout,
        head_mix=head_mix,
        output_norm=nn.RMSNorm(d_h, eps=norm_eps) if output_norm else None,
        gate=SigmoidGate(embed_dim) if gate else None,
        output_proj=nn.Linear(embed_dim, embed_dim, bias=False),
        rope_last_base=rope_base if use_rope and rope_position == "last" else None,
        calibration=calibration,
    )
