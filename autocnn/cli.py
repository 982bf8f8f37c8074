"""The command line: ``autocnn tune | db | bench | train | report``."""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from autocnn.errors import AutocnnError, InvalidProblemError
from autocnn.kernels.problem import DEFAULT_PRECISION, PRECISIONS, ConvProblem

EXAMPLES = """examples:
  autocnn tune --op conv_fwd --shape N=128,C=3,H=32,W=32,K=64,R=8,S=8,stride=1,pad=4,4,3,3 --trials 100
  autocnn tune --network kriz09 --batch 128 --trials 400
  autocnn tune --suite seed --ops conv_fwd --precision tf32
  autocnn db list --precision tf32
  autocnn train --network lenet5 --epochs 10 --backend cuda --precision tf32
  autocnn bench --ops conv_fwd --shapes modern_14 --precision both
"""


# Commands whose options belong to another module's parser: handed over before argparse sees them
# (argparse.REMAINDER would drop a first argument that looks like an option).
DELEGATED = ("bench", "report")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        if argv[0] == "bench":
            from autocnn.tuning.benchmark import main as delegate
        else:
            from autocnn.reports import main as delegate
        rest = argv[1:]
        if rest[:1] == ["--"]:
            rest = rest[1:]
        try:
            return int(delegate(rest) or 0)
        except AutocnnError as exc:
            print(f"autocnn: {exc}", file=sys.stderr)
            return 1
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except AutocnnError as exc:
        print(f"autocnn: {exc}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"autocnn: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (autocnn db list | head): nothing left to say.
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("autocnn: interrupted; finished trials are kept in the study, re-run the same command to resume",
              file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autocnn", description="Generated, tuned CUDA kernels for CNNs.",
                                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(title="commands")

    t = sub.add_parser("tune", help="search the fastest verified kernel for a layer shape or a network",
                       description="Search each kernel's parameters with Optuna on this GPU and store the "
                                   "fastest verified variant in the tuning database.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = t.add_mutually_exclusive_group(required=True)
    what.add_argument("--op", help="operation: conv_fwd, conv_bwd_data, conv_wgrad, avgpool_fwd, avgpool_bwd")
    what.add_argument("--suite", choices=("seed",),
                      help="every seed shape of the five source documents (with --ops to choose operations)")
    what.add_argument("--network", help="a zoo network (kriz09, scherer10, convnet18, chellapilla06, lenet5) "
                                        "or a network JSON file: tunes every kernel it needs, forward and backward")
    what.add_argument("--stale", action="store_true",
                      help="every shape whose record for this GPU kind (shipped or user) was tuned with "
                           "templates that have changed since (with --ops to choose operations)")
    t.add_argument("--shape", help="with --op: N=..,C=..,H=..,W=..,K=..,R=..,S=..,stride=..,pad=t,l,b,r "
                                   "(pooling: N,C,H,W,window,stride,pad,count_pad)")
    t.add_argument("--batch", type=int, default=128, help="with --network: the batch size (default 128)")
    t.add_argument("--ops", default=None,
                   help="with --suite, --network or --stale: comma-separated operations (default: all five)")
    t.add_argument("--trials", type=int, default=100,
                   help="measured trials per kernel (with --network: for the whole network; default 100). "
                        "A re-run continues the same study up to this total.")
    t.add_argument("--timeout", type=float, default=None, help="wall-clock seconds per kernel (network: in all)")
    t.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    t.add_argument("--storage", default=None,
                   help="Optuna storage: an RDB URL (sqlite:///path, postgresql://...) or a journal file "
                        "(*.log). Default: SQLite in the autocnn cache directory. Point several processes at "
                        "one storage to share the work of one study.")
    t.add_argument("--sampler", default="tpe", choices=("tpe", "random", "grid", "cmaes", "gp"),
                   help="search strategy (default tpe; grid is exhaustive)")
    t.add_argument("--seed", type=int, default=None, help="sampler seed")
    t.add_argument("--fix", default="", help="parameters held at one value, e.g. formulation=direct,PAD=1")
    t.add_argument("--replay", nargs="+", type=Path, default=None,
                   help="answer from recorded GPU measurements instead of a GPU (replay files)")
    t.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="what the convolutions must be as accurate as: fp32 (default; FP32-accurate, tensor "
                        "cores through 3xTF32) or tf32 (opt-in: one TF32 product per term, a looser bound). "
                        "Applies to every convolution tuned (--op, --suite, --network, --stale: there, only "
                        "the stale records of this precision); pooling has no precision. With --op it may "
                        "also be given in --shape as precision=tf32")
    t.add_argument("--cudnn", action="store_true",
                   help="also time PyTorch/cuDNN on each shape and keep it in the record (TF32 off for fp32 "
                        "problems, on for tf32 ones)")
    t.add_argument("--json", action="store_true", help="print the results as JSON")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_tune)

    d = sub.add_parser("db", help="list, show, export, import or remove tuned records")
    dsub = d.add_subparsers(title="database commands")
    dl = dsub.add_parser("list", help="one line per tuned kernel")
    _db_filters(dl)
    dl.add_argument("--json", action="store_true")
    dl.set_defaults(func=cmd_db_list)
    ds = dsub.add_parser("show", help="every field of the matching records")
    _db_filters(ds)
    ds.add_argument("--shape", help="shape string of the problem (with --op)")
    ds.set_defaults(func=cmd_db_show)
    de = dsub.add_parser("export", help="write matching records to a JSON file")
    de.add_argument("path", type=Path)
    _db_filters(de)
    de.set_defaults(func=cmd_db_export)
    di = dsub.add_parser("import", help="validate and add the records of a JSON file")
    di.add_argument("path", type=Path)
    di.add_argument("--keep-faster", action="store_true",
                    help="replace a record of the same problem only when the imported one is faster "
                         "(keeping its cuDNN time); default: the imported record replaces it")
    di.set_defaults(func=cmd_db_import)
    dr = dsub.add_parser("remove", help="remove matching user records (shipped records stay)")
    _db_filters(dr)
    dr.add_argument("--shape", help="shape string of the problem (with --op)")
    dr.add_argument("--stale", action="store_true",
                    help="match the stale records (tuned with templates that have changed since) instead")
    dr.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    dr.set_defaults(func=cmd_db_remove)
    dc = dsub.add_parser("check", help="report unreadable files and records that are skipped")
    dc.set_defaults(func=cmd_db_check)

    b = sub.add_parser("bench", help="benchmark the kernel families on the seed shapes against cuDNN, fp32 and "
                                     "tf32 side by side (--precision fp32|tf32|both), with TFLOP/s and shares "
                                     "of the measured SGEMM and TF32 GEMM rates")
    b.add_argument("args", nargs=argparse.REMAINDER, help="arguments of scripts/bench_kernels.py")
    b.set_defaults(func=cmd_bench)

    tr = sub.add_parser("train", help="train a zoo network on tuned kernels")
    tr.add_argument("--network", required=True, help="kriz09, scherer10, convnet18, chellapilla06, lenet5 or a JSON file")
    tr.add_argument("--dataset", default="fashion-mnist", help="fashion-mnist (default), mnist or cifar10")
    tr.add_argument("--data-root", default=None, help="folder of the data set files")
    tr.add_argument("--epochs", type=int, default=10)
    tr.add_argument("--batch-size", type=int, default=64,
                    help="mini-batch size (default 64: lenet5 reaches 90%% on Fashion-MNIST in 10 epochs)")
    tr.add_argument("--backend", default="cuda", choices=("cuda", "numpy"))
    tr.add_argument("--optimizer", default="adam", help="sgd, adam or rprop")
    tr.add_argument("--lr", type=float, default=None)
    tr.add_argument("--lr-schedule", default="cosine", choices=("cosine", "none"),
                    help="learning-rate schedule over the epochs (default cosine; RPROP ignores it)")
    tr.add_argument("--no-standardize", action="store_true",
                    help="keep pixel values in [0, 1] instead of zero mean and unit variance")
    tr.add_argument("--precision", choices=PRECISIONS, default=DEFAULT_PRECISION,
                    help="the convolutions' precision on the cuda backend: fp32 (default, FP32-accurate) or "
                         "tf32 (tensor cores round operands to TF32). The numpy backend computes in float32 "
                         "either way. The dispatch table shows each layer's")
    tr.add_argument("--seed", type=int, default=None)
    tr.add_argument("--limit", type=int, default=None, help="use only this many training images")
    tr.add_argument("--save", type=Path, default=None, help="write the trained weights (.npz)")
    tr.add_argument("--json", action="store_true")
    tr.set_defaults(func=cmd_train)

    r = sub.add_parser("report", help="an HTML and Markdown report of tuning results")
    r.add_argument("args", nargs=argparse.REMAINDER, help="arguments of scripts/tuning_report.py")
    r.set_defaults(func=cmd_report)
    return parser


def _db_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", default=None, help="only GPUs whose name contains this text")
    p.add_argument("--op", default=None, help="only this operation")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="only convolution records of this precision (pooling records have none and are "
                        "left out)")


