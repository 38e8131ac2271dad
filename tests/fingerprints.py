"""Fingerprints of what the named builders build (parameters and logits at a fixed seed), so a
refactor of the layers can be checked to change structure, not numbers.

    python -m tests.fingerprints   # rewrite tests/data/builder_fingerprints.json (deliberately)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

FILE = Path(__file__).parent / "data" / "builder_fingerprints.json"
BUILDERS = ["interdomain_tiny", "softmax_tiny", "s4d_tiny"]
CELLS = [
    "full",
    "full_no_rope",
    "single_input_query",
    "s4d_only",
    "s4d_only_rope",
    "dual_kv_linear",
]
SAMPLES = 8


def _sample(t: torch.Tensor) -> list[float]:
    flat = t.detach().double().flatten()
    at = torch.linspace(0, flat.numel() - 1, min(SAMPLES, flat.numel())).long()
    return flat[at].tolist()


def fingerprint(model) -> dict:
    """{parameter name: [shape, Σx, Σ|x|, samples]} and the logits of a fixed input."""
    params = {
        n: [list(p.shape), p.double().sum().item(), p.double().abs().sum().item(), _sample(p)]
        for n, p in model.state_dict().items()
    }
    tokens = (torch.arange(40) * 97 % 4096)[None]
    with torch.no_grad():
        logits = model.eval()(tokens).double()
    return {
        "params": params,
        "logits": [logits.sum().item(), logits.abs().sum().item(), _sample(logits[0, :, :16])],
    }


def build(name: str):
    """A named tiny builder, or a Table 4 cell at the tiny scale, at seed 0."""
    import idmix.models as models

    torch.manual_seed(0)
    if name in CELLS:
        return models.cpu_model(name, "tiny")
    return getattr(models, name)()


def all_fingerprints() -> dict:
    return {name: fingerprint(build(name)) for name in BUILDERS + CELLS}


if __name__ == "__main__":
    FILE.write_text(json.dumps(all_fingerprints(), indent=0))
    print(f"wrote {FILE}")


LEGACY = Path(__file__).parent / "data" / "legacy_exports"
LEGACY_MIXERS = ["interdomain", "s4d", "dual_kv_linear", "softmax"]


def legacy_config(mixer: str) -> dict:
    kw = dict(vocab_size=64, num_layers=1, num_heads=2, embed_dim=16, max_seq_len=64, mixer=mixer)
    if mixer != "softmax":
        kw["num_modes"] = 4
    return {"_component_": "idmix.models.decoder", **kw}


def legacy_tokens() -> torch.Tensor:
    return (torch.arange(12) * 5 % 64)[None]


def write_legacy_exports() -> None:
    """model_final.pt files as the layers before the composition redesign wrote them (kept to
    check that old exports still load and give the same logits)."""
    from omegaconf import DictConfig
    from torchtune import config

    LEGACY.mkdir(exist_ok=True)
    logits = {}
    for mixer in LEGACY_MIXERS:
        torch.manual_seed(0)
        cfg = legacy_config(mixer)
        model = config.instantiate(DictConfig(cfg)).eval()
        torch.save({"model": model.state_dict(), "model_config": cfg}, LEGACY / f"{mixer}.pt")
        with torch.no_grad():
            logits[mixer] = model(legacy_tokens()).double().flatten().tolist()
    (LEGACY / "logits.json").write_text(json.dumps(logits))
