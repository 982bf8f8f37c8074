#!/usr/bin/env python3
"""Layer shapes no record covers, against cuDNN: the lookup's answer untuned (by the rule and by the
cost model), quick-tuned, and cuDNN, in fp32 and tf32.

Draws layer shapes at random (seeded; the seed is printed) and keeps those of which no problem,
of any of the three convolutions in either precision, has a record of this GPU's architecture:
which shapes a seed gives depends on neither --ops nor --precision, so a run split by them, or by
--shapes ranges, measures the same problems, and ``--merge`` joins the parts into one table. For
each problem of each shape, four columns:

* untuned rule: the lookup's answer with the cost model off (``AUTOCNN_COST_MODEL=off``: the
  nearest tuned shape's config, else the heuristic default);
* untuned cost model: the lookup's answer with the model in use (what an untuned run gets);
* quick-tuned: autocnn.dispatch.quick's quick tuning from that answer (the default of autocnn.nn
  and autocnn.torch), with ``--budget`` seconds a problem;
* cuDNN through PyTorch, ``cudnn.benchmark`` on: TF32 off for fp32, on for tf32.

The three configs are timed again side by side in ``--rounds`` interleaved rounds, cuDNN after them.
Every lookup and quick tuning sees the shipped records alone (what quick tuning stores is kept in
memory), so each problem is what a new user meets first and no problem's result answers another's.
Each precision's table gives every row in us and as cuDNN's time over ours (x cuDNN, above 1:
faster than cuDNN), then per column the geometric mean, the count below 0.8x and the worst row.
Every number goes to ``--out`` as JSON, rewritten after each problem.

Time: about 3 s a problem on an H100 (quick tuning's compiles and measurements, the re-timing,
cuDNN), so 48 shapes x 3 ops x 2 precisions (288 problems) take about 15 minutes: in two commands
under 10 minutes each,

    python scripts/bench_quick_tune.py --seed 7 --precision fp32 --out fp32.json
    python scripts/bench_quick_tune.py --seed 7 --precision tf32 --out tf32.json
    python scripts/bench_quick_tune.py --merge fp32.json tf32.json --out quick.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autocnn.benchmark.random_shapes import CONV_OPS  # noqa: E402
from autocnn.benchmark.table import LOW_SPEEDUP, geomean  # noqa: E402
from autocnn.dispatch.quick import QUICK_BUDGET_S, check_budget  # noqa: E402
from autocnn.nn.text_table import format_table  # noqa: E402

PRECISIONS = ("fp32", "tf32")
COLUMNS = ("rule", "model", "quick")   # autocnn's, each against cuDNN's
TITLES = {"rule": "untuned rule", "model": "untuned cost model", "quick": "quick-tuned"}
CUDNN = {"fp32": "cuDNN FP32 (TF32 off)", "tf32": "cuDNN TF32"}
DEFAULT_SHAPES = 48
# What a problem took this benchmark on an H100 (MEASUREMENTS.md: 16 problems in 44 s with two
# configs re-timed), with a third config re-timed; for the estimate printed at the start.
SECONDS_PER_PROBLEM = 3.0
# A run estimated longer than this is worth splitting: each part's rows are saved on their own, and
# --merge joins them.
SPLIT_ADVICE_S = 600


@dataclass(frozen=True)
class BenchArgs:
    """What a run measures (or, with ``merge``, which parts it joins)."""

    shapes: range            # indices into the seed's sequence of unseen shapes
    ops: tuple[str, ...]
    precisions: tuple[str, ...]
    seed: int | None
    budget_s: float
    rounds: int
    device: int
    out: Path
    merge: tuple[Path, ...] = ()

    @property
    def problems(self) -> int:
        return len(self.shapes) * len(self.ops) * len(self.precisions)


def parse_shapes(text: str) -> range:
    """``--shapes``: a count (the seed's first shapes) or ``START:END`` (shapes START to END-1)."""
    start, sep, end = str(text).strip().partition(":")
    try:
        shapes = range(int(start), int(end)) if sep else range(int(start))
    except ValueError:
        shapes = range(0)
    if len(shapes) == 0 or shapes.start < 0:
        raise ValueError(f"--shapes takes a count ({DEFAULT_SHAPES}) or a range START:END of the seed's shapes "
                         f"(24:48), not {text!r}")
    return shapes


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=str(DEFAULT_SHAPES),
                    help=f"how many unseen shapes (default {DEFAULT_SHAPES}), or START:END of the seed's")
    ap.add_argument("--ops", default=",".join(CONV_OPS), help="comma-separated convolution operations")
    ap.add_argument("--precision", default="both", choices=(*PRECISIONS, "both"))
    ap.add_argument("--seed", type=int, default=None, help="shape seed (default: drawn and printed)")
    ap.add_argument("--budget", type=float, default=QUICK_BUDGET_S, help="quick tuning's budget per problem, s")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved re-timing rounds of the three configs")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench_quick_tune.json"))
    ap.add_argument("--merge", type=Path, nargs="+", default=(), metavar="JSON",
                    help="join the results of runs split by --shapes, --ops or --precision (no GPU)")
    return ap


