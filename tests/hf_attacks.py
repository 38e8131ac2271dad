"""Code planted in a Hugging Face directory, for the tests that show our load routes never run
it: Python files that record their import and fail, named by ``auto_map`` entries in
config.json and tokenizer_config.json (what ``trust_remote_code=True`` would import)."""

from __future__ import annotations

import json
from pathlib import Path

PLANTED = {
    "configuration_idmix.py": "configuration_idmix.IdmixConfig",
    "modeling_idmix.py": "modeling_idmix.IdmixForCausalLM",
    "tokenization_idmix.py": "tokenization_idmix.IdmixTokenizer",
}


def plant_code(d: Path, ran: Path, drop_tokenizer_class: bool = False) -> None:
    """Plant PLANTED in directory d and name it in both auto_maps; importing any of them
    creates ran/<file name>. drop_tokenizer_class: also remove tokenizer_config.json's
    tokenizer_class (the auto_map is then its only named tokenizer)."""
    ran.mkdir(exist_ok=True)
    for name in PLANTED:
        (d / name).write_text(
            f"import pathlib\npathlib.Path({str(ran)!r}, {name!r}).touch()\n"
            "raise RuntimeError('planted code ran')\n"
        )
    config = json.loads((d / "config.json").read_text())
    config["auto_map"] = {
        "AutoConfig": PLANTED["configuration_idmix.py"],
        "AutoModelForCausalLM": PLANTED["modeling_idmix.py"],
        "AutoTokenizer": [None, PLANTED["tokenization_idmix.py"]],
    }
    (d / "config.json").write_text(json.dumps(config))
    tokenizer = json.loads((d / "tokenizer_config.json").read_text())
    tokenizer["auto_map"] = {"AutoTokenizer": [None, PLANTED["tokenization_idmix.py"]]}
    if drop_tokenizer_class:
        tokenizer.pop("tokenizer_class", None)
    (d / "tokenizer_config.json").write_text(json.dumps(tokenizer))
