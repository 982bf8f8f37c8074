#!/usr/bin/env bash
# What to run on a GPU host after a change to templates or generated code: the GPU tests, then the
# kernel benchmark. Logs and JSON go to ${OUT:-out}/. Usage: scripts/gpu_check.sh [samples]
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"
samples=${1:-16}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__)" | tee -a "$out/gpu.txt"
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log" | tail -40
timeout 250 python3 scripts/bench_kernels.py --samples "$samples" --out "$out/bench_kernels.json" 2>&1 | tee "$out/bench.log" | tail -70
