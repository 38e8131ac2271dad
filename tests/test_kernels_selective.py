"""The second half of the Triton kernel checks under the interpreter (tests/kernel_checks.py):
the per-token-decay (selective) kernels, and every check repeated with NaN-poisoned
allocations. Its own file, so that two test workers share the interpreter's time with
tests/test_kernels.py."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.kernel_checks import SECOND_HALF  # noqa: E402
from tests.test_kernels import run_checks  # noqa: E402


def test_selective_and_poisoned_kernels_interpreted_on_cpu():
    run_checks("cpu", "--only", ",".join(SECOND_HALF))
