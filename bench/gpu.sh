#!/usr/bin/env bash
# kiln on a GPU machine, in one go (~10 min): the CUDA correctness check, then eager vs kiln vs
# torch.compile. The GPU machine has Python 3.12, torch, triton and transformers but no network and
# no `bytecode`, which capture needs (nor, perhaps, pytest): carry them as wheels.
#
#   here, with a network:   bench/gpu.sh prepare      (downloads the wheels into wheels/, git-ignored)
#   there (device tool run, carry ["wheels"]):  bench/gpu.sh
#   here, without a GPU:    bench/gpu.sh dry          (every step on CPU tensors through Triton's
#                                                      interpreter, toy sizes: the script works)
#
# Writes gpu-check.txt, gpu-bench.txt and gpu-bench.json into $OUT (default bench/).
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS="bytecode==0.19.1 pytest==9.0.3 pluggy==1.6.0 iniconfig==2.3.0 packaging==26.2 pygments==2.19.2"
if [[ "${1:-}" == prepare ]]; then
    exec python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --dest wheels $WHEELS
fi
SCRIPT_ARGS=()
if [[ "${1:-}" == dry ]]; then
    export TRITON_INTERPRET=1 KILN_DEVICE_BACKEND=cpu:triton
    SCRIPT_ARGS=(--device cpu --small)
fi
for module in bytecode pytest; do
    python -c "import $module" 2>/dev/null ||
        python -m pip install --quiet --no-index --find-links wheels "$module" || exit 1
done
export PYTHONPATH=$PWD KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-cache-gpu}
OUT=${OUT:-bench}
python -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', \
triton.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU (dry run)')"
# the seam's tests (on a GPU the interpreter ones skip: kernels run compiled there)
timeout "${TEST_TIMEOUT:-120}" python -m pytest -q -p no:cacheprovider tests/compiler/test_triton_backend.py 2>&1 | tail -3
timeout "${CHECK_TIMEOUT:-240}" python -m bench.gpu_check "${SCRIPT_ARGS[@]}" 2>&1 | tee "$OUT/gpu-check.txt"
timeout "${BENCH_TIMEOUT:-330}" python -m bench.gpu_bench "${SCRIPT_ARGS[@]}" --budget "${BENCH_BUDGET:-270}" \
    --json "$OUT/gpu-bench.json" 2>&1 | tee "$OUT/gpu-bench.txt"
