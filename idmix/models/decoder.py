"""torchtune-style component builder: a Llama-style decoder around any token mixer.

The result is torchtune's own ``TransformerDecoder`` of ``TransformerSelfAttentionLayer`` blocks
(list ``layers``), so torchtune's FSDP2 sharding, per-layer compile and activation
checkpointing apply to our blocks unchanged. torchtune is imported here, at build time only.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch
from torch import nn

from ..debug import check_values
from ..modules import (
    ABLATION_CELLS,
    InterdomainAttention,
    S4DMixer,
    SelectiveInterdomainAttention,
    SoftmaxAttention,
    SSMMixer,
    ablation_cell,
    ssm_mixer,
)

MixerFactory = Callable[[int], nn.Module]


def swiglu_hidden_dim(embed_dim: int) -> int:
    """(2/3)·4d rounded up to a multiple of 128 (the paper's SwiGLU width)."""
    return math.ceil(8 * embed_dim / 3 / 128) * 128


def _check_options(kind: str, kwargs: dict) -> None:
    """A config typo (e.g. ``model.mixer_kwargs.dt_min=…``) fails here, naming the key, instead
    of as a TypeError deep inside a mixer's constructor."""
    fixed = {"embed_dim", "num_heads", "dual_kv", "query_readout"}  # set by the kind
    known = set(inspect.signature(ssm_mixer).parameters) - fixed
    if kind == "softmax":
        known = {"rope_base", "use_rope", *known}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ValueError(
            f"mixer options: unknown {unknown} for mixer {kind!r}; known: {sorted(known)}"
        )


def mixer_factory(kind: str, embed_dim: int, num_heads: int, **kwargs) -> MixerFactory:
    """layer_idx -> mixer for kind "interdomain", "softmax", "s4d", "selective_interdomain" or
    an ablation cell name."""
    _check_options(kind, kwargs)
    if kind == "interdomain":
        return lambda _: InterdomainAttention(embed_dim, num_heads, **kwargs)
    if kind == "s4d":
        return lambda _: S4DMixer(embed_dim, num_heads, **kwargs)
    if kind == "selective_interdomain":
        return lambda _: SelectiveInterdomainAttention(embed_dim, num_heads, **kwargs)
    if kind == "softmax":
        keep = {k: v for k, v in kwargs.items() if k in ("rope_base", "use_rope")}
        return lambda _: SoftmaxAttention(embed_dim, num_heads, **keep)
    if kind in ABLATION_CELLS:
        return lambda _: ablation_cell(kind, embed_dim, num_heads, **kwargs)
    raise ValueError(
        "mixer: expected 'interdomain', 'softmax', 's4d', 'selective_interdomain' or one of "
        f"{sorted(ABLATION_CELLS)}, "
        f"got {kind!r}"
    )


def decoder(
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    embed_dim: int,
    max_seq_len: int,
    mixer: str | MixerFactory = "interdomain",
    intermediate_dim: int | None = None,
    norm_eps: float = 1e-6,
    init_std: float = 0.02,
    **mixer_kwargs,
):
    """Pre-norm decoder: embedding -> num_layers × [RMSNorm, mixer, RMSNorm, SwiGLU] -> RMSNorm
    -> untied output. No linear biases. ``mixer`` is a kind (see ``mixer_factory``) or a
    ``layer_idx -> nn.Module`` callable (dependency injection). ``max_seq_len`` bounds the input
    torchtune accepts (the SSM mixers themselves have no length limit).

    Init: N(0, init_std) for embeddings and linears; residual output projections (mixer
    ``output_proj``, SwiGLU ``w2``) N(0, init_std/√(2·num_layers)); SSM mixers then rescale C
    so their core output has unit RMS (``SSMMixer.calibrate_``). Skipped on the meta device.
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
    make_mixer = (
        mixer_factory(mixer, embed_dim, num_heads, **mixer_kwargs)
        if isinstance(mixer, str)
        else mixer
    )
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
    init_weights_(model, init_std)
    return model


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
