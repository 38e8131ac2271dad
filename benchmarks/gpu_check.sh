#!/usr/bin/env bash
# The one prepared GPU run (docs/gpu.md): on a CUDA machine, the kernel checks against the
# PyTorch path on the GPU (tests/kernel_checks.py: every kernel, shape, dtype and precision), then
# the benchmark against SDPA's flash backend and the decode step (benchmarks/bench_gpu.py),
# which writes benchmarks/results/h200.md (or $OUT/h200.md when $OUT is set: the device tool's
# folder that comes back), then each kernel's share of the time (benchmarks/profile_gpu.py,
# h200_profile.md). Meant to finish in under 8 minutes on an H200.
#
#   bash benchmarks/gpu_check.sh             # on the GPU machine, from the repository root
#   bash benchmarks/gpu_check.sh --dry-run   # the benchmark and profile steps on CPU, tiny, interpreted
#
# It needs only torch and triton: idmix runs from the checkout (PYTHONPATH), with the
# kernels package reachable as idmix_kernels through a link, so nothing is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-$root/benchmarks/results}
mkdir -p "$out"
shim=$(mktemp -d)
ln -s "$root/kernels" "$shim/idmix_kernels"
export PYTHONPATH="$root:$shim${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
start=$(date +%s)
if [[ "${1:-}" == "--dry-run" ]]; then
    "$py" benchmarks/bench_gpu.py --dry-run --markdown "$out/h200.md"
    "$py" benchmarks/profile_gpu.py --dry-run --markdown "$out/h200_profile.md"
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
"$py" - <<'PY'
import torch, triton
print("device:", torch.cuda.get_device_name(), "| torch", torch.__version__, "| triton", triton.__version__)
PY
# Each stage has its own time cap, so a slow first stage still leaves the benchmark its turn;
# the kernel checks keep going past a failure and print every one.
set +e
timeout "${CHECKS_SECONDS:-300}" "$py" tests/kernel_checks.py cuda --keep-going 2>&1 \
    | tee "$out/gpu_tests.txt"
tests=${PIPESTATUS[0]}
echo "kernel checks: exit $tests after $(( $(date +%s) - start )) s"
timeout "${BENCH_SECONDS:-100}" "$py" benchmarks/bench_gpu.py --markdown "$out/h200.md" 2>&1 \
    | tee "$out/bench_gpu.txt"
bench=${PIPESTATUS[0]}
timeout "${PROFILE_SECONDS:-60}" "$py" benchmarks/profile_gpu.py --markdown "$out/h200_profile.md" \
    2>&1 | tee "$out/profile_gpu.txt"
profiled=${PIPESTATUS[0]}
set -e
{ echo; echo "GPU kernel checks (tests/kernel_checks.py cuda --keep-going): exit $tests"; \
  grep -E "^(ok|FAIL) |kernel checks" "$out/gpu_tests.txt"; \
  for name in $("$py" -c 'from tests import kernel_checks as k; print(*(c.__name__ for c in k.CHECKS))'); do
      grep -qE "^(ok|FAIL) +$name " "$out/gpu_tests.txt" || echo "not reached: $name"; done; echo; \
  echo "benchmark: exit $bench; profile: exit $profiled; whole run: $(( $(date +%s) - start )) s"; } >> "$out/h200.md"
exit $(( tests || bench || profiled ))
