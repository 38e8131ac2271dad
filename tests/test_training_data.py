"""Packing, the embedded corpus and its tokenizer, the optimiser groups and schedule."""

from __future__ import annotations

import torch

from idmix.models import interdomain_tiny
from idmix.training.optim import param_groups, warmup_cosine
from idmix.training.packing import PackedStream, cycling_documents

DOCS = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11]]
EOS = 0


def stream(**kw):
    return PackedStream(cycling_documents(DOCS, lambda d: d, seed=3), 4, EOS, **kw)


def test_rows_overlap_by_one_and_positions_restart_after_eos():
    tokens, pos = stream().next_batch(6)
    flat = [t for row in tokens.tolist() for t in row[:-1]] + [tokens[-1, -1].item()]
    for a, b in zip(tokens[:-1, -1].tolist(), tokens[1:, 0].tolist(), strict=True):
        assert a == b  # the last label of a row is the next row's first input
    positions = [p for row in pos.tolist() for p in row[:-1]]
    for i in range(1, len(positions)):
        prev = flat[i - 1]
        assert positions[i] == (0 if prev == EOS else positions[i - 1] + 1)
    # every epoch visits every document once, in a seeded order
    assert sorted(x for x in flat[: sum(len(d) + 1 for d in DOCS)] if x != EOS) == list(
        range(1, 12)
    )


def test_state_round_trip_continues_exactly():
    a = stream()
    a.next_batch(3)
    saved = a.state_dict()
    expected = a.next_batch(5)
    b = stream()
    b.load_state_dict(saved)
    got = b.next_batch(5)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_ranks_take_disjoint_interleaved_rows():
    whole = stream().next_batch(6)[0]
    r0 = stream(rank=0, world=2).next_batch(3)[0]
    r1 = stream(rank=1, world=2).next_batch(3)[0]
    assert torch.equal(r0, whole[0::2]) and torch.equal(r1, whole[1::2])


def test_ssm_group_is_capped_and_undecayed():
    model = interdomain_tiny()
    groups = param_groups(model, lr=3e-3, weight_decay=0.1, ssm_lr_cap=1e-3)
    ssm = groups[-1]
    names = {id(p): n for n, p in model.named_parameters()}
    ssm_names = {names[id(p)] for p in ssm["params"]}
    assert ssm["lr"] == 1e-3 and ssm["weight_decay"] == 0.0
    assert any(n.endswith("core.C_re") for n in ssm_names)
    assert any("key_norm" in n for n in ssm_names) and any(
        n.endswith("core.log_dt") for n in ssm_names
    )
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_warmup_then_cosine_to_the_floor():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([{"params": [p], "lr": 1e-2}])
    sched = warmup_cosine(opt, warmup_steps=10, total_steps=110, min_lr=1e-5)
    lrs = []
    for _ in range(120):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert abs(lrs[0] - 1e-3) < 1e-12 and abs(lrs[9] - 1e-2) < 1e-12
    assert all(a >= b for a, b in zip(lrs[9:109], lrs[10:110], strict=True))
    assert abs(lrs[110] - 1e-5) < 1e-12 and abs(lrs[-1] - 1e-5) < 1e-12


def test_embedded_corpus_and_tokenizer_are_deterministic(tmp_path):
    from idmix.io.corpus import VALIDATION_PLAYS, shakespeare
    from idmix.io.tokenizer import shakespeare_bpe

    train, val = shakespeare("train"), shakespeare("validation")
    assert len(train) > 500 and len(val) > 10
    assert set(val["source"]) == set(VALIDATION_PLAYS) and not set(train["source"]) & set(
        VALIDATION_PLAYS
    )
    text = val["text"][3][:500]
    a = shakespeare_bpe(512, cache_dir=tmp_path / "a")
    b = shakespeare_bpe(512, cache_dir=tmp_path / "b")
    assert a.vocab_size == 512 and a.encode(text) == b.encode(text)
    assert a.decode(a.encode(text)) == text
