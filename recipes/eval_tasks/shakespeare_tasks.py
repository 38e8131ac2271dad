"""Offline lm-eval tasks built from the embedded corpus's validation plays (deterministic; no
download). Referenced by the YAML files beside this one through ``custom_dataset``."""

from __future__ import annotations

import random
import re

import datasets

from idmix.io.corpus import shakespeare

SPEAKER = re.compile(r"\n\n([A-Z][A-Z' ]+)\.\n")


def _scenes() -> list[str]:
    return [t for t in shakespeare("validation")["text"] if t.startswith("SCENE")]


def _test_split(rows: list[dict]) -> datasets.DatasetDict:
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def next_line(
    num_docs: int = 200, context_chars: int = 400, seed: int = 0, **_
) -> datasets.DatasetDict:
    """Multiple choice: after context_chars of a scene (ending at a line break), which of four
    lines comes next? Distractors are lines of other scenes; gold is at a random index."""
    rng = random.Random(seed)
    scenes = [s.splitlines(keepends=True) for s in _scenes()]
    pool = [ln.rstrip("\n") for lines in scenes for ln in lines if len(ln.strip()) > 20]
    rows = []
    while len(rows) < num_docs:
        s = rng.randrange(len(scenes))
        lines = scenes[s]
        i = rng.randrange(1, len(lines))
        answer = lines[i].rstrip("\n")
        if len(answer.strip()) <= 20:
            continue
        context = "".join(lines[:i])[-context_chars:]
        choices = [answer]
        while len(choices) < 4:
            other = rng.choice(pool)
            if other not in choices and other not in "".join(lines):
                choices.append(other)
        order = list(range(4))
        rng.shuffle(order)
        rows.append(
            {"context": context, "choices": [choices[j] for j in order], "gold": order.index(0)}
        )
    return _test_split(rows)


def scenes(max_docs: int = 27, **_) -> datasets.DatasetDict:
    """Rolling perplexity over whole validation scenes."""
    return _test_split([{"text": t} for t in _scenes()[:max_docs]])


def next_speaker(
    num_docs: int = 100, context_chars: int = 600, seed: int = 0, **_
) -> datasets.DatasetDict:
    """Generation: the scene so far, up to the line break that ends a speech; the answer is the
    name of the character who speaks next (as printed: upper case, before the full stop). The
    blank line before the name is left to the model: a trailing "\n\n" would encode as one
    token that the tokenizer never produces before a name in running text."""
    rng = random.Random(seed)
    found = [(text, m) for text in _scenes() for m in SPEAKER.finditer(text) if m.start() > 200]
    rows = []
    for text, m in rng.sample(found, min(num_docs, len(found))):
        rows.append({"context": text[: m.start() + 1][-context_chars:], "speaker": m.group(1)})
    return _test_split(rows)
