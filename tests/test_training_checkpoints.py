"""Training checkpoints a hostile or careless user might hand us: crafted DCP metadata and byte
items run no code, damaged files (or a deleted manifest) are named with the newest intact step,
``latest`` cannot point elsewhere and no symbolic link in a checkpoint is followed, a full disk
leaves the previous checkpoint (and model_final.pt), another run's checkpoint is refused, a
file torch.save did not write is named (``idmix.io.checkpoint``, ``dcp_reader``,
``manifest``, ``files``)."""

from __future__ import annotations

import errno
import pickle
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from idmix.io import checkpoint as ckpt
from idmix.io import manifest
from idmix.io.dcp_reader import UnsafeCheckpointError, read_dcp_metadata
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


def _secret(tmp_path, text="hunter2\n"):
    secret = tmp_path / "secret.txt"
    secret.write_text(text)
    return secret


@pytest.mark.parametrize("text", ["hunter2\n", "step_000001\n"])
def test_latest_as_a_symbolic_link_is_refused_without_quoting_its_target(tmp_path, text):
    run = saved_run(tmp_path, steps=(1,))
    pointer = run / "checkpoints" / "latest"
    pointer.unlink()
    pointer.symlink_to(_secret(tmp_path, text))
    with pytest.raises(ValueError, match=r"latest' is a symbolic link") as err:
        ckpt.latest_checkpoint(run)
    assert "hunter2" not in str(err.value)


def test_latest_that_is_not_a_step_name_is_refused_without_quoting_it(tmp_path):
    run = saved_run(tmp_path, steps=(1,))
    (run / "checkpoints" / "latest").write_text("hunter2\n")
    with pytest.raises(ValueError, match=r"not a step directory of this run") as err:
        ckpt.latest_checkpoint(run)
    assert "hunter2" not in str(err.value)


def test_a_symlinked_step_or_checkpoints_directory_is_refused(tmp_path):
    """A step directory (or checkpoints/ itself) linked to another run's is never resumed."""
    run = saved_run(tmp_path / "a", steps=(1,))
    other = saved_run(tmp_path / "b", steps=(1, 2), run_id="run-b")
    step = run / "checkpoints" / "step_000002"
    step.symlink_to(other / "checkpoints" / "step_000002")
    (run / "checkpoints" / "latest").write_text("step_000002\n")
    with pytest.raises(ValueError, match=r"step_000002' is a symbolic link"):
        ckpt.latest_checkpoint(run)
    with pytest.raises(manifest.DamagedCheckpointError, match=r"is a symbolic link"):
        ckpt.load_checkpoint(step, *model_and_optimizer())
    assert ckpt.newest_intact(run) == run / "checkpoints" / "step_000001"
    linked = tmp_path / "c"
    linked.mkdir()
    (linked / "checkpoints").symlink_to(other / "checkpoints")
    with pytest.raises(ValueError, match=r"checkpoints' is a symbolic link"):
        ckpt.latest_checkpoint(linked)


@pytest.mark.parametrize("name", ["manifest.json", "extra_rank0.pt", "__0_0.distcp"])
def test_a_symlinked_file_in_a_checkpoint_is_refused(tmp_path, name):
    """Even a link to an identical copy outside the run (its checksum matches) is refused."""
    path = ckpt.latest_checkpoint(saved_run(tmp_path, steps=(1,)))
    outside = tmp_path / f"copy_of_{name}"
    (path / name).rename(outside)
    (path / name).symlink_to(outside)
    with pytest.raises(manifest.DamagedCheckpointError, match=rf"{name}' is a symbolic link"):
        ckpt.load_checkpoint(path, *model_and_optimizer(), "run-a")


def test_a_deleted_manifest_is_an_error_naming_the_newest_intact_step(tmp_path):
    run = saved_run(tmp_path, steps=(1, 2))
    path = ckpt.latest_checkpoint(run)
    (path / manifest.NAME).unlink()
    (shard,) = path.glob("*.distcp")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40  # what the manifest would have caught
    shard.write_bytes(bytes(data))
    with pytest.raises(manifest.DamagedCheckpointError) as err:
        ckpt.load_checkpoint(path, *model_and_optimizer(), "run-a")
    message = str(err.value)
    assert "step_000002/manifest.json' is missing" in message
    assert "the newest intact checkpoint is step_000001" in message


def test_a_checkpoint_from_before_manifests_loads_with_a_note(tmp_path, capsys):
    """No manifest and no run id in extra_rank0.pt: what idmix wrote before checksums."""
    path = ckpt.latest_checkpoint(saved_run(tmp_path, steps=(1,)))
    (path / manifest.NAME).unlink()
    extra = torch.load(path / "extra_rank0.pt", weights_only=True)
    del extra["run_id"]
    torch.save(extra, path / "extra_rank0.pt")
    assert ckpt.load_checkpoint(path, *model_and_optimizer())["step"] == 1
    assert "has no manifest (written before checksums)" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["empty", "text", "bytes", "truncated", "zip_header", "pickle"])
def test_a_file_torch_save_did_not_write_is_named(tmp_path, kind):
    good = tmp_path / "good.pt"
    torch.save({"a": torch.ones(3)}, good)
    data = {
        "empty": b"",
        "text": b"hello world\n",
        "bytes": bytes(range(256)) * 4,
        "truncated": good.read_bytes()[: good.stat().st_size // 2],
        "zip_header": b"PK\x03\x04" + b"\0" * 100,
        "pickle": b"\x80\x02}q\x00(X",
    }[kind]
    (tmp_path / "bad.pt").write_bytes(data)
    with pytest.raises(ValueError, match=r"'.*bad.pt' is not a file torch.save wrote"):
        ckpt.safe_load(tmp_path / "bad.pt")


@pytest.mark.parametrize(
    "failure",
    ["basic_ios::clear: iostream error",
     "[enforce fail at inline_container.cc:672] . unexpected pos 1024 vs 960",
     "[enforce fail at inline_container.cc:858] . PytorchStreamWriter failed writing file "
     "data/0: file write failed"],
)  # fmt: skip
def test_a_full_disk_while_exporting_keeps_the_previous_model_final(tmp_path, monkeypatch, failure):
    path = tmp_path / "model_final.pt"
    path.write_bytes(b"the previous export")
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)  # a partial file is left, as a real full disk would
        raise RuntimeError(failure)

    monkeypatch.setattr(torch, "save", full_disk)
    model, _ = model_and_optimizer()
    with pytest.raises(OSError) as err:
        ckpt.export_model(path, model, {"_component_": "x"})
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(path)
    assert "no space left on device while writing" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_final.pt"]
    assert path.read_bytes() == b"the previous export"
