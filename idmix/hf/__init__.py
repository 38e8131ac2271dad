"""idmix models as Hugging Face transformers models (the ``hf`` extra; docs/huggingface.md).
Importing this package imports transformers and registers ``IdmixConfig`` with
``AutoConfig``, ``IdmixForCausalLM`` with ``AutoModelForCausalLM`` and the fast tokenizer with
``AutoTokenizer``, so ``from_pretrained(dir)`` loads an idmix directory with
``trust_remote_code=False``; ``idmix`` itself never imports it. Conversion from
``model_final.pt``: ``idmix.hf.convert`` (also a command)."""

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from .cache import IdmixCache
from .configuration import IdmixConfig
from .modeling import IdmixForCausalLM

AutoConfig.register(IdmixConfig.model_type, IdmixConfig, exist_ok=True)
AutoModelForCausalLM.register(IdmixConfig, IdmixForCausalLM, exist_ok=True)
AutoTokenizer.register(IdmixConfig, tokenizer_class=PreTrainedTokenizerFast, exist_ok=True)

__all__ = ["IdmixCache", "IdmixConfig", "IdmixForCausalLM"]
