#!/usr/bin/env bash
# The one prepared GPU run (docs/gpu.md): on a CUDA machine, the kernel tests against the
# PyTorch path on the GPU (tests -m gpu: every kernel, shape, dtype and precision there), then
# the benchmark against SDPA's flash backend and the decode step (benchmarks/bench_gpu.py),
# which writes benchmarks/results/h200.md (or $OUT/h200.md when $OUT is set: the device tool's
# folder that comes back). Meant to finish in under 8 minutes on an H200.
#
#   bash benchmarks/gpu_check.sh             # on the GPU machine, from the repository root
#   bash benchmarks/gpu_check.sh --dry-run   # the same steps on CPU, tiny, in the interpreter
#
# It needs only torch, triton and pytest: idmix runs from the checkout (PYTHONPATH), with the
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
    exit 0
fi
"$py" - <<'PY'
import torch, triton
print("device:", torch.cuda.get_device_name(), "| torch", torch.__version__, "| triton", triton.__version__)
PY
set +e
"$py" -m pytest -p no:cacheprovider -q -m gpu tests/test_kernels.py 2>&1 | tee "$out/gpu_tests.txt"
tests=${PIPESTATUS[0]}
set -e
echo "kernel tests: exit $tests after $(( $(date +%s) - start )) s"
"$py" benchmarks/bench_gpu.py --markdown "$out/h200.md" 2>&1 | tee "$out/bench_gpu.txt"
{ echo; echo "GPU kernel tests (pytest -m gpu tests/test_kernels.py): exit $tests"; \
  tail -3 "$out/gpu_tests.txt"; echo; echo "whole run: $(( $(date +%s) - start )) s"; } >> "$out/h200.md"
exit "$tests"
