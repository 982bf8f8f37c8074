#!/usr/bin/env python3
"""Tune chosen rows of the seed suite in chosen precisions on one GPU, under one wall-clock budget.

`autocnn tune --suite seed` tunes every row of one precision; this runs a named subset (the
compute-bound rows, say) in both precisions, spreading a time budget evenly over the problems, with
parameters optionally held (`--fix formulation=tc`). The target layers that `autocnn bench --shapes`
names beside the seed suite (pointwise_s1, pointwise_s2) are rows here too. Records go to the
tuning database as usual (AUTOCNN_TUNING_DB chooses where). Prints one line per problem, then a table.

Usage (GPU host):
  python3 scripts/tune_rows.py --rows modern_56,modern_14,sweep_3x3 --ops conv_fwd,conv_wgrad \\
      --precisions fp32,tf32 --budget 480 --fix formulation=tc
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autocnn.kernels.suite import CONV_OPS, named_problems  # noqa: E402  (after the path above)

DEFAULT_TRIALS = 24
UNCAPPED_TRIALS = 1_000_000   # with --budget and no --trials: the budget (or an exhausted space) ends a study
MIN_SHARE_S = 5.0             # below this a problem's share measures nothing worth keeping: the run stops


@dataclasses.dataclass
class BudgetShares:
    """Each problem's share of the wall-clock budget: what is left over the problems left, less what
    each of them is expected to run past its share. A study checks its timeout between trials, and
    its warm start, last batch and confirmation run past it: on an H200 the fft rows ran 5-11 s past
    18-19 s shares, and with even shares of what was left the last two problems of twelve found none
    (gpu_tuning_run.sh fft:radix, commit b664ba1). Reserving the mean overrun so far for every problem
    left reaches them all."""

    budget_s: float
    problems: int
    overruns: list[float] = dataclasses.field(default_factory=list)

    def share(self, done: int, elapsed_s: float) -> float | None:
        """The timeout of problem ``done`` (0-based) after ``elapsed_s`` seconds, or None where the
        budget is spent."""
        left, remaining = self.budget_s - elapsed_s, self.problems - done
        overrun = sum(self.overruns) / len(self.overruns) if self.overruns else 0.0
        share = (left - overrun * remaining) / remaining
        if share >= MIN_SHARE_S:
            return share
        # Past the reserve: an even share of what is left, while that is worth a study.
        return left / remaining if left / remaining >= MIN_SHARE_S else None

    def ran(self, seconds: float, timeout_s: float) -> None:
        self.overruns.append(max(0.0, seconds - timeout_s))


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", required=True,
                        help="seed rows or target layers, comma-separated (e.g. modern_56,sweep_3x3,pointwise_s1)")
    parser.add_argument("--ops", default=",".join(CONV_OPS))
    parser.add_argument("--precisions", default="fp32,tf32")
    parser.add_argument("--trials", type=int, default=None,
                        help="measured trials per problem (default 24; with --budget, as many as each problem's "
                        "share of the budget allows)")
    parser.add_argument("--budget", type=float, default=None, help="wall-clock seconds for all problems")
    parser.add_argument("--fix", default="", help="parameters held at one value, e.g. formulation=tc")
    parser.add_argument("--vary", default="", help="parameters along which the earlier winners are also tried at "
                        "every other value before the search, e.g. TF32_ROUND,FRAG")
    parser.add_argument("--storage", default=None, help="Optuna storage URL")
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args(argv)
    ops = args.ops.split(",")
    precisions = args.precisions.split(",")
    rows = args.rows.split(",")
    for op in ops:
        if op not in CONV_OPS:
            parser.error(f"--ops: {op!r} is not one of {', '.join(CONV_OPS)}")
        known = {n for n, _ in named_problems(op)}
        for row in rows:
            if row not in known:
                parser.error(f"--rows: {row!r} is not a seed row or target layer of {op}; rows are "
                             f"{', '.join(sorted(known))}")
    for precision in precisions:
        if precision not in ("fp32", "tf32"):
            parser.error(f"--precisions: {precision!r} is not fp32 or tf32")
    if args.vary:
        from autocnn.cli.tune import parse_vary

        problems = [dataclasses.replace(p, precision=precision) for op in ops for precision in precisions
                    for name, p in named_problems(op) if name in rows]
        try:
            args.vary = parse_vary(args.vary, problems)
        except ValueError as exc:
            parser.error(str(exc))
    if args.trials is None:
        # A trial of a small layer takes well under a second: a fixed count, not the budget, would end
        # the search (24 trials a row left most of tc_rows' space untried while 90 s of budget went unused).
        args.trials = DEFAULT_TRIALS if args.budget is None else UNCAPPED_TRIALS
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    if args.budget is not None and args.budget <= 0:
        parser.error("--budget must be positive")
    return args, ops, precisions, rows


def main(argv: list[str] | None = None) -> int:
    args, ops, precisions, rows = parse_args(argv)
    from autocnn.cli.tune import parse_fixed
    from autocnn.store import TuningDatabase
    from autocnn.measurement.sources import GpuSource
    from autocnn.search.tuner import TuneSettings, Tuner

    problems = [(op, name, dataclasses.replace(p, precision=precision))
                for precision in precisions for op in ops for name, p in named_problems(op) if name in rows]
    settings = TuneSettings(trials=args.trials, storage=args.storage, fixed=parse_fixed(args.fix),
                            vary=tuple(args.vary))
    source = GpuSource(args.device)
    rows_out = []
    start = time.monotonic()
    shares = BudgetShares(args.budget, len(problems)) if args.budget is not None else None
    try:
        tuner = Tuner(source, TuningDatabase(), settings, progress=False, log=None)
        for i, (op, name, problem) in enumerate(problems):
            timeout = None
            if shares is not None:
                timeout = shares.share(i, time.monotonic() - start)
                if timeout is None:
                    print(f"budget spent: {len(problems) - i} problems not tuned", flush=True)
                    break
            began = time.monotonic()
            o = tuner.tune(op, problem, timeout_s=timeout)
            if shares is not None:
                # The whole call, not the study's own seconds: its setup and records count against the budget too.
                shares.ran(time.monotonic() - began, timeout)
            best = o.best.time_us if o.best else None
            default = o.default.time_us if o.default else None
            cfg = o.best.config if o.best else None
            rows_out.append((op, name, problem.precision, best, default, cfg))
            print(f"{op} {name} {problem.precision}: best {best} us, default {default} us, "
                  f"{o.measured} measured in {o.seconds:.0f} s {o.stopped_because}; {cfg}", flush=True)
    finally:
        source.close()
    print(f"\n| op | row | precision | tuned us | default us |\n| --- | --- | --- | --- | --- |")
    for op, name, precision, best, default, _ in rows_out:
        f = lambda v: "-" if v is None else f"{v:.1f}"
        print(f"| {op} | {name} | {precision} | {f(best)} | {f(default)} |")
    return 0 if all(r[3] is not None for r in rows_out) else 1


if __name__ == "__main__":
    raise SystemExit(main())
