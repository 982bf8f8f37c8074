"""Wall time of ``autocnn tune --network`` on one GPU against several, and the tuned step each gives.

Each run is the real command in a process of its own, with fresh caches (compiled kernels, CuPy's,
the Optuna storage) and an empty user tuning database, so that no run profits from another's
compilations or records. Run it from a source tree whose ``tuning_db/`` holds no records for this
GPU kind if the shipped records should not take part (the lookup would otherwise prefer a faster
shipped record over what a run found, and both steps would run the same kernels).

After the tuning runs, the training step (forward, loss, backward, Adam, captured as a CUDA graph)
is timed on each run's database, the runs alternated ``--step-rounds`` times. Prints a table last
and writes JSON.

    python scripts/bench_multi_device.py --network convnet18 --trials 160 --runs 0 0,1 --out multi.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent


def tune_run(network: str, batch: int, trials: int, devices: str, work: Path, timeout_s: float) -> dict:
    """One ``autocnn tune --network`` in a fresh process with fresh caches; its wall time and results."""
    for sub in ("db", "cache", "cupy"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, AUTOCNN_TUNING_DB=str(work / "db"), AUTOCNN_CACHE_DIR=str(work / "cache"),
               CUPY_CACHE_DIR=str(work / "cupy"))
    cmd = [sys.executable, "-m", "autocnn.cli", "tune", "--network", network, "--batch", str(batch),
           "--trials", str(trials), "--devices", devices, "--storage", f"sqlite:///{work / 'optuna.db'}",
           "--no-cudnn", "--json"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"autocnn tune --devices {devices} exited {done.returncode}")
    results = json.loads(done.stdout)["results"]
    return {"devices": devices, "wall_s": wall, "problems": len(results),
            "trials_measured": sum(r["measured"] for r in results),
            "tuned_us_sum": sum(r["tuned_us"] for r in results if r.get("tuned_us") is not None),
            "results": results}


def step_time(network: str, batch: int, steps: int, db_dir: Path) -> float:
    """The graphed training step's time (ms) on one database, in a process of its own."""
    env = dict(os.environ, AUTOCNN_TUNING_DB=str(db_dir))
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from bench_training import time_autocnn_cuda\n"
            "from autocnn import nn\n"
            "model = nn.build_network(%r, backend='cuda', seed=0)\n"
            "print(time_autocnn_cuda(model, %d, %d))\n") % (str(SCRIPTS), network, batch, steps)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"timing the step on {db_dir} failed")
    return float(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--network", default="convnet18")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--trials", type=int, default=160, help="trials for the whole network, every run")
    parser.add_argument("--runs", nargs="+", default=["0", "0,1"], help="a --devices value per run")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per measurement")
    parser.add_argument("--step-rounds", type=int, default=3, help="alternated step timings per run")
    parser.add_argument("--timeout", type=float, default=560.0, help="seconds one tuning run may take")
    parser.add_argument("--out", default="bench_multi_device.json")
    args = parser.parse_args(argv)
    for spec in args.runs:   # the CLI checks them too, but only after a process has started
        if not spec or not all(p.strip().isdigit() for p in spec.split(",")):
            parser.error(f"--runs takes --devices values such as 0 or 0,1, not {spec!r}")
    root = Path(tempfile.mkdtemp(prefix="autocnn-multi-"))
    rows = []
    try:
        for i, spec in enumerate(args.runs):
            print(f"tuning {args.network} (batch {args.batch}, {args.trials} trials) on GPUs {spec}", flush=True)
            row = tune_run(args.network, args.batch, args.trials, spec, root / f"run{i}", args.timeout)
            print(f"  {row['wall_s']:.1f} s, {row['trials_measured']} trials measured", flush=True)
            row["step_ms"] = []
            rows.append(row)
        for _ in range(args.step_rounds):
            for i, row in enumerate(rows):
                row["step_ms"].append(step_time(args.network, args.batch, args.steps, root / f"run{i}" / "db"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = rows[0]
    for row in rows:
        row["step_ms_median"] = statistics.median(row["step_ms"])
        row["wall_vs_first"] = row["wall_s"] / base["wall_s"]
        row["step_vs_first"] = row["step_ms_median"] / base["step_ms_median"]
    Path(args.out).write_text(json.dumps({"network": args.network, "batch": args.batch, "trials": args.trials,
                                          "runs": rows}, indent=2))
    print(f"\n{args.network}, batch {args.batch}, {args.trials} trials for the network, fresh caches each run")
    print(f"{'--devices':>10} {'wall s':>8} {'x first':>8} {'trials':>7} {'sum tuned us':>13} "
          f"{'step ms':>8} {'x first':>8}")
    for row in rows:
        print(f"{row['devices']:>10} {row['wall_s']:8.1f} {row['wall_vs_first']:8.2f} {row['trials_measured']:7d} "
              f"{row['tuned_us_sum']:13.1f} {row['step_ms_median']:8.3f} {row['step_vs_first']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
