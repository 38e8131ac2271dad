"""ExecuTorch: the decode step lowered to XNNPACK (``idmix.evaluation.edge``) runs in
ExecuTorch's runtime and decodes exactly like its exported program, fp32 and int4."""

from __future__ import annotations

import pytest
import torch

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
    # (measured worst |Δ|/range: fp32 1.7e-7; int4 3.6e-3, XNNPACK rounding its int8
    # activations unlike torchao, held to the 1% agreement bound)
    logits, *state = prefill.module()(prompt, torch.arange(6)[None], torch.ones(1, 6, 20) > 0)
    step = (logits.argmax(-1, keepdim=True), torch.tensor([[6]]), torch.ones(1, 1, 20) > 0)
    for got, want in zip(lowered(*step, *state), decode.module()(*step, *state), strict=True):
        bound = 1e-5 if mode == "fp32" else 1e-2
        assert got.shape == want.shape
        assert want.numel() == 0 or (got - want).abs().max() <= bound * (want.max() - want.min())


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="path: no such file"):
        load_executorch(tmp_path / "nothing.pte")
