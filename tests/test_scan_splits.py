"""How the chunk-state scans split along T (kernels/scan_splits.py): every split non-empty, the
chunks covered exactly, and no split where the scan already has programs enough."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("triton")

from idmix_kernels.scan_splits import plan_splits, splits_for  # noqa: E402


@given(programs=st.integers(1, 5000), n=st.integers(1, 5000), target=st.integers(0, 5000))
def test_splits_cover_the_chunks_and_none_is_empty(programs, n, target):
    splits, per_split = plan_splits(programs, n, target)
    assert splits * per_split >= n > (splits - 1) * per_split  # the last split non-empty
    if 2 * programs >= target or n < 4:
        assert (splits, per_split) == (1, n)
    else:
        assert splits <= math.isqrt(n) and splits > 1  # √n runs: per_split + splits steps


@given(asked=st.integers(1, 100), n=st.integers(1, 300))
def test_asked_splits_are_at_most_the_chunks(asked, n):
    splits, per_split = splits_for(asked, 1, n, device=None)
    assert 1 <= splits <= min(asked, n)
    assert splits * per_split >= n > (splits - 1) * per_split


def test_a_long_row_on_few_programs():
    """1 × 64K tokens × 16 heads at chunk 64, a segment of 2^19 token·heads: 512 chunks over 64
    programs on 132 SMs -> 22 runs of 24 chunks (46 steps a program instead of 512)."""
    assert plan_splits(64, 512, 132) == (22, 24)
    assert plan_splits(128, 256, 132) == (1, 256)  # 2 × 32K: not split
