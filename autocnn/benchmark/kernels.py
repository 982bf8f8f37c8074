"""Benchmark every kernel family on the seed shapes, next to cuDNN, in one run on one GPU.

For each operation, shape and precision: the default config, the config autocnn runs for it (the
tuning database's lookup: its record where one exists) and a random sample of valid configs, the
best of them reported (every one verified against the float64 reference, at the precision's bound, before
it is timed), and PyTorch/cuDNN for the same operation at the same precision: fp32 against cuDNN
in FP32 (``allow_tf32`` off), tf32 against cuDNN with TF32 on, bf16 and fp16 against cuDNN on
bfloat16 and float16 tensors. Convolutions run in fp32 and tf32 by default (``--precision`` chooses
one); pooling runs once at the storage of the run's precision (float32 for fp32 and tf32). The
GPU's SGEMM and TF32 GEMM rates (and, in a 16-bit run, the BF16 or FP16 GEMM rate) and its copy
bandwidth are measured first, under the same timing protocol, and each convolution's achieved
TFLOP/s is shown as a share of SGEMM and of its precision's tensor-core GEMM. Every measurement is
written as JSON as it comes; the tables are printed last (``autocnn.benchmark.table``).

cuDNN's benchmark mode picks an algorithm per shape once per process, and on small layers it does
not always pick the same one: two runs minutes apart have differed by up to 2x on a row and by 2% on
the geometric means. ``--cudnn-processes N`` times cuDNN again in N-1 fresh processes after the
run (one after another, the GPU otherwise idle) and compares with the fastest of the N draws; each
row keeps every draw in the JSON (``cudnn_draws_us``).

    autocnn bench --samples 64 --out bench.json      (or python scripts/bench_kernels.py ...)
    autocnn bench --precision tf32 --ops conv_fwd --shapes modern_14,modern_56
    autocnn bench --suite depthwise --precision fp32      (or --suite grouped: kernels.suite.SUITES)
"""
from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any

from autocnn.device import set_workspace_limit
from autocnn.kernels import OPERATIONS, operation_for
from autocnn.layout import DEFAULT_LAYOUT, layout_named, layout_of
from autocnn.precision import PRECISION_NAMES, precision_named, without_products
from autocnn.kernels.suite import CONV_OPS, POOL_OPS, SUITES, named_problems, suite_problems
from autocnn.benchmark.table import (CONV_PRECISIONS, GpuRates, fastest_draws, progress_line, row_from_results,
                                         tables)

PRECISION_CHOICES = {"both": CONV_PRECISIONS, **{p: (p,) for p in PRECISION_NAMES}}


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """What ``autocnn bench`` was asked for (autocnn.cli.bench reads it from the command line)."""

    ops: str = ",".join(CONV_OPS + POOL_OPS)   # comma-separated operations
    shapes: str = ""                  # comma-separated shape names; empty: the suite's
    suite: str = "seed"               # a named suite (kernels.suite.SUITES): its shapes, unless named
    precision: str = "both"           # a key of PRECISION_CHOICES
    layout: str = DEFAULT_LAYOUT.name  # one of LAYOUT_NAMES: the problems' memory order
    samples: int = 64                 # random valid configs per family and shape
    budget: float = 0.08              # seconds of timed repetitions per variant
    seed: int | None = None           # sampling seed; None: random, printed
    out: Path = Path("bench_kernels.json")
    device: int = 0
    cudnn_processes: int = 1
    workspace_limit: str | None = None


@dataclasses.dataclass(frozen=True)
class BenchPlan:
    """What a run measures, checked before any GPU work: (op, shape name, problem) in order."""

    problems: list[tuple[str, str, Any]]
    precisions: tuple[str, ...]


def plan(args: BenchSettings) -> BenchPlan:
    """The run's problems and precisions, every input checked before any GPU work."""
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPERATIONS]
    if unknown:
        raise ValueError(f"--ops: unknown operation(s) {unknown}; choose from {', '.join(OPERATIONS)}")
    wanted = {s.strip() for s in args.shapes.split(",") if s.strip()}
    if args.suite not in SUITES:
        raise ValueError(f"--suite: unknown suite {args.suite!r}; choose from {', '.join(SUITES)}")
    known = {name for op in OPERATIONS if op in CONV_OPS + POOL_OPS for name, _ in named_problems(op)}
    if wanted - known:
        raise ValueError(f"--shapes: unknown shape(s) {sorted(wanted - known)}; known: {', '.join(sorted(known))}")
    if args.samples < 0:
        raise ValueError(f"--samples must be at least 0, not {args.samples}")
    if not 1 <= args.cudnn_processes <= 16:
        raise ValueError(f"--cudnn-processes must be 1 to 16, not {args.cudnn_processes}")
    if args.workspace_limit is not None:
        set_workspace_limit(args.workspace_limit)
    precisions = PRECISION_CHOICES[args.precision]
    layout = layout_named(args.layout, "--layout")
    suite_names = {name for op in ops for name, _ in suite_problems(args.suite, op)}
    problems = []
    for op in ops:
        # Named shapes, else the suite's (the target shapes only when named).
        for name, problem in named_problems(op):
            if name not in (wanted or suite_names):
                continue
            if layout is not layout_of(problem):
                if not problem.takes_layout:
                    raise ValueError(f"--layout {layout.name}: {op} has only the {layout_of(problem).name} layout; "
                                     f"leave it out of --ops")
                problem = dataclasses.replace(problem, layout=layout)
            if op in CONV_OPS:
                problems += [(op, name, dataclasses.replace(problem, precision=p)) for p in precisions]
            else:   # once per storage: fp32 and tf32 share float32 pooling
                stores = dict.fromkeys(without_products(precision_named(p)) for p in precisions)
                problems += [(op, name, dataclasses.replace(problem, precision=p)) for p in stores]
    if not problems:
        raise ValueError(f"no shape of {', '.join(ops)} is named {', '.join(sorted(wanted))}")
    return BenchPlan(problems, precisions)


