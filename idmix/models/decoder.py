"""torchtune-style component builder: a Llama-style decoder around any token mixer.

The result is torchtune's own ``TransformerDecoder`` of ``TransformerSelfAttentionLayer`` blocks
(list ``layers``), so torchtune's FSDP2 sharding, per-layer compile and activation
checkpointing apply to our blocks unchanged. torchtune is imported here, at build time only.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping

import torch
from torch import nn

from ..debug import check_values
from ..modules import SoftmaxAttention, SSMMixer, resolve_mixer

MixerFactory = Callable[[int], nn.Module]


def swiglu_hidden_dim(embed_dim: int) -> int:
    """(2/3)·4d rounded up to a multiple of 128 (the paper's SwiGLU width)."""
    return math.ceil(8 * embed_dim / 3 / 128) * 128


def mixer_factory(mixer: str | Mapping, embed_dim: int, num_heads: int, **options) -> MixerFactory:
    """layer_idx -> mixer, for mixer a name of ``idmix.modules.MIXERS`` ("interdomain",
    "softmax", "s4d", "selective_interdomain", a Table 4 cell, or one you registered), the
    dotted name of a builder (embed_dim, num_heads, **options) -> nn.Module, or a config node
    ``{"_component_": "package.module.builder", **more options}`` naming one (how a config
    selects a mixer of your own: ``model.mixer._component_=…``; a saved model description holds
    the dotted name). Unknown options of a registered mixer fail here, by name."""
    if isinstance(mixer, Mapping):
        spec = dict(mixer)
        build = _component(spec.pop("_component_", None))
        options = {**options, **spec}
    elif isinstance(mixer, str) and "." in mixer:
        build = _component(mixer)
    else:
        build, options = resolve_mixer(mixer, options)
    return lambda _: build(embed_dim, num_heads, **options)


def hybrid_factory(
    make_mixer: MixerFactory, every: int, num_layers: int, embed_dim: int, num_heads: int,
    rope_base: float = 10000.0, context_parallel=None,
) -> MixerFactory:  # fmt: skip
    """layer_idx -> SoftmaxAttention where layer_idx % every == every - 1, else make_mixer."""
    if isinstance(every, bool) or not isinstance(every, int) or not 2 <= every <= num_layers:
        raise ValueError(
            f"softmax_every: expected an int in [2, num_layers={num_layers}] (every k-th layer "
            f"softmax), got {every!r}"
        )
    return lambda i: (
        SoftmaxAttention(
            embed_dim, num_heads, rope_base=rope_base, context_parallel=context_parallel
        )
        if i % every == every - 1
        else make_mixer(i)
    )


def _component(path) -> Callable:
    """The object a dotted path names (``mixer._component_``)."""
    module, _, name = path.rpartition(".") if isinstance(path, str) else ("", "", "")
    try:
        found = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError) as e:
        raise ValueError(f"mixer._component_: cannot import {path!r} ({e})") from None
    if not callable(found):
        raise ValueError(
            f"mixer._component_: expected the dotted path of a mixer builder, got {path!r}"
        )
    return found


