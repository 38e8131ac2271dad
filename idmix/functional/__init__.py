"""Pure functional primitives of Interdomain Attention; each has a naive reference beside it."""

from .feature_map import silu_l2_feature_map, silu_l2_feature_map_naive
from .interdomain import (
    IMPLS,
    empty_state,
    interdomain_attention,
    interdomain_attention_closed_form,
    interdomain_attention_naive,
    interdomain_decode_step,
    interleaved_to_state,
    state_to_interleaved,
    to_real_form,
)
from .readout import READOUTS, readout_gram, readout_gram_real
from .rope import rope
from .s4d import (
    complex_A,
    discretize,
    discretize_real,
    log_uniform_dt,
    s4d_inv_init,
    s4d_lin_init,
)
from .s4d_readout import s4d_linear_readout, s4d_linear_step
from .short_conv import short_conv, short_conv_naive, short_conv_step, short_conv_with_resets

__all__ = [
    "IMPLS",
    "READOUTS",
    "complex_A",
    "discretize",
    "discretize_real",
    "empty_state",
    "interdomain_attention",
    "interdomain_attention_closed_form",
    "interdomain_attention_naive",
    "interdomain_decode_step",
    "interleaved_to_state",
    "log_uniform_dt",
    "readout_gram",
    "readout_gram_real",
    "rope",
    "s4d_inv_init",
    "s4d_lin_init",
    "s4d_linear_readout",
    "s4d_linear_step",
    "short_conv",
    "short_conv_naive",
    "short_conv_step",
    "short_conv_with_resets",
    "silu_l2_feature_map",
    "silu_l2_feature_map_naive",
    "state_to_interleaved",
    "to_real_form",
]
