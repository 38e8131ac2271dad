"""idmix: Interdomain Attention for PyTorch.

Core (``idmix.functional``, ``idmix.modules``) imports only torch and tensordict; model
builders import torchtune when called.
"""

from .generation import cache_nbytes, generate, release_caches, sample_next

__version__ = "0.1.0"
__all__ = ["cache_nbytes", "generate", "release_caches", "sample_next"]