# -- tune -------------------------------------------------------------------------------------------

def _parse_fixed(text: str) -> dict[str, Any]:
    fixed: dict[str, Any] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--fix takes name=value pairs, not {item!r}")
        value = value.strip()
        fixed[key.strip()] = int(value) if value.lstrip("-").isdigit() else value
    return fixed


def _parse_ops(text: str | None) -> list[str]:
    from autocnn.kernels import OPERATIONS

    ops = [o.strip() for o in (text or ",".join(OPERATIONS)).split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPERATIONS]
    if unknown:
        raise ValueError(f"--ops: unknown operation(s) {unknown}; choose from {', '.join(OPERATIONS)}")
    return ops


def _at_precision(problem: Any, precision: str) -> Any:
    """The convolution problem at this precision; a pooling problem as it is (it has none)."""
    if isinstance(problem, ConvProblem) and problem.precision != precision:
        return dataclasses.replace(problem, precision=precision)
    return problem


def _has_precision(problem: Any, precision: str) -> bool:
    return not isinstance(problem, ConvProblem) or problem.precision == precision


_PRECISION_IN_SHAPE = re.compile(r"(^|,)\s*precision\s*=")


def _shape_problem(op: str, shape: str, flag: str | None) -> Any:
    """--op's problem from --shape, at the precision of --precision or of the shape string (not both,
    unless they agree)."""
    from autocnn.kernels import parse_shape

    problem = parse_shape(op, shape)
    if flag is None or not isinstance(problem, ConvProblem):
        return problem   # pooling has no precision: its kernels are the same at both
    if _PRECISION_IN_SHAPE.search(shape) and problem.precision != flag:
        raise ValueError(f"--shape says precision={problem.precision} but --precision says {flag}: "
                         f"give one of them, or the same value in both")
    return _at_precision(problem, flag)


