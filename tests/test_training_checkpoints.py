"""Training checkpoints a hostile or careless user might hand us: crafted DCP metadata and byte
items run no code, damaged files are named with the newest intact step, ``latest`` cannot
point elsewhere, a full disk leaves the previous checkpoint, another run's checkpoint is
refused (``idmix.training.checkpoint``, ``dcp_reader``, ``manifest``)."""

from __future__ import annotations

import errno
import pickle
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from idmix.training import checkpoint as ckpt
from idmix.training import manifest
from idmix.training.dcp_reader import UnsafeCheckpointError, read_dcp_metadata
from tests.test_checkpoint_safety import RunsCode

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def model_and_optimizer(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def saved_run(tmp_path, steps=(1, 2), run_id="run-a"):
    run = tmp_path / "run"
    model, opt = model_and_optimizer()
    for step in steps:
        ckpt.save_checkpoint(run, step, model, opt, {"step": step}, run_id)
    return run


def test_a_checkpoint_round_trips_with_its_manifest(tmp_path):
    run = saved_run(tmp_path)
    path = ckpt.latest_checkpoint(run)
    assert path.name == "step_000002"
    found = manifest.verify(path)
    assert found["run_id"] == "run-a" and found["step"] == 2
    assert {"extra_rank0.pt", ".metadata"} <= found["files"].keys()
    model, opt = model_and_optimizer(seed=1)
    extra = ckpt.load_checkpoint(path, model, opt, "run-a")
    assert extra["step"] == 2 and extra["run_id"] == "run-a"
    want, _ = model_and_optimizer()
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), want.parameters(), strict=True)
    )


def test_crafted_dcp_metadata_runs_no_code(tmp_path):
    run = saved_run(tmp_path)
    path = ckpt.latest_checkpoint(run)
    marker = tmp_path / "ran"
    (path / ".metadata").write_bytes(pickle.dumps(RunsCode(marker)))
    manifest.write_manifest(path, "run-a", 2)  # checksums are not a defence: recompute them
    with pytest.raises(UnsafeCheckpointError, match=r"asks for (io|builtins).open"):
        ckpt.load_checkpoint(path, *model_and_optimizer(), "run-a")
    with pytest.raises(UnsafeCheckpointError):
        read_dcp_metadata(path)
    assert not marker.exists()


def test_crafted_dcp_byte_item_runs_no_code(tmp_path):
    """A non-tensor item (the optimizer's lr) replaced by a pickle that runs code: torch's own
    loader runs it; ours refuses it."""
    model, opt = model_and_optimizer()
    path = tmp_path / "run" / "checkpoints" / "step_000001"
    path.mkdir(parents=True)
    marker = tmp_path / "ran"
    model_sd, optim_sd = get_state_dict(model, opt)
    optim_sd["param_groups"][0]["lr"] = RunsCode(marker)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
    torch.save({"step": 1, "rng": ckpt.rng_state()}, path / "extra_rank0.pt")
    manifest.write_manifest(path, "run-a", 1)
    with pytest.raises(UnsafeCheckpointError, match=r"optim.param_groups.0.lr"):
        ckpt.load_checkpoint(path, *model_and_optimizer(), "run-a")
    assert not marker.exists()
    model_sd, optim_sd = get_state_dict(*model_and_optimizer())
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
    assert marker.exists()  # the attack is real: DCP's default planner ran it


def test_a_flipped_byte_is_named_with_the_newest_intact_step(tmp_path):
    run = saved_run(tmp_path, steps=(1, 2, 3))
    path = ckpt.latest_checkpoint(run)
    (shard,) = path.glob("*.distcp")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40
    shard.write_bytes(bytes(data))
    with pytest.raises(manifest.DamagedCheckpointError) as err:
        ckpt.load_checkpoint(path, *model_and_optimizer(), "run-a")
    message = str(err.value)
    assert shard.name in message and "SHA-256" in message
    assert "the newest intact checkpoint is step_000002" in message


@pytest.mark.parametrize("damage", ["truncate", "delete", "add"])
def test_truncated_missing_or_extra_files_are_named(tmp_path, damage):
    run = saved_run(tmp_path, steps=(1,))
    path = ckpt.latest_checkpoint(run)
    target = path / "extra_rank0.pt"
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:10])
        expected = r"extra_rank0.pt' has 10 bytes"
    elif damage == "delete":
        target.unlink()
        expected = r"extra_rank0.pt' is missing"
    else:
        (path / "extra_rank1.pt").write_bytes(b"x")
        expected = r"extra_rank1.pt' is not in its manifest"
    with pytest.raises(manifest.DamagedCheckpointError, match=expected) as err:
        ckpt.load_checkpoint(path, *model_and_optimizer(), "run-a")
    assert "no earlier checkpoint of this run is intact" in str(err.value)


@pytest.mark.parametrize("pointer", ["../../other/checkpoints/step_000001", "/tmp/x", "..", ""])
def test_latest_cannot_point_outside_its_run(tmp_path, pointer):
    run = saved_run(tmp_path, steps=(1,))
    (run / "checkpoints" / "latest").write_text(pointer + "\n")
    with pytest.raises(ValueError, match=r"not a step directory of this run"):
        ckpt.latest_checkpoint(run)


def test_another_runs_checkpoint_is_refused(tmp_path):
    path = ckpt.latest_checkpoint(saved_run(tmp_path, steps=(1,), run_id="run-a"))
    with pytest.raises(ValueError, match=r"written by run 'run-a'.*belongs to run 'run-b'"):
        ckpt.load_checkpoint(path, *model_and_optimizer(), "run-b")


@pytest.mark.parametrize(
    "failure",
    [OSError(errno.ENOSPC, "No space left on device"),
     RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1024 vs 960")],
)  # fmt: skip
def test_a_full_disk_names_enospc_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, failure):
    run = saved_run(tmp_path, steps=(1,))
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)  # a partial file is left, as a real full disk would
        raise failure

    monkeypatch.setattr(torch, "save", full_disk)
    model, opt = model_and_optimizer()
    with pytest.raises(OSError) as err:
        ckpt.save_checkpoint(run, 2, model, opt, {"step": 2}, "run-a")
    assert err.value.errno == errno.ENOSPC and "no space left on device" in str(err.value)
    assert "step_000001" in str(err.value) and ".step_000002.tmp-run-a" in str(err.value)
    monkeypatch.undo()
    root = run / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]
    assert manifest.is_intact(ckpt.latest_checkpoint(run))


def test_a_config_in_an_export_cannot_read_the_environment(tmp_path, monkeypatch):
    from tests.helpers import tiny_model

    monkeypatch.setenv("IDMIX_TEST_SECRET", "hunter2")
    model, config = tiny_model("interdomain")
    for value in ("${oc.env:IDMIX_TEST_SECRET}", "x ${ oc.env : IDMIX_TEST_SECRET}"):
        crafted = {**config, "norm_eps": value}
        torch.save({"model": model.state_dict(), "model_config": crafted}, tmp_path / "m.pt")
        with pytest.raises(ValueError, match=r"model_config.norm_eps calls an OmegaConf resolver"):
            ckpt.load_exported_model(tmp_path / "m.pt")
        try:
            ckpt.load_exported_model(tmp_path / "m.pt")
        except ValueError as e:
            assert "hunter2" not in str(e)
    ckpt.check_no_resolvers({"a": "${tokenizer.vocab_size}", "b": ["${a}"]}, "f")  # references
