"""Deployment: torchao int8 quantisation of the linear layers and ``torch.export`` programs for
prefill and for the one-token decode step, with the decoding state as explicit inputs and
outputs (no hidden mutable state in a deployed program).

    prefill(tokens (B, P), input_pos (B, P), mask (B, P, S)) -> (logits (B, V), *state)
    decode(token (B, 1), input_pos (B, 1), mask (B, 1, S), *state) -> (logits (B, V), *state)

``state`` is every layer's cache tensors in a fixed order (``cache_tensors``): constant-size
for Interdomain and S4D-only; a KV cache of S positions for softmax.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from ..generation import release_caches

QUANT_MODES = ("int8_weight_only", "int8_dynamic", "int8_dynamic_int4")
INT4_GROUP_SIZE = 64  # int4 weights per (bf16) scale: 1 + 2/64 bytes a weight, 3.9x under fp32


def quantize_linears(model: nn.Module, mode: str) -> nn.Module:
    """A copy of model whose nn.Linear weights are quantised by torchao: int8_weight_only,
    int8_dynamic (int8 activations, per token, and int8 weights; both ``version=2``), or
    int8_dynamic_int4 (int8 activations and symmetric int4 weights in groups of
    :data:`INT4_GROUP_SIZE` with bf16 scales, held one value per int8 byte: the size mode, whose
    fast runtime is ExecuTorch's XNNPACK, ``idmix.evaluation.edge``). Embeddings, norms and the
    SSM parameters (Δ, A, C, mode weights) stay as they are (fp32).

    The int4 scales are bf16 because XNNPACK's int4 kernels take bf16 scales: lowering casts
    fp32 ones, and the ExecuTorch program then computes with other weights than the model it
    came from (one linear: |Δ|/range 2.8e-3 with fp32 scales, 1.6e-7 with bf16; on a trained
    model 2.3% of teacher-forced top-1 choices flipped, none with bf16 scales)."""
    from torchao.quantization import (
        Int8DynamicActivationInt8WeightConfig,
        Int8DynamicActivationIntxWeightConfig,
        Int8WeightOnlyConfig,
        PerAxis,
        PerGroup,
        quantize_,
    )

    def int4(granularity):
        return Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4,
            weight_granularity=granularity,
            weight_scale_dtype=torch.bfloat16,
        )

    def grouped(m) -> bool:
        return m.in_features % INT4_GROUP_SIZE == 0

    # (config, which linears); int4 falls back to one scale per output row where the groups
    # do not divide the input width
    passes = {
        "int8_weight_only": [(Int8WeightOnlyConfig(version=2), lambda m: True)],
        "int8_dynamic": [(Int8DynamicActivationInt8WeightConfig(version=2), lambda m: True)],
        "int8_dynamic_int4": [
            (int4(PerGroup(INT4_GROUP_SIZE)), grouped),
            (int4(PerAxis(0)), lambda m: not grouped(m)),
        ],
    }
    if mode not in passes:
        raise ValueError(f"mode: expected one of {QUANT_MODES}, got {mode!r}")
    quantized = copy.deepcopy(model)
    for cfg, which in passes[mode]:
        quantize_(quantized, cfg, filter_fn=lambda m, _, w=which: _plain_linear(m) and w(m))
    return quantized


def _plain_linear(module: nn.Module) -> bool:
    """An nn.Linear whose weight quantize_ has not replaced yet."""
    return isinstance(module, nn.Linear) and type(module.weight) is nn.Parameter


def linear_weight_bytes(model: nn.Module) -> int:
    """Bytes held by the nn.Linear weights: for a torchao tensor, its inner tensors (values,
    scales, zero points)."""
    total = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            w = module.weight
            inner = [getattr(w, n) for n in w.__tensor_flatten__()[0]] if _is_subclass(w) else [w]
            total += sum(t.numel() * t.element_size() for t in inner)
    return total


def _is_subclass(t: torch.Tensor) -> bool:
    return type(t) not in (torch.Tensor, nn.Parameter) and hasattr(t, "__tensor_flatten__")


def quantized_tensor_types() -> list:
    """The classes a quantised state dict of :data:`QUANT_MODES` pickles, allowlisted by name for
    ``torch.load(weights_only=True)`` (nothing else in the file may name code)."""
    from torchao.quantization import Int8Tensor, IntxUnpackedToInt8Tensor, MappingType, PerRow
    from torchao.quantization.quantize_.workflows.int8.int8_tensor import (
        QuantizeTensorToInt8Kwargs,
    )

    return [Int8Tensor, QuantizeTensorToInt8Kwargs, PerRow, MappingType, IntxUnpackedToInt8Tensor]


def save_quantized_model(path, model: nn.Module, model_config: dict, mode: str) -> Path:
    """Write a :func:`quantize_linears` model as {model, model_config, quantization}, atomically
    (model_config: the plain-data builder config of the unquantised model)."""
    from ..io.files import atomic_write

    if mode not in QUANT_MODES:
        raise ValueError(f"mode: expected one of {QUANT_MODES}, got {mode!r}")
    obj = {"model": model.state_dict(), "model_config": model_config, "quantization": mode}
    return atomic_write(path, lambda tmp: torch.save(obj, tmp))


def load_quantized_model(path, device="cpu") -> nn.Module:
    """The model of a :func:`save_quantized_model` file, in eval mode. Loaded with
    weights_only=True and only :func:`quantized_tensor_types` allowed beyond tensors and plain
    data; its model description is checked and built as ``model_final.pt``'s is
    (``idmix.io.model_description``)."""
    from ..io.checkpoint import safe_load
    from ..io.model_description import build_described

    if not Path(path).is_file():
        raise ValueError(f"path: no such file {str(path)!r}")
    with torch.serialization.safe_globals(quantized_tensor_types()):
        saved = safe_load(path)
    if not isinstance(saved, dict) or saved.get("quantization") not in QUANT_MODES:
        raise ValueError(f"path: {str(path)!r} is not a save_quantized_model file")
    source = f"quantised model {str(path)!r}"
    model = quantize_linears(
        build_described(saved.get("model_config"), saved["model"], source), saved["quantization"]
    )
    model.load_state_dict(saved["model"], assign=True)
    return model.to(device).eval()


def cache_tensors(model) -> list[torch.Tensor]:
    """Every layer's cache tensors, layer by layer, fields in declaration order."""
    return [t for layer in model.layers for t in _fields(layer.attn.kv_cache).values()]


def _fields(cache) -> dict[str, torch.Tensor]:
    return {k: getattr(cache, k) for k in cache.to_tensordict().keys()}


def _load_state(model, tensors) -> None:
    """Point the caches at clones of tensors (the program's inputs are never mutated)."""
    it = iter(tensors)
    for layer in model.layers:
        cache = layer.attn.kv_cache
        for name in _fields(cache):
            setattr(cache, name, next(it).clone())


class _Program(nn.Module):
    """The model with its caches set up for batch_size rows and max_seq_len positions."""

    def __init__(self, model, batch_size: int, max_seq_len: int):
        super().__init__()
        self.model = model
        dtype = next(model.parameters()).dtype
        model.setup_caches(batch_size=batch_size, dtype=dtype, decoder_max_seq_len=max_seq_len)

    def empty_state(self) -> list[torch.Tensor]:
        """Fresh zeros of the caches' shapes (built from shapes, not from the cache tensors,
        which a trace would treat as constants)."""
        return [
            torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in cache_tensors(self.model)
        ]

    def _run(self, tokens, input_pos, mask, state):
        _load_state(self.model, state)
        logits = self.model(tokens, input_pos=input_pos, mask=mask)[:, -1].float()
        return (logits, *cache_tensors(self.model))


class Prefill(_Program):
    def forward(self, tokens, input_pos, mask):
        return self._run(tokens, input_pos, mask, self.empty_state())


class Decode(_Program):
    def forward(self, token, input_pos, mask, *state):
        return self._run(token, input_pos, mask, state)


def export_programs(
    model, batch_size: int, prompt_len: int, max_seq_len: int
) -> tuple[torch.export.ExportedProgram, torch.export.ExportedProgram]:
    """(prefill for prompts of prompt_len tokens, decode step) as exported programs; both for
    batch_size rows and masks over max_seq_len positions."""
    model = model.eval()
    prefill = Prefill(model, batch_size, max_seq_len)
    tokens = torch.zeros(batch_size, prompt_len, dtype=torch.long)
    pos = torch.arange(prompt_len).expand(batch_size, -1)
    mask = causal_mask(batch_size, max_seq_len)
    with torch.no_grad():
        prefill_ep = torch.export.export(prefill, (tokens, pos, mask[:, :prompt_len]))
        decode = Decode(model, batch_size, max_seq_len)
        state = decode.empty_state()
        step = (tokens[:, :1], pos[:, :1], mask[:, prompt_len : prompt_len + 1], *state)
        decode_ep = torch.export.export(decode, step)
    release_caches(model)
    return prefill_ep, decode_ep


def save_program(program: torch.export.ExportedProgram, path, aoti: bool = False) -> Path:
    """Write an exported program atomically: torch.export's archive, or (aoti) an
    AOTInductor-compiled package of it (native code for this machine's device), with freezing
    on: weights become constants, so Inductor pre-packs them (oneDNN's int8 GEMMs for the
    ``pt2e`` programs; the same for fp32, so the two compare at their best)."""
    from ..io.files import atomic_write

    if aoti:
        from torch._inductor import aoti_compile_and_package

        def compile_to(tmp):
            aoti_compile_and_package(
                program, package_path=str(tmp), inductor_configs={"freezing": True}
            )

        return atomic_write(path, compile_to)
    return atomic_write(path, lambda tmp: torch.export.save(program, tmp))


def load_program(path, aoti: bool = False):
    """A callable with the program's call convention, from :func:`save_program`'s file."""
    if aoti:
        from torch._inductor import aoti_load_package

        return aoti_load_package(str(path))
    return torch.export.load(path).module()


def causal_mask(batch_size: int, max_seq_len: int) -> torch.Tensor:
    """(B, S, S) bool, row t sees positions ≤ t."""
    causal = torch.ones(max_seq_len, max_seq_len, dtype=torch.bool).tril()
    return causal.expand(batch_size, -1, -1)


@torch.no_grad()
def greedy_with_programs(
    prefill, decode, prompt: torch.Tensor, max_new_tokens: int, max_seq_len: int
):
    """prompt (B, P) -> new tokens (B, max_new_tokens), greedy, through exported programs' (or
    the Prefill/Decode modules') call convention."""
    B, P = prompt.shape
    if P + max_new_tokens > max_seq_len:
        raise ValueError(f"max_new_tokens: prompt + new tokens exceed max_seq_len={max_seq_len}")
    mask = causal_mask(B, max_seq_len)
    pos = torch.arange(P).expand(B, -1)
    logits, *state = prefill(prompt, pos, mask[:, :P])
    out = []
    for i in range(max_new_tokens):
        nxt = logits.argmax(-1, keepdim=True)
        out.append(nxt)
        if i == max_new_tokens - 1:
            break
        t = P + i
        logits, *state = decode(nxt, torch.full((B, 1), t), mask[:, t : t + 1], *state)
    return torch.cat(out, 1)
