"""Attacks on idmix's Hugging Face directories (issue 50), each refused. Planted Python and
``auto_map`` entries never run on the documented routes (``import idmix.hf`` then
``from_pretrained``; lm-eval's ``hf`` model); the weight files resolve inside the directory (no
``..``, absolute path or symlink; one source of truth; every tensor present in its shape and
dtype) with errors that quote nothing from outside it; the converter replaces only a directory
it wrote, never a run directory or a user's; a full disk leaves the previous directory intact."""

from __future__ import annotations

import errno
import fcntl
import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from safetensors import SafetensorError  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerFast,
)

from idmix.hf import IdmixConfig, IdmixForCausalLM  # noqa: E402
from idmix.hf.convert import main as convert_main  # noqa: E402
from idmix.hf.convert import save_hf  # noqa: E402
from idmix.hf.directory import MARKER  # noqa: E402
from idmix.io.checkpoint import export_model  # noqa: E402
from idmix.io.run_dir import claim_run_dir  # noqa: E402
from idmix.io.tokenizer import shakespeare_bpe  # noqa: E402
from idmix.models import interdomain_tiny  # noqa: E402
from tests.hf_attacks import plant_code  # noqa: E402

TOY = {"num_layers": 1, "vocab_size": 4096, "embed_dim": 32, "num_heads": 2, "num_modes": 8}
NODE = {"_component_": "idmix.models.interdomain_tiny", **TOY}
SECRET = "SECRET-OUTSIDE-CONTENT"  # in every file outside the directory: never in an error
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def toy():
    torch.manual_seed(0)
    return interdomain_tiny(**TOY).eval()


@pytest.fixture(scope="module")
def written(toy, tmp_path_factory) -> Path:
    """A directory the converter wrote, with the embedded corpus's tokenizer."""
    out = tmp_path_factory.mktemp("written") / "hf"
    save_hf(toy.state_dict(), NODE, out, shakespeare_bpe(4096))
    return out


@pytest.fixture
def copy(written, tmp_path) -> Path:
    return Path(shutil.copytree(written, tmp_path / "model"))


def _same_logits(model, toy) -> bool:
    tokens = torch.tensor([[5, 17, 301, 2, 4000]])
    with torch.no_grad():
        return torch.equal(model(tokens).logits, toy(tokens))


# no code runs -------------------------------------------------------------------------------
def test_a_written_directory_names_no_code_and_carries_the_marker(written):
    names = {p.name for p in written.iterdir()}
    assert names == {MARKER, "config.json", "generation_config.json", "model.safetensors",
                     "tokenizer.json", "tokenizer_config.json"}  # fmt: skip
    for name in ("config.json", "tokenizer_config.json"):
        assert "auto_map" not in json.loads((written / name).read_text()), name
    assert json.loads((written / MARKER).read_text()) == {"written_by": "idmix.hf.convert"}


