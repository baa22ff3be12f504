#!/usr/bin/env bash
# kiln on a GPU machine, in one go (~10 min): the CUDA correctness check, then eager vs kiln vs
# torch.compile. The GPU machine has Python 3.12, torch, triton and transformers but no network and
# no `bytecode`, which capture needs: carry it as a wheel.
#
#   here, with a network:   bench/gpu.sh prepare      (downloads the wheels into wheels/, git-ignored)
#   there (device tool run, carry ["wheels"]):  bench/gpu.sh
#
# Writes gpu-check.txt, gpu-bench.txt and gpu-bench.json into $OUT (default bench/).
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == prepare ]]; then
    exec python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --dest wheels "bytecode==0.19.1"
fi
python -c "import bytecode" 2>/dev/null ||
    python -m pip install --quiet --no-index --no-deps --find-links wheels bytecode || exit 1
export PYTHONPATH=$PWD KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-cache-gpu}
OUT=${OUT:-bench}
python -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', \
triton.__version__, torch.cuda.get_device_name())"
# the seam's tests (the interpreter ones skip: kernels run compiled here)
timeout 120 python -m pytest -q -p no:cacheprovider tests/compiler/test_triton_backend.py 2>&1 | tail -3
timeout 240 python -m bench.gpu_check 2>&1 | tee "$OUT/gpu-check.txt"
timeout 330 python -m bench.gpu_bench --budget 270 --json "$OUT/gpu-bench.json" 2>&1 | tee "$OUT/gpu-bench.txt"
