"""idmix models as Hugging Face transformers models (the ``hf`` extra; README "Use from
Hugging Face"). Importing this package imports transformers and registers ``IdmixConfig`` and
``IdmixForCausalLM`` with ``AutoConfig`` and ``AutoModelForCausalLM``; ``idmix`` itself never
imports it. Conversion from ``model_final.pt``: ``idmix.hf.convert`` (also a command)."""

from .cache import IdmixCache
from .configuration import IdmixConfig
from .modeling import IdmixForCausalLM

__all__ = ["IdmixCache", "IdmixConfig", "IdmixForCausalLM"]
