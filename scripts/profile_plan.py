#!/usr/bin/env python3
"""Where one kernel plan's time goes: each step (generated kernel, cuBLAS GEMM, cuFFT transform)
timed alone with CUDA events, next to the whole plan under the timing protocol (cold L2).

A step timed alone starts with whatever its predecessor left in L2 (the plan ran just before), as
in the plan itself; its time is the median of repeated launches. The clearing of outputs that some
plans do before their first kernel (zero_first memsets) is not a step and is not listed. The plan's outputs are verified
against float64 first: a config that computes the wrong thing is reported, not timed.

    python scripts/profile_plan.py --op conv_bwd_data \\
        --shape "N=128,C=64,H=32,W=32,K=64,R=11,S=11,stride=1,pad=5" \\
        --config '{"formulation": "fft", ...}' --config record --out profile.json

``--config record`` (the default) profiles what autocnn runs for the problem on this GPU: the
lookup's answer. Each --config is a JSON object of parameters, checked against the space.

``--ncu KERNEL`` also runs the script again under Nsight Compute for each config, profiling the
first launch of that kernel of the plan, and prints what bounds it (autocnn.measurement.nsight): its
throughput at each level of the memory system, the busiest pipe, the warps ready to issue, the
occupancy and what capped it. ncu locks the clocks (the profiled time is not the timed one).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if TYPE_CHECKING:
    from autocnn.measurement.nsight import NsightSummary

# One config under ncu: a few dozen replays of one launch, seconds for the seed layers; a hung
# profiler is reported, not waited on forever.
NCU_TIMEOUT_S = 600


def step_name(step) -> str:
    from autocnn.kernels.steps import LibraryComplexGemm, LibraryFft, LibraryGemm

    if isinstance(step, LibraryFft):
        layout = " frequency-major" if step.frequency_major else ""
        return f"cuFFT {step.kind} {step.batch}x{step.height}x{step.width}{layout}"
    if isinstance(step, LibraryGemm):
        return f"cuBLAS {step.kernel}"
    if isinstance(step, LibraryComplexGemm):
        return (f"cuBLAS complex GEMM {step.batch}x({step.m}x{step.n}x{step.k}) "
                f"{step.op_a}{step.op_b}{' tf32' if step.tf32 else ''}")
    return f"{step.kernel} {step.grid}x{step.block[0]}" + (f" smem {step.shared_bytes}" if step.shared_bytes else "")


def profile(plan, problem, flusher, budget_s: float) -> dict:
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate, plan_buffers, time_callable

    config = plan.config
    loaded = KernelLoader().load(plan)
    check = check_candidate(loaded, problem, flusher=flusher, budget_s=budget_s)
    row = {"config": config.as_dict(), "verified": check.verification.passed,
           "message": check.verification.message, "plan_us": check.timing.median_us if check.timing else None,
           "steps": []}
    if not check.verification.passed:
        return row
    _inputs, _outputs, buffers = plan_buffers(loaded, problem, 0)
    loaded(buffers)   # every step then starts from what its predecessors wrote
    for step in plan.steps:
        t = time_callable(lambda s=step: loaded.run_step(s, buffers), budget_s=budget_s / 4, min_reps=5)
        row["steps"].append({"step": step_name(step), "us": t.median_us})
    return row


def profile_under_ncu(ncu: str, args: argparse.Namespace, config) -> NsightSummary:
    """This script again, for this config alone, under ncu (its first launch of args.ncu); the summary
    of ncu's report."""
    from autocnn.errors import DeviceError
    from autocnn.measurement.nsight import ncu_command, summarize

    program = [sys.executable, str(Path(__file__).resolve()), "--op", args.op, "--shape", args.shape,
               "--config", json.dumps(config.as_dict()), "--budget", "0.02", "--device", str(args.device)]
    try:
        done = subprocess.run(ncu_command(ncu, args.ncu, program), capture_output=True, text=True,
                              timeout=NCU_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise DeviceError(f"ncu did not finish within {NCU_TIMEOUT_S} s") from None
    return summarize(done.stdout + done.stderr, args.ncu)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", required=True)
    ap.add_argument("--shape", required=True, help="as `autocnn tune --shape`")
    ap.add_argument("--config", action="append", default=None,
                    help="a JSON object of parameters, or 'record' (the lookup's answer); repeatable")
    ap.add_argument("--budget", type=float, default=0.3, help="seconds of timed runs per plan")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--ncu", metavar="KERNEL", help="also profile this kernel of each plan under Nsight Compute")
    ap.add_argument("--ncu-path", help="the ncu executable (default: ncu on PATH, then CUDA's bin)")
    args = ap.parse_args(argv)

    from autocnn.kernels.problem import parse_shape
    from autocnn.kernels import get_operation
    from autocnn.measurement.nsight import NcuMissingError, find_ncu

    try:
        problem = parse_shape(args.op, args.shape)
        operation = get_operation(args.op)
        operation.check_problem(problem)
        texts = args.config or ["record"]
        configs_json = [None if t == "record" else json.loads(t) for t in texts]
        ncu = find_ncu(args.ncu_path) if args.ncu else None
    except (ValueError, KeyError, NcuMissingError) as exc:
        ap.error(str(exc))

    from autocnn.gpu import require_cupy
    from autocnn.store import TuningDatabase
    from autocnn.device import current_device
    from autocnn.measurement.measure import L2Flusher

    from autocnn.errors import AutocnnError

    try:
        cp = require_cupy()
        cp.cuda.Device(args.device).use()
        device = current_device(args.device)
        space = operation.space(problem, device.limits())
        configs = []
        for given in configs_json:
            if given is None:
                looked = TuningDatabase().lookup(device, problem)
                print(f"# record: {looked.source}: {looked.detail}")
                configs.append(looked.config)
            else:
                configs.append(space.validate(given))
        plans = [operation.plan(problem, config) for config in configs]
        for plan in plans if ncu else ():
            if args.ncu not in plan.kernel_names:
                raise AutocnnError(f"--ncu {args.ncu}: the plan of {plan.config} has no such kernel; its kernels are "
                                   f"{', '.join(plan.kernel_names)}")
    except AutocnnError as exc:
        print(f"profile_plan: {exc}", file=sys.stderr)
        return 1
    flusher = L2Flusher(device.l2_bytes)
    print(f"# {device.name}: {args.op} {problem.shape_string()}")
    rows = []
    for config, plan in zip(configs, plans):
        row = profile(plan, problem, flusher, args.budget)
        rows.append(row)
        print(f"\n{config}")
        if not row["verified"]:
            print(f"  fails verification: {row['message']}")
            continue
        total = sum(s["us"] for s in row["steps"])
        for s in row["steps"]:
            print(f"  {s['us']:9.1f} us {100 * s['us'] / total:5.1f}%  {s['step']}")
        print(f"  {total:9.1f} us sum of steps; the plan under the timing protocol: {row['plan_us']:.1f} us")
        if ncu:
            try:
                summary = profile_under_ncu(ncu, args, config)
            except AutocnnError as exc:
                print(f"  ncu: {exc}")
                row["ncu_error"] = str(exc)
                continue
            row["ncu"] = summary.to_dict()
            for line in summary.lines():
                print(f"  {line}")
    if args.out:
        args.out.write_text(json.dumps({"device": device.name, "op": args.op, "problem": problem.to_dict(),
                                        "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
