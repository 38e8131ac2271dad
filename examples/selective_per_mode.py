"""Selective Interdomain Attention with one step size per head *and mode*: the alternative the
library's layer does not take (it keeps one Δ per head). Only the readout's ``decays`` changes:

    Δ_{t,h,m} = softplus(W_h[m] · [k̃_t; ṽ_t] + softplus⁻¹(Δ_h)),   λ = exp(Δ A), β = (λ − 1)/A

Train it: tune run recipes/pretrain_interdomain.py --config examples/configs/selective_per_mode.yaml
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from idmix.functional import discretize_real
from idmix.models import CPU_SCALES, CPU_SSM_DEFAULTS, decoder
from idmix.modules import SelectiveInterdomainAttention, SelectiveQueryReadout, SSMMixer


class PerModeSelectiveReadout(SelectiveQueryReadout):
    """dt_weight: (H, M, 2·d_h), zero at init (the layer starts as Interdomain Attention)."""

    def __init__(self, num_heads, head_dim, num_modes, convention="conj", chunk_size=64):
        super().__init__(num_heads, head_dim, convention, chunk_size)
        self.dt_weight = nn.Parameter(torch.zeros(num_heads, num_modes, 2 * head_dim))

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
    """The library's selective layer with this readout in place of its own."""
    mixer = SelectiveInterdomainAttention(embed_dim, num_heads, **options)
    shared = mixer.readout
    mixer.readout = PerModeSelectiveReadout(
        num_heads, mixer.head_dim, mixer.num_modes, shared.convention, shared.chunk_size
    )
    return mixer


def selective_per_mode_tiny(**overrides):
    """A model builder for configs: the tiny CPU size with this mixer in every block."""
    d, layers, heads, modes = CPU_SCALES["tiny"]
    options = {"num_modes": modes, **CPU_SSM_DEFAULTS}
    kwargs = dict(vocab_size=4096, num_layers=layers, num_heads=heads, embed_dim=d)
    kwargs.update(max_seq_len=2048, **overrides)
    return decoder(mixer=lambda _: selective_per_mode(d, heads, **options), **kwargs)
