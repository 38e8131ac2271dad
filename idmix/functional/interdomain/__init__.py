"""The core op of Interdomain Attention (docs/design.md §7: which file holds what)."""

from .api import SharedDecays, TokenDecays, interdomain_attention, to_real_form
from .decode import empty_state, interdomain_decode_step
from .layout import interleaved_to_state, state_to_interleaved
from .references import interdomain_attention_closed_form, interdomain_attention_naive
from .validation import IMPLS

__all__ = [
    "IMPLS",
    "SharedDecays",
    "TokenDecays",
    "empty_state",
    "interdomain_attention",
    "interdomain_attention_closed_form",
    "interdomain_attention_naive",
    "interdomain_decode_step",
    "interleaved_to_state",
    "state_to_interleaved",
    "to_real_form",
]
