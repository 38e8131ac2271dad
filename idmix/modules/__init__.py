"""nn.Modules built from idmix.functional: the SSM mixer and its parts (contracts in
``parts``), the named mixers (choices of parts) and their registry, caches, the softmax
baseline and the linear baselines (GLA, Mamba-2, Gated DeltaNet)."""

from .branches import Branch, HeadNorm
from .cache import KVCache, Mamba3Cache, MatrixStateCache, RecurrentCache
from .cells import ABLATION_CELLS, ablation_cell
from .compose import SSM_OPTIONS, InterdomainAttention, S4DMixer, SigmoidGate, ssm_mixer
from .delta_core import DeltaInterdomainAttention, DeltaReadout
from .gated_deltanet import GatedDeltaNet
from .gated_norm import GatedHeadNorm
from .gla import GatedLinearAttention
from .inputs import dual_kv_inputs, generic_inputs
from .linear_state import LinearStateMixer
from .mamba2 import Mamba2
from .mamba3 import Mamba3
from .mamba3_core import Mamba3CoreInterdomainAttention, Mamba3CoreReadout
from .mixer import SSMMixer
from .parts import (
    Core,
    FeatureMap,
    Gate,
    InputBranch,
    InputParts,
    PartFactory,
    Readout,
    ReadoutParts,
    SSMArgs,
)
from .readouts import LinearReadout, QueryReadout
from .registry import MIXERS, register_mixer, resolve_mixer
from .selective import (
    PerTokenDecayReadout,
    SelectiveInterdomainAttention,
    SelectiveQueryReadout,
)
from .softmax import SoftmaxAttention
from .ssm import S4DCore

__all__ = [
    "ABLATION_CELLS",
    "MIXERS",
    "SSM_OPTIONS",
    "Branch",
    "Core",
    "DeltaInterdomainAttention",
    "DeltaReadout",
    "FeatureMap",
    "Gate",
    "GatedDeltaNet",
    "GatedHeadNorm",
    "GatedLinearAttention",
    "HeadNorm",
    "InputBranch",
    "InputParts",
    "InterdomainAttention",
    "KVCache",
    "LinearReadout",
    "LinearStateMixer",
    "Mamba2",
    "Mamba3",
    "Mamba3Cache",
    "Mamba3CoreInterdomainAttention",
    "Mamba3CoreReadout",
    "MatrixStateCache",
    "PartFactory",
    "PerTokenDecayReadout",
    "QueryReadout",
    "Readout",
    "ReadoutParts",
    "RecurrentCache",
    "S4DCore",
    "S4DMixer",
    "SSMArgs",
    "SSMMixer",
    "SelectiveInterdomainAttention",
    "SelectiveQueryReadout",
    "SigmoidGate",
    "SoftmaxAttention",
    "ablation_cell",
    "dual_kv_inputs",
    "generic_inputs",
    "register_mixer",
    "resolve_mixer",
    "ssm_mixer",
]
