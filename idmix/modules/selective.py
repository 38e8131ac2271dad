"""Selective Interdomain Attention: per-token step sizes Δ_t (the paper's named future work),
composed from the shared parts with one new part, the readout that computes the decays.

Δ_{t,h} = softplus(w_h · [k̃_t; ṽ_t] + softplus⁻¹(Δ_h)), λ_t = exp(Δ_t A), β_t = (λ_t − 1)/A.

- Per head, not per head and mode: one Δ per head is what the S4D core already has (the
  modes of a head keep their relative time scales, set by A), and it costs 2·d_h new
  parameters per head instead of M times that.
- From the normalised SSM inputs [k̃_t; ṽ_t], which the readout receives, so the layer is
  ``ssm_mixer`` with this readout and nothing else new; they carry the token (projection,
  short conv, feature map) like Mamba's x_t.
- w starts at zero and the bias is the core's own Δ_h (``log_dt``): at init the layer is
  exactly Interdomain Attention, and training moves away from it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..functional import discretize_real, interdomain_decode_step
from .compose import ssm_mixer
from .linear_state import inverse_softplus
from .mixer import SSMMixer
from .parts import SSMArgs
from .readouts import QueryReadout, whole_sequence


class PerTokenDecayReadout(QueryReadout):
    """The query readout with per-token decays from ``decays(a, b, core)`` (a subclass's) and one
    zero-initialised parameter ``dt_weight`` of the subclass's shape (so the layer starts as
    Interdomain Attention), in the SSM optimiser group like Δ itself. One query head per state
    head (no grouped state)."""

    param_group = "ssm"

    def __init__(
        self,
        num_heads: int,
        dt_weight_shape: tuple[int, ...],
        convention: str = "conj",
        chunk_size=64,
        backend: str = "auto",
        precision: str = "auto",
        attention=whole_sequence,
    ):
        super().__init__(
            num_heads, num_heads, convention, chunk_size, backend, precision, attention
        )
        self.dt_weight = nn.Parameter(torch.zeros(dt_weight_shape))

    @staticmethod
    def check_args(args: SSMArgs) -> SSMArgs:
        """args, if they keep one state per head (for a subclass's ``from_args``)."""
        if args.groups != args.num_heads:
            raise ValueError("num_state_groups: the selective layer keeps one state per head")
        return args

    def forward(self, q, a, b, core, state=None, reset=None, *, whole=False):
        lam_ri, beta_ri = self.decays(a, b, core)
        return (whole_sequence if whole else self.attention)(
            q,
            a,
            b,
            lam_ri,
            beta_ri,
            core.gram(self.convention),
            state,
            chunk_size=self.chunk_size,
            reset=reset,
            backend=self.backend,
            precision=self.precision,
        )

    def step(self, q, a, b, core, state):
        lam_ri, beta_ri = self.decays(a[:, None], b[:, None], core)
        G_hat = core.decoding_gram(self.convention)
        return interdomain_decode_step(
            q, a, b, lam_ri[:, 0], beta_ri[:, 0], G_hat, state, inplace=True, backend=self.backend
        )[0]


class SelectiveQueryReadout(PerTokenDecayReadout):
    """Δ per token and head (above): ``dt_weight`` (H, 2·d_h)."""

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        convention: str = "conj",
        chunk_size=64,
        backend: str = "auto",
        precision: str = "auto",
        attention=whole_sequence,
    ):
        shape = (num_heads, 2 * head_dim)
        super().__init__(num_heads, shape, convention, chunk_size, backend, precision, attention)

    @classmethod
    def from_args(cls, args: SSMArgs) -> SelectiveQueryReadout:
        a = cls.check_args(args)
        return cls(
            a.num_heads,
            a.head_dim,
            a.readout_convention,
            a.chunk_size,
            a.backend,
            a.precision,
            cls.attention_for(a),
        )

    def decays(self, a, b, core):
        """a, b: (B, T, H, d_h) -> (lam_ri, beta_ri): (B, T, H, M, 2) fp32."""
        with torch.autocast(a.device.type, enabled=False):
            base = torch.exp(core.log_dt.float())  # (H,): the core's Δ
            bias = inverse_softplus(base)
            z = torch.cat([a, b], -1).float()
            dt = F.softplus((z * self.dt_weight.float()).sum(-1) + bias)  # (B, T, H)
            return discretize_real(dt, core.log_A_real.float(), core.A_imag.float())


def SelectiveInterdomainAttention(embed_dim: int, num_heads: int, **options) -> SSMMixer:  # noqa: N802
    """Builder: Interdomain Attention whose readout is a ``SelectiveQueryReadout``. Options as
    for ``InterdomainAttention`` except ``num_state_groups`` (one state per head)."""
    return ssm_mixer(embed_dim, num_heads, readout=SelectiveQueryReadout, **options)
