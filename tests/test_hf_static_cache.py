"""A static ``IdmixCache`` in transformers' ``generate``: the one-token step compiled (on CUDA
also graphed, ``idmix.hf.static_step``) gives idmix.generate's greedy tokens on a ragged batch
and the dynamic cache's beams, compiles once per model (a second generation with a new cache
reuses it), never reallocates the cache, and refuses what would (growth, a batch it does not
hold) with an error that says what to make instead."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("transformers")

from transformers import CompileConfig  # noqa: E402

from idmix import generate  # noqa: E402
from idmix.hf import IdmixCache  # noqa: E402
from tests.test_hf import toy  # noqa: E402

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [3, 1, 4, 1, 5, 9, 2]]
NEW = 6


def on_cpu_too() -> CompileConfig:
    """transformers compiles generate's step on accelerators only unless told otherwise."""
    config = CompileConfig()
    config._compile_all_devices = True
    return config


def left_padded(prompts):
    P = max(map(len, prompts))
    ids = torch.zeros(len(prompts), P, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :], mask[i, P - len(p) :] = torch.tensor(p), 1
    return ids, mask


def addresses(cache: IdmixCache) -> list[int]:
    return [cache.keys.data_ptr()] + [
        getattr(state, field.name).data_ptr()
        for state in cache.layers
        for field in dataclasses.fields(state)
    ]


@pytest.mark.parametrize("mixer", ["interdomain", "softmax"])
def test_compiled_static_generate_gives_idmix_tokens_and_compiles_once(mixer):
    model = toy(mixer)
    expected = generate(model.model, PROMPTS, NEW, temperature=0)
    ids, mask = left_padded(PROMPTS)
    graphs = []
    for prompts_ids in (ids, ids.flip(1) * mask.flip(1)):  # the second: other tokens, same shapes
        cache = IdmixCache(model.model, len(PROMPTS), ids.shape[1] + NEW, static=True)
        before = addresses(cache)
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
        out = model.generate(prompts_ids, attention_mask=mask, max_new_tokens=NEW,
                             do_sample=False, cache=cache, compile_config=on_cpu_too())  # fmt: skip
        assert cache.step is not None and cache.step.steps == NEW - 1  # every step took it
        assert addresses(cache) == before
        assert cache.get_seq_length() == ids.shape[1] + NEW - 1
    graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    eager = model.generate(ids.flip(1) * mask.flip(1), attention_mask=mask, max_new_tokens=NEW,
                           do_sample=False)  # fmt: skip
    assert out.tolist() == eager.tolist()
    first = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    assert first[:, ids.shape[1] :].tolist() == expected
    assert graphs[2] - graphs[1] == 0, "a new static cache of the same shapes recompiled"


def test_beams_reorder_a_static_cache_in_place():
    model = toy("softmax")
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    dynamic = model.generate(ids, max_new_tokens=4, num_beams=3, do_sample=False)
    cache = IdmixCache(model.model, 6, 7, static=True)
    before = addresses(cache)
    static = model.generate(ids, max_new_tokens=4, num_beams=3, do_sample=False, cache=cache,
                            compile_config=on_cpu_too())  # fmt: skip
    assert static.tolist() == dynamic.tolist() and addresses(cache) == before


def test_a_static_cache_refuses_what_it_cannot_hold():
    model = toy("interdomain")
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    with pytest.raises(ValueError, match="static IdmixCache holds 6 positions.*capacity >="):
        model.generate(ids, max_new_tokens=5, cache=IdmixCache(model.model, 2, 6, static=True))
    with pytest.raises(ValueError, match="4 rows, but the cache holds 2.*num_beams"):
        model.generate(ids, max_new_tokens=2, num_beams=2,
                       cache=IdmixCache(model.model, 2, 6, static=True))  # fmt: skip
    cache = IdmixCache(model.model, 2, 6, static=True)
    with pytest.raises(ValueError, match="static IdmixCache keeps its 2 rows.*static=False"):
        cache.batch_repeat_interleave(2)
    with pytest.raises(ValueError, match="capacity: expected an int >= 1"):
        IdmixCache(model.model, 2, 0, static=True)
    assert cache.is_compileable and not IdmixCache(model.model, 2).is_compileable


def test_a_step_with_labels_takes_the_models_own_forward():
    """What generate never passes (labels, here) goes to the model's forward, which gives the
    loss; the static step is not made."""
    model = toy("interdomain")
    cache = IdmixCache(model.model, 2, 6, static=True)
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    model(ids, cache=cache)
    call = model.get_compiled_call(on_cpu_too())
    out = call(input_ids=ids[:, :1], cache=cache, labels=ids[:, :1], return_dict=True)
    assert out.loss is not None and cache.step is None and cache.get_seq_length() == 4


def test_a_static_step_without_position_ids_counts_them_from_the_recorded_keys():
    """Called as a user may (an attention mask, no position_ids): the step's positions come
    from the keys the cache recorded, and its logits are the model's own on a dynamic cache."""
    model = toy("interdomain")
    ids, mask = left_padded(PROMPTS)
    nxt = torch.tensor([[3], [4], [5]])
    grown = torch.cat([mask, torch.ones_like(nxt)], 1)
    with torch.no_grad():
        dynamic = model(ids, attention_mask=mask, use_cache=True).cache
        want = model(nxt, attention_mask=grown, cache=dynamic).logits
        static = IdmixCache(model.model, len(PROMPTS), ids.shape[1] + 1, static=True)
        model(ids, attention_mask=mask, cache=static)
        call = model.get_compiled_call(on_cpu_too())
        got = call(input_ids=nxt, attention_mask=grown, cache=static, return_dict=True).logits
    assert static.step is not None
    # measured: max |Δ| ≤ 6.0e-8 at |logits| ≤ 0.35 over three seeds (Inductor's fp32 sums)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
