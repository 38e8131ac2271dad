"""Interdomain Attention on a Mamba-3 core (the paper's future work 1; issue 54): the key and
value projections onto the modes driven by Mamba-3's recurrence, the query-conditioned readout
unchanged. One new part, the readout that makes the decays (docs/research/interdomain_mamba3.md):

    z_t = [k̃_t; ṽ_t] (the normalised SSM inputs, per head),
    Δ_t = softplus(w_Δ·z_t + softplus⁻¹(Δ_h))                      (the core's Δ at init)
    A_{t,m} = −exp(log_A_real_m) · f(w_A·z_t)                       (f heavy-tailed, f(0) = 1)
    θ_{t,m} = A_imag_m + π tanh(w_θ,m·z_t)                          (the core's frequencies at init)
    λ_{t,m} = exp(Δ_t (A_{t,m} + i θ_{t,m})),   σ_t = sigmoid(w_σ·z_t + b_σ)
    X_t = λ_t ⊙ (X_{t−1} + (1 − σ_t) Δ_t z_{t−1}) + σ_t Δ_t z_t      (``functional.trapezoid``)

w_Δ, w_A, w_θ, w_σ and b_σ start at zero: at init the decays are the S4D core's and the update
is the plain trapezoid (σ = 1/2) with every mode taking the input with weight Δ. One state per
head. The state the mixer caches carries the last token's z beside X: (B, H, R+D, 2M + 2), its
last column pair [z, 0] (``carried_modes = 1``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..functional.trapezoid import TrapezoidState, trapezoid_attention, trapezoid_step
from .compose import ssm_mixer
from .linear_state import inverse_softplus
from .mamba3 import heavy_tail
from .mixer import SSMMixer
from .parts import SSMArgs
from .readouts import QueryReadout


class Mamba3CoreReadout(QueryReadout):
    """The query readout with Mamba-3's decays and trapezoid (the module's docstring); its
    parameters are in the SSM optimiser group, like Δ itself."""

    param_group = "ssm"
    carried_modes = 1  # the cached state's extra column pair: the last token's z

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        num_modes: int,
        convention: str = "conj",
        chunk_size=64,
        backend: str = "auto",
        precision: str = "auto",
    ):
        super().__init__(num_heads, num_heads, convention, chunk_size, backend, precision)
        zeros = lambda *shape: nn.Parameter(torch.zeros(*shape))  # noqa: E731
        self.dt_weight = zeros(num_heads, 2 * head_dim)
        self.rate_weight = zeros(num_heads, 2 * head_dim)
        self.angle_weight = zeros(num_heads, num_modes, 2 * head_dim)
        self.trap_weight = zeros(num_heads, 2 * head_dim)
        self.trap_bias = zeros(num_heads)

    @classmethod
    def from_args(cls, args: SSMArgs) -> Mamba3CoreReadout:
        if args.groups != args.num_heads:
            raise ValueError("num_state_groups: the Mamba-3 core keeps one state per head")
        if args.context_parallel is not None:
            raise ValueError("context_parallel: the Mamba-3 core has no context-parallel form")
        return cls(
            args.num_heads, args.head_dim, args.num_modes, args.readout_convention,
            args.chunk_size, args.backend, args.precision,
        )  # fmt: skip

    def decays(self, a, b, core):
        """a, b: (B, T, H, d_h) -> (lam_ri (B, T, H, M, 2), g, b (B, T, H)), fp32 (fp64 for fp64
        inputs)."""
        with torch.autocast(a.device.type, enabled=False):
            dtype = torch.promote_types(a.dtype, torch.float32)
            z = torch.cat([a, b], -1).to(dtype)
            lin = lambda w: (z * w.to(dtype)).sum(-1)  # noqa: E731  (B, T, H)
            dt = F.softplus(lin(self.dt_weight) + inverse_softplus(core.log_dt.to(dtype).exp()))
            rate = core.log_A_real.to(dtype).exp() * heavy_tail(lin(self.rate_weight))[..., None]
            turn = torch.einsum("bthc,hmc->bthm", z, self.angle_weight.to(dtype))
            theta = core.A_imag.to(dtype) + math.pi * torch.tanh(turn)
            modulus = torch.exp(-dt[..., None] * rate)
            angle = dt[..., None] * theta
            lam = torch.stack((modulus * angle.cos(), modulus * angle.sin()), -1)
            sigma = torch.sigmoid(lin(self.trap_weight) + self.trap_bias.to(dtype))
            return lam, sigma * dt, (1 - sigma) * dt

    @staticmethod
    def _split(state):
        """A cached state (B, H, R+D, 2M + 2) -> TrapezoidState views (Z, z)."""
        return TrapezoidState(state[..., :-2], state[..., -2])

    @staticmethod
    def _join(state: TrapezoidState):
        z = state.z[..., None]
        return torch.cat((state.Z, z, torch.zeros_like(z)), -1)

    def forward(self, q, a, b, core, state=None, reset=None, *, whole=False):
        lam, g, b_old = self.decays(a, b, core)
        o, final = trapezoid_attention(
            q, a, b, lam, g, b_old, core.gram(self.convention),
            initial_state=None if state is None else self._split(state),
            output_final_state=True, reset=reset, chunk_size=self.chunk_size,
            backend=self.backend, precision=self.precision,
        )  # fmt: skip
        return o, self._join(final)

    def step(self, q, a, b, core, state):
        lam, g, b_old = (x[:, 0] for x in self.decays(a[:, None], b[:, None], core))
        G_hat = core.decoding_gram(self.convention)
        o, new = trapezoid_step(q, a, b, lam, g, b_old, G_hat, self._split(state))
        state.copy_(self._join(new))
        return o


def Mamba3CoreInterdomainAttention(embed_dim: int, num_heads: int, **options) -> SSMMixer:  # noqa: N802
    """Builder: Interdomain Attention whose readout is a ``Mamba3CoreReadout``. Options as for
    ``InterdomainAttention`` except ``num_state_groups`` (one state per head)."""
    return ssm_mixer(embed_dim, num_heads, readout=Mamba3CoreReadout, **options)
