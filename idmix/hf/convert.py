"""Write a Hugging Face directory (config.json, model.safetensors, generation_config.json, the
tokenizer and the ``.idmix-hf`` marker; no Python and no ``auto_map``: it loads after
``import idmix.hf`` with ``trust_remote_code=False``) from an idmix model: a ``model_final.pt``
export (``convert``, the command below; the pretraining run calls it for ``output_dir/hf``),
or a state dict and its model config (``save_hf``). ``--overwrite`` replaces only a directory
the converter wrote (``idmix.hf.directory``).

    python -m idmix.hf.convert runs/tiny_interdomain/model_final.pt runs/tiny_interdomain/hf
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from idmix.io import tokenizer as tokenizers
from idmix.io.checkpoint import safe_load
from idmix.io.model_description import (
    check_description,
    check_given_sizes,
    compare_shapes,
    plain_description,
)
from idmix.io.upgrade import refuse_old_layout

from .configuration import IdmixConfig
from .directory import check_replaceable, write_dir
from .modeling import IdmixForCausalLM

MODELS = "idmix.models."


def hf_tokenizer(tokenizer, max_length: int) -> PreTrainedTokenizerFast:
    """An idmix ``BPETokenizer`` as a fast HF tokenizer (same ids, same decoding); its
    end-of-document token is also bos and pad, as in idmix's recipes."""
    eos = tokenizer._tok.id_to_token(tokenizer.eos_id)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer._tok,
        bos_token=eos,
        eos_token=eos,
        pad_token=eos,
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )


def save_hf(state_dict: dict, model_config: dict, out_dir, tokenizer=None, overwrite=False):
    """out_dir from a full state dict and the plain model config of a ``model_final.pt``
    (``{"_component_": builder, **overrides}``), written beside it and swapped in
    (``directory.write_dir``: out_dir must be new, empty or, with overwrite, one the converter
    wrote). tokenizer: an idmix BPETokenizer (saved for AutoTokenizer) or None. Returns
    out_dir (absolute)."""
    out = Path(os.path.abspath(out_dir))
    check_replaceable(out, overwrite)
    overrides = dict(model_config)
    builder = overrides.pop("_component_").removeprefix(MODELS)
    eos = None if tokenizer is None else tokenizer.eos_id
    config = IdmixConfig(
        builder=builder, overrides=overrides, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos
    )
    shapes, where = {k: v.shape for k, v in state_dict.items()}, f"{builder} {overrides}"
    check_given_sizes(config.overrides, shapes, where)
    with torch.device("meta"):  # shapes only; the weights come from state_dict
        model = IdmixForCausalLM(config)
    compare_shapes(model.model, shapes, where)
    model.model.load_state_dict(state_dict, assign=True)
    model.generation_config.update(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            hf_tokenizer(tokenizer, config.max_position_embeddings).save_pretrained(tmp)

    return write_dir(out, write, overwrite)


def convert(checkpoint, out_dir, tokenizer=None, overwrite=False) -> Path:
    """A ``model_final.pt`` (read with weights_only=True; its builder must be trusted, as
    for ``idmix.io.checkpoint.load_exported_model``) to a Hugging Face directory.
    tokenizer: a BPETokenizer, None, or a spec string of :func:`load_tokenizer`."""
    check_replaceable(Path(os.path.abspath(out_dir)), overwrite)  # before any work
    source = f"checkpoint {str(checkpoint)!r}"
    saved = safe_load(checkpoint)
    if not isinstance(saved, dict) or "model" not in saved or "model_config" not in saved:
        raise ValueError(f"{source} is not a model_final.pt export")
    saved["model_config"] = plain_description(saved["model_config"], source)
    check_description(saved["model_config"], source)
    refuse_old_layout(saved["model"], source)
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer, saved["model"]["tok_embeddings.weight"].shape[0])
    return save_hf(saved["model"], saved["model_config"], out_dir, tokenizer, overwrite)


def convert_run(run_dir, tokenizer=None) -> Path:
    """run_dir/hf: the Hugging Face directory of run_dir/model_final.pt (what a training run
    writes at its end), replacing an earlier one; with the tokenizer when it is one of idmix's
    BPEs, else without one, saying so."""
    run_dir = Path(run_dir)
    if tokenizer is not None and not isinstance(tokenizer, tokenizers.BPETokenizer):
        print(f"hf/: no tokenizer saved ({type(tokenizer).__name__} is not an idmix BPE)")
        tokenizer = None
    return convert(run_dir / "model_final.pt", run_dir / "hf", tokenizer, overwrite=True)


def load_tokenizer(spec: str, vocab_size: int):
    """spec: "none", a builder of idmix.io.tokenizer trained for vocab_size
    ("shakespeare_bpe", "python_stdlib_bpe") or the path of a tokenizers JSON file."""
    if spec == "none":
        return None
    if spec in ("shakespeare_bpe", "python_stdlib_bpe"):
        return getattr(tokenizers, spec)(vocab_size)
    return tokenizers.from_file(spec)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m idmix.hf.convert", description=__doc__)
    parser.add_argument("checkpoint", help="a model_final.pt export")
    parser.add_argument("out_dir", help="the Hugging Face directory to write")
    parser.add_argument(
        "--tokenizer",
        default="shakespeare_bpe",
        help="shakespeare_bpe (default), python_stdlib_bpe (both at the model's vocab_size), "
        "a tokenizers JSON file, or none",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace out_dir if the converter wrote it (never a run directory or another)",
    )
    args = parser.parse_args(argv)
    out = convert(args.checkpoint, args.out_dir, args.tokenizer, args.overwrite)
    print(f"wrote {out} ({', '.join(sorted(p.name for p in out.iterdir()))})")


if __name__ == "__main__":
    main()
