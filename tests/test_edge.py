"""ExecuTorch: the decode step lowered to XNNPACK (``idmix.evaluation.edge``) runs in
ExecuTorch's runtime and decodes exactly like its exported program, fp32 and int4."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from idmix.evaluation.deploy import export_programs, greedy_with_programs, quantize_linears
from idmix.evaluation.edge import EXECUTORCH_MODES, load_executorch, save_executorch
from tests.helpers import tiny_model


@pytest.mark.slow  # ~15 s a mode, lowering; CI's slow tier (the recipe test lowers both too)
@pytest.mark.parametrize("mode", EXECUTORCH_MODES)
def test_lowered_decode_step_is_token_exact(mode, tmp_path):
    model, _ = tiny_model()
    if mode != "fp32":
        model = quantize_linears(model, mode)
    prompt = torch.randint(0, 4096, (1, 6))
    prefill, decode = export_programs(model, batch_size=1, prompt_len=6, max_seq_len=20)
    path = save_executorch(decode, tmp_path / "decode.pte")
    lowered = load_executorch(path)
    ref = greedy_with_programs(prefill.module(), decode.module(), prompt, 14, 20)
    assert torch.equal(greedy_with_programs(prefill.module(), lowered, prompt, 14, 20), ref)
    # one step, same inputs: logits and every state tensor agree with the exported program
    # to fp32 rounding (measured worst |Δ|/range: fp32 1.7e-7, int4 7.5e-8; int4 was 3.6e-3
    # before its scales were made bf16, test_lowered_int4_linears_compute_what_torchao_does)
    logits, *state = prefill.module()(prompt, torch.arange(6)[None], torch.ones(1, 6, 20) > 0)
    step = (logits.argmax(-1, keepdim=True), torch.tensor([[6]]), torch.ones(1, 1, 20) > 0)
    for got, want in zip(lowered(*step, *state), decode.module()(*step, *state), strict=True):
        assert got.shape == want.shape
        assert want.numel() == 0 or (got - want).abs().max() <= 1e-5 * (want.max() - want.min())


@pytest.mark.slow  # ~10 s of lowering; CI's slow tier
def test_lowered_int4_linears_compute_what_torchao_does(tmp_path):
    """XNNPACK takes bf16 int4 scales, so quantize_linears makes them bf16: the lowered layers
    then equal torchao's to fp32 rounding (measured 1.6e-7 of the range; fp32 scales, which
    lowering casts, gave 2.8e-3 grouped and 6.5e-3 per row), grouped and per-row alike."""
    torch.manual_seed(0)
    linears = nn.Sequential(nn.Linear(256, 96), nn.Linear(96, 8))
    model = quantize_linears(linears, "int8_dynamic_int4")
    x = torch.randn(4, 256)
    with torch.no_grad():
        want = model(x)
    path = save_executorch(torch.export.export(model, (x,)), tmp_path / "linears.pte")
    got = load_executorch(path)(x)[0]
    assert (got - want).abs().max() <= 1e-5 * (want.max() - want.min())


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="path: no such file"):
        load_executorch(tmp_path / "nothing.pte")
