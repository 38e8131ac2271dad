"""Interdomain attention with a delta-rule erase (issue 54, the paper's future work 2): a
per-step reference, the decode step and an O(T) chunked form."""

from .chunked import interdomain_delta
from .naive import interdomain_delta_naive, interdomain_delta_step
from .validation import IMPLS as INTERDOMAIN_DELTA_IMPLS

__all__ = [
    "INTERDOMAIN_DELTA_IMPLS",
    "interdomain_delta",
    "interdomain_delta_naive",
    "interdomain_delta_step",
]
