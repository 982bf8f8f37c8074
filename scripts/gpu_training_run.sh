#!/usr/bin/env bash
# The training run on a GPU host: GPU training tests, a per-operation profile of the step,
# the training benchmark and lenet5 on Fashion-MNIST. Logs and JSON go to OUT.
# Fashion-MNIST's IDX files are read from DATA (default .data/fashion-mnist).
# TUNE=N first tunes every zoo network's kernels at the benchmark's batch sizes with N trials per
# kernel problem (the records go to $AUTOCNN_TUNING_DB and are exported to $OUT/zoo_records.json).
set -uo pipefail
out=${OUT:-out}; data=${DATA:-.data/fashion-mnist}; tune=${TUNE:-0}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 AUTOCNN_TUNING_DB="${AUTOCNN_TUNING_DB:-$PWD/.data/userdb}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
echo "=== GPU training tests $(date +%T)"
timeout "${TEST_S:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_training.py 2>&1 \
  | tee "$out/gpu_training_tests.log" | tail -8
if [ "$tune" -gt 0 ]; then
  echo "=== tuning the zoo networks, $tune trials per problem $(date +%T)"
  for spec in kriz09:128 scherer10:60 convnet18:128 chellapilla06:128 lenet5:128; do
    net=${spec%%:*}; batch=${spec##*:}
    problems=$(python3 -c "from autocnn import nn; print(len(nn.build_network('$net').problems($batch)))")
    timeout "${TUNE_S:-90}" python3 -m autocnn.cli tune --network "$net" --batch "$batch" --no-progress \
      --trials $((tune * problems)) --timeout $(( ${TUNE_S:-90} - 15 )) 2>&1 | tee -a "$out/tune_zoo.log" | tail -4
  done
  python3 -m autocnn.cli db export "$out/zoo_records.json" 2>&1 | tail -1
fi
echo "=== profile of the step $(date +%T)"
timeout 90 python3 scripts/profile_step.py --out "$out/profile_step.json" 2>&1 | tee "$out/profile_step.log" | tail -80
echo "=== training benchmark $(date +%T)"
timeout 200 python3 scripts/bench_training.py --steps 40 --cpu-steps 2 --out "$out/bench_training.json" 2>&1 \
  | tee "$out/bench_training.log" | tail -9
echo "=== lenet5 on Fashion-MNIST $(date +%T)"
timeout 90 python3 -m autocnn.cli train --network lenet5 --dataset fashion-mnist --data-root "$data" --epochs 10 \
  --batch-size 64 --backend cuda --optimizer adam --seed 0 2>&1 | tee "$out/lenet5.log" | grep -v "it/s\]$" | tail -16
echo "=== done $(date +%T)"
