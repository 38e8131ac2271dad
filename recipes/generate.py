"""Generate text from a checkpoint, streaming tokens as they come.

    tune run recipes/generate.py --config recipes/configs/generate_tiny.yaml [key=value …]

Loads a single-file checkpoint written by the pretraining recipe (``model_final.pt``: the
state dict and the model's config), prefills the prompt, then decodes one token per step
through the mixers' caches (constant-size for the SSM mixers). Prints the text as it streams,
then tokens/s, the decoding cache's size and the process's peak memory.
"""

from __future__ import annotations

import resource
import sys
import time

import torch
from omegaconf import DictConfig
from torchtune import config

from idmix import cache_nbytes, generate
from idmix.io.checkpoint import load_exported_model
from idmix.io.config_checks import boolean, check_components, check_keys, integer

KEYS = {
    "checkpoint", "tokenizer", "prompt", "max_new_tokens", "temperature", "top_k", "top_p",
    "seed", "device", "compile",
}  # fmt: skip


@config.parse
def main(cfg: DictConfig) -> None:
    check_keys(cfg, KEYS)
    boolean(cfg, "compile")
    check_components(cfg)
    integer(cfg, "max_new_tokens", 1)
    if not isinstance(cfg.prompt, str) or not cfg.prompt:
        raise ValueError(f"config: prompt: expected non-empty text, got {cfg.prompt!r}")
    model = load_exported_model(cfg.checkpoint, cfg.device)
    tokenizer = config.instantiate(cfg.tokenizer)
    vocab = model.output.out_features if hasattr(model, "output") else None
    if vocab is not None and tokenizer.vocab_size > vocab:
        raise ValueError(
            f"config: tokenizer: its vocab_size {tokenizer.vocab_size} exceeds the model's "
            f"{vocab} ({cfg.checkpoint}): is it the tokenizer the model was trained with?"
        )
    prompt = tokenizer.encode(cfg.prompt, add_bos=False, add_eos=False)
    if not prompt:
        raise ValueError("config: prompt: encodes to no tokens")
    generator = torch.Generator(device=cfg.device).manual_seed(cfg.seed)
    out: list[int] = []
    shown = [0]
    cache = [0]
    t0 = [0.0]

    def stream(step: int, tokens: torch.Tensor) -> None:
        if step == 0:
            cache[0] = cache_nbytes(model)
        if step == 1:  # timing starts after the first decode step (and any compile it did)
            t0[0] = time.perf_counter()
        out.append(int(tokens[0]))
        text = tokenizer.decode(out)
        print(text[shown[0] :], end="", flush=True)
        shown[0] = len(text)

    print(cfg.prompt, end="", flush=True)
    generate(
        model,
        [prompt],
        cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        stop_tokens=[tokenizer.eos_id],
        callback=stream,
        generator=generator,
        compile=cfg.compile,
    )
    elapsed = time.perf_counter() - t0[0]
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rate = (len(out) - 2) / elapsed if len(out) > 2 and elapsed > 0 else float("nan")
    print(
        f"\n\n{len(out)} tokens | {rate:.1f} tokens/s after the first two | decoding cache "
        f"{cache[0] / 2**20:.2f} MiB | peak RSS {peak_mib:.0f} MiB"
    )


if __name__ == "__main__":
    sys.exit(main())