def _make_source(args: argparse.Namespace):
    if args.replay:
        from autocnn.tuning.sources import ReplayFile, ReplaySource

        return ReplaySource([ReplayFile.load(p) for p in args.replay])
    from autocnn.tuning.sources import GpuSource

    return GpuSource(args.device)


def cmd_tune(args: argparse.Namespace) -> int:
    from autocnn.store import TuningDatabase
    from autocnn.tuning.tuner import TuneSettings, Tuner, tune_problems

    if args.op and not args.shape:
        raise ValueError("--op needs --shape, e.g. --shape N=128,C=3,H=32,W=32,K=64,R=8,S=8,stride=1,pad=4,4,3,3")
    if args.network and args.shape:
        raise ValueError("--shape goes with --op; a network's shapes come from the network and --batch")
    precision = args.precision or DEFAULT_PRECISION
    # Parsed before any source is opened: a bad shape or a precision clash costs no GPU start.
    op_problem = _shape_problem(args.op, args.shape, args.precision) if args.op else None
    settings = TuneSettings(trials=args.trials, timeout_s=args.timeout if not args.network else None,
                            sampler=args.sampler, seed=args.seed, storage=args.storage,
                            fixed=_parse_fixed(args.fix))
    log = (lambda text: print(text, file=sys.stderr)) if not args.json else None
    source = _make_source(args)
    try:
        tuner = Tuner(source, TuningDatabase(), settings, progress=not (args.no_progress or args.json), log=log)
        if args.op:
            outcomes = [tuner.tune(args.op, op_problem)]
        elif args.stale:
            stale = TuningDatabase().stale_problems(source.device, _parse_ops(args.ops))
            problems = [p for p in stale if _has_precision(p, precision)]
            if log:
                log(f"{len(problems)} shapes with stale records for {source.device.name}")
            others = sorted({p.precision for p in stale if not _has_precision(p, precision)})
            if others:   # said even with --json (on stderr): work this run leaves undone
                print(f"autocnn: {len(stale) - len(problems)} more stale shapes are {'/'.join(others)}: "
                      f"tune them with --precision {others[0]}", file=sys.stderr)
            outcomes = []
            for problem in problems:
                if log:
                    log(f"{problem.op} {problem.shape_string()}")
                outcomes.append(tuner.tune(problem.op, problem))
        elif args.suite:
            from autocnn.kernels.suite import seed_problems

            ops = _parse_ops(args.ops)
            outcomes = []
            for op in ops:
                for name, problem in seed_problems(op):
                    if log:
                        log(f"{op} {name}")
                    outcomes.append(tuner.tune(op, _at_precision(problem, precision)))
        else:
            from autocnn.nn.zoo import load_network

            if args.batch < 1:
                raise ValueError(f"--batch must be at least 1, not {args.batch}")
            model = load_network(args.network)
            model.precision = precision
            problems = model.problems(args.batch)
            if args.ops:
                ops = _parse_ops(args.ops)
                problems = [p for p in problems if p.op in ops]
                if not problems:
                    raise ValueError(f"--ops: {args.network} runs no {', '.join(ops)} kernel")
            outcomes = tune_problems(tuner, problems, args.trials, timeout_s=args.timeout, log=log)
    finally:
        source.close()
    if args.cudnn and not args.replay:
        _add_cudnn_times(outcomes, TuningDatabase())
    rows = [_outcome_row(o) for o in outcomes]
    if args.json:
        print(json.dumps({"device": source.device.to_dict(), "results": rows}, indent=2))
    else:
        print(_outcome_table(rows))
    return 0 if all(r["tuned_us"] is not None for r in rows) else 1


