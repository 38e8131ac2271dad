"""Deployment: int8 linears keep the SSM parameters fp32 and stay close to fp32; exported
prefill/decode programs (saved and reloaded) decode exactly like idmix.generate."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from idmix import generate
from idmix.evaluation.deploy import (
    INT4_GROUP_SIZE,
    QUANT_MODES,
    cache_tensors,
    export_programs,
    greedy_with_programs,
    linear_weight_bytes,
    load_program,
    load_quantized_model,
    quantize_linears,
    save_program,
    save_quantized_model,
)
from tests.helpers import tiny_model


def reload(program, path, aoti=False):
    save_program(program, path, aoti=aoti)
    return load_program(path, aoti=aoti)


@pytest.mark.parametrize("mixer", ["interdomain", "s4d", "softmax"])
def test_exported_programs_decode_like_generate(mixer, tmp_path):
    model, _ = tiny_model(mixer)
    prompt = torch.randint(0, 4096, (2, 11))
    ref = torch.tensor(generate(model, prompt.tolist(), 9, temperature=0))
    prefill, decode = export_programs(model, batch_size=2, prompt_len=11, max_seq_len=24)
    prefill, decode = reload(prefill, tmp_path / "p.pt2"), reload(decode, tmp_path / "d.pt2")
    assert torch.equal(greedy_with_programs(prefill, decode, prompt, 9, 24), ref)
    if mixer != "softmax":  # the SSM mixers' state does not grow with max_seq_len
        sizes = {S: sum(t.numel() for t in cache_tensors(_setup(model, S))) for S in (24, 4096)}
        assert sizes[24] == sizes[4096]


def _setup(model, S):
    model.setup_caches(batch_size=1, dtype=torch.float32, decoder_max_seq_len=S)
    return model


# the mode's weight type and its relative error bound on the toy model's logits (measured: 0.011
# and 0.016 for int8; 0.19 for int4, one scale per row at the toy width 32)
WEIGHT_TYPES = {"int8_weight_only": ("Int8Tensor", 0.05), "int8_dynamic": ("Int8Tensor", 0.05)}
WEIGHT_TYPES["int8_dynamic_int4"] = ("IntxUnpackedToInt8Tensor", 0.3)


@pytest.mark.parametrize("mode", QUANT_MODES)
def test_quantised_linears_only_and_the_reloaded_export_matches_eager(mode, tmp_path):
    import torchao.quantization

    model, _ = tiny_model()
    q = quantize_linears(model, mode)
    weight_type, bound = WEIGHT_TYPES[mode]
    for name, module in q.named_modules():
        if isinstance(module, nn.Linear):
            assert isinstance(module.weight, getattr(torchao.quantization, weight_type)), name
    for (name, p), (_, p0) in zip(q.named_parameters(), model.named_parameters(), strict=True):
        if ".core." in name or "mode_weights" in name:
            assert p.dtype == torch.float32 and torch.equal(p, p0), name
    assert isinstance(model.output.weight, nn.Parameter)  # the original is untouched
    x = torch.randint(0, 4096, (2, 40))
    ref, got = model(x), q(x)
    assert (got - ref).norm() / ref.norm() < bound
    prompt = x[:, :8]
    eager = torch.tensor(generate(q, prompt.tolist(), 6, temperature=0))
    prefill, decode = export_programs(q, batch_size=2, prompt_len=8, max_seq_len=16)
    prefill, decode = reload(prefill, tmp_path / "p.pt2"), reload(decode, tmp_path / "d.pt2")
    assert torch.equal(greedy_with_programs(prefill, decode, prompt, 6, 16), eager)


@pytest.mark.parametrize("mode", QUANT_MODES)
def test_quantized_model_file_loads_safely_and_equals_the_model(mode, tmp_path, monkeypatch):
    """save_quantized_model / load_quantized_model: same logits; loading goes through
    torch.load(weights_only=True) with only the torchao tensor types allowlisted."""
    model, model_config = tiny_model()
    q = quantize_linears(model, mode)
    path = save_quantized_model(tmp_path / "q.pt", q, model_config, mode)
    calls = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(k) or real(*a, **k))
    loaded = load_quantized_model(path)
    assert calls and all(k["weights_only"] is True for k in calls)
    x = torch.randint(0, 4096, (2, 20))
    assert torch.equal(loaded(x), q(x))
    monkeypatch.undo()
    # anything beyond tensors, plain data and the allowlisted types is refused
    torch.save({"model": {}, "extra": nn.Linear(2, 2)}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="beyond tensors and plain data"):
        load_quantized_model(tmp_path / "bad.pt")
    torch.save({"model": {}, "model_config": model_config}, tmp_path / "plain.pt")
    with pytest.raises(ValueError, match="not a save_quantized_model file"):
        load_quantized_model(tmp_path / "plain.pt")
    bad_builder = {**model_config, "_component_": "os.system"}
    torch.save({"model": {}, "model_config": bad_builder, "quantization": mode}, tmp_path / "b.pt")
    with pytest.raises(ValueError, match="not one of idmix.models"):
        load_quantized_model(tmp_path / "b.pt")
    with pytest.raises(ValueError, match="mode: expected one of"):
        save_quantized_model(tmp_path / "x.pt", q, model_config, "int4")


def test_int4_weights_are_grouped_and_under_a_third_of_fp32():
    """int8_dynamic_int4: values in [-8, 7], one bf16 scale (XNNPACK's) per INT4_GROUP_SIZE
    inputs where the width divides (one per row otherwise), linear weights ≥ 3.5× smaller."""
    model = nn.Sequential(nn.Linear(4 * INT4_GROUP_SIZE, 96), nn.Linear(96, 8))
    q = quantize_linears(model, "int8_dynamic_int4")
    grouped, per_row = q[0].weight, q[1].weight
    for w in (grouped, per_row):
        assert w.qdata.dtype == torch.int8 and -8 <= w.qdata.min() and w.qdata.max() <= 7
    assert grouped.scale.shape == (96, 4) and per_row.scale.shape == (8, 1)
    assert grouped.scale.dtype == per_row.scale.dtype == torch.bfloat16
    wide = nn.Sequential(nn.Linear(8 * INT4_GROUP_SIZE, 64))
    assert (
        linear_weight_bytes(wide) / linear_weight_bytes(quantize_linears(wide, "int8_dynamic_int4"))
        >= 3.5
    )


def test_bad_mode_and_length_are_named():
    model, _ = tiny_model()
    with pytest.raises(ValueError, match="mode: expected one of"):
        quantize_linears(model, "int4")
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_with_programs(None, None, torch.zeros(1, 10, dtype=torch.long), 10, 16)


def test_aoti_packages_decode_like_generate(tmp_path):
    """The AOTInductor-compiled programs (native code) reproduce idmix.generate too."""
    model, _ = tiny_model()
    prompt = torch.randint(0, 4096, (1, 6))
    ref = torch.tensor(generate(model, prompt.tolist(), 5, temperature=0))
    programs = export_programs(model, batch_size=1, prompt_len=6, max_seq_len=12)
    prefill, decode = (
        reload(p, tmp_path / f"{i}.aoti.pt2", aoti=True) for i, p in enumerate(programs)
    )
    assert torch.equal(greedy_with_programs(prefill, decode, prompt, 5, 12), ref)
