#!/usr/bin/env bash
# The one prepared GPU run (docs/gpu.md), ordered by what we lack most: first where the time
# goes (benchmarks/profile_gpu.py: device time per kernel and per PyTorch op of one
# forward+backward at 64 x 1K and 1 x 64K, and the decode step), then the benchmark against
# SDPA's flash backend (benchmarks/bench_gpu.py: 1K-64K, forward and forward+backward, TF32 and
# bf16 products, autotuning time, the decode step called and graphed, and the models' decoding
# table of benchmarks/decode_models.py), then the kernel checks against the PyTorch
# path (tests/kernel_checks.py). Reports go to benchmarks/results/<device>.md and
# <device>_profile.md (<device>: h100, h200, ... from the GPU's name; $OUT/... when $OUT is set:
# the device tool's folder that comes back). Each stage has its own time cap; under 8 minutes.
#
#   bash benchmarks/gpu_check.sh             # on the GPU machine, from the repository root
#   bash benchmarks/gpu_check.sh --dry-run   # the profile and benchmark steps on CPU, tiny, interpreted
#
# It needs only torch and triton: idmix runs from the checkout (PYTHONPATH), with the
# kernels package reachable as idmix_kernels through a link, so nothing is installed. The
# models' decoding table also needs torchtune and tensordict (and what they import); the GPU
# image has neither: `bash benchmarks/gpu_wheels.sh` here writes them to .whl/, which the device
# call carries and this script installs to a temporary folder (with the torchtune/torchao shim
# of tools/recipes-hook on the path); without them that table says "not run" and why.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-$root/benchmarks/results}
mkdir -p "$out"
shim=$(mktemp -d)
ln -s "$root/kernels" "$shim/idmix_kernels"
export PYTHONPATH="$root:$shim${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
if [[ -d .whl && "${1:-}" != "--dry-run" ]]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site:$root/tools/recipes-hook"
fi
start=$(date +%s)
if [[ "${1:-}" == "--dry-run" ]]; then
    "$py" benchmarks/profile_gpu.py --dry-run --markdown "$out/dry_run_profile.md"
    "$py" benchmarks/bench_gpu.py --dry-run --markdown "$out/dry_run.md"
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
name=$("$py" - <<'PY'
import re, torch, triton
full = torch.cuda.get_device_name()
print("device:", full, "| torch", torch.__version__, "| triton", triton.__version__, flush=True)
m = re.search(r"\b([A-Z]\d{2,3})\b", full)
print(m.group(1).lower() if m else re.sub(r"\W+", "_", full).strip("_").lower())
PY
)
echo "$name" | head -1
device=$(echo "$name" | tail -1)
set +e
timeout "${PROFILE_SECONDS:-75}" "$py" benchmarks/profile_gpu.py \
    --markdown "$out/${device}_profile.md" 2>&1 | tee "$out/profile_gpu.txt"
profiled=${PIPESTATUS[0]}
echo "profile: exit $profiled after $(( $(date +%s) - start )) s"
timeout "${BENCH_SECONDS:-230}" "$py" benchmarks/bench_gpu.py --markdown "$out/$device.md" \
    --models-seconds "${MODELS_SECONDS:-80}" 2>&1 \
    | tee "$out/bench_gpu.txt"
bench=${PIPESTATUS[0]}
echo "benchmark: exit $bench after $(( $(date +%s) - start )) s"
timeout "${CHECKS_SECONDS:-150}" "$py" tests/kernel_checks.py cuda --keep-going 2>&1 \
    | tee "$out/gpu_tests.txt"
tests=${PIPESTATUS[0]}
set -e
{ echo; echo "GPU kernel checks (tests/kernel_checks.py cuda --keep-going): exit $tests"; \
  grep -E "^(ok|FAIL) |kernel checks" "$out/gpu_tests.txt"; \
  for check in $("$py" -c 'from tests import kernel_checks as k; print(*(c.__name__ for c in k.CHECKS))'); do
      grep -qE "^(ok|FAIL) +$check " "$out/gpu_tests.txt" || echo "not reached: $check"; done; echo; \
  echo "profile: exit $profiled; benchmark: exit $bench; whole run: $(( $(date +%s) - start )) s"; } \
  >> "$out/$device.md"
exit $(( tests || bench || profiled ))
