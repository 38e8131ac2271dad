"""Recall probes: every answer is recoverable from the row (an oracle that looks it up scores
1), nothing but answer positions is scored, rows are reproducible from the seed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from idmix.evaluation import recall


def oracle_logits(batch: recall.Batch, vocab_size: int = recall.VOCAB_SIZE) -> torch.Tensor:
    """Logits that put all mass on the target wherever one is scored (a perfect reader)."""
    logits = torch.zeros(*batch.inputs.shape, vocab_size)
    scored = batch.targets != -100
    logits[scored, batch.targets[scored]] = 1.0
    return logits


def lookup_mqar(row: torch.Tensor, t: int) -> int:
    """The value that followed the first occurrence of the key at position t."""
    key = row[t].item()
    first = (row[:t] == key).nonzero()[0].item()
    return row[first + 1].item()


@settings(max_examples=20, deadline=None)
@given(
    pairs=st.integers(1, 16),
    seed=st.integers(0, 10_000),
    vocab_size=st.sampled_from([64, 100, 512, 8192]),
)
def test_mqar_answers_are_the_values_bound_to_each_key(pairs, seed, vocab_size):
    g = torch.Generator().manual_seed(seed)
    batch = recall.mqar(3, 4 * pairs + 5, pairs, g=g, vocab_size=vocab_size)
    vocab = recall.Vocabulary(vocab_size)
    scored = (batch.targets != -100).nonzero().tolist()
    assert len(scored) == 3 * pairs  # one per query
    for b, t in scored:
        assert batch.targets[b, t] == lookup_mqar(batch.inputs[b], t)
        assert batch.targets[b, t] in vocab.values and batch.inputs[b, t] in vocab.keys
    assert batch.inputs.max() < vocab_size
    assert recall.exact_match(oracle_logits(batch, vocab_size), batch) == 1.0


@given(size=st.integers(recall.MIN_VOCAB_SIZE, 100_000))
def test_vocabulary_ranges_are_disjoint_and_cover_the_ids(size):
    vocab = recall.Vocabulary(size)
    ranges = [range(0, 4), recall.DIGITS, vocab.keys, vocab.values, vocab.noise]
    assert [r.start for r in ranges[1:]] == [r.stop for r in ranges[:-1]]
    assert vocab.noise.stop == size and len(vocab.keys) == len(vocab.values) == size // 4
    assert len(vocab.noise) > 0


def test_default_vocabulary_is_the_512_layout():
    assert (recall.KEYS, recall.VALUES, recall.NOISE) == (
        range(14, 142), range(142, 270), range(270, 512)
    )  # fmt: skip


@settings(max_examples=20, deadline=None)
@given(entries=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_phonebook_query_returns_the_listed_number(entries, seed):
    g = torch.Generator().manual_seed(seed)
    batch = recall.phonebook(2, entries * 6 + 8, entries, g=g)
    for b in range(2):
        row, tgt = batch.inputs[b].tolist(), batch.targets[b]
        pos = (tgt != -100).nonzero().flatten().tolist()
        assert len(pos) == 3 and pos == list(range(pos[0], pos[0] + 3))
        name = row[pos[0] - 1 : pos[0] + 1]  # the two name tokens after QUERY
        assert row[pos[0] - 2] == recall.QUERY
        at = next(i for i in range(len(row) - 1) if row[i : i + 2] == name)
        assert tgt[pos].tolist() == row[at + 2 : at + 5]
    assert recall.exact_match(oracle_logits(batch), batch) == 1.0


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("seq_len", [16, 100, 1024])
def test_passkey_is_the_digits_after_the_needle(depth, seq_len):
    batch = recall.passkey(2, seq_len, g=torch.Generator().manual_seed(1), depth=depth)
    assert batch.inputs.shape == (2, seq_len)
    for b in range(2):
        row = batch.inputs[b].tolist()
        needle = row.index(recall.NEEDLE)
        answer = batch.targets[b][batch.targets[b] != -100].tolist()
        assert row[needle + 1 : needle + 6] == answer
        assert row[-6:-4] == [recall.QUERY, recall.NEEDLE] and row.count(recall.NEEDLE) == 2
        assert row[-4:] == answer[:4]  # teacher forcing: the answer's digits follow the query
        assert all(t in recall.DIGITS for t in answer)


def test_scoring_counts_whole_answers_and_seeds_reproduce():
    g = torch.Generator().manual_seed(3)
    batch = recall.phonebook(4, 64, 8, g=g)
    logits = oracle_logits(batch)
    b, t = (batch.targets != -100).nonzero()[0].tolist()  # spoil one digit of row b's answer
    logits[b, t] = 0
    logits[b, t, (batch.targets[b, t] + 1) % recall.VOCAB_SIZE] = 1
    assert recall.exact_match(logits, batch) == 0.75
    again = recall.phonebook(4, 64, 8, g=torch.Generator().manual_seed(3))
    assert torch.equal(again.inputs, batch.inputs) and torch.equal(again.targets, batch.targets)


def test_bad_sizes_are_named():
    with pytest.raises(ValueError, match="seq_len: 10 is too short"):
        recall.mqar(1, 10, 8)
    with pytest.raises(ValueError, match="task: expected one of"):
        recall.make_batch("copying", 1, 64, 4)
    with pytest.raises(ValueError, match="vocab_size: expected an int ≥ 64"):
        recall.passkey(1, 64, vocab_size=32)


@pytest.mark.parametrize("mixer", ["interdomain", "softmax"])
def test_answer_loss_equals_the_loss_over_full_logits_with_its_gradients(mixer):
    from idmix.models import decoder

    torch.manual_seed(0)
    model = decoder(
        vocab_size=64, num_layers=1, num_heads=2, embed_dim=16, max_seq_len=32, mixer=mixer
    )
    batch = recall.make_batch("mqar", 3, 32, 4, torch.Generator().manual_seed(1), 64)
    full = torch.nn.functional.cross_entropy(
        model(batch.inputs).flatten(0, 1), batch.targets.flatten()
    )
    full_grads = torch.autograd.grad(full, list(model.parameters()))
    fast = recall.answer_loss(model, batch)
    fast_grads = torch.autograd.grad(fast, list(model.parameters()))
    torch.testing.assert_close(fast, full, rtol=1e-6, atol=1e-6)
    for a, b in zip(fast_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
