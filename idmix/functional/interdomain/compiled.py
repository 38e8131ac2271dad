"""Plain PyTorch functions compiled by Inductor behind the ops (one cache for every caller)."""

from __future__ import annotations

import functools
import shutil

import torch


@functools.cache
def compiled(fn, **options):
    """torch.compile(fn, **options), built once per process for each (fn, options)."""
    return torch.compile(fn, **options)


@functools.cache
def have_cxx() -> bool:
    """Whether Inductor can build CPU kernels here (it needs a C++ compiler)."""
    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))
