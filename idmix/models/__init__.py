"""torchtune-style model builders (torchtune is imported when a builder runs, not here)."""

from . import configs
from .configs import MODEL_BUILDERS, ablation_125m, cpu_model, paper_model
from .decoder import decoder, init_weights_, mixer_factory, swiglu_hidden_dim

for _name in MODEL_BUILDERS:
    globals()[_name] = getattr(configs, _name)

__all__ = [
    "MODEL_BUILDERS",
    "ablation_125m",
    "cpu_model",
    "decoder",
    "init_weights_",
    "mixer_factory",
    "paper_model",
    "swiglu_hidden_dim",
    *MODEL_BUILDERS,
]