def decoder(
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    embed_dim: int,
    max_seq_len: int,
    mixer: str | Mapping | MixerFactory = "interdomain",
    intermediate_dim: int | None = None,
    softmax_every: int | None = None,
    norm_eps: float = 1e-6,
    init_std: float = 0.02,
    context_parallel=None,
    **mixer_kwargs,
):
    """Pre-norm decoder: embedding -> num_layers × [RMSNorm, mixer, RMSNorm, SwiGLU] -> RMSNorm
    -> untied output. No linear biases. ``mixer``: a registered name or a ``_component_`` node,
    built with ``mixer_kwargs`` (``mixer_factory``), or a ``layer_idx -> nn.Module`` callable
    (dependency injection; it takes no mixer_kwargs). ``max_seq_len`` bounds the input
    torchtune accepts (the SSM mixers themselves have no length limit). ``softmax_every=k``
    makes a hybrid: layers i with i % k == k - 1 are softmax attention (``SoftmaxAttention``,
    with the mixer options' ``rope_base``), the others ``mixer``.

    Init: N(0, init_std) for embeddings and linears; residual output projections (mixer
    ``output_proj``, SwiGLU ``w2``) N(0, init_std/√(2·num_layers)); SSM mixers then rescale C
    so their core output has unit RMS (``SSMMixer.calibrate_``). Skipped on the meta device.

    ``context_parallel``: None, or the ``idmix.parallel.ContextParallel`` each input sequence is
    split over (the model then takes this rank's slice): every mixer is built for it (a mixer
    option; a ``layer_idx`` callable passes it to its layers itself), and one without a
    context-parallel form is refused by layer. The layers are the same, parameter for
    parameter, as without it.
    """
    from torchtune.modules import (
        FeedForward,
        RMSNorm,
        TransformerDecoder,
        TransformerSelfAttentionLayer,
    )

    for name, value in (
        ("vocab_size", vocab_size),
        ("num_layers", num_layers),
        ("num_heads", num_heads),
        ("embed_dim", embed_dim),
        ("max_seq_len", max_seq_len),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim: {embed_dim} is not divisible by num_heads={num_heads}")
    if callable(mixer) and mixer_kwargs:
        raise ValueError(
            f"mixer_kwargs: {sorted(mixer_kwargs)} given with a callable mixer, which builds its "
            "layers itself: pass them to it, or give mixer as a registered name or as "
            "{'_component_': 'module.builder'}, which receive them"
        )
    split = {} if context_parallel is None else {"context_parallel": context_parallel}
    make_mixer = (
        mixer
        if callable(mixer)
        else mixer_factory(mixer, embed_dim, num_heads, **mixer_kwargs, **split)
    )
    if softmax_every is not None:
        rope_base = mixer_kwargs.get("rope_base", 10000.0)
        make_mixer = hybrid_factory(make_mixer, softmax_every, num_layers, embed_dim, num_heads,
                                    rope_base, context_parallel)  # fmt: skip
    hidden = intermediate_dim or swiglu_hidden_dim(embed_dim)

    def block(i):
        mlp = FeedForward(
            gate_proj=nn.Linear(embed_dim, hidden, bias=False),
            down_proj=nn.Linear(hidden, embed_dim, bias=False),
            up_proj=nn.Linear(embed_dim, hidden, bias=False),
        )
        return TransformerSelfAttentionLayer(
            attn=make_mixer(i),
            mlp=mlp,
            sa_norm=RMSNorm(embed_dim, eps=norm_eps),
            mlp_norm=RMSNorm(embed_dim, eps=norm_eps),
        )

    model = TransformerDecoder(
        tok_embeddings=TokenEmbedding(vocab_size, embed_dim),
        layers=[block(i) for i in range(num_layers)],
        max_seq_len=max_seq_len,
        num_heads=num_heads,
        head_dim=embed_dim // num_heads,
        norm=RMSNorm(embed_dim, eps=norm_eps),
        output=nn.Linear(embed_dim, vocab_size, bias=False),
    )
    if context_parallel is not None:
        check_split(model, context_parallel)
        model.register_forward_pre_hook(context_parallel.new_pass)
    init_weights_(model, init_std)
    return model


def check_split(model, context_parallel) -> None:
    """Every layer of model built for context_parallel, else a ValueError naming the layer."""
    for i, layer in enumerate(model.layers):
        mixer = layer.attn
        if getattr(mixer, "context_parallel", None) is not context_parallel:
            raise ValueError(
                f"context_parallel: model.layers[{i}].attn: {type(mixer).__name__} has no "
                "context-parallel form (or was built without it); supported: interdomain and "
                "selective interdomain layers, softmax attention"
            )


class TokenEmbedding(nn.Embedding):
    """nn.Embedding that names an out-of-range token id (instead of "index out of range in
    self") where ``idmix.debug.check_values`` allows a host sync."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if check_values(tokens) and tokens.numel():
            if (
                tokens.dtype.is_floating_point
                or tokens.dtype.is_complex
                or tokens.dtype == torch.bool
            ):
                raise TypeError(f"tokens: expected integer token ids, got {tokens.dtype}")
            lo, hi = int(tokens.min()), int(tokens.max())
            if lo < 0 or hi >= self.num_embeddings:
                bad = lo if lo < 0 else hi
                raise ValueError(
                    f"tokens: id {bad} is outside the vocabulary [0, {self.num_embeddings})"
                )
        return super().forward(tokens)


@torch.no_grad()
def init_weights_(model: nn.Module, std: float = 0.02) -> None:
    """The paper's init (GPT-2 rule for residual projections) plus SSM calibration."""
    if next(model.parameters()).is_meta:
        return
    num_layers = len(model.layers)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
    for layer in model.layers:
        nn.init.normal_(layer.attn.output_proj.weight, std=std / math.sqrt(2 * num_layers))
        nn.init.normal_(layer.mlp.w2.weight, std=std / math.sqrt(2 * num_layers))
        if isinstance(layer.attn, SSMMixer):
            layer.attn.calibrate_()
