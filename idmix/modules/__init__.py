"""nn.Modules built from idmix.functional: the mixer and its parts, the named mixers (builders
composing the parts), their caches and the softmax baseline."""

from .branches import Branch, HeadNorm
from .cache import KVCache, RecurrentCache
from .cells import ABLATION_CELLS, ablation_cell
from .compose import ssm_mixer
from .interdomain import InterdomainAttention
from .mixer import SigmoidGate, SSMMixer, upgrade_state_dict
from .readouts import LinearReadout, QueryReadout
from .s4d_mixer import S4DMixer
from .selective import SelectiveInterdomainAttention, SelectiveQueryReadout
from .softmax import SoftmaxAttention
from .ssm import S4DCore

__all__ = [
    "ABLATION_CELLS",
    "Branch",
    "HeadNorm",
    "InterdomainAttention",
    "KVCache",
    "LinearReadout",
    "QueryReadout",
    "RecurrentCache",
    "S4DCore",
    "S4DMixer",
    "SSMMixer",
    "SelectiveInterdomainAttention",
    "SelectiveQueryReadout",
    "SigmoidGate",
    "SoftmaxAttention",
    "ablation_cell",
    "ssm_mixer",
    "upgrade_state_dict",
]
