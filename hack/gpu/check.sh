#!/usr/bin/env bash
# The trainer on one GPU, offline: bench/gpu.py with what the machine lacks carried as
# wheels (hack/gpu/wheels.sh makes them here). Uses the machine's own torch (2.11-2.13).
#
#   OUT=DIR bash hack/gpu/check.sh [bench/gpu.py options: --only, --budget, --quick]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUT=${OUT:-gpu-bench}
if compgen -G ".gpu-wheels/*.whl" >/dev/null; then
    site=/tmp/llmtrain-gpu-site
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .gpu-wheels/*.whl
    export PYTHONPATH=$site
fi
export PYTHONPATH=$PWD/trainer_image:$PWD/common:$PWD/operator${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 LLMTRAIN_GPU_BENCH_DISK=${LLMTRAIN_GPU_BENCH_DISK:-/var/tmp}
mkdir -p "$LLMTRAIN_GPU_BENCH_DISK" "$OUT"
nvidia-smi || true
exec $PY bench/gpu.py --out "$OUT" "$@"
