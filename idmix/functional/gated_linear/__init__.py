"""Gated linear attention (GLA's per-channel decay, Mamba-2/SSD's per-head decay): a per-step
reference and an O(T) chunked form."""

from .chunked import gated_linear_attention, gated_linear_attention_chunked
from .naive import gated_linear_attention_naive
from .validation import IMPLS as GATED_LINEAR_IMPLS

__all__ = [
    "GATED_LINEAR_IMPLS",
    "gated_linear_attention",
    "gated_linear_attention_chunked",
    "gated_linear_attention_naive",
]
