"""Mamba-3's SISO recurrence (rotations, the exponential-trapezoidal rule): a per-step
reference, its decode step and an O(T) chunked form."""

from .chunked import mamba3_attention, mamba3_chunked
from .naive import mamba3_naive, mamba3_step
from .validation import IMPLS as MAMBA3_IMPLS
from .validation import Mamba3State, empty_state

__all__ = [
    "MAMBA3_IMPLS",
    "Mamba3State",
    "empty_state",
    "mamba3_attention",
    "mamba3_chunked",
    "mamba3_naive",
    "mamba3_step",
]
