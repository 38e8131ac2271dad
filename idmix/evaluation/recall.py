"""Synthetic recall probes on token ids (no tokenizer): multi-query associative recall (MQAR),
phonebook lookup and passkey retrieval (needle in a haystack).

Every generator returns ``inputs`` (B, T) and ``targets`` (B, T) with -100 everywhere except at
the positions whose next token is an answer token, and ``groups`` (B, T): the answer each
scored position belongs to (-1 elsewhere), so exact match is "every position of a group right".
Content sits at the end of the row; the front is filled with noise tokens. Under teacher
forcing, all positions of an answer argmax-correct ⇔ greedy decoding writes the whole answer.

Token ids follow ``Vocabulary(size)``: 4 specials, 10 digits, then a quarter of the vocabulary
each for keys and values, the rest noise (512 by default; 8,192 is the usual MQAR setting).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

PAD, SEP, QUERY, NEEDLE = 0, 1, 2, 3
DIGITS = range(4, 14)
VOCAB_SIZE = 512
MIN_VOCAB_SIZE = 64
TASKS = ("mqar", "phonebook", "passkey")


@dataclass(frozen=True)
class Vocabulary:
    """The probes' token ranges for a vocabulary of ``size`` ids."""

    size: int = VOCAB_SIZE

    def __post_init__(self):
        if not isinstance(self.size, int) or self.size < MIN_VOCAB_SIZE:
            raise ValueError(f"vocab_size: expected an int ≥ {MIN_VOCAB_SIZE}, got {self.size!r}")

    @property
    def keys(self) -> range:
        return range(DIGITS.stop, DIGITS.stop + self.size // 4)

    @property
    def values(self) -> range:
        return range(self.keys.stop, self.keys.stop + self.size // 4)

    @property
    def noise(self) -> range:
        return range(self.values.stop, self.size)


KEYS, VALUES, NOISE = Vocabulary().keys, Vocabulary().values, Vocabulary().noise


@dataclass
class Batch:
    inputs: torch.Tensor  # (B, T) int64
    targets: torch.Tensor  # (B, T) int64, -100 where not scored
    groups: torch.Tensor  # (B, T) int64, answer index of each scored position, -1 elsewhere


def _draw(r: range, shape, g: torch.Generator) -> torch.Tensor:
    return torch.randint(r.start, r.stop, shape, generator=g)


def _distinct(r: range, batch: int, n: int, g: torch.Generator) -> torch.Tensor:
    """(batch, n) distinct values of r per row."""
    if n > len(r):
        raise ValueError(f"expected at most {len(r)} distinct items, got {n}")
    return torch.rand(batch, len(r), generator=g).argsort(-1)[:, :n] + r.start


def _assemble(
    rows: list[tuple[list[int], list[tuple[int, int]]]], seq_len: int, g, vocab: Vocabulary
) -> Batch:
    """rows: (content tokens, [(position in content, answer group)] of scored next-token
    positions) -> a Batch with the content right-aligned after noise."""
    B = len(rows)
    inputs = _draw(vocab.noise, (B, seq_len), g)
    targets = torch.full((B, seq_len), -100)
    groups = torch.full((B, seq_len), -1)
    for b, (content, scored) in enumerate(rows):
        if len(content) > seq_len + 1:
            raise ValueError(f"seq_len: {seq_len} is too short for {len(content)} content tokens")
        tail = torch.tensor(content)
        off = seq_len + 1 - len(content)  # content[i] sits at stream position off + i
        stream = torch.cat([inputs[b, :off], tail])
        inputs[b] = stream[:-1]
        for i, group in scored:  # position i predicts content[i + 1]
            targets[b, off + i] = content[i + 1]
            groups[b, off + i] = group
    return Batch(inputs, targets, groups)


def mqar(
    batch: int,
    seq_len: int,
    num_pairs: int,
    num_queries: int | None = None,
    g=None,
    vocab_size: int = VOCAB_SIZE,
) -> Batch:
    """k1 v1 … kn vn, then num_queries (default n) of the keys again, each followed by its
    value: the model must predict v at each query key."""
    vocab = Vocabulary(vocab_size)
    num_queries = num_queries or num_pairs
    keys = _distinct(vocab.keys, batch, num_pairs, g)
    values = _draw(vocab.values, (batch, num_pairs), g)
    rows = []
    for b in range(batch):
        content = [
            t for k, v in zip(keys[b].tolist(), values[b].tolist(), strict=True) for t in (k, v)
        ]
        scored = []
        for q, j in enumerate(torch.randint(0, num_pairs, (num_queries,), generator=g).tolist()):
            scored.append((len(content), q))
            content += [keys[b, j].item(), values[b, j].item()]
        rows.append((content, scored))
    return _assemble(rows, seq_len, g, vocab)


def phonebook(
    batch: int,
    seq_len: int,
    num_entries: int,
    g=None,
    name_len: int = 2,
    number_len: int = 3,
    vocab_size: int = VOCAB_SIZE,
) -> Batch:
    """num_entries of "name(2 key tokens) number(3 digits) SEP", then QUERY name: the model
    must write that entry's number (exact match over its digits)."""
    vocab = Vocabulary(vocab_size)
    rows = []
    for _ in range(batch):
        names = _distinct(vocab.keys, 1, num_entries * name_len, g).view(num_entries, name_len)
        numbers = _draw(DIGITS, (num_entries, number_len), g)
        content = []
        for name, number in zip(names.tolist(), numbers.tolist(), strict=True):
            content += [*name, *number, SEP]
        j = int(torch.randint(0, num_entries, (1,), generator=g))
        content += [QUERY, *names[j].tolist()]
        scored = [(len(content) - 1 + i, 0) for i in range(number_len)]
        content += numbers[j].tolist()
        rows.append((content, scored))
    return _assemble(rows, seq_len, g, vocab)


def passkey(
    batch: int,
    seq_len: int,
    g=None,
    key_len: int = 5,
    depth: float | None = None,
    vocab_size: int = VOCAB_SIZE,
) -> Batch:
    """Noise of seq_len tokens with "NEEDLE d1…d5 SEP" hidden at a random (or the given,
    0…1) depth, ending with "QUERY NEEDLE": the model must write the digits."""
    vocab = Vocabulary(vocab_size)
    rows = []
    answer = key_len + 2  # QUERY NEEDLE, then the digits
    for _ in range(batch):
        key = _draw(DIGITS, (key_len,), g).tolist()
        haystack = _draw(vocab.noise, (seq_len + 1 - answer - key_len - 2,), g).tolist()
        frac = float(torch.rand((), generator=g)) if depth is None else depth
        at = round(frac * len(haystack))
        content = haystack[:at] + [NEEDLE, *key, SEP] + haystack[at:] + [QUERY, NEEDLE]
        scored = [(len(content) - 1 + i, 0) for i in range(key_len)]
        rows.append((content + key, scored))
    return _assemble(rows, seq_len, g, vocab)


def make_batch(
    task: str, batch: int, seq_len: int, size: int, g=None, vocab_size: int = VOCAB_SIZE
) -> Batch:
    """One task's batch: size = pairs (mqar), entries (phonebook); ignored for passkey, whose
    difficulty is seq_len."""
    if task == "mqar":
        return mqar(batch, seq_len, size, g=g, vocab_size=vocab_size)
    if task == "phonebook":
        return phonebook(batch, seq_len, size, g=g, vocab_size=vocab_size)
    if task == "passkey":
        return passkey(batch, seq_len, g=g, vocab_size=vocab_size)
    raise ValueError(f"task: expected one of {TASKS}, got {task!r}")


def answer_loss(model, batch: Batch, device: str | torch.device = "cpu") -> torch.Tensor:
    """Mean cross-entropy over the scored positions of ``batch``, equal to the loss over full
    logits (ignored positions excluded) but with the output layer applied to the scored rows
    only: MQAR scores ~6% of its positions and a vocabulary-wide output layer on every
    position is most of a small model's training step.
    ``model``: a torchtune ``TransformerDecoder`` (``tok_embeddings``, ``layers``, ``unembed``)."""
    h = model.tok_embeddings(batch.inputs.to(device))
    for layer in model.layers:
        h = layer(h)
    targets = batch.targets.to(device)
    scored = targets != -100
    return F.cross_entropy(model.unembed(h[scored]), targets[scored])


def exact_match(logits: torch.Tensor, batch: Batch) -> float:
    """Fraction of answers (groups) whose every position is argmax-correct."""
    scored = batch.targets != -100
    right = (logits.argmax(-1) == batch.targets) | ~scored
    total = correct = 0
    for b in range(batch.inputs.shape[0]):
        for group in batch.groups[b][scored[b]].unique().tolist():
            total += 1
            correct += bool(right[b][batch.groups[b] == group].all())
    return correct / total
