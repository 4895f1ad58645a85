#!/usr/bin/env bash
# Device-side wrapper for benchmarks/gpu/gpu_bench.py on a lent GPU machine (no network).
#
# Prepare here, once, from the repository root (.whl/ is ignored through .git/info/exclude):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux2014_x86_64 -d .whl ml_collections==1.1.0
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux2014_x86_64 -d .whl/fallback flax==0.12.8 optax==0.2.8
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
#       -d .whl/extra $(grep -iE "^(grain|array_record|portpicker|qwix|zstandard)==" constraints.txt)
#   mkdir -p .whl/snap/benchmarks && cp -r t5x_like configs .whl/snap/ \
#       && cp benchmarks/_smoke.py benchmarks/model_step.py benchmarks/decode_speed.py .whl/snap/benchmarks/
# (.whl/snap is a frozen copy of the package, so concurrent edits of the tree do not travel
# into the measurement.) Then run, through the device tool, with carry [".whl"]:
#   bash benchmarks/gpu/run_device.sh [--script low_precision_bench.py] [extra flags]
# (--script picks the benchmark in benchmarks/gpu/; gpu_bench.py by default.)
# It installs ml_collections and .whl/extra's wheels (missing there: the H200 of 2026-12-04
# lacked grain, array_record, portpicker, qwix and zstandard) into a fresh /tmp/site (a warm
# machine keeps the last call's, whose fallback flax may not import with its JAX), falls
# back to the pinned flax/optax if t5x_like does not import with the machine's own, and
# writes $OUT/log.txt and $OUT/results.json.
set -u
SCRIPT=gpu_bench.py
if [ "${1:-}" = "--script" ]; then SCRIPT=$2; shift 2; fi
OUT=${OUT:-/tmp/gpu_bench_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/ml_collections-*.whl $(ls .whl/extra/*.whl 2>/dev/null) || exit 1
export PYTHONPATH=/tmp/site
check='import sys; sys.path[:0]=[".whl/snap", ".whl/snap/benchmarks"]; import model_step, decode_speed, t5x_like.engine.trainer, t5x_like.models.decoding'
if ! python3 -c "$check"; then
    echo "t5x_like does not import with this machine's flax/optax: using pinned fallback"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/fallback/*.whl || exit 1
    python3 -c "$check" || exit 1
fi
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=1 \
    TOKENIZERS_PARALLELISM=false
timeout -s INT "${GPU_BENCH_TIMEOUT:-380}" python3 "benchmarks/gpu/$SCRIPT" \
    --src .whl/snap --out "$OUT/results.json" "$@"
echo "rc=$?"
nvidia-smi --query-gpu=memory.used,clocks.sm,temperature.gpu --format=csv,noheader
