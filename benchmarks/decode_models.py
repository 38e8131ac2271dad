"""Model-level decoding on a GPU: interdomain_125m against softmax_125m (random weights, bf16),
both through generate's step (idmix.static_decode) compiled and replayed as one CUDA graph
per token; the softmax side reads a static KV cache sized to the context, as gpt-fast does.
Per (batch, context): prefill time, decode tokens/s, the caches' bytes and the peak memory of
decoding. ``bench_gpu.py`` runs it after its op tables, within a deadline; cells the deadline
cuts are listed as not reached. The target cells (B = 1 at 2K and 32K) come first.
"""

from __future__ import annotations

import importlib.util
import time

import torch

MODELS = ("interdomain_125m", "softmax_125m")
CELLS = ((1, 2048), (1, 32768), (32, 2048), (32, 32768), (1, 512), (1, 8192), (32, 512), (32, 8192))
NEW_TOKENS = 64
PREFILL_TOKENS = 16384  # rows × positions per prefill piece: bounds the (B, piece, S) mask
SAMPLING = (1.0, 50, None)  # temperature, top_k, top_p: sampling costs what it costs in use
HEADER = [
    "model", "B", "context", "prefill s", "decode tok/s", "step ms", "caches GiB",
    "decode peak GiB", "alloc Δ B", "mode",
]  # fmt: skip


def build(name: str, device: str, max_seq_len: int):
    """The named paper builder (bf16 on CUDA; its RoPE and checks sized to max_seq_len, past
    the paper's 4K context: the table asks for 32K), or on CPU its tiny stand-in (fp32). Where the
    recipes hook's start-up file did not run (the GPU image: wheels from gpu_wheels.sh), its
    torchtune/torchao shim is imported here, before torchtune."""
    if importlib.util.find_spec("_idmix_torchtune_compat") is not None:
        import _idmix_torchtune_compat  # noqa: F401
    from idmix import models

    if device == "cpu":
        return models.cpu_model(name.split("_")[0], "tiny").eval()
    return getattr(models, name)(max_seq_len=max_seq_len).to(device, torch.bfloat16).eval()


@torch.no_grad()
def measure(model, name: str, B: int, ctx: int, new_tokens: int, mode: str) -> list[str]:
    """One cell: prefill B random prompts of ctx tokens, then decode new_tokens - 1 steps
    (the first WARMUP_STEPS + 1 untimed: compiles and the capture)."""
    from idmix.generation import cache_nbytes, prefill, release_caches
    from idmix.static_decode import WARMUP_STEPS, StepRunner, emit

    device = next(model.parameters()).device
    vocab = model.tok_embeddings.num_embeddings
    prompts = torch.randint(1, vocab, (B, ctx)).tolist()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    try:
        sync()
        t0 = time.perf_counter()
        buf, logits = prefill(model, prompts, new_tokens, chunk=max(1, PREFILL_TOKENS // B))
        sync()
        prefill_s = time.perf_counter() - t0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()  # the peak reported is decoding's
        emit(buf, logits, *SAMPLING)
        step = StepRunner(model, buf, SAMPLING, mode)
        for _ in range(WARMUP_STEPS + 1):
            step()
        timed = new_tokens - WARMUP_STEPS - 2
        sync()
        before = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        t0 = time.perf_counter()
        for _ in range(timed):
            step()
        sync()
        seconds = time.perf_counter() - t0
        grown = (torch.cuda.memory_allocated() if device.type == "cuda" else 0) - before
        peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
        caches = cache_nbytes(model)
    finally:
        release_caches(model)
    return [
        name, str(B), str(ctx), f"{prefill_s:.3f}", f"{B * timed / seconds:.0f}",
        f"{seconds / timed * 1e3:.3f}", f"{caches / 2**30:.3f}", f"{peak / 2**30:.2f}",
        str(grown), mode,
    ]  # fmt: skip


def model_rows(device: str, deadline: float, cells=CELLS, new_tokens=NEW_TOKENS, report=print):
    """The table's rows, cell by cell, each model at each cell; report(row) as each is done."""
    mode = "graphed" if device == "cuda" else "eager"
    # one compile per (model, batch, context) for the shared step: more than Dynamo's default 8
    torch._dynamo.config.recompile_limit = 4 * len(cells) * len(MODELS)
    longest = max(ctx for _, ctx in cells) + new_tokens
    try:
        built = {name: build(name, device, longest) for name in MODELS}
    except ImportError as missing:  # the models need torchtune and tensordict
        return [[name, "", "", f"not run: {missing}", *[""] * 6] for name in MODELS]
    rows = []
    for B, ctx in cells:
        for name in MODELS:
            if time.perf_counter() > deadline:
                row = [name, str(B), str(ctx), "not reached (time cap)", *[""] * 6]
            else:
                label = name if device == "cuda" else name.split("_")[0] + "_tiny"
                try:
                    row = measure(built[name], label, B, ctx, new_tokens, mode)
                except Exception as failure:  # a cell's failure (out of memory, ...) is its row
                    row = [label, str(B), str(ctx), f"failed: {type(failure).__name__}", *[""] * 6]
                    print(f"{label} B={B} context={ctx}: {failure!r}"[:2000])
                if device == "cuda":
                    torch.cuda.empty_cache()  # after the handler: a failure's frames are gone
            rows.append(row)
            report(row)
    return rows
