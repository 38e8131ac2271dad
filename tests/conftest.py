import functools
import os

import pytest
import torch
from hypothesis import settings

from tests.helpers import PoisonEmpty

# Property tests reproduce: "ci" (the default) derandomises, so a failure recurs on every run
# and machine and hypothesis prints the failing example; HYPOTHESIS_PROFILE=explore searches
# with fresh randomness (and prints the seed to reproduce with --hypothesis-seed).
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def poison():
    """Run the test body with NaN-poisoned fresh allocations (yields the mode)."""
    mode = PoisonEmpty()
    with mode:
        yield mode


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def small_segments(monkeypatch):
    """Make the chunked path cut even short sequences into several segments."""
    from idmix.functional.interdomain import shared

    monkeypatch.setattr(shared, "SEGMENT_TOKENS", 16)


@pytest.fixture
def dynamo_only(monkeypatch):
    """backend="inductor"'s pieces traced by Dynamo but run eagerly (backend="eager"): the
    traced code path (real-form complex arithmetic, padded shears, functional scans) without
    Inductor's compile time; fullgraph, so that a graph break fails. Dynamo's caches start
    empty (the recompile limit counts per function). Yields the names of the pieces traced."""
    from idmix.functional.interdomain import driver

    torch._dynamo.reset()
    traced = []

    @functools.cache
    def trace(piece, **options):
        traced.append(piece.__name__)
        return torch.compile(piece, **options, fullgraph=True, backend="eager")

    monkeypatch.setattr(driver, "compiled", trace)
    yield traced
