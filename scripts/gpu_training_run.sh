#!/usr/bin/env bash
# The training session on a GPU host: GPU training tests, lenet5 on Fashion-MNIST, the training
# benchmark, the fault-injection run and a short kernel check. Logs and JSON go to OUT.
# Fashion-MNIST's IDX files are read from DATA (default .data/fashion-mnist).
set -uo pipefail
out=${OUT:-out}; data=${DATA:-.data/fashion-mnist}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 AUTOCNN_TUNING_DB="$PWD/.data/userdb"
echo "=== GPU training tests $(date +%T)"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_training.py 2>&1 | tee "$out/gpu_training_tests.log" | tail -6
echo "=== lenet5 on Fashion-MNIST $(date +%T)"
timeout 100 python3 -m autocnn.cli train --network lenet5 --dataset fashion-mnist --data-root "$data" --epochs 10 \
  --batch-size 128 --backend cuda --optimizer adam --seed 0 2>&1 | tee "$out/lenet5.log" | grep -v "it/s\]$" | tail -16
echo "=== training benchmark $(date +%T)"
timeout 190 python3 scripts/bench_training.py --steps 40 --cpu-steps 2 --out "$out/bench_training.json" 2>&1 \
  | tee "$out/bench_training.log" | tail -9
echo "=== fault injection $(date +%T)"
timeout 70 python3 scripts/fault_injection.py --op conv_fwd --shape kriz09 --trials 12 --timeout 15 2>&1 \
  | tee "$out/faults.log" | grep -v "^\[I\|Traceback\|File \"cupy" | tail -9
echo "=== kernel check $(date +%T)"
AUTOCNN_GPU_SAMPLES=3 timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_kernels.py 2>&1 \
  | tee "$out/gpu_kernel_tests.log" | tail -3
echo "=== done $(date +%T)"
