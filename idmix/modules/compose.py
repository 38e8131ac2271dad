"""Component builder of the SSM mixers (torchtune style): ``ssm_mixer`` builds an input path, a
core and a readout from their factories and the settings in ``SSMArgs``, and injects them into
``SSMMixer``. The paper's layers are choices of parts (``InterdomainAttention``, ``S4DMixer``,
Table 4's cells); a new mixer is one call with a new part (``examples/``).
"""

from __future__ import annotations

from dataclasses import fields

import torch
from torch import nn

from .inputs import dual_kv_inputs
from .mixer import SSMMixer
from .parts import InputsFactory, PartFactory, ReadoutParts, SSMArgs
from .readouts import QueryReadout
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
