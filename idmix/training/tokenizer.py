"""A small byte-level BPE trained locally on the embedded corpus: offline, deterministic and
cached on disk. Its interface is the subset of torchtune's tokenizers the recipes use
(``encode``, ``decode``, ``eos_id``, ``bos_id``, ``vocab_size``), so a torchtune tokenizer
(e.g. ``torchtune.models.llama2.llama2_tokenizer``) drops in through the config."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .files import atomic_write

EOS = "<|endoftext|>"


def default_cache_dir() -> Path:
    return Path(os.environ.get("IDMIX_CACHE", Path.home() / ".cache" / "idmix"))


class BPETokenizer:
    """Wraps a ``tokenizers.Tokenizer`` whose special token ``<|endoftext|>`` ends documents."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        eos = tokenizer.token_to_id(EOS)
        if eos is None:
            raise ValueError(f"tokenizer: expected the special token {EOS!r}")
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
    def from_file(cls, path: str | os.PathLike) -> BPETokenizer:
        if not Path(path).is_file():
            raise FileNotFoundError(f"tokenizer path: no such file {str(path)!r}")
        return cls(Tokenizer.from_file(str(path)))


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
