"""Let torchtune 0.6.1 import against torchao ≥ 0.16 (constraints.txt pins 0.17).

torchtune 0.6.1 (its last release) imports ``int4_weight_only`` and
``int8_dynamic_activation_int4_weight`` from ``torchao.quantization`` at the top of
``torchtune/training/quantization.py``; torchao 0.16 removed both (its config classes replace
them), so ``import torchtune.training`` fails, and with it every recipe. idmix needs torchao
0.17 (its C++ kernels load on torch 2.13, and its PT2E flow imports), and never uses torchtune's
quantizers. This start-up hook (``idmix-recipes.pth``) puts one finder first on
``sys.meta_path`` that answers only for ``torchtune.training.quantization``: before that module
runs, it adds the two missing names to ``torchao.quantization`` as functions that raise a clear
error when called. Nothing is imported until torchtune's module is; only the standard library is
imported here. Remove this file (and its line in the .pth) once torchtune imports cleanly.
"""

from __future__ import annotations

import importlib.abc
import sys

TARGET = "torchtune.training.quantization"
REMOVED = ("int4_weight_only", "int8_dynamic_activation_int4_weight")


def _removed(name: str):
    def call(*args, **kwargs):
        raise NotImplementedError(
            f"torchao.quantization.{name} was removed in torchao 0.16 (idmix pins 0.17); "
            "torchtune's int4 quantizers that call it are not supported here: use torchao's "
            "Int4WeightOnlyConfig / Int8DynamicActivationIntxWeightConfig with quantize_"
        )

    call.__name__ = name
    return call


def add_removed_names() -> None:
    """Give torchao.quantization the names torchtune 0.6.1 imports, where they are missing."""
    import torchao.quantization as quantization

    for name in REMOVED:
        if not hasattr(quantization, name):
            setattr(quantization, name, _removed(name))


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        add_removed_names()
        self.inner.exec_module(module)


class TorchtuneCompatFinder(importlib.abc.MetaPathFinder):
    """Wraps the loader of torchtune.training.quantization (found by the other finders)."""

    @classmethod
    def invalidate_caches(cls) -> None:
        """Nothing is cached. The class itself sits on sys.meta_path, so
        ``importlib.invalidate_caches()`` (transformers calls it to load ``trust_remote_code``
        modules) calls this on the class, where MetaPathFinder's instance method would fail."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is cls or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    if not any(f is TorchtuneCompatFinder for f in sys.meta_path):
        sys.meta_path.insert(0, TorchtuneCompatFinder)


install()
