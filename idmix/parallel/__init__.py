"""Context parallelism: one sequence split across the ranks of a process group, which exchange
fixed-size recurrent states (and short-conv halos, and softmax keys/values) instead of tokens."""

from ..functional.collectives import Traffic, all_gather_with_grad, count_traffic
from .context import ContextParallel

__all__ = [
    "ContextParallel",
    "Traffic",
    "all_gather_with_grad",
    "count_traffic",
]