def _add_cudnn_times(outcomes, db) -> None:
    """Time PyTorch/cuDNN on each tuned shape (same protocol, at the problem's precision) and keep it
    in the stored record."""
    from autocnn.device import current_device
    from autocnn.tuning.baselines import time_cudnn, torch_available
    from autocnn.tuning.measure import L2Flusher

    if not torch_available():
        print("autocnn: --cudnn needs PyTorch with CUDA; cuDNN times were not taken", file=sys.stderr)
        return
    flusher = L2Flusher(current_device().l2_bytes)
    for o in outcomes:
        o.cudnn_us = time_cudnn(o.op, o.problem, flusher=flusher, budget_s=0.2)
        if o.cudnn_us is not None and o.record is not None:
            o.record = dataclasses.replace(o.record, cudnn_time_us=o.cudnn_us)
            db.put(o.record)


def _outcome_row(o) -> dict[str, Any]:
    return {
        "op": o.op, "shape": o.problem.shape_string(), "precision": _precision_text(o.problem),
        "default_us": o.default.time_us if o.default and o.default.ok else None,
        "tuned_us": o.best.time_us if o.best else None,
        "speedup": o.speedup, "cudnn_us": getattr(o, "cudnn_us", None),
        "vs_cudnn": (o.cudnn_us / o.best.time_us) if getattr(o, "cudnn_us", None) and o.best else None,
        "config": o.best.config.as_dict() if o.best else None,
        "measured": o.measured, "infeasible": o.infeasible, "reused": o.reused,
        "failures": dict(o.failures), "seconds": round(o.seconds, 2), "stopped": o.stopped_because,
        "study": o.study_name, "stored": o.record is not None,
    }


