"""The core op of Interdomain Attention (docs/design.md §10: which file holds what)."""

from .api import (
    IMPLS,
    interdomain_attention,
    interdomain_attention_real,
    interdomain_attention_varlen,
    interdomain_attention_varlen_real,
)
from .decode import empty_state, interdomain_decode_step, interdomain_decode_step_real
from .layout import SharedDecays, TokenDecays, interleaved_to_state, state_to_interleaved
from .references import interdomain_attention_closed_form, interdomain_attention_naive

__all__ = [
    "IMPLS",
    "SharedDecays",
    "TokenDecays",
    "empty_state",
    "interdomain_attention",
    "interdomain_attention_closed_form",
    "interdomain_attention_naive",
    "interdomain_attention_real",
    "interdomain_attention_varlen",
    "interdomain_attention_varlen_real",
    "interdomain_decode_step",
    "interdomain_decode_step_real",
    "interleaved_to_state",
    "state_to_interleaved",
]