def run(args: BenchSettings, work: BenchPlan) -> int:
    """Measure ``work`` on the GPU, writing the JSON as it comes; the tables printed last."""
    from autocnn.gpu import require_cupy
    from autocnn.benchmark.baselines import measure_ceilings, time_baseline, torch_available
    from autocnn.measurement.measure import L2Flusher
    from autocnn.store import TuningDatabase
    from autocnn.measurement.sources import GpuSource

    seed = args.seed if args.seed is not None else random.randrange(2**31)
    rng = random.Random(seed)
    cp = require_cupy()
    cp.cuda.Device(args.device).use()
    source = GpuSource(args.device, budget_s=args.budget)
    device = source.device
    flusher = L2Flusher(device.l2_bytes)
    database = TuningDatabase()
    have_torch = torch_available()
    rates = GpuRates()
    if have_torch:
        c = measure_ceilings(flusher, sixteen_bit=tuple(p for p in work.precisions if precision_named(p).sixteen_bit))
        rates = GpuRates(c.copy_gbps, c.sgemm_tflops, c.tf32_tflops, c.bf16_tflops, c.fp16_tflops)
    print(f"# {device.name} ({device.arch}, {device.sm_count} SMs), sampling seed {seed}"
          + ("" if have_torch else "; no PyTorch with CUDA: no cuDNN times and no GEMM rates"), flush=True)
    print(rates.header(), flush=True)

    rows, records = [], []
    start = time.time()
    try:
        for op, name, problem in work.problems:
            operation = operation_for(problem)
            limits = device.limits()
            # What autocnn runs for the problem (its record, where one is shipped or tuned here), so
            # that "best" is at least the tuned kernel, and the default a lookup hands out where no
            # record serves (the first candidate that runs here without spills: the lookup's own
            # answer when it found none, not checked twice); then the sample.
            looked = database.lookup(device, problem)
            default = (looked.config if looked.source == "default"
                       else database.heuristic_default(device, problem).config)
            configs = [default] + ([looked.config] if looked.config.key() != default.key() else [])
            configs += operation.space(problem, limits).sample(rng, args.samples, exclude=configs)
            results = list(source.measure(op, problem, configs))
            cudnn = time_baseline(op, problem, flusher=flusher, budget_s=args.budget * 2) if have_torch else None
            cudnn_us = cudnn.us if cudnn is not None else None
            if cudnn is not None and cudnn.reason is not None:
                print(f"# {op} {name}: no cuDNN time: {cudnn.reason}", flush=True)
            row = row_from_results(op, name, problem, results, cudnn_us)
            rows.append(row)
            records.append({"op": op, "shape": name, "precision": row.precision, "problem": problem.to_dict(),
                            "lookup": {"source": looked.source, "config": looked.config.as_dict()},
                            "fingerprint": operation.fingerprint(), "results": [r.to_dict() for r in results]})
            print(progress_line(row), flush=True)
            _write(args.out, device.to_dict(), seed, args.samples, work.precisions, rates, rows, records)
        if have_torch and args.cudnn_processes > 1 and rows:
            rows = _cudnn_in_fresh_processes(args, device, work, rows, records)
            _write(args.out, device.to_dict(), seed, args.samples, work.precisions, rates, rows, records)
    finally:
        source.close()
    print(f"\n# {len(rows)} problems in {time.time() - start:.0f} s; full results in {args.out}")
    if args.cudnn_processes > 1:
        print(f"# cuDNN: the fastest of {args.cudnn_processes} processes' times")
    print(tables(rows, rates, work.precisions))
    return 0


def _cudnn_in_fresh_processes(args: BenchSettings, device: Any, work: BenchPlan, rows: list,
                              records: list) -> list:
    """The rows with cuDNN's fastest time over this run's draw and ``args.cudnn_processes - 1``
    more, each timed in a fresh process, one after another; every draw kept in ``records``."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from autocnn.benchmark.baselines import cudnn_draw

    jobs = [(op, problem.to_dict()) for op, _, problem in work.problems][:len(rows)]
    draws = [[r.cudnn_us for r in rows]]
    for i in range(1, args.cudnn_processes):
        print(f"# cuDNN in a fresh process ({i + 1} of {args.cudnn_processes})", flush=True)
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
            draws.append(pool.submit(cudnn_draw, args.device, device.l2_bytes, jobs, args.budget * 2).result())
    for record, times in zip(records, zip(*draws)):
        record["cudnn_draws_us"] = list(times)
    return [dataclasses.replace(row, cudnn_us=fastest) for row, fastest in zip(rows, fastest_draws(draws))]


def _write(path: Path, device: dict[str, Any], seed: int, samples: int, precisions: tuple[str, ...],
           rates: GpuRates, rows: list, records: list) -> None:
    """The whole run so far (rewritten after every row, so an interrupted run keeps what it measured)."""
    path.write_text(json.dumps({"device": device, "seed": seed, "samples": samples, "precisions": list(precisions),
                                "ceilings": rates.to_dict(),
                                "rows": [r.to_dict() for r in rows], "records": records}, indent=1))
