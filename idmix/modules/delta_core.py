"""Interdomain Attention with a delta-rule erase (the paper's future work 2; issue 54): before
a token's value is projected onto the modes, what the state already returns for its key is
subtracted with a learned strength (docs/research/interdomain_delta.md):

    η_t = sigmoid(w_η·z_t + b_η),   z_t = [k̃_t; ṽ_t] (the normalised SSM inputs, per head)
    e_t = ṽ_t − η_t Zᵛ_{t−1} Ĝ Zᵏ_{t−1}ᵀ k̃_t,   Z_t = λ ⊙ Z_{t−1} + β ⊗ [k̃_t; e_t]

The S4D core, the decays and the query readout are Interdomain's. w_η starts at zero and b_η at
logit(0.1): the layer starts near Interdomain Attention (η = 0 is it exactly). One state per
head, Interdomain's (B, H, R+D, 2M).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..functional.interdomain_delta import interdomain_delta, interdomain_delta_step
from .compose import ssm_mixer
from .mixer import SSMMixer
from .parts import SSMArgs
from .readouts import QueryReadout

INITIAL_ERASE = 0.1


class DeltaReadout(QueryReadout):
    """The query readout of a delta-rule state (the module's docstring); the erase strength's
    weights are its only parameters."""

    def __init__(self, num_heads: int, head_dim: int, convention: str = "conj", chunk_size=64):
        super().__init__(num_heads, num_heads, convention, chunk_size)
        self.erase_weight = nn.Parameter(torch.zeros(num_heads, 2 * head_dim))
        logit = math.log(INITIAL_ERASE / (1 - INITIAL_ERASE))
        self.erase_bias = nn.Parameter(torch.full((num_heads,), logit))

    @classmethod
    def from_args(cls, args: SSMArgs) -> DeltaReadout:
        if args.groups != args.num_heads:
            raise ValueError("num_state_groups: the delta-rule readout keeps one state per head")
        if args.context_parallel is not None:
            raise ValueError(
                "context_parallel: the delta-rule readout has no context-parallel form"
            )
        if args.backend not in ("auto", "torch"):
            raise ValueError(
                f"backend: the delta-rule op runs on PyTorch only, got {args.backend!r}"
            )
        if args.precision != "auto":
            raise ValueError(
                f"precision: the delta-rule op computes in fp32 (fp64 for fp64 inputs), got "
                f"{args.precision!r}"
            )
        return cls(args.num_heads, args.head_dim, args.readout_convention, args.chunk_size)

    def erase(self, a, b):
        """a, b: (B, T, H, d_h) -> η (B, T, H) in (0, 1)."""
        z = torch.cat([a, b], -1)
        return torch.sigmoid((z * self.erase_weight.to(z.dtype)).sum(-1) + self.erase_bias)

    def forward(self, q, a, b, core, state=None, reset=None, *, whole=False):
        lam_ri, beta_ri = core.discretized_real()
        return interdomain_delta(
            q, a, b, self.erase(a, b), lam_ri, beta_ri, core.gram(self.convention),
            initial_state=state, output_final_state=True, reset=reset,
            chunk_size=self.chunk_size,
        )  # fmt: skip

    def step(self, q, a, b, core, state):
        lam_ri, beta_ri = core.decoding_real()
        G_hat = core.decoding_gram(self.convention)
        eta = self.erase(a[:, None], b[:, None])[:, 0]
        o, new = interdomain_delta_step(q, a, b, eta, lam_ri, beta_ri, G_hat, state)
        state.copy_(new)
        return o


def DeltaInterdomainAttention(embed_dim: int, num_heads: int, **options) -> SSMMixer:  # noqa: N802
    """Builder: Interdomain Attention whose readout is a ``DeltaReadout``. Options as for
    ``InterdomainAttention`` except ``num_state_groups`` (one state per head), a backend other
    than PyTorch, and context parallelism."""
    return ssm_mixer(embed_dim, num_heads, readout=DeltaReadout, **options)
