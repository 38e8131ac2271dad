"""Selective Interdomain Attention with one step size per head *and mode*: the alternative the
library's layer does not take (it keeps one Δ per head). One new part, the readout's decays:

    Δ_{t,h,m} = softplus(W_h[m] · [k̃_t; ṽ_t] + softplus⁻¹(Δ_h)),   λ = exp(Δ A), β = (λ − 1)/A

    tune run recipes/pretrain_interdomain.py --config recipes/configs/tiny_interdomain.yaml \\
        model.mixer._component_=examples.selective_per_mode.selective_per_mode
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from idmix.functional import discretize_real
from idmix.modules import PerTokenDecayReadout, SSMArgs, SSMMixer, ssm_mixer


class PerModeSelectiveReadout(PerTokenDecayReadout):
    """dt_weight: (H, M, 2·d_h), zero at init (the layer starts as Interdomain Attention)."""

    @classmethod
    def from_args(cls, args: SSMArgs) -> PerModeSelectiveReadout:
        a = cls.check_args(args)
        shape = (a.num_heads, a.num_modes, 2 * a.head_dim)
        return cls(
            a.num_heads,
            shape,
            a.readout_convention,
            a.chunk_size,
            a.backend,
            a.precision,
            cls.attention_for(a),
        )

    def decays(self, a, b, core):
        """a, b: (B, T, H, d_h) -> (lam_ri, beta_ri): (B, T, H, M, 2) fp32."""
        H, M = core.log_A_real.shape
        base = torch.exp(core.log_dt.float())
        bias = (base + torch.log(-torch.expm1(-base)))[:, None]  # softplus⁻¹(Δ_h), (H, 1)
        z = torch.cat([a, b], -1).float()
        dt = F.softplus(torch.einsum("bthc,hmc->bthm", z, self.dt_weight.float()) + bias)
        # every (head, mode) as its own one-mode head: discretize_real broadcasts Δ over heads
        lam, beta = discretize_real(
            dt.flatten(-2),
            core.log_A_real.float().reshape(H * M, 1),
            core.A_imag.float().reshape(H * M, 1),
        )
        return lam.unflatten(-3, (H, M))[..., 0, :], beta.unflatten(-3, (H, M))[..., 0, :]


def selective_per_mode(embed_dim: int, num_heads: int, **options) -> SSMMixer:
    """Interdomain Attention whose readout is ``PerModeSelectiveReadout``."""
    return ssm_mixer(embed_dim, num_heads, readout=PerModeSelectiveReadout, **options)
