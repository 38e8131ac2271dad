"""torchtune-style model builders (torchtune is imported when a builder runs, not here)."""

from .baselines import *  # noqa: F403  (the linear baselines and hybrids, matched to interdomain)
from .baselines import __all__ as _baselines
from .configs import *  # noqa: F403  (the named builders: configs.MODEL_BUILDERS, each one def)
from .configs import __all__ as _builders
from .decoder import decoder, init_weights_, mixer_factory, swiglu_hidden_dim

__all__ = [
    *_builders,
    *_baselines,
    "decoder",
    "init_weights_",
    "mixer_factory",
    "swiglu_hidden_dim",
]
