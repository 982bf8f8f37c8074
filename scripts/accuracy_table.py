#!/usr/bin/env python3
"""The accuracy table (MEASUREMENTS.md): per convolution and precision, the median and largest
relative error against float64 over the seed suite, on this GPU.

Two rows per operation and precision, and a third where the runs take wgmma's CROSS:
  "as run"  the config autocnn runs for the problem (the tuning database's lookup: a record, a
            borrowed config or the default), so whichever formulation won;
  "tc"      the tensor-core formulation's default config, so that the table shows what 3xTF32 and
            TF32 cost in accuracy even where another formulation won;
  "as run, CROSS=0"  where the config run has CROSS=1 (3xTF32's cross products as one BF16 wgmma),
            the same config with the two TF32 cross products, so that the table shows what CROSS
            costs.
Each error is ||out - ref|| / ||ref|| of the main output (y, dx or dw) on fresh random inputs, as the
verification computes it, next to the bound it must meet. Writes JSON (--out) and prints Markdown.

Usage (GPU host): python3 scripts/accuracy_table.py --out out/accuracy.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autocnn.kernels.suite import CONV_OPS  # noqa: E402  (after the path above)
MAIN_OUTPUT = {"conv_fwd": "y", "conv_bwd_data": "dx", "conv_wgrad": "dw"}
PRECISIONS = ("fp32", "tf32")


@dataclasses.dataclass(frozen=True)
class ErrorSample:
    op: str
    precision: str
    row: str          # "as run" or "tc"
    shape: str
    formulation: str
    error: float
    bound: float
    passed: bool


ROWS = ("as run", "as run, CROSS=0", "tc")


def measure(device_id: int, shapes: set[str] | None = None, precisions: tuple[str, ...] = PRECISIONS) -> list[ErrorSample]:
    from autocnn.device import current_device
    from autocnn.kernels import OPERATIONS
    from autocnn.kernels.formulations.tensorcore import FORMULATION_TC
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.kernels.suite import seed_problems
    from autocnn.store import TuningDatabase
    from autocnn.measurement.measure import check_candidate

    device = current_device(device_id)
    limits = device.limits()
    db = TuningDatabase()
    loader = KernelLoader()
    out = []
    for op in CONV_OPS:
        operation = OPERATIONS[op]
        for precision in precisions:
            for name, seed in seed_problems(op):
                if shapes and name not in shapes:
                    continue
                problem = dataclasses.replace(seed, precision=precision)
                run = db.lookup(device, problem).config
                configs = {"as run": run}
                if run.get("CROSS") == 1:
                    configs["as run, CROSS=0"] = operation.space(problem, limits).validate({**run.as_dict(), "CROSS": 0})
                configs["tc"] = operation.default_config(problem, limits, formulation=FORMULATION_TC)
                for row, config in configs.items():
                    check = check_candidate(loader.load(operation.plan(problem, config)), problem, time_it=False)
                    v = check.verification
                    key = MAIN_OUTPUT[op]
                    out.append(ErrorSample(op, precision, row, name, str(config["formulation"]),
                                           v.errors[key], v.bounds[key], v.passed))
                    print(f"{op:14s} {precision} {row:15s} {name:18s} {config['formulation']:9s} "
                          f"{v.errors[key]:.2e} (bound {v.bounds[key]:.2e}) {'ok' if v.passed else 'FAILED'}",
                          flush=True)
    return out


def markdown(samples: list[ErrorSample], gpu: str) -> str:
    shapes = len({s.shape for s in samples})
    lines = [f"Relative error against float64 over {shapes} seed shapes ({gpu}):", "",
             "| operation | precision | config | median | largest | largest bound | all within bound |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for op in CONV_OPS:
        for precision in PRECISIONS:
            for row in ROWS:
                group = [s for s in samples if (s.op, s.precision, s.row) == (op, precision, row)]
                if not group:
                    continue
                worst = max(group, key=lambda s: s.error)
                lines.append(f"| {op} | {precision} | {row} | {statistics.median(s.error for s in group):.1e} | "
                             f"{worst.error:.1e} ({worst.shape}) | {max(s.bound for s in group):.1e} | "
                             f"{'yes' if all(s.passed for s in group) else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write every sample as JSON here")
    parser.add_argument("--shapes", default="", help="only these seed shapes (comma-separated; default all)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="fp32, tf32 or both (comma-separated)")
    args = parser.parse_args(argv)
    from autocnn.kernels.suite import seed_shapes

    shapes = {s.strip() for s in args.shapes.split(",") if s.strip()}
    unknown = shapes - {s.name for s in seed_shapes()}
    if unknown:
        parser.error(f"--shapes: unknown seed shape(s) {', '.join(sorted(unknown))}")
    precisions = tuple(p.strip() for p in args.precisions.split(",") if p.strip())
    if not precisions or set(precisions) - set(PRECISIONS):
        parser.error(f"--precisions: {args.precisions!r}: fp32, tf32 or both")
    from autocnn.device import current_device

    gpu = current_device(args.device).name
    samples = measure(args.device, shapes or None, precisions)
    table = markdown(samples, gpu)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"gpu": gpu, "samples": [dataclasses.asdict(s) for s in samples],
                                        "markdown": table}, indent=1))
    print(table)
    return 0 if all(s.passed for s in samples) else 1


if __name__ == "__main__":
    raise SystemExit(main())
