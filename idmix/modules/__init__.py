"""nn.Modules built from idmix.functional: the mixers, their caches and the ablation cells."""

from .cache import KVCache, RecurrentCache
from .cells import ABLATION_CELLS, InterdomainAttention, S4DMixer, ablation_cell
from .mixer import SSMMixer
from .softmax import SoftmaxAttention

__all__ = [
    "ABLATION_CELLS",
    "InterdomainAttention",
    "KVCache",
    "RecurrentCache",
    "S4DMixer",
    "SSMMixer",
    "SoftmaxAttention",
    "ablation_cell",
]
