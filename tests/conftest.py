import pytest
import torch

from tests.helpers import PoisonEmpty


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
    from idmix.functional.interdomain import chunked

    monkeypatch.setattr(chunked, "SEGMENT_TOKENS", 16)
