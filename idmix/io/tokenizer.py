"""Byte-level BPEs trained locally on a corpus (the embedded plays, the stdlib code corpus or
any ``text_corpus``): offline, deterministic and cached on disk; and any ``tokenizers`` JSON
file (``from_file``). Their interface is the subset of torchtune's tokenizers the recipes use
(``encode``, ``encode_batch``, ``decode``, ``eos_id``, ``bos_id``, ``vocab_size``), so a
torchtune tokenizer (e.g. ``torchtune.models.llama2.llama2_tokenizer``) drops in through the
config."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .files import atomic_write

EOS = "<|endoftext|>"
# End-of-document tokens looked for in a tokenizer file, in this order (GPT-2, Llama/T5, …).
EOS_CANDIDATES = (EOS, "</s>", "<eos>", "<|end_of_text|>", "[SEP]")


def default_cache_dir() -> Path:
    return Path(os.environ.get("IDMIX_CACHE", Path.home() / ".cache" / "idmix"))


class BPETokenizer:
    """Wraps a ``tokenizers.Tokenizer``; ``eos_token`` (``<|endoftext|>`` by default) ends
    documents and also serves as bos."""

    def __init__(self, tokenizer: Tokenizer, eos_token: str = EOS):
        self._tok = tokenizer
        eos = tokenizer.token_to_id(eos_token)
        if eos is None:
            raise ValueError(f"tokenizer: expected the special token {eos_token!r}")
        self.eos_id = self.bos_id = eos
        self.vocab_size = tokenizer.get_vocab_size()

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = self._tok.encode(text).ids
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids))

    @classmethod
    def from_file(cls, path: str | os.PathLike, eos_token: str = EOS) -> BPETokenizer:
        if not Path(path).is_file():
            raise FileNotFoundError(f"tokenizer path: no such file {str(path)!r}")
        return cls(Tokenizer.from_file(str(path)), eos_token)


def from_file(path: str, eos_token: str | None = None) -> BPETokenizer:
    """Any ``tokenizers`` JSON file (e.g. a hub model's ``tokenizer.json``). eos_token: the
    token that ends documents; by default the first of ``EOS_CANDIDATES`` the file has."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"tokenizer path: no such file {str(path)!r}")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:
        raise ValueError(f"tokenizer path: {str(path)!r} is not a tokenizers JSON file: {e}") from e
    if eos_token is None:
        eos_token = next((t for t in EOS_CANDIDATES if tok.token_to_id(t) is not None), None)
        if eos_token is None:
            raise ValueError(
                f"tokenizer: {str(path)!r} has none of {EOS_CANDIDATES}; name its end-of-document "
                "token with eos_token=…"
            )
    elif tok.token_to_id(eos_token) is None:
        raise ValueError(f"eos_token: {eos_token!r} is not a token of {str(path)!r}")
    return BPETokenizer(tok, eos_token)


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE over texts; deterministic for the same texts and vocab_size."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def cached_bpe(
    name: str, texts: list[str], vocab_size: int, cache_dir: str | None = None
) -> BPETokenizer:
    """A BPE of vocab_size trained on texts on first use and cached on disk as
    ``<name>-bpe-<vocab_size>-<content hash>.json`` (keyed by the texts and vocab_size, so a
    changed corpus trains a new one); later calls load the cached file."""
    if vocab_size < 257:
        raise ValueError(f"vocab_size: expected >= 257 (bytes + <|endoftext|>), got {vocab_size}")
    key = hashlib.sha256(("\0".join(texts) + f"|{vocab_size}").encode()).hexdigest()[:16]
    path = Path(cache_dir or default_cache_dir()) / f"{name}-bpe-{vocab_size}-{key}.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tokenizer = train_bpe(texts, vocab_size)
        atomic_write(path, lambda tmp: tokenizer.save(str(tmp)))  # ranks never read a partial file
    return BPETokenizer.from_file(path)


def shakespeare_bpe(vocab_size: int = 4096, cache_dir: str | None = None) -> BPETokenizer:
    """The embedded corpus's BPE, trained on its train split (``cached_bpe``)."""
    from .corpus import shakespeare

    return cached_bpe("shakespeare", shakespeare("train")["text"], vocab_size, cache_dir)


def python_stdlib_bpe(vocab_size: int = 4096, cache_dir: str | None = None) -> BPETokenizer:
    """A BPE for the standard-library code corpus, trained on its train split."""
    from .corpus import python_stdlib

    return cached_bpe("python-stdlib", python_stdlib("train")["text"], vocab_size, cache_dir)


def python_docs_bpe(vocab_size: int = 4096, cache_dir: str | None = None) -> BPETokenizer:
    """A BPE for the documentation-prose corpus, trained on its train split."""
    from .corpus import python_docs

    return cached_bpe("python-docs", python_docs("train")["text"], vocab_size, cache_dir)


def bpe_for_corpus(
    vocab_size: int,
    source: str,
    *,
    data_files=None,
    name: str | None = None,
    column: str = "text",
    split: str = "train",
    max_documents: int | None = None,
    validation_fraction: float | None = None,
    seed: int = 0,
    sample_by: str | None = None,
    cache_dir: str | None = None,
) -> BPETokenizer:
    """A BPE of vocab_size for any ``text_corpus`` (same arguments), trained on its first
    max_documents documents (all when None) on first use and cached keyed by their content and
    vocab_size (``cached_bpe``): an edited corpus trains a new one. With validation_fraction it
    trains on the train side of the carve-out only."""
    from .corpus import text_corpus

    if max_documents is not None and (not isinstance(max_documents, int) or max_documents < 1):
        raise ValueError(f"max_documents: expected a positive int or None, got {max_documents!r}")
    ds = text_corpus(
        source, data_files=data_files, name=name, split=split, column=column,
        streaming=max_documents is not None, validation_fraction=validation_fraction, seed=seed,
        sample_by=sample_by,
    )  # fmt: skip
    texts = [row["text"] for row in ds.take(max_documents)] if max_documents else ds["text"]
    if not texts:
        raise ValueError(f"{source!r}: the corpus has no non-empty documents")
    named = data_files if isinstance(data_files, str) else source
    label = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(str(named)).name).strip("-") or "corpus"
    return cached_bpe(label, list(texts), vocab_size, cache_dir)