@pytest.mark.parametrize("drop_tokenizer_class", [False, True])
@pytest.mark.parametrize("kwargs", [{}, {"trust_remote_code": False}])
def test_planted_code_never_runs_on_the_documented_routes(
    copy, tmp_path, toy, kwargs, drop_tokenizer_class
):
    ran = tmp_path / "ran"
    plant_code(copy, ran, drop_tokenizer_class)
    assert isinstance(AutoConfig.from_pretrained(copy, **kwargs), IdmixConfig)
    model = AutoModelForCausalLM.from_pretrained(copy, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(copy, **kwargs)
    assert type(model) is IdmixForCausalLM and _same_logits(model, toy)
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert tokenizer.encode("ROMEO.\n") == shakespeare_bpe(4096).encode("ROMEO.\n")
    assert not list(ran.iterdir())


def test_lm_eval_hf_model_runs_no_planted_code(copy, tmp_path):
    """What ``idmix-lm-eval --model hf --model_args pretrained=DIR`` loads (its default
    trust_remote_code=False); the command itself runs in tests/test_hf.py."""
    HFLM = pytest.importorskip("lm_eval.models.huggingface").HFLM
    ran = tmp_path / "ran"
    plant_code(copy, ran)
    lm = HFLM(pretrained=str(copy), device="cpu", batch_size=1)
    assert type(lm.model) is IdmixForCausalLM and not list(ran.iterdir())


# weight files resolved inside the directory -------------------------------------------------
def _shard(d: Path) -> dict[str, str]:
    """d's model.safetensors split into SHARDS and an index; returns the weight_map."""
    tensors = load_file(d / "model.safetensors")
    keys = sorted(tensors)
    weight_map = {k: SHARDS[i >= len(keys) // 2] for i, k in enumerate(keys)}
    for shard in SHARDS:
        part = {k: tensors[k] for k in keys if weight_map[k] == shard}
        save_file(part, d / shard, metadata={"format": "pt"})
    (d / "model.safetensors").unlink()
    _index(d, weight_map)
    return weight_map


def _index(d: Path, weight_map: dict) -> None:
    (d / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _outside(d: Path, name: str) -> Path:
    """A directory beside d for files an attack points at."""
    out = d.parent / "outside"
    out.mkdir(exist_ok=True)
    return out / name


def _move_out(file: Path) -> Path:
    """file moved outside its directory, its tensors' metadata carrying SECRET."""
    target = _outside(file.parent, file.name)
    save_file(load_file(file), target, metadata={"format": "pt", "note": SECRET})
    file.unlink()
    return target


def _escape_with_dotdot(d):
    weight_map = _shard(d)
    _move_out(d / SHARDS[1])
    _index(d, {k: f"../outside/{v}" if v == SHARDS[1] else v for k, v in weight_map.items()})


def _escape_with_absolute_path(d):
    weight_map = _shard(d)
    target = _move_out(d / SHARDS[1])
    _index(d, {k: str(target) if v == SHARDS[1] else v for k, v in weight_map.items()})


def _symlinked_shard(d):
    _shard(d)
    (d / SHARDS[1]).symlink_to(_move_out(d / SHARDS[1]))


def _symlinked_file(d):
    (d / "model.safetensors").symlink_to(_move_out(d / "model.safetensors"))


def _symlinked_text_file(d):
    target = _outside(d, "passwd")
    target.write_text(f"root:{SECRET}\n")
    (d / "model.safetensors").unlink()
    (d / "model.safetensors").symlink_to(target)


def _symlinked_index(d):
    _shard(d)
    target = _outside(d, INDEX)
    (d / INDEX).rename(target)
    (d / INDEX).symlink_to(target)


def _index_and_an_incomplete_file(d):
    """The index is complete; model.safetensors (what transformers loads) lacks a tensor."""
    full = load_file(d / "model.safetensors")
    _shard(d)
    full.pop("model.norm.scale")
    save_file(full, d / "model.safetensors", metadata={"format": "pt"})


def _missing_tensor(d):
    tensors = load_file(d / "model.safetensors")
    tensors.pop("model.norm.scale")
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


def _indexed_tensor_in_no_shard(d):
    _shard(d)
    shard = d / SHARDS[1]
    tensors = load_file(shard)
    tensors.pop("model.output.weight")
    save_file(tensors, shard, metadata={"format": "pt"})


def _tensor_in_another_shard(d):
    weight_map = _shard(d)
    weight_map["model.output.weight"] = SHARDS[0]
    _index(d, weight_map)


def _retyped(dtype, key=None):
    def edit(d):
        tensors = load_file(d / "model.safetensors")
        for k in [key] if key else list(tensors):
            tensors[k] = tensors[k].to(dtype)
        save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})

    return edit


def _distributed_shard_beside(d):
    """transformers loads every *.safetensors of a directory holding a file of this name."""
    shutil.copy(d / "model.safetensors", d / "shard-00000-model-00001-of-00001.safetensors")


def _transformers_weights(d):
    shutil.copy(d / "model.safetensors", d / "other.safetensors")
    config = json.loads((d / "config.json").read_text())
    config["transformers_weights"] = "other.safetensors"
    (d / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("attack", "match"),
    [
        (_escape_with_dotdot, r"weight_map\['model\.\S+'\] = '\.\./outside/"),
        (_escape_with_absolute_path, r"weight_map\['model\.\S+'\] = '/"),
        (_symlinked_shard, "a symbolic link"),
        (_symlinked_file, "a symbolic link"),
        (_symlinked_text_file, "a symbolic link"),
        (_symlinked_index, "a symbolic link"),
        (_index_and_an_incomplete_file, "holds both model.safetensors and model.safetensors.index"),
        (_missing_tensor, r"lack \['norm.scale'\]"),
        (_indexed_tensor_in_no_shard, r"names \['model.output.weight'\], which no shard holds"),
        (_tensor_in_another_shard, "which model.safetensors.index.json puts in"),
        (_retyped(torch.float16, "model.norm.scale"), r"^dtype: .* model\.norm\.scale as F16"),
        (_retyped(torch.bfloat16), r"^dtype: .* as BF16, but .* builds it as F32"),
        (_distributed_shard_beside, r"unexpected weight files \['shard-00000"),
        (_transformers_weights, "^transformers_weights: "),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_weight_files_outside_the_directory_or_not_fitting_are_refused(copy, attack, match):
    attack(copy)
    with pytest.raises(ValueError, match=match) as e:
        AutoModelForCausalLM.from_pretrained(copy)
    assert SECRET not in str(e.value)


def test_a_sharded_directory_loads(copy, toy):
    """The positive case of the index checks: plain shard names, each tensor once."""
    _shard(copy)
    assert _same_logits(AutoModelForCausalLM.from_pretrained(copy), toy)


@pytest.mark.parametrize("kwargs", [{"variant": "fp16"}, {"gguf_file": "model.gguf"}])
def test_other_weight_files_cannot_be_chosen_at_load(copy, written, kwargs):
    """A variant file beside model.safetensors (lacking a tensor) would be loaded unchecked."""
    _missing_tensor(copy)
    (copy / "model.safetensors").rename(copy / "model.fp16.safetensors")
    shutil.copy(written / "model.safetensors", copy)
    with pytest.raises(ValueError, match=f"^{next(iter(kwargs))}: not supported"):
        IdmixForCausalLM.from_pretrained(copy, **kwargs)


# the converter never deletes a directory it did not write -----------------------------------
@pytest.fixture(scope="module")
def checkpoint(toy, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("export") / "model_final.pt"
    export_model(path, toy, NODE)
    return path


def _listing(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def _finished_run(d: Path) -> None:
    (d / "checkpoints" / "step_000010").mkdir(parents=True)
    (d / "checkpoints" / "latest").write_text("step_000010\n")
    (d / "run.json").write_text('{"run_id": "abc"}')
    (d / ".run.lock").touch()


@pytest.mark.parametrize("run", ["live", "finished", "lock only, held"])
def test_convert_overwrite_refuses_a_run_directory(checkpoint, tmp_path, run):
    d = tmp_path / "run"
    d.mkdir()
    held = None
    if run == "live":
        held = claim_run_dir(d, resume=False, overwrite=False)
    elif run == "finished":
        _finished_run(d)
    else:
        held = open(d / ".run.lock", "a+")  # noqa: SIM115 (held across the call)
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    before = _listing(d)
    try:
        with pytest.raises(ValueError, match=rf"^out_dir: '{d}' is a training run directory"):
            convert_main([str(checkpoint), str(d), "--tokenizer", "none", "--overwrite"])
    finally:
        held is not None and (held.release() if run == "live" else held.close())
    assert _listing(d) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing written beside


def _user_files(d: Path) -> None:
    (d / "notes.txt").write_text("mine")


def _user_subdirectory(d: Path) -> None:
    _finished_run(d / "an_old_run")  # a directory above runs, say


def _legacy_and_a_user_file(d: Path) -> None:
    _legacy(d)
    (d / "notes.txt").write_text("mine")


def _legacy(d: Path) -> None:
    """What converters before the marker wrote."""
    old = ["config.json", "model.safetensors", "generation_config.json", "tokenizer.json"]
    for name in old + ["tokenizer_config.json", "configuration_idmix.py", "modeling_idmix.py"]:
        (d / name).write_text("old")


@pytest.mark.parametrize(
    ("setup", "match"),
    [
        (_user_files, r"was not written by idmix.hf.convert \(no .idmix-hf marker\)"),
        (_user_subdirectory, r"holds \['an_old_run'\], which the converter never writes"),
        (_legacy_and_a_user_file, "was not written by idmix.hf.convert"),
    ],
)
def test_convert_overwrite_refuses_a_directory_it_did_not_write(checkpoint, tmp_path, setup, match):
    d = tmp_path / "mine"
    d.mkdir()
    setup(d)
    before = _listing(d)
    with pytest.raises(ValueError, match=rf"^out_dir: '{d}' " + match):
        convert_main([str(checkpoint), str(d), "--tokenizer", "none", "--overwrite"])
    assert _listing(d) == before


def test_convert_refuses_a_symlink_and_an_existing_directory_without_overwrite(
    checkpoint, written, tmp_path
):
    link = tmp_path / "link"
    link.symlink_to(written, target_is_directory=True)
    with pytest.raises(ValueError, match="is a symbolic link"):
        convert_main([str(checkpoint), str(link), "--tokenizer", "none", "--overwrite"])
    with pytest.raises(ValueError, match="exists; pass overwrite=True"):
        convert_main([str(checkpoint), str(written), "--tokenizer", "none"])


@pytest.mark.parametrize("previous", ["ours", "legacy", "empty"])
def test_convert_replaces_a_directory_it_wrote(checkpoint, written, tmp_path, toy, previous):
    d = tmp_path / "hf"
    if previous == "ours":
        shutil.copytree(written, d)
    else:
        d.mkdir()
        if previous == "legacy":
            _legacy(d)
    convert_main([str(checkpoint), str(d), "--tokenizer", "none", "--overwrite"])
    assert (d / MARKER).is_file() and not list(d.glob("*.py"))
    assert _same_logits(AutoModelForCausalLM.from_pretrained(d), toy)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no partial or old copy left


# a full disk ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        ),
    ],
    ids=["OSError", "SafetensorError"],
)
@pytest.mark.parametrize("previous", [True, False])
def test_a_full_disk_names_the_directory_and_keeps_the_previous_one(
    toy, written, tmp_path, monkeypatch, error, previous
):
    out = tmp_path / "hf"
    if previous:
        shutil.copytree(written, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()} if previous else None

    def full(*args, **kwargs):
        raise error

    monkeypatch.setattr("transformers.modeling_utils.safe_save_file", full)
    with pytest.raises(OSError, match="No space left on device") as e:
        save_hf(toy.state_dict(), NODE, out, overwrite=True)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(out)
    if previous:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == (["hf"] if previous else [])
