#!/usr/bin/env bash
# What to run on a GPU host after a change to templates or generated code: the GPU tests, one test
# file at a time under its own time limit (one slow file cannot take the others' time, and every
# finished file's result is written before the next starts), then optionally the kernel benchmark.
# Logs, JUnit XML per file and a summary go to ${OUT:-out}/.
#
#   scripts/gpu_check.sh                           every file with GPU tests, "gpu and not slow"
#   scripts/gpu_check.sh -m gpu tests/test_fft.py  the slow ones too, of one file
#   scripts/gpu_check.sh -t 120 --bench 16         120 s per file, then bench_kernels --samples 16
#   scripts/gpu_check.sh --by-op tests/test_gpu_kernels.py
#                                                  one run (and time limit) per operation's cases
#   scripts/gpu_check.sh -j 12 --by-function       one run per test function (all its parameters),
#                                                  12 at a time: the compiles of one run use one core,
#                                                  so runs side by side share the host's cores
#   scripts/gpu_check.sh -j 14 --by-case tests/test_tma.py::test_tma_kernels_verify_against_float64
#                                                  one run per collected test (each parameter alone)
#   scripts/gpu_check.sh -j 12 --by-function -T 560   no run starts or goes on past 560 s from the
#                                                  start (a deadline for the whole check); those left are
#                                                  listed NOT RUN
#
# The summary (last lines printed) has one row per file: passed, failed, errors, skipped, or
# TIMEOUT after the limit (the file's log says how far it got).
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"
mark="gpu and not slow"
per_file=240
bench=""
by_op=""
by_function=""
by_case=""
jobs=1
deadline=""
files=()
while [ $# -gt 0 ]; do
    case "$1" in
        -m) mark="$2"; shift 2 ;;
        -t) per_file="$2"; shift 2 ;;
        --bench) bench="$2"; shift 2 ;;
        --by-op) by_op=1; shift ;;
        --by-function) by_function=1; shift ;;
        --by-case) by_case=1; shift ;;
        -j) jobs="$2"; shift 2 ;;
        -T) deadline="$2"; shift 2 ;;
        -h|--help) sed -n 2,22p "$0"; exit 0 ;;
        -*) echo "gpu_check.sh: unknown option $1 (allowed: -m MARK, -t SECONDS, -j RUNS, -T SECONDS, --by-op, --by-function, --by-case, --bench SAMPLES)" >&2; exit 2 ;;
        *) files+=("$1"); shift ;;
    esac
