"""The gated delta rule (Gated DeltaNet): a per-step reference and an O(T) chunked form."""

from .chunked import gated_delta_rule, gated_delta_rule_chunked
from .naive import gated_delta_rule_naive
from .validation import IMPLS as GATED_DELTA_RULE_IMPLS

__all__ = [
    "GATED_DELTA_RULE_IMPLS",
    "gated_delta_rule",
    "gated_delta_rule_chunked",
    "gated_delta_rule_naive",
]
