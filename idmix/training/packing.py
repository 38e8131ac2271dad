"""Sequence packing over a document stream, with positions that restart at every document (the
``input_pos`` the mixers reset their state on) and a resumable position."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch


class PackedStream:
    """Rows of ``seq_len + 1`` tokens (inputs and next-token labels overlap by one) cut from the
    concatenation of documents, each followed by ``eos_id``.

    documents(start) yields the token lists of documents start, start+1, … (it may cycle).
    Rows are numbered globally; with ``world`` ranks, rank r keeps rows r, r + world, … .
    ``state_dict()`` holds documents consumed, the carried-over tokens and rows emitted, so a
    restored stream continues exactly where the saved one stopped.
    Each row is (tokens (seq_len + 1,), positions (seq_len + 1,)): a document's first token
    has position 0.
    """

    def __init__(
        self,
        documents: Callable[[int], Iterable[list[int]]],
        seq_len: int,
        eos_id: int,
        rank: int = 0,
        world: int = 1,
    ):
        if seq_len < 1:
            raise ValueError(f"seq_len: expected >= 1, got {seq_len}")
        if not 0 <= rank < world:
            raise ValueError(f"rank: expected 0 <= rank < world = {world}, got {rank}")
        self.documents, self.seq_len, self.eos_id = documents, seq_len, eos_id
        self.rank, self.world = rank, world
        self.docs, self.rows = 0, 0
        self.carry: list[int] = []
        self.carry_pos: list[int] = []
        self._it: Iterator[list[int]] | None = None

    def state_dict(self) -> dict:
        return {
            "docs": self.docs,
            "rows": self.rows,
            "carry": list(self.carry),
            "carry_pos": list(self.carry_pos),
        }

    def load_state_dict(self, state: dict) -> None:
        self.docs, self.rows = int(state["docs"]), int(state["rows"])
        self.carry, self.carry_pos = list(state["carry"]), list(state["carry_pos"])
        self._it = None

    def _fill(self, n: int) -> None:
        if self._it is None:
            self._it = iter(self.documents(self.docs))
        while len(self.carry) < n:
            try:
                doc = next(self._it)
            except StopIteration:
                raise RuntimeError("the document stream ran out (a finite source?)") from None
            self.docs += 1
            tokens = list(doc) + [self.eos_id]
            self.carry += tokens
            self.carry_pos += range(len(tokens))

    def _next_row(self) -> tuple[list[int], list[int]]:
        n = self.seq_len + 1
        self._fill(n)
        row, pos = self.carry[:n], self.carry_pos[:n]
        # the last token is the next row's first input: keep it
        self.carry, self.carry_pos = self.carry[n - 1 :], self.carry_pos[n - 1 :]
        self.rows += 1
        return row, pos

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, positions): (batch_size, seq_len + 1) int64 each, this rank's rows."""
        rows, positions = [], []
        while len(rows) < batch_size:
            keep = self.rows % self.world == self.rank
            row, pos = self._next_row()
            if keep:
                rows.append(row)
                positions.append(pos)
        return torch.tensor(rows), torch.tensor(positions)


def cycling_documents(
    texts: list[str], tokenize, seed: int
) -> Callable[[int], Iterator[list[int]]]:
    """documents(start) over a finite corpus, tokenized once: epoch e visits the documents in a
    permutation seeded by (seed, e); document index i is epoch i // n, position i % n."""
    tokens = tokenize(texts)
    n = len(tokens)
    if n == 0:
        raise ValueError("texts: the corpus is empty")

    def documents(start: int) -> Iterator[list[int]]:
        i = start
        while True:
            epoch, offset = divmod(i, n)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
            for j in order[offset:].tolist():
                yield tokens[j]
            i = (epoch + 1) * n

    return documents


def streaming_documents(dataset, tokenize_one) -> Callable[[int], Iterator[list[int]]]:
    """documents(start) over a (streaming) ``datasets`` dataset with a ``text`` column."""

    def documents(start: int) -> Iterator[list[int]]:
        for example in dataset.skip(start) if start else dataset:
            yield tokenize_one(example["text"])

    return documents
