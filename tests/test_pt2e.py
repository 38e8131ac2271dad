"""CPU int8 through PT2E (X86InductorQuantizer): only the linear layers are quantised, the
programs keep their call convention, the static mode calibrates, and the AOTInductor package
(freezing on, oneDNN int8) agrees with the converted program it was compiled from."""

from __future__ import annotations

import pytest
import torch

from idmix.evaluation.deploy import causal_mask, export_programs, load_program, save_program
from idmix.evaluation.pt2e import agreement, quantize_program, teacher_forced_logits
from tests.helpers import tiny_model

P, S = 6, 20


def _quantized_ops(program) -> set[str]:
    """The quantise/dequantise and oneDNN-bound ops of a program's graph."""
    return {
        str(n.target)
        for n in program.graph.nodes
        if n.op == "call_function" and "quantize" in str(n.target)
    }


def _programs(mode):
    model, _ = tiny_model()
    tokens = torch.randint(0, 4096, (1, S))
    fp32 = export_programs(model.eval(), batch_size=1, prompt_len=P, max_seq_len=S)
    ref, steps = teacher_forced_logits(*(p.module() for p in fp32), tokens, P, S)
    q = (
        quantize_program(
            fp32[0], mode, [(tokens[:, :P], torch.arange(P)[None], causal_mask(1, S)[:, :P])]
        ),
        quantize_program(fp32[1], mode, steps[:4]),
    )
    return model, tokens, ref, q


@pytest.mark.parametrize("mode", ["x86_int8_dynamic", "x86_int8_static"])
def test_linear_layers_only_and_close_to_fp32(mode):
    model, tokens, ref, (prefill, decode) = _programs(mode)
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    for program in (prefill, decode):
        ops = _quantized_ops(program)
        assert any("quantize_per_tensor" in op for op in ops), ops
        # one weight dequantise per linear layer (per-channel int8 weights), no more
        weights = [n for n in program.graph.nodes if "dequantize_per_channel" in str(n.target)]
        assert len(weights) == n_linear, (len(weights), n_linear)
    got, _ = teacher_forced_logits(prefill.module(), decode.module(), tokens, P, S)
    # per-tensor int8 activations on an untrained model: measured 0.066 (dynamic); the real
    # criterion is the recipe's perplexity change on a trained one
    assert (got - ref).norm() / ref.norm() < 0.1
    assert agreement(got, ref)["top1"] >= 0.8


def test_calibration_is_required_and_modes_are_named():
    model, _ = tiny_model()
    prefill, _ = export_programs(model.eval(), batch_size=1, prompt_len=P, max_seq_len=S)
    with pytest.raises(ValueError, match="calibration"):
        quantize_program(prefill, "x86_int8_dynamic", [])
    with pytest.raises(ValueError, match="mode: expected one of"):
        quantize_program(prefill, "int3", [])


def test_aoti_package_agrees_with_the_converted_program(tmp_path):
    """The static decode program compiled with AOTInductor and freezing (oneDNN int8 kernels)
    against the converted program it came from: teacher-forced top-1 agreement and max |Δlogit|
    within the report's criteria (≥ 99%, ≤ 1e-2 of the logit range)."""
    _, tokens, _, (prefill, decode) = _programs("x86_int8_static")
    save_program(decode, tmp_path / "d.aoti.pt2", aoti=True)
    compiled = load_program(tmp_path / "d.aoti.pt2", aoti=True)
    eager, _ = teacher_forced_logits(prefill.module(), decode.module(), tokens, P, S)
    got, _ = teacher_forced_logits(prefill.module(), compiled, tokens, P, S)
    a = agreement(got, eager)
    assert a["top1"] >= 0.99 and a["max_dlogit_over_range"] <= 1e-2, a
