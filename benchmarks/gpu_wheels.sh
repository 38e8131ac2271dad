#!/usr/bin/env bash
# The wheels that the models' decoding table (benchmarks/decode_models.py) needs on the GPU
# image, which holds torch and triton but not torchtune, tensordict or what they import. Run
# here (PyPI reachable), then name .whl in the device call's carry; gpu_check.sh installs them
# into a temporary folder. Versions as constraints.txt pins them (and the versions installed
# beside them); Python 3.12 wheels for x86-64 Linux. 8.3 MB.
#
#   bash benchmarks/gpu_wheels.sh            # writes .whl/ (ignored by git)
set -euo pipefail
cd "$(dirname "$0")/.."
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
    manylinux2014_x86_64; do
    platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d .whl \
    torchtune==0.6.1 tensordict==0.15.3 pyvers==0.2.3 torchao==0.17.0 torchdata==0.11.0 \
    datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 omegaconf==2.4.0 blobfile==3.3.0 \
    pycryptodomex==3.24.2 kagglehub==1.0.3
ls .whl
