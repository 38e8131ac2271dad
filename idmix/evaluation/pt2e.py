"""CPU int8 that is faster, not only smaller: torchao's PT2E flow with ``X86InductorQuantizer``.

An exported program (the prefill or decode program of ``deploy``, or the scoring forward) is
annotated on its ``nn.Linear`` layers only (int8 weights per channel; int8 activations per
tensor, computed per call for ``x86_int8_dynamic`` or calibrated on a few validation batches for
``x86_int8_static``), converted, and exported again. Everything else, the SSM core (A, Δ, C, the
readout Gram) included, stays fp32: that is the sensitive part. Compiled with AOTInductor and
freezing on (``deploy.save_program(..., aoti=True)``), the int8 GEMMs run in oneDNN.

The converted program run as is (quantise/dequantise ops in fp32) is the "eager quantised model"
each compiled package is checked against; dynamic quantisation is not bit-identical across the
two (the fused kernels round differently), hence :func:`agreement`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

PT2E_MODES = ("x86_int8_dynamic", "x86_int8_static")


def _allow_removed_transpose_overload() -> None:
    """torchao 0.17's PT2E convert looks up ``aten.transpose.Dimname``, an overload torch 2.13
    no longer has (named tensors); it only tests membership in a list of view ops, so aliasing
    the name to ``transpose.int`` changes nothing else. Remove with a torchao that drops it."""
    packet = torch.ops.aten.transpose
    if "Dimname" not in packet.overloads():
        packet.Dimname = packet.int


def quantize_program(
    program: torch.export.ExportedProgram,
    mode: str,
    calibration: Iterable[tuple],
    dynamic_shapes=None,
) -> torch.export.ExportedProgram:
    """program's nn.Linear layers in int8 (mode: one of PT2E_MODES); calibration: argument
    tuples to run through the observed program, at least one (the weight observers only see
    the weights in a forward; the static mode's activation ranges come from all of them).
    Returns the converted program, exported again with program's example inputs."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    if mode not in PT2E_MODES:
        raise ValueError(f"mode: expected one of {PT2E_MODES}, got {mode!r}")
    static = mode == "x86_int8_static"
    quantizer = x86.X86InductorQuantizer().set_module_type_qconfig(
        nn.Linear, x86.get_default_x86_inductor_quantization_config(is_dynamic=not static)
    )
    prepared = prepare_pt2e(program.module(), quantizer)
    seen = 0
    with torch.no_grad():
        for args in calibration:
            prepared(*args)
            seen += 1
    if not seen:
        raise ValueError("calibration: expected at least one tuple of program inputs")
    _allow_removed_transpose_overload()
    converted = _without_unused_tensors(convert_pt2e(prepared))
    args, kwargs = program.example_inputs
    with torch.no_grad():
        return torch.export.export(converted, args, kwargs, dynamic_shapes=dynamic_shapes)


def _without_unused_tensors(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Drop the parameters and buffers no graph node reads (the fp32 weights that convert
    replaced by int8 constants), so that exporting gm again does not carry them."""
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for name, _ in [*gm.named_parameters(), *gm.named_buffers()]:
        if name not in used:
            owner, _, attr = name.rpartition(".")
            delattr(gm.get_submodule(owner), attr)
    return gm


@torch.no_grad()
def teacher_forced_logits(
    prefill, decode, tokens: torch.Tensor, prompt_len: int, max_seq_len: int
) -> tuple[torch.Tensor, list[tuple]]:
    """Run the programs' call convention over tokens (B, N) teacher-forced: the prefill on the
    first prompt_len tokens, then one decode step per following token. Returns (logits
    (B, N − prompt_len + 1, V): the prefill's and every step's, the decode steps' argument
    tuples (the static mode's calibration))."""
    from .deploy import causal_mask

    B, N = tokens.shape
    if N > max_seq_len:
        raise ValueError(f"tokens: {N} positions exceed max_seq_len={max_seq_len}")
    mask = causal_mask(B, max_seq_len)
    pos = torch.arange(prompt_len).expand(B, -1)
    logits, *state = prefill(tokens[:, :prompt_len], pos, mask[:, :prompt_len])
    out, steps = [logits], []
    for t in range(prompt_len, N):
        args = (tokens[:, t : t + 1], torch.full((B, 1), t), mask[:, t : t + 1], *state)
        steps.append(args)
        logits, *state = decode(*args)
        out.append(logits)
    return torch.stack(out, 1), steps


def agreement(got: torch.Tensor, ref: torch.Tensor) -> dict:
    """Teacher-forced agreement of two logit tensors (.., V): top-1 agreement (fraction of
    positions with the same argmax) and max |Δlogit| over the logit range of ref."""
    span = (ref.amax(-1) - ref.amin(-1)).max().clamp_min(torch.finfo(ref.dtype).tiny)
    return {
        "top1": (got.argmax(-1) == ref.argmax(-1)).float().mean().item(),
        "max_dlogit_over_range": ((got - ref).abs().max() / span).item(),
    }


class QuantizedScorer(nn.Module):
    """A model's full forward (tokens (1, seq_len) -> logits (1, seq_len, V)) as a converted
    PT2E program, for ``perplexity_by_context(..., batch_size=1)``."""

    def __init__(self, model: nn.Module, mode: str, windows: torch.Tensor):
        """windows: (N, seq_len) calibration token windows (not the evaluated ones)."""
        super().__init__()
        self.max_seq_len = windows.shape[1]
        with torch.no_grad():
            program = torch.export.export(model.eval(), (windows[:1],))
        calibration = [(w[None],) for w in windows]
        self.program = quantize_program(program, mode, calibration).module()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.program(tokens)


def weight_bytes(program: torch.export.ExportedProgram) -> int:
    """Bytes of a program's parameters, buffers and constants (int8 weights count 1 each)."""
    tensors = [*program.state_dict.values(), *program.constants.values()]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