def parse_args(argv: Sequence[str] | None = None) -> BenchArgs:
    """The arguments, checked; a mistake exits with status 2 and one line naming what is allowed."""
    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        shapes = parse_shapes(a.shapes)
        budget = check_budget(a.budget)
    except ValueError as exc:
        ap.error(str(exc))
    ops = tuple(o.strip() for o in a.ops.split(",") if o.strip())
    bad = [o for o in ops if o not in CONV_OPS]
    if bad or not ops:
        ap.error(f"--ops: {', '.join(bad) or 'none given'}; choose among {', '.join(CONV_OPS)}")
    if a.rounds < 1:
        ap.error(f"--rounds must be at least 1, not {a.rounds}")
    if shapes.start > 0 and a.seed is None:
        ap.error(f"--shapes {a.shapes} measures part of a seed's shapes: give that run's --seed")
    precisions = PRECISIONS if a.precision == "both" else (a.precision,)
    return BenchArgs(shapes, tuple(dict.fromkeys(ops)), precisions, a.seed, budget, a.rounds, a.device, a.out,
                     tuple(a.merge))


# -- the tables (no GPU) ---------------------------------------------------------------------------------

def speedup(row: dict[str, Any], column: str) -> float | None:
    """cuDNN's time over the column's (above 1: autocnn is faster), or None where either is missing."""
    ours, theirs = row.get(f"{column}_us"), row.get("cudnn_us")
    if not ours or not theirs or not math.isfinite(ours) or not math.isfinite(theirs):
        return None
    return theirs / ours


def _ordered(rows: Sequence[dict[str, Any]], precision: str) -> list[dict[str, Any]]:
    return sorted((r for r in rows if r["precision"] == precision),
                  key=lambda r: (r["shape_index"], CONV_OPS.index(r["op"])))


def column_summary(rows: Sequence[dict[str, Any]], column: str) -> dict[str, Any]:
    """Over the rows with a time of the column and of cuDNN: the geometric mean of ``speedup``, how
    many are below LOW_SPEEDUP, and the worst row."""
    timed = [(x, r) for r in rows if (x := speedup(r, column)) is not None]
    worst = min(timed, key=lambda t: t[0]) if timed else None
    return {"geomean": geomean(x for x, _ in timed), "timed": len(timed), "problems": len(rows),
            "below": sum(1 for x, _ in timed if x < LOW_SPEEDUP),
            "worst": None if worst is None else {"x": worst[0], "shape_index": worst[1]["shape_index"],
                                                 "op": worst[1]["op"], "shape": worst[1]["shape"]}}


