"""A clean start: importing the library and running the README's main job print nothing but
their own output. torchao 0.17's two messages no user can act on are dropped by exactly two
logging filters (tools/recipes-hook/_idmix_quiet.py), which keep every other message."""

from __future__ import annotations

import enum
import logging
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "recipes-hook"))

import _idmix_quiet  # noqa: E402


def record(logger: str, msg: str, *args) -> logging.LogRecord:
    return logging.LogRecord(logger, logging.WARNING, __file__, 1, msg, args, None)


def test_the_filters_drop_exactly_torchao_messages():
    cuda_only = _idmix_quiet.UnloadableCudaExtension()
    failed = "Failed to load /site-packages/torchao/{}: Could not load this library"
    assert not cuda_only.filter(record("torchao", failed.format("_C_mxfp8.cpython-310.so")))
    assert not cuda_only.filter(record("torchao", failed.format("_C_cutlass_90a.abi3.so")))
    assert cuda_only.filter(record("torchao", failed.format("_C_cpu_kernels.so")))
    assert cuda_only.filter(record("torchao", "Skipping import of cpp extensions"))

    class Local(enum.Enum):
        A = 1

    Torchao = enum.Enum("KernelPreference", "AUTO")
    Torchao.__module__ = "torchao.quantization.quantize_.common.kernel_preference"
    notice = "%s " + _idmix_quiet.ENUM_NOTICE + ". Calling register_constant() is deprecated."
    enums = _idmix_quiet.TorchaoEnumNotice()
    assert not enums.filter(record("torch.utils._pytree", notice, Torchao))
    assert enums.filter(record("torch.utils._pytree", notice, Local))
    assert enums.filter(record("torch.utils._pytree", "another message %s", Torchao))


def test_imports_print_nothing():
    code = "import idmix, idmix.models, idmix.hf, torchtune.training, torchao.quantization"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout + out.stderr == ""


# every line the README's main job may print: torchtune's log file and seed lines, the
# progress bars (training; transformers' writing the hf/ export), the run's summary
OWN_LINES = [
    r"Writing logs to \S+",
    r"Setting manual seed to local seed \d+\. Local seed is seed \+ rank = \d+ \+ 0",
    r"(Writing model shards: *)?\d+%\|.*\|.*",
    r"summary: .*",
    r"run directory: .*",
]


def test_the_readme_main_job_prints_only_its_own_lines(tmp_path):
    readme = (ROOT / "README.md").read_text()
    main_job = re.findall(r"```bash\n(.*?)```", readme, re.S)[1].strip()
    assert main_job.startswith("tune run recipes/pretrain_interdomain.py"), main_job
    args = main_job.split()[1:] + [f"output_dir={tmp_path / 'run'}", "max_steps=3"]
    tune = str(Path(sys.executable).with_name("tune"))
    out = subprocess.run([tune, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = re.split(r"[\r\n]+", out.stdout + "\n" + out.stderr)
    foreign = [ln for ln in lines if ln.strip() and not any(re.fullmatch(p, ln.strip())
                                                            for p in OWN_LINES)]  # fmt: skip
    assert not foreign, f"lines the main job should not print: {foreign}"
