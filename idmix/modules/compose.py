"""Component builder of the SSM mixers (torchtune style): ``ssm_mixer`` builds an input path, a
core and a readout from their factories and the settings in ``SSMArgs``, and injects them into
``SSMMixer``. The paper's layers are choices of parts (``InterdomainAttention``, ``S4DMixer``,
Table 4's cells); a new mixer is one call with a new part (``examples/``).
"""

from __future__ import annotations

from dataclasses import fields

import torch
from torch import nn

from .inputs import dual_kv_inputs, generic_inputs
from .mixer import SSMMixer
from .parts import InputsFactory, PartFactory, ReadoutParts, SSMArgs
from .readouts import LinearReadout, QueryReadout
from .ssm import S4DCore

# every option of ssm_mixer (the settings of SSMArgs besides the sizes)
SSM_OPTIONS = frozenset(f.name for f in fields(SSMArgs)) - {"embed_dim", "num_heads"}


class SigmoidGate(nn.Linear):
    """o ← σ(W_g x) ⊙ o (d × d, no bias): the ``gate=True`` option."""

    def __init__(self, embed_dim: int):
        super().__init__(embed_dim, embed_dim, bias=False)

    def forward(self, x, o):
        """x, o: (..., d) -> (..., d)."""
        return torch.sigmoid(super().forward(x)) * o


def ssm_mixer(
    embed_dim: int,
    num_heads: int,
    *,
    inputs: InputsFactory = dual_kv_inputs,
    core: PartFactory = S4DCore,
    readout: PartFactory = QueryReadout,
    **options,
) -> SSMMixer:
    """An SSMMixer from parts: ``inputs(args, query=readout.needs_query)`` (an input path of
    ``idmix.modules.inputs`` or yours), ``core.from_args(args)``, ``readout.from_args(args)``
    (``QueryReadout``, ``LinearReadout``, ``SelectiveQueryReadout`` or yours: idmix.modules.parts
    has the contracts). options: the fields of ``SSMArgs`` (num_modes, use_rope, feature_map,
    dt_min, backend, gate, …); each part reads the ones it needs and refuses what it cannot do.
    The defaults build Interdomain Attention."""
    unknown = sorted(set(options) - SSM_OPTIONS)
    if unknown:
        raise TypeError(f"ssm_mixer: unknown options {unknown}; known: {sorted(SSM_OPTIONS)}")
    args = SSMArgs(embed_dim, num_heads, **options)
    input_parts = inputs(args, query=readout.needs_query)
    core_part = core.from_args(args)
    readout_parts = readout.from_args(args)
    if not isinstance(readout_parts, ReadoutParts):
        readout_parts = ReadoutParts(readout_parts)
    output_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps) if args.output_norm else None
    gate = args.gate if args.gate is True or not args.gate else args.gate(args)
    return SSMMixer(
        embed_dim,
        num_heads,
        **input_parts._asdict(),
        core=core_part,
        **readout_parts._asdict(),
        output_norm=output_norm,
        gate=SigmoidGate(embed_dim) if gate is True else gate or None,  # False: none
        output_proj=nn.Linear(embed_dim, embed_dim, bias=False),
        calibration=args.calibration,
        context_parallel=args.context_parallel,
    )


def InterdomainAttention(embed_dim: int, num_heads: int, **options) -> SSMMixer:  # noqa: N802
    """Interdomain Attention, the paper's practical layer (docs/design.md §1): ``ssm_mixer``'s
    default parts, the dual KV input path [ξ(SC(W_K x)), W_V x] and the query-conditioned
    readout o = Re(Γᴴ U ξ(q)). A builder named like the layer it builds.

    Options (``SSMArgs``): use_rope (default on), gate (σ(W_g x) ⊙ o, default off),
    readout_convention "conj" (default) or "product", num_modes M (default 64), chunk_size of
    the training path, feature_map (default ξ), num_state_groups, rope_position, dt_min,
    dt_max, a_init, calibration, output_norm, value_conv, rope_base, norm_eps, backend of the
    core op ("auto", "torch", "triton", or "inductor": its segment math compiled on first use),
    precision of its matrix products ("auto", "ieee", "tf32", "bf16": docs/precision.md),
    context_parallel (a ``ContextParallel``: the input is this rank's slice of a sequence).
    """
    return ssm_mixer(embed_dim, num_heads, **options)


def S4DMixer(embed_dim: int, num_heads: int, *, use_rope: bool = False, **options) -> SSMMixer:  # noqa: N802
    """The S4D-only baseline (paper §6): generic [a, b] projections, each with SC and N+b, the
    same complex S4D core with full per-head C, and a linear readout: per channel
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