done
case "$per_file" in ''|*[!0-9]*) echo "gpu_check.sh: -t takes whole seconds, not '$per_file'" >&2; exit 2 ;; esac
case "$jobs" in ''|0|*[!0-9]*) echo "gpu_check.sh: -j takes a number of runs of 1 or more, not '$jobs'" >&2; exit 2 ;; esac
case "$deadline" in *[!0-9]*) echo "gpu_check.sh: -T takes whole seconds, not '$deadline'" >&2; exit 2 ;; esac
began=$(date +%s)
if [ ${#files[@]} -eq 0 ]; then
    mapfile -t files < <(grep -l "pytest.mark.gpu" tests/test_*.py)
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__)" | tee -a "$out/gpu.txt"
summary="$out/gpu_tests_summary.txt"
: > "$summary"
rm -rf "$out/.lines"; mkdir -p "$out/.lines"
labels=()
# One pytest run under the time limit: its log (one line per test, so a run cut short still shows
# how far it got), JUnit XML and a summary line (in $out/.lines/, gathered in the order the runs
# were started once all have ended). Arguments: a label, then what pytest is given.
run_part() {
    local label=$1; shift
    local start rc took line limit=$per_file left
    start=$(date +%s)
    if [ -n "$deadline" ]; then
        left=$(( deadline - (start - began) ))
        [ "$left" -gt 10 ] || return 0     # listed NOT RUN
        [ "$left" -ge "$limit" ] || limit=$left
    fi
    timeout "$limit" python3 -m pytest -m "$mark" -v -p no:cacheprovider -rfE --tb=short \
        --junitxml="$out/$label.xml" "$@" > "$out/$label.log" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        line="TIMEOUT after ${limit} s ($(grep -c " PASSED" "$out/$label.log" 2>/dev/null || true) passed, \
$(grep -c " FAILED" "$out/$label.log" 2>/dev/null || true) failed before it)"
        touch "$out/.lines/$label.bad"
    else
        line=$(tail -1 "$out/$label.log" | sed 's/^=* *//; s/ *=*$//')
        # 5: every test deselected by the mark
        [ $rc -eq 0 ] || [ $rc -eq 5 ] || touch "$out/.lines/$label.bad"
    fi
    printf '%-34s %4ss  %s\n' "$label" "$took" "$line" | tee "$out/.lines/$label.txt"
}
# The test ids pytest collects under the mark from one file or id (printed from pytest's rootdir).
collect() {
    python3 -m pytest --collect-only -q -p no:cacheprovider -m "$mark" "$1" 2>/dev/null | grep "::"
}
# Starts a run, in the background when -j allows more than one, waiting first while -j are running.
start_part() {
    labels+=("$1")
    if [ "$jobs" -eq 1 ]; then run_part "$@"; return; fi
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    run_part "$@" &
}

for f in "${files[@]}"; do
    name=$(basename "${f%%::*}" .py)
    if [ -n "$by_op" ] && [ "$name" = test_gpu_kernels ]; then
        # One run per operation's family cases (each compiles only its own variants), then the rest.
        # Ids rebuilt from the file as given (pytest prints them from its rootdir).
        mapfile -t ids < <(collect "$f" | sed "s|^[^:]*::|${f%%::*}::|")
        for op in $(printf '%s\n' "${ids[@]}" | sed -n 's/.*::test_family_verifies\[\([a-z0-9_]*\)-.*/\1/p' | sort -u); do
            mapfile -t part < <(printf '%s\n' "${ids[@]}" | grep -F "::test_family_verifies[$op-")
            start_part "$name-$op" "${part[@]}"
        done
        # (grep . drops the empty line printf writes for no ids: a collection that found none.)
        mapfile -t part < <(printf '%s\n' "${ids[@]}" | grep -vF "::test_family_verifies[" | grep .)
        [ ${#part[@]} -eq 0 ] || start_part "$name-other" "${part[@]}"
    elif [ -n "$by_case" ]; then
        # One run per collected test id; the label is the id's function and parameters.
        mapfile -t ids < <(collect "$f")
        for id in "${ids[@]}"; do
            # pytest prints ids from its rootdir: the file as given here, then the id's rest.
            start_part "$name-$(printf '%s' "${id#*::}" | tr -c 'A-Za-z0-9_.=-' '_')" "${f%%::*}::${id#*::}"
        done
    elif [ -n "$by_function" ]; then
        # One run per test function that has a test under the mark, all its parameters together.
        mapfile -t fns < <(collect "$f" | sed -n 's/^[^:]*::\([A-Za-z0-9_]*\).*/\1/p' | awk '!seen[$0]++')
        for fn in "${fns[@]}"; do
            start_part "$name-$fn" "${f%%::*}::$fn"
        done
    else
        start_part "$name" "$f"
    fi
done
wait
status=0
for label in "${labels[@]}"; do
    if [ -f "$out/.lines/$label.txt" ]; then cat "$out/.lines/$label.txt" >> "$summary"
    else printf '%-34s        %s\n' "$label" "NOT RUN (ended before it)" >> "$summary"; fi
    [ ! -f "$out/.lines/$label.bad" ] && [ -f "$out/.lines/$label.txt" ] || status=1
done
if [ -n "$bench" ]; then
    timeout 250 python3 scripts/bench_kernels.py --samples "$bench" --out "$out/bench_kernels.json" \
        > "$out/bench.log" 2>&1
    tail -70 "$out/bench.log"
fi
echo "# GPU tests (-m '$mark', ${per_file} s per run):"
cat "$summary"
exit $status
