"""The graph-capturable decode step (idmix.static_decode) of a whole model: one graph with no
break, no host read and no tensor built from host data inside it, every persistent tensor at
a fixed address across steps, and generate(compile=True) giving eager's tokens, sampled too."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._inductor import config as inductor_config
from torch.utils._python_dispatch import TorchDispatchMode

from compile_tests.test_model import tiny
from idmix import generate
from idmix.generation import prefill
from idmix.static_decode import StepRunner, decode_step, emit

aten = torch.ops.aten
MIXERS = ["interdomain", "softmax"]
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]
SAMPLED = (0.8, 40, 0.9)  # temperature, top_k, top_p


class NoHostReads(TorchDispatchMode):
    """Fails on an op that reads a tensor's value on the host (``.item()``, ``bool(t)``, a
    data-dependent shape) or makes a tensor from host data (``torch.tensor``): each would be a
    sync or a host-to-device copy per token, and none can be captured in a CUDA graph."""

    FORBIDDEN = {
        aten._local_scalar_dense.default,
        aten.is_nonzero.default,
        aten.equal.default,
        aten.nonzero.default,
        aten.masked_select.default,
        aten.lift_fresh.default,
        aten.lift_fresh_copy.default,
    }

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.FORBIDDEN:
            raise AssertionError(f"the decode step called {func} (a host read or host data)")
        return func(*args, **(kwargs or {}))


def persistent_tensors(model, buf) -> dict[str, torch.Tensor]:
    """Every tensor a step reads or writes that outlives it: caches, buffers, the snapshots."""
    found = {f"buf.{k}": v for k, v in vars(buf).items()}
    for i, layer in enumerate(model.layers):
        cache = layer.attn.kv_cache
        for field in dataclasses.fields(cache):
            found[f"layers.{i}.cache.{field.name}"] = getattr(cache, field.name)
    found.update({f"buffer {k}": b for k, b in model.named_buffers() if b is not None})
    return found


@pytest.mark.parametrize("mixer", MIXERS)
def test_step_is_one_graph_without_host_reads_at_fixed_addresses(mixer, monkeypatch):
    monkeypatch.setenv("IDMIX_DEBUG", "0")  # no value checks: the path a GPU takes
    model = tiny(mixer).eval()
    with torch.no_grad():
        buf, logits = prefill(model, PROMPTS, 8)
        emit(buf, logits, *SAMPLED)
        before = {k: t.data_ptr() for k, t in persistent_tensors(model, buf).items()}
        with NoHostReads():
            for _ in range(3):
                decode_step(model, buf, *SAMPLED)
        explained = torch._dynamo.explain(decode_step)(model, buf, *SAMPLED)
        after = {k: t.data_ptr() for k, t in persistent_tensors(model, buf).items()}
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    moved = [k for k in before if after.get(k) != before[k]]
    assert not moved, f"reallocated during decoding: {moved}"
    assert int(buf.index) == 5 and buf.count.tolist() == [5, 5]


@pytest.mark.parametrize("mixer", MIXERS)
def test_compiled_generation_equals_eager_sampled_and_does_not_recompile(mixer):
    """Sampled tokens agree with Inductor's random ops made eager's (fallback_random); a second
    call with other prompts of the same shapes reuses the compiled step."""
    model = tiny(mixer).eval()
    kw = dict(temperature=SAMPLED[0], top_k=SAMPLED[1], top_p=SAMPLED[2], stop_tokens=[7])

    def both(prompts):
        torch.manual_seed(1)
        eager = generate(model, prompts, 10, **kw)
        torch.manual_seed(1)
        return eager, generate(model, prompts, 10, compile=True, **kw)

    with inductor_config.patch(fallback_random=True):
        eager, fast = both(PROMPTS)
        assert fast == eager
        with torch.compiler.set_stance("fail_on_recompile"):
            eager, fast = both([[p + 100 for p in row] for row in PROMPTS])
    assert fast == eager


def test_graphed_mode_needs_cuda():
    model = tiny("interdomain").eval()
    with torch.no_grad():
        buf, _ = prefill(model, PROMPTS, 4)
    with pytest.raises(ValueError, match="mode: 'graphed' needs a CUDA model"):
        StepRunner(model, buf, SAMPLED, "graphed")
    with pytest.raises(ValueError, match="mode: expected one of"):
        StepRunner(model, buf, SAMPLED, "cudagraph")