def summaries(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``column_summary`` of every column, per precision that has rows."""
    return {p: {c: column_summary(_ordered(rows, p), c) for c in COLUMNS}
            for p in PRECISIONS if any(r["precision"] == p for r in rows)}


def _us(v: float | None) -> str:
    return f"{v:.1f}" if v else "-"


def _x(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else "-"


def precision_table(rows: Sequence[dict[str, Any]], precision: str) -> str:
    """One precision's rows and, under them, each column's geometric mean, count below 0.8x and worst row."""
    mine = _ordered(rows, precision)
    shapes = len({r["shape_index"] for r in mine})
    lines = [f"{precision} against {CUDNN[precision]}: {len(mine)} problems of {shapes} shapes"]
    table = [("#", "op", "shape", "rule us", "x cuDNN", "model us", "x cuDNN", "quick us", "x cuDNN", "cuDNN us")]
    for r in mine:
        cells = [str(r["shape_index"]), r["op"], r["shape"]]
        for c in COLUMNS:
            cells += [_us(r.get(f"{c}_us")), _x(speedup(r, c))]
        table.append((*cells, _us(r.get("cudnn_us"))))
    lines.append(format_table(table))
    summary = [("", *(TITLES[c] for c in COLUMNS))]
    stats = [column_summary(mine, c) for c in COLUMNS]
    summary.append(("geometric mean", *(f"{_x(s['geomean'])} cuDNN over {s['timed']}" for s in stats)))
    summary.append((f"below {LOW_SPEEDUP:g}x", *(f"{s['below']} of {s['timed']}" for s in stats)))
    summary.append(("worst", *("-" if s["worst"] is None else
                               f"{_x(s['worst']['x'])}: #{s['worst']['shape_index']} {s['worst']['op']}"
                               for s in stats)))
    lines += ["", format_table(summary)]
    return "\n".join(lines)


def report(result: dict[str, Any]) -> str:
    """The header (GPU, seed, budget, cost model) and each precision's table."""
    head = (f"# {result['device']['name']}, shape seed {result['seed']}, quick budget {result['budget_s']:g} s "
            f"a problem, {result['rounds']} re-timing rounds; {result['cost_model']}")
    rows = result["rows"]
    return "\n\n".join([head, *(precision_table(rows, p) for p in PRECISIONS if any(r["precision"] == p
                                                                                  for r in rows))])


def result_of(device: dict[str, Any], seed: int, args: BenchArgs, cost_model: str,
              rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"device": device, "seed": seed, "budget_s": args.budget_s, "rounds": args.rounds,
            "cost_model": cost_model, "shapes": [args.shapes.start, args.shapes.stop], "ops": list(args.ops),
            "precisions": list(args.precisions), "rows": rows, "summary": summaries(rows)}


def merge(paths: Sequence[Path]) -> dict[str, Any]:
    """The results of the runs in ``paths`` as one: the same GPU, seed, budget and rounds, each
    problem in one part only; a ValueError naming the file otherwise."""
    parts = []
    for path in paths:
        try:
            parts.append((path, json.loads(Path(path).read_text())))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--merge: {path} cannot be read as this benchmark's JSON: {exc}") from None
    first_path, first = parts[0]
    rows: dict[tuple[int, str, str], dict[str, Any]] = {}
    where: dict[tuple[int, str, str], Path] = {}
    for path, part in parts:
        for field in ("seed", "budget_s", "rounds", "cost_model"):
            if part.get(field) != first.get(field):
                raise ValueError(f"--merge: {path} has {field} {part.get(field)!r}, {first_path} "
                                 f"{first.get(field)!r}: only parts of one run join")
        if part.get("device", {}).get("name") != first.get("device", {}).get("name"):
            raise ValueError(f"--merge: {path} was measured on {part.get('device', {}).get('name')!r}, "
                             f"{first_path} on {first.get('device', {}).get('name')!r}")
        for row in part.get("rows", []):
            key = (row["shape_index"], row["op"], row["precision"])
            if key in rows:
                raise ValueError(f"--merge: {where[key]} and {path} both hold shape {key[0]} {key[1]} {key[2]}")
            rows[key], where[key] = row, path
    joined = sorted(rows.values(), key=lambda r: (r["precision"], r["shape_index"], CONV_OPS.index(r["op"])))
    indices = [r["shape_index"] for r in joined]
    return {**first, "shapes": [min(indices, default=0), max(indices, default=-1) + 1],
            "ops": sorted({r["op"] for r in joined}, key=CONV_OPS.index),
            "precisions": [p for p in PRECISIONS if any(r["precision"] == p for r in joined)],
            "parts": [str(p) for p in paths], "rows": joined, "summary": summaries(joined)}


# -- on the GPU ------------------------------------------------------------------------------------------

@contextlib.contextmanager
def cost_model_off() -> Iterator[None]:
    """The lookup without the cost model, as ``AUTOCNN_COST_MODEL=off`` gives it."""
    from autocnn.cost_model.model_file import COST_MODEL_ENV

    before = os.environ.get(COST_MODEL_ENV)
    os.environ[COST_MODEL_ENV] = "off"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(COST_MODEL_ENV, None)
        else:
            os.environ[COST_MODEL_ENV] = before


class ShippedOnly:
    """A database of the shipped records that quick tuning reads and whose stores it keeps to
    itself: no problem's quick record answers another problem's lookup."""

    def __init__(self, db: Any):
        self.db = db

    def lookup(self, device: Any, problem: Any) -> Any:
        return self.db.lookup(device, problem)

    def neighbour_configs(self, *args: Any, **kwargs: Any) -> Any:
        return self.db.neighbour_configs(*args, **kwargs)

    def put_many(self, records: Sequence[Any], keep_faster: bool = False) -> list[Any]:
        return list(records)


def measure_problem(index: int, problem: Any, db: Any, source: Any, flusher: Any, args: BenchArgs) -> dict[str, Any]:
    """The four columns of one problem, and what quick tuning did."""
    from autocnn.benchmark.baselines import time_baseline
    from autocnn.dispatch.quick import quick_tune
    from autocnn.precision import precision_of
    from autocnn.search.confirm import retime

    with cost_model_off():
        rule = db.lookup(source.device, problem)
    model = db.lookup(source.device, problem)
    outcome = quick_tune(problem, source.device, ShippedOnly(db), source, args.budget_s, lookup=model)
    configs = list({c.key(): c for c in (rule.config, model.config, outcome.config)}.values())
    medians, _ = retime(source, problem.op, problem, configs, args.rounds)
    cudnn = time_baseline(problem.op, problem, flusher=flusher, budget_s=0.4)
    chosen = next((c.origin for c in outcome.candidates if c.config.key() == outcome.config.key()), "lookup")
    return {"shape_index": index, "op": problem.op, "precision": precision_of(problem).name,
            "shape": problem.shape_string(), "problem": problem.to_dict(),
            "rule_us": medians.get(rule.config.key()), "model_us": medians.get(model.config.key()),
            "quick_us": medians.get(outcome.config.key()), "cudnn_us": cudnn.us, "cudnn_reason": cudnn.reason,
            "rule": {"source": rule.source, "config": rule.config.as_dict()},
            "model": {"source": model.source, "config": model.config.as_dict(),
                      "same_as_rule": model.config.key() == rule.config.key()},
            "quick": {"chosen": chosen, "config": outcome.config.as_dict(), "seconds": outcome.seconds,
                      "measured": len(outcome.results), "candidates": len(outcome.candidates),
                      "failed": len(outcome.failed), "stopped_because": outcome.stopped_because}}


def progress_line(row: dict[str, Any], elapsed_s: float) -> str:
    q = row["quick"]
    cells = "  ".join(f"{c} {_x(speedup(row, c)):>6s}" for c in COLUMNS)
    return (f"#{row['shape_index']:<3d} {row['precision']} {row['op']:13s} {row['shape']:58s} {cells}  "
            f"(quick: {q['measured']}/{q['candidates']} in {q['seconds']:.1f} s, {q['chosen']}; {elapsed_s:.0f} s)")


def run(args: BenchArgs) -> int:
    from autocnn.benchmark.baselines import torch_available
    from autocnn.benchmark.random_shapes import layer_problem, unseen_layers
    from autocnn.cost_model.model_file import in_use_text
    from autocnn.gpu import require_cupy
    from autocnn.measurement.measure import L2Flusher
    from autocnn.measurement.sources import GpuSource
    from autocnn.store import TuningDatabase

    seed = args.seed if args.seed is not None else random.randrange(2**31)
    cp = require_cupy()
    cp.cuda.Device(args.device).use()
    if not torch_available():
        print("autocnn: this benchmark compares with cuDNN: install PyTorch with CUDA", file=sys.stderr)
        return 1
    estimate = args.problems * SECONDS_PER_PROBLEM
    print(f"# shape seed {seed}; shapes {args.shapes.start}-{args.shapes.stop - 1}, {', '.join(args.ops)}, "
          f"{' and '.join(args.precisions)}: {args.problems} problems, about {estimate / 60:.0f} min", flush=True)
    if estimate > SPLIT_ADVICE_S:
        print(f"# longer than {SPLIT_ADVICE_S // 60} minutes: split it (--precision, --ops or --shapes "
              f"START:END, with --seed {seed}) and join the parts with --merge", flush=True)
    source = GpuSource(args.device)
    flusher = L2Flusher(source.device.l2_bytes)
    cost_model = in_use_text()
    print(f"# {source.device.name} ({source.device.arch}); {cost_model}", flush=True)
    rows: list[dict[str, Any]] = []
    start = time.time()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            db = TuningDatabase(user_dir=Path(scratch))   # the shipped records alone, never written
            layers = unseen_layers(db, source.device, args.shapes.stop, random.Random(seed), PRECISIONS)
            for index, layer in enumerate(layers):
                if index not in args.shapes:
                    continue
                for precision in args.precisions:
                    for op in args.ops:
                        row = measure_problem(index, layer_problem(layer, op, precision), db, source, flusher, args)
                        rows.append(row)
                        print(progress_line(row, time.time() - start), flush=True)
                        args.out.write_text(json.dumps(result_of(source.device.to_dict(), seed, args, cost_model,
                                                                 rows), indent=1))
    finally:
        source.close()
    result = result_of(source.device.to_dict(), seed, args, cost_model, rows)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\n{report(result)}\n\n# {len(rows)} problems in {time.time() - start:.0f} s; every number in {args.out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        try:
            result = merge(args.merge)
        except ValueError as exc:
            print(f"autocnn: {exc}", file=sys.stderr)
            return 2
        args.out.write_text(json.dumps(result, indent=1))
        print(f"{report(result)}\n\n# {len(result['rows'])} problems from {len(args.merge)} parts; in {args.out}")
        return 0
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
