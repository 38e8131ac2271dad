import os
from pathlib import Path

# One Inductor cache shared by every test and run (set before Inductor is imported): a graph
# compiled once is loaded from disk afterwards, which keeps this suite fast on a rerun.
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".inductor-cache")
)

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test starts from an empty Dynamo cache (past 8 recompiles of one code object Dynamo
    silently falls back to eager) and the default stance, and leaves it so."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch.compiler.set_stance("default")
    torch._dynamo.reset()
