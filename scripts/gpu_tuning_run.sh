#!/usr/bin/env bash
# Tuning runs on a GPU host, one step after another, each under its own time limit.
# Results accumulate in RUN (default .data/run): the Optuna storage run/optuna.db and the tuning
# database run/db/; logs and recorded replay files go to OUT. Usage:
#   scripts/gpu_tuning_run.sh replay faults trials100 suite:conv_fwd suite:conv_bwd_data ...
# A GPU without a full set of records of its own, one step at a time:
#   scripts/gpu_tuning_run.sh missing:fp32        the seed suite's convolutions without a record of
#   scripts/gpu_tuning_run.sh missing:tf32        this GPU's own, TRIALS each (default 30)
#   scripts/gpu_tuning_run.sh zoo:kriz09 ...      a zoo network's kernels without one, at batch 128
#   scripts/gpu_tuning_run.sh bench accuracy      the suite in both precisions beside cuDNN; the
#                                                 accuracy table (MEASUREMENTS.md)
#   scripts/gpu_tuning_run.sh fft:radix           the fft rows retuned with the radix transforms:
#                                                 their records' neighbours first, then a search
#                                                 (scherer10_l2's backward-data with radix both ways)
# A step that its time limit (SUITE_TIMEOUT, default 240 s) cuts off keeps the records it finished:
# run it again and --missing takes up the rest. Ship the records with scripts/ship_records.py.
set -uo pipefail
run=${RUN:-.data/run}; out=${OUT:-out}
mkdir -p "$run/db" "$out"
export AUTOCNN_TUNING_DB="$PWD/$run/db" PYTHONUNBUFFERED=1
storage="sqlite:///$PWD/$run/optuna.db"
kriz=N=128,C=3,H=32,W=32,K=64,R=8,S=8,stride=1,pad=4,4,3,3
# autocnn tune under the step's time limit with the run's trials, storage and output; $1 the log.
tune() {
  local log=$1; shift
  timeout ${SUITE_TIMEOUT:-240} python3 -m autocnn.cli tune "$@" --trials ${TRIALS:-30} \
    ${TUNE_TIMEOUT:+--timeout $TUNE_TIMEOUT} --storage "$storage" --no-progress 2>&1 | tee -a "$out/$log"
}
for step in "$@"; do
  echo "=== $step $(date +%T)"
  case "$step" in
    replay)
      rm -rf "$run/replay"
      for op in avgpool_fwd avgpool_bwd; do
        timeout 120 python3 scripts/record_replay.py --op $op --shapes kriz09_pool,convnet18_pool,modern_pool \
          --out "$run/replay" 2>&1 | tee -a "$out/replay.log" | tail -3
      done
      timeout 200 python3 scripts/record_replay.py --op conv_wgrad --shapes scherer10_l1,convnet18_c1,chellapilla06_c2 \
        --fix formulation=atomic,PAD_A=1,PAD_B=1,UNROLL_K=0,BK=16 --out "$run/replay" 2>&1 | tee -a "$out/replay.log" | tail -3
      tar czf "$out/replay.tar.gz" -C "$run" replay ;;
    faults)
      timeout 150 python3 scripts/fault_injection.py --op conv_fwd --shape kriz09 --trials 24 2>&1 | tee "$out/faults.log" | tail -12 ;;
    trials100)
      # One shape, 100 measured trials, wall time measured around the whole command.
      t0=$(date +%s.%N)
      timeout 120 python3 -m autocnn.cli tune --op conv_fwd --shape $kriz --trials 100 \
        --storage "$storage" --cudnn --no-progress 2>&1 | tee "$out/trials100.log" | tail -4
      echo "wall time of the whole command: $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s" | tee -a "$out/trials100.log" ;;
    suite:*)
      op=${step#suite:}
      tune suite.log --suite seed --ops $op --cudnn | grep -v "^\(conv\|avgpool\)_[a-z_]* [a-z]" | tail -16 ;;
    missing:*)
      precision=${step#missing:}
      tune missing_$precision.log --suite seed --ops conv_fwd,conv_bwd_data,conv_wgrad --missing --precision $precision \
        --cudnn | tail -16 ;;
    zoo:*)
      net=${step#zoo:}
      tune zoo_$net.log --network $net --batch 128 --missing | tail -8 ;;
    fft:radix)
      timeout ${SUITE_TIMEOUT:-240} python3 scripts/tune_rows.py --rows sweep_7x7,sweep_11x11 --precisions fp32,tf32 \
        --fix formulation=fft --vary XFORM_A,XFORM_B,XFORM_O,RADIX_THREADS --budget $(( ${SUITE_TIMEOUT:-240} - 30 )) \
        --storage "$storage" 2>&1 | tee -a "$out/fft_radix.log" | tail -14
      # radix both ways also needs WS_SHARE=0 and FFT_VEC=1, which --vary's one-parameter steps do not reach.
      timeout ${SUITE_TIMEOUT:-240} python3 scripts/tune_rows.py --rows scherer10_l2 --ops conv_bwd_data \
        --precisions fp32,tf32 --fix formulation=fft,XFORM_A=radix,XFORM_O=radix,WS_SHARE=0,FFT_VEC=1 \
        --budget $(( ${SUITE_TIMEOUT:-240} - 30 )) --storage "$storage" 2>&1 | tee -a "$out/fft_radix.log" | tail -6 ;;
    bench)
      timeout ${SUITE_TIMEOUT:-400} python3 scripts/bench_kernels.py --samples 0 --precision both --cudnn-processes 2 \
        --ops conv_fwd,conv_bwd_data,conv_wgrad --out "$out/bench.json" > "$out/bench.log" 2>&1
      grep -E "^\| (conv|\*\*)|^# (fp32|tf32|measured)" "$out/bench.log" | tail -48 ;;
    accuracy)
      timeout ${SUITE_TIMEOUT:-400} python3 scripts/accuracy_table.py --out "$out/accuracy.json" 2>&1 \
        | tee "$out/accuracy.log" | tail -20 ;;
    *) echo "unknown step $step (allowed: replay, faults, trials100, suite:OP, missing:fp32|tf32, zoo:NET, fft:radix, bench, accuracy)" ;;
  esac
done
cp "$run/optuna.db" "$out/optuna.db" 2>/dev/null
cp "$run"/db/*.json "$out/" 2>/dev/null
ls -la "$out"