def _fmt(v: Any, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _outcome_table(rows: list[dict[str, Any]]) -> str:
    width = max([len("shape"), *(len(r["shape"]) for r in rows)])   # never cut: the end names the precision
    lines = [f"{'op':14s} {'shape':{width}s} {'default us':>10s} {'tuned us':>10s} {'speed-up':>8s} {'cuDNN us':>9s} "
             f"{'vs cuDNN':>8s} {'trials':>6s} {'failed':>6s} {'seconds':>7s}  stopped after"]
    for r in rows:
        failed = sum(r["failures"].values())
        lines.append(f"{r['op']:14s} {r['shape']:{width}s} {_fmt(r['default_us']):>10s} {_fmt(r['tuned_us']):>10s} "
                     f"{_fmt(r['speedup'], '.2f'):>8s} {_fmt(r['cudnn_us']):>9s} {_fmt(r['vs_cudnn'], '.2f'):>8s} "
                     f"{r['measured']:6d} {failed:6d} {r['seconds']:7.1f}  {r['stopped']}")
    return "\n".join(lines)


# -- db ---------------------------------------------------------------------------------------------

def _precision_text(problem: Any) -> str:
    """A record's precision as db list and show print it ("-" for pooling, which has none)."""
    return problem.precision if isinstance(problem, ConvProblem) else "-"


def _matching(db, args: argparse.Namespace, shape: str | None = None, stale: bool = False):
    from autocnn.kernels import problem_from_dict

    wanted: dict[str, Any] = {}   # op -> the problem --shape (and --precision) names for it

    def named(op: str) -> Any:
        if op not in wanted:
            try:
                wanted[op] = _shape_problem(op, shape, args.precision)
            except InvalidProblemError:
                wanted[op] = None   # a shape of another kind of operation: no record of this op matches
        return wanted[op]

    out = []
    for rec in ([r for r, _ in db.stale_records()] if stale else db.records()):
        if args.gpu and args.gpu.lower() not in rec.key.gpu.lower():
            continue
        if args.op and rec.key.op != args.op:
            continue
        problem = problem_from_dict(rec.key.problem)
        if args.precision and _precision_text(problem) != args.precision:
            continue
        if shape is not None and named(rec.key.op) != problem:
            continue
        out.append(rec)
    return out


def cmd_db_list(args: argparse.Namespace) -> int:
    from autocnn.store import TuningDatabase

    from autocnn.kernels import parse_shape

    db = TuningDatabase()
    rows = []
    for r in db.summary_rows():
        # The shape string is the problem's canonical text (a tf32 one ends in precision=tf32), so
        # parsing it back gives the precision without a second pass over the records.
        precision = _precision_text(parse_shape(r.op, r.shape))
        if ((not args.gpu or args.gpu.lower() in r.gpu.lower()) and (not args.op or r.op == args.op)
                and (not args.precision or precision == args.precision)):
            rows.append((r, precision))
    if args.json:
        print(json.dumps([{**dataclasses.asdict(r), "precision": precision} for r, precision in rows], indent=2))
        return 0
    if not rows:
        print("no tuned records (run autocnn tune first)" if not (args.gpu or args.op or args.precision)
              else "no tuned record matches the filters")
        return 0
    # Shapes are never cut: their ends (epilogue, precision) tell records apart.
    width = max([len("shape"), *(len(r.shape) for r, _ in rows)])
    print(f"{'gpu':22s} {'op':14s} {'precision':9s} {'shape':{width}s} {'tuned us':>9s} {'default us':>10s} "
          f"{'speed-up':>8s}")
    for r, precision in rows:
        print(f"{r.gpu[:22]:22s} {r.op:14s} {precision:9s} {r.shape:{width}s} {_fmt(r.time_us):>9s} "
              f"{_fmt(r.default_time_us):>10s} {_fmt(r.speedup, '.2f'):>8s}")
    return 0


def cmd_db_show(args: argparse.Namespace) -> int:
    from autocnn.store import TuningDatabase

    recs = _matching(TuningDatabase(), args, args.shape)
    if not recs:
        print("no matching record")
        return 1
    from autocnn.kernels import problem_from_dict

    # The stored key leaves fp32 out (records made before precision existed keep their keys): say it.
    print(json.dumps([{"precision": _precision_text(problem_from_dict(r.key.problem)), **r.to_dict()}
                      for r in recs], indent=2))
    return 0


def cmd_db_export(args: argparse.Namespace) -> int:
    from autocnn.store import TuningDatabase

    db = TuningDatabase()
    keys = {r.key for r in _matching(db, args)}
    count = db.export(args.path, lambda rec: rec.key in keys)
    print(f"wrote {count} records to {args.path}")
    return 0


def cmd_db_import(args: argparse.Namespace) -> int:
    from autocnn.store import TuningDatabase

    report = TuningDatabase().import_file(args.path, keep_faster=args.keep_faster)
    stored = len(report.accepted) - len(report.kept_existing)
    print(f"imported {stored} records from {args.path}"
          + (f"; kept {len(report.kept_existing)} existing records that are as fast or faster"
             if report.kept_existing else ""))
    for reason in report.rejected:
        print(f"  rejected: {reason}")
    return 0 if not report.rejected else 1


def cmd_db_remove(args: argparse.Namespace) -> int:
    from autocnn.store import TuningDatabase

    db = TuningDatabase()
    recs = _matching(db, args, args.shape, stale=args.stale)
    if not recs:
        print("no matching stale record" if args.stale else "no matching record")
        return 1
    if not args.yes:
        if not sys.stdin.isatty():
            raise ValueError(f"{len(recs)} records match; add --yes to remove them without a prompt")
        answer = input(f"remove {len(recs)} records? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            return 1
    removed = db.remove(lambda rec: any(rec.key == r.key for r in recs))
    print(f"removed {removed} records")
    return 0


def cmd_db_check(args: argparse.Namespace) -> int:
    from autocnn.store import TuningDatabase

    problems = TuningDatabase().check()
    for p in problems:
        print(p)
    if not problems:
        print("the tuning database is consistent")
    return 0 if not problems else 1


# -- bench, train, report ------------------------------------------------------------------------

def cmd_bench(args: argparse.Namespace) -> int:
    from autocnn.tuning.benchmark import main as bench_main

    return bench_main(args.args)


def cmd_train(args: argparse.Namespace) -> int:
    from autocnn.nn.training import train

    report = train(args.network, dataset=args.dataset, epochs=args.epochs, batch_size=args.batch_size,
                   backend=args.backend, optimizer=args.optimizer, lr=args.lr, seed=args.seed,
                   data_root=args.data_root, limit=args.limit, verbose=not args.json,
                   standardize=not args.no_standardize, precision=args.precision,
                   lr_schedule=None if args.lr_schedule == "none" else args.lr_schedule)
    if args.save:
        report.model.save(args.save)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(report.summary())
        print(report.dispatch_report)
        if args.save:
            print(f"weights written to {args.save}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from autocnn.reports import main as report_main

    return report_main(args.args)


if __name__ == "__main__":
    raise SystemExit(main())
