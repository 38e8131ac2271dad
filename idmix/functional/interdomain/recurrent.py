"""The op's impl "recurrent": T applications of the decode step (the code that decodes), over a
whole sequence."""

from __future__ import annotations

import torch

from .decay_values import Decays
from .decode import torch_step


def interdomain_attention_recurrent(q, k, v, decays: Decays, G_hat, Z0, reset=None):
    """q, k: (B, T, H, R); v: (B, T, H, D); decays: SharedDecays or TokenDecays; G_hat
    (H, 2M, 2M); Z0 (B, H, R+D, 2M) in the compute dtype; reset (B, T) bool or None.
    Returns (o (B, T, H, D) in q's dtype, final state like Z0)."""
    Z, outs = Z0, []
    for t in range(q.shape[1]):
        if reset is not None:  # a select, not a product: 0·NaN would carry a NaN across
            Z = torch.where(reset[:, t, None, None, None], 0, Z)
        lam_t, beta_t = decays.at(t)
        o_t, Z = torch_step(q[:, t], k[:, t], v[:, t], lam_t, beta_t, G_hat, Z)
        outs.append(o_t)
    return torch.stack(outs, dim=1).to(q.dtype), Z
