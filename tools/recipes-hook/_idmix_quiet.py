"""Drop exactly two start-up messages of torchao 0.17 that no user can act on (issue 53):

- "Failed to load …/torchao/_C_mxfp8….so" and "…/_C_cutlass_90a.abi3.so": torchao's PyPI wheel
  carries CUDA-only extensions (one built for CPython 3.10) and tries them on every import; on a
  CPU build of torch (``torch.version.cuda is None``) they can never load. On a CUDA build the
  message is kept: there it says which kernels are missing.
- torch 2.13's deprecation notice for ``register_constant()`` on an Enum subclass, logged once
  per enum that torchao registers (``KernelPreference``, ``ScaleCalculationMode``): kept for
  any enum not defined in torchao.

Each is a ``logging.Filter`` on the one logger that emits it, installed at start-up by
``idmix-recipes.pth`` (the standard library only; torch is looked up when a record arrives).
"""

from __future__ import annotations

import enum
import logging
import sys

CUDA_ONLY_EXTENSIONS = ("_C_mxfp8", "_C_cutlass_90a")
ENUM_NOTICE = "is an Enum subclass and is now natively supported by torch.compile"


class UnloadableCudaExtension(logging.Filter):
    """On logger "torchao": drops its failure to load a CUDA-only extension on a CPU torch."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        torch = sys.modules.get("torch")
        cpu_build = torch is not None and torch.version.cuda is None
        unloadable = message.startswith("Failed to load ") and any(
            name in message for name in CUDA_ONLY_EXTENSIONS
        )
        return not (cpu_build and unloadable)


class TorchaoEnumNotice(logging.Filter):
    """On logger "torch.utils._pytree": drops the Enum deprecation notice for torchao's enums."""

    def filter(self, record: logging.LogRecord) -> bool:
        if ENUM_NOTICE not in str(record.msg) or not record.args:
            return True
        cls = record.args[0] if isinstance(record.args, tuple) else None
        an_enum = isinstance(cls, type) and issubclass(cls, enum.Enum)
        return not (an_enum and cls.__module__.split(".")[0] == "torchao")


def install() -> None:
    for name, kind in (("torchao", UnloadableCudaExtension),
                       ("torch.utils._pytree", TorchaoEnumNotice)):  # fmt: skip
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())


install()
