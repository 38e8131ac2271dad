"""idmix: Interdomain Attention for PyTorch.

``idmix.functional`` imports only torch (and triton for its Triton backend, when used);
``idmix.modules`` adds tensordict (the decoding caches); model builders import torchtune when
called. The generation helpers below load on first use, so that importing the functional core
alone (a kernel test, a GPU check on a machine with only torch and triton) pulls in nothing else.
"""

__version__ = "0.1.0"
__all__ = ["cache_nbytes", "generate", "release_caches", "sample_next"]


def __getattr__(name: str):
    if name in __all__:
        from . import generation

        return getattr(generation, name)
    raise AttributeError(f"module 'idmix' has no attribute {name!r}")
