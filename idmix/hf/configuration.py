"""``IdmixConfig``: a transformers config that names an idmix model builder and its overrides.

The model is described the way ``model_final.pt`` describes it: ``builder`` (a named builder
of ``idmix.models``, e.g. ``"interdomain_tiny"``, ``"softmax_125m"``, ``"cpu_model"``,
``"decoder"``, or the dotted name of a builder in ``$IDMIX_TRUSTED_BUILDERS``) and
``overrides`` (its keyword arguments: ``{"mixer": "s4d", "vocab_size": 512, ...}``). Every
model the builders make is one such pair. ``vocab_size``, ``hidden_size``,
``num_hidden_layers``, ``num_attention_heads`` and ``max_position_embeddings`` are filled in
from the built model (what HF tools read) and checked against it when given.
"""

from __future__ import annotations

import re
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import PretrainedConfig

# the HF-standard fields, each with how it is read off a built TransformerDecoder
DERIVED = {
    "vocab_size": lambda m: m.tok_embeddings.num_embeddings,
    "hidden_size": lambda m: m.tok_embeddings.embedding_dim,
    "num_hidden_layers": lambda m: len(m.layers),
    "num_attention_heads": lambda m: m.num_heads,
    "max_position_embeddings": lambda m: m.max_seq_len,
}
# the decoder argument each derived field comes from (named in errors)
DECODER_ARG = {
    "vocab_size": "vocab_size",
    "hidden_size": "embed_dim",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "max_position_embeddings": "max_seq_len",
}


def builder_path(builder: str) -> str:
    """The dotted name of builder (short names are ``idmix.models.<name>``)."""
    return builder if "." in builder else f"idmix.models.{builder}"


def description(builder, overrides) -> tuple:
    """(builder function, keyword arguments) of config.json's builder and overrides, checked
    as a saved model description (``idmix.io.model_description``: plain data, a trusted
    builder and mixer, argument types), each error naming the field."""
    from idmix.io.model_description import check_description, plain_description

    if not isinstance(builder, str) or not builder:
        raise ValueError(f"builder: expected the name of an idmix.models builder, got {builder!r}")
    if not isinstance(overrides, dict) or not all(isinstance(k, str) for k in overrides):
        raise ValueError(f"overrides: expected a dict of builder arguments, got {overrides!r}")
    if "_component_" in overrides:
        raise ValueError("overrides._component_: the builder is named by builder, not overrides")
    try:
        desc = plain_description({"_component_": builder_path(builder), **overrides}, "json")
        return check_description(desc, "json")
    except ValueError as e:  # "json: model_config.<key>…" -> "<field>: config.json: <key>…"
        found = re.match(r"json: model_config\.(\w+)(.*)", str(e), re.DOTALL)
        if found is None:
            raise
        key = found[1]
        field = "builder" if key == "_component_" else key
        raise ValueError(f"{field}: config.json: {key}{found[2]}") from None


@strict(accept_kwargs=True)
class IdmixConfig(PretrainedConfig):
    """builder + overrides describe the model (module docstring); the token ids are the
    tokenizer's (bos = eos = pad = ``<|endoftext|>`` for idmix's BPEs)."""

    model_type = "idmix"

    builder: str = "interdomain_tiny"
    overrides: dict[str, Any] | None = None
    vocab_size: int | None = None
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    max_position_embeddings: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    use_cache: bool = True
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        # here, not as a validate_* method: transformers would re-wrap the error's message
        self.overrides = dict(self.overrides or {})
        self.overrides = description(self.builder, self.overrides)[1]  # older mixer nodes flat
        super().__post_init__(**kwargs)

    def build(self):
        """The idmix ``TransformerDecoder`` that builder(**overrides) makes (on the current
        default device: meta under ``from_pretrained``)."""
        make, kwargs = description(self.builder, self.overrides)
        return make(**kwargs)

    def fill_from(self, model) -> None:
        """Set the derived fields from a built model; a value already set that differs (an
        edited config.json) is an error naming the field and the decoder argument behind it."""
        for name, read in DERIVED.items():
            built, given = read(model), getattr(self, name)
            if given is not None and given != built:
                raise ValueError(
                    f"{name}: config.json says {given}, but builder {self.builder!r} with "
                    f"overrides {self.overrides} builds {built}; {name} is derived: set "
                    f"overrides.{DECODER_ARG[name]} instead"
                )
            setattr(self, name, built)
