"""Perplexity by context length: windows of L score every token once; a window as long as
the stream is one forward pass; bad lengths are named."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from idmix.evaluation.extrapolation import perplexity_by_context
from idmix.evaluation.scoring import sequence_nll
from tests.helpers import tiny_model


@pytest.mark.parametrize("mixer", ["interdomain", "softmax"])
def test_windows_score_each_token_once_within_its_window(mixer):
    model, _ = tiny_model(mixer)
    stream = torch.randint(0, 4096, (97,))
    whole = F.cross_entropy(model(stream[None, :-1])[0], stream[1:], reduction="none")
    torch.testing.assert_close(sequence_nll(model, stream, 96), whole, rtol=1e-5, atol=1e-5)
    by_32 = sequence_nll(model, stream, 32, batch_size=2)
    first = F.cross_entropy(model(stream[None, :32])[0], stream[1:33], reduction="none")
    torch.testing.assert_close(by_32[:32], first, rtol=1e-5, atol=1e-5)
    ppl = perplexity_by_context(model, stream, [32, 96], 96)
    assert ppl[96] == pytest.approx(math.exp(whole.double().mean().item()), rel=1e-5)
    assert ppl[32] == pytest.approx(math.exp(by_32.double().mean().item()), rel=1e-5)


def test_bad_lengths_are_named():
    model, _ = tiny_model()
    stream = torch.randint(0, 4096, (200,))
    with pytest.raises(ValueError, match="not a multiple of the length 48"):
        perplexity_by_context(model, stream, [48], 64)
    with pytest.raises(ValueError, match="outside"):
        perplexity_by_context(model, stream, [1024], 1024)
    with pytest.raises(ValueError, match="fewer than num_tokens"):
        perplexity_by_context(model, stream, [64], 256)
