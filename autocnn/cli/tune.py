"""``autocnn tune``: its arguments turned once into a TuneCommand (the problems, the search's
settings, where measurements come from, what is printed), checked before any GPU is touched,
then the run: sources opened, each problem tuned under its budget, cuDNN timed beside, a table."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from autocnn.cli.checks import check_seed, quiet_database, say, tune_preflight
from autocnn.cli.problems import (LAYOUT_HELP, WORKSPACE_HELP, at_layout, at_precision, fmt, has_precision,
                                  precision_text, shape_problem, takes_layout, zoo_text)
from autocnn.device import set_workspace_limit
from autocnn.kernels.suite import SUITES
from autocnn.layout import LAYOUT_NAMES, layout_named, layout_of
from autocnn.precision import DEFAULT_PRECISION, PRECISION_NAMES, Precision, precision_named

if TYPE_CHECKING:   # the search's modules import Optuna: only a run needs them
    from autocnn.search.settings import TuneSettings

EXAMPLES = """examples:
  autocnn tune --op conv_fwd --shape N=128,C=3,H=32,W=32,K=64,R=8,S=8,stride=1,pad=4,4,3,3 --trials 100
  autocnn tune --network kriz09 --batch 128 --trials 400
  autocnn tune --suite seed --ops conv_fwd --precision tf32
  autocnn tune --suite grouped --ops conv_fwd,conv_bwd_data,conv_wgrad --precision bf16
  autocnn db list --precision tf32
  autocnn train --network lenet5 --epochs 10 --backend cuda --precision tf32
  autocnn bench --ops conv_fwd --shapes modern_14 --precision both
"""


def add_parser(sub: Any) -> None:
    """The ``tune`` command's parser, under the top-level ``sub``parsers."""
    t = sub.add_parser("tune", help="search the fastest verified kernel for a layer shape or a network",
                       description="Search each kernel's parameters with Optuna on this GPU and store the "
                                   "fastest verified variant in the tuning database.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = t.add_mutually_exclusive_group(required=True)
    what.add_argument("--op", help="operation: conv_fwd, conv_bwd_data, conv_wgrad, avgpool_fwd, avgpool_bwd")
    what.add_argument("--suite", choices=SUITES,
                      help="every shape of a named suite (with --ops to choose operations): seed, the five "
                           "source documents' layers; grouped, ResNeXt-50 32x4d's grouped 3x3 layers; depthwise, "
                           "MobileNetV2's, ConvNeXt-T's and RepLKNet-31B's depthwise layers (batch 64)")
    what.add_argument("--network", help=f"a zoo network ({zoo_text()}) "
                                        "or a network JSON file: tunes every kernel it needs, forward and backward")
    what.add_argument("--stale", action="store_true",
                      help="every shape whose record for this GPU kind (shipped or user) was tuned with "
                           "templates that have changed since (with --ops to choose operations)")
    what.add_argument("--torch-model", metavar="MODULE:FACTORY",
                      help="a PyTorch model, package.module:factory returning a torch.nn.Module (needs "
                           "autocnn[torch]; with --input-shape and --batch): tunes every kernel its training "
                           "step runs on autocnn's operators; with --precision bf16 or fp16, those it runs in "
                           "that dtype (under torch.autocast, or converted to it)")
    t.add_argument("--input-shape", metavar="C,H,W", help="with --torch-model: one input's channels, height, width")
    t.add_argument("--shape", help="with --op: N=..,C=..,H=..,W=..,K=..,R=..,S=..,stride=..,pad=t,l,b,r "
                                   "(pooling: N,C,H,W,window,stride,pad,count_pad)")
    t.add_argument("--batch", type=int, default=128,
                   help="with --network or --torch-model: the batch size (default 128)")
    t.add_argument("--ops", default=None,
                   help="with --suite, --network, --torch-model or --stale: comma-separated operations "
                        "(default: all five)")
    t.add_argument("--missing", action="store_true",
                   help="with --suite, --network or --torch-model: only the kernels without a full record of their "
                        "own for this GPU (those the lookup answers with another GPU's record, a nearest shape's "
                        "config, a default or a quick record); the others keep their records untouched")
    t.add_argument("--trials", type=int, default=100,
                   help="measured trials per kernel (with --network: for the whole network; default 100). "
                        "A re-run continues the same study up to this total.")
    t.add_argument("--timeout", type=float, default=None, help="wall-clock seconds per kernel (network: in all)")
    t.add_argument("--workspace-limit", default=None, metavar="SIZE",
                   help=WORKSPACE_HELP + "; configs that need more are never measured")
    where = t.add_mutually_exclusive_group()
    where.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    where.add_argument("--devices", default=None, metavar="0,1,...|all",
                       help="several GPUs of this host, one measuring worker each: a run's problems in "
                            "parallel, and one problem's trials shared by the GPUs of one kind")
    t.add_argument("--storage", default=None,
                   help="Optuna storage: sqlite:///PATH, postgresql://USER[:PASSWORD]@HOST[:PORT]/DB (the way "
                        "to share studies between hosts), journal:PATH or a *.log/.journal/.jsonl file, or "
                        "memory. Default: SQLite in the autocnn cache directory. Processes pointed at one "
                        "storage share each study's budget; no config is measured twice.")
    t.add_argument("--sampler", default="tpe", choices=("tpe", "random", "grid", "cmaes", "gp"),
                   help="search strategy (default tpe; grid is exhaustive)")
    t.add_argument("--seed", type=int, default=None, help="sampler seed")
    t.add_argument("--fix", default="", help="parameters held at one value, e.g. formulation=direct,PAD=1")
    t.add_argument("--vary", default="", metavar="NAME,...",
                   help="parameters along which the shape's earlier winners (its record, current or stale, and "
                        "the nearest shapes') are also measured at every other value before the search (a value "
                        "the space's rules refuse as it stands moves up to two other parameters to their nearest "
                        "values that keep them), e.g. TF32_ROUND,FRAG after a template gained them")
    t.add_argument("--replay", nargs="+", type=Path, default=None,
                   help="answer from recorded GPU measurements instead of a GPU (replay files)")
    t.add_argument("--precision", choices=PRECISION_NAMES, default=None,
                   help="what the convolutions must be as accurate as: fp32 (default; FP32-accurate, tensor "
                        "cores through 3xTF32) or tf32 (opt-in: one TF32 product per term, a looser bound). "
                        "Applies to every convolution tuned (--op, --suite, --network, --stale: there, only "
                        "the stale records of this precision); pooling has no precision. With --op it may "
                        "also be given in --shape as precision=tf32")
    t.add_argument("--layout", choices=LAYOUT_NAMES, default=None,
                   help=LAYOUT_HELP + ". Applies to the problems of --op (where --shape may also say layout=nhwc) "
                        "and --suite, and with --torch-model to the model (nhwc: it and its input in "
                        "channels_last); the training library (--network) runs nchw")
    t.add_argument("--cudnn", action=argparse.BooleanOptionalAction, default=None,
                   help="time PyTorch/cuDNN on each tuned shape, show the ratio and keep it in the record "
                        "(TF32 off for fp32 problems, on for tf32 ones); default: on when PyTorch with CUDA "
                        "is importable")
    t.add_argument("--json", action="store_true", help="print the results as JSON")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=lambda args: run_tune(tune_command(args)))


@dataclass(frozen=True)
class SourceChoice:
    """Where a run's measurements come from: recorded replay files, several GPUs of this host
    (--devices, as given: "all" or indices), or the one --device GPU."""

    replay: tuple[Path, ...] | None
    devices: str | None
    device: int


@dataclass(frozen=True)
class TuneCommand:
    """``autocnn tune`` as checked at the door, before any measurement source opens."""

    problems: tuple[Any, ...] | None      # None: --stale, asked of the database once the device is known
    torch_uses: tuple[Any, ...] | None    # --torch-model: its problems with their call counts (ProblemUse)
    stale_ops: tuple[str, ...]            # --stale: the operations whose stale records are tuned
    precision: Precision
    missing: bool                         # only the problems without a full record of their own
    whole_budget: bool                    # --network, --torch-model: --trials and --timeout for all kernels
    trials: int
    timeout_s: float | None
    settings: TuneSettings
    sources: SourceChoice
    cudnn: bool | None                    # None: time cuDNN where PyTorch with CUDA is importable
    json: bool
    progress: bool


def parse_fixed(text: str) -> dict[str, Any]:
    """--fix's name=value pairs; a value of digits as an int."""
    fixed: dict[str, Any] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--fix takes name=value pairs, not {item!r}")
        value = value.strip()
        fixed[key.strip()] = int(value) if value.lstrip("-").isdigit() else value
    return fixed


def parse_ops(text: str | None) -> list[str]:
    """--ops's operations (default: every one), each checked by name."""
    from autocnn.kernels import OPERATIONS

    ops = [o.strip() for o in (text or ",".join(OPERATIONS)).split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPERATIONS]
    if unknown:
        raise ValueError(f"--ops: unknown operation(s) {unknown}; choose from {', '.join(OPERATIONS)}")
    return ops


def open_sources(choice: SourceChoice):
    """The measurement sources of a run (a GpuSources; ``close()`` ends them): recorded replay
    files, the --devices GPUs (one measuring worker each) or the one --device GPU."""
    from autocnn.search.devices import GpuSources

    if choice.replay:
        from autocnn.measurement.sources import ReplayFile, ReplaySource

        return GpuSources([ReplaySource([ReplayFile.load(p) for p in choice.replay])], {})
    if choice.devices is not None:
        from autocnn.search.devices import device_count, open_gpu_sources, parse_devices, resolve_devices

        return open_gpu_sources(resolve_devices(parse_devices(choice.devices), device_count()))
    from autocnn.measurement.sources import GpuSource

    return GpuSources([GpuSource(choice.device)], {})


def parse_vary(text: str, problems: Sequence[Any] | None) -> tuple[str, ...]:
    """--vary's names, each a parameter of at least one problem's search space (checked before any
    device is touched, with sm_90's static limits: the names do not depend on the device)."""
    names = tuple(n for n in (t.strip() for t in text.split(",")) if n)
    if not names or not problems:
        return names
    from autocnn.device import DeviceLimits
    from autocnn.kernels import get_operation

    limits = DeviceLimits.for_arch("sm_90")
    known = {p.name for problem in problems for p in get_operation(problem.op).space(problem, limits).params}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"--vary: {', '.join(unknown)} is not a parameter of the problems tuned; "
                         f"their parameters are {', '.join(sorted(known))}")
    return names


def _tune_problems(args: argparse.Namespace, precision: Precision, op_problem: Any,
                   torch_uses: Any) -> list[Any] | None:
    """The problems of the run, known before any device is touched (None for --stale, which asks
    the database about the device's kind)."""
    if args.op:
        return [op_problem]
    if torch_uses is not None:
        return [u.problem for u in torch_uses]
    if args.suite:
        from autocnn.kernels.suite import suite_problems

        problems = [at_precision(problem, precision) for op in parse_ops(args.ops)
                    for _, problem in suite_problems(args.suite, op)]
        return problems if args.layout is None else _in_layout(problems, args.layout)
    if args.network:
        from autocnn.nn.zoo import load_network

        if args.batch < 1:
            raise ValueError(f"--batch must be at least 1, not {args.batch}")
        model = load_network(args.network)
        # The model's own problems at this precision (a 16-bit model offers no fused kernels).
        model.precision = precision
        problems = model.problems(args.batch, alternatives=True)
        if args.ops:
            ops = parse_ops(args.ops)
            problems = [p for p in problems if p.op in ops]
            if not problems:
                raise ValueError(f"--ops: {args.network} runs no {', '.join(ops)} kernel")
        return problems
    return None


def _in_layout(problems: list[Any], layout: str) -> list[Any]:
    """The suite's problems in --layout; says how many are left out (operations with no such layout)."""
    wanted = layout_named(layout, "--layout")
    kept = [at_layout(p, wanted) for p in problems if takes_layout(p) or layout_of(p) is wanted]
    if len(kept) < len(problems):
        ops = sorted({p.op for p in problems if not takes_layout(p)})
        print(f"autocnn: {len(problems) - len(kept)} problems ({', '.join(ops)}) left out: their operations have "
              f"only the nchw layout", file=sys.stderr)
    return kept


def _offering(fixed: dict[str, Any], problems: list[Any]) -> list[Any]:
    """The problems some config may serve (problems_offering: the held parameters, and the
    formulations' precisions); says how many are left out."""
    from autocnn.search.tuner import fixed_text, problems_offering

    offering = problems_offering(fixed, problems)
    if len(offering) < len(problems):   # said even with --json (on stderr): work this run leaves undone
        ops = sorted({p.op for p in problems if p not in offering})
        why = (f"their operations offer no config with --fix {fixed_text(fixed)}" if fixed
               else "no formulation of their operations serves their precision")
        print(f"autocnn: {len(problems) - len(offering)} problems ({', '.join(ops)}) left out: {why}", file=sys.stderr)
    return offering


def tune_command(args: argparse.Namespace) -> TuneCommand:
    """The parsed arguments as a TuneCommand. Everything is checked here, before a source is
    opened: a mistake costs no GPU start (the run's directories, storage and replay files are
    checked by ``run_tune`` before it opens one)."""
    from autocnn.search.devices import parse_devices
    from autocnn.search.settings import TuneSettings, check_timeout

    if args.op and not args.shape:
        raise ValueError("--op needs --shape, e.g. --shape N=128,C=3,H=32,W=32,K=64,R=8,S=8,stride=1,pad=4,4,3,3")
    if args.network and args.shape:
        raise ValueError("--shape goes with --op; a network's shapes come from the network and --batch")
    if args.missing and not (args.suite or args.network or args.torch_model):
        raise ValueError("--missing goes with --suite, --network or --torch-model (it leaves out the kernels that "
                         "already have a record of their own); --op tunes the one shape given, --stale the stale ones")
    if bool(args.torch_model) != bool(args.input_shape):
        raise ValueError("--torch-model and --input-shape go together, e.g. "
                         "--torch-model torchvision.models:resnet18 --input-shape 3,224,224 --batch 64")
    check_timeout(args.timeout)
    if args.workspace_limit is not None:
        set_workspace_limit(args.workspace_limit)   # the workers inherit it
    if args.devices is not None:
        parse_devices(args.devices)
    precision = precision_named(args.precision) if args.precision else DEFAULT_PRECISION
    if args.layout is not None and not (args.op or args.suite or args.torch_model):
        raise ValueError("--layout goes with --op, --suite or --torch-model: the training library (--network) runs "
                         "nchw, and --stale tunes each stale record in its own layout")
    op_problem = shape_problem(args.op, args.shape, args.precision, args.layout) if args.op else None
    torch_uses = None
    if args.torch_model:
        try:
            import autocnn.torch as autocnn_torch
        except ImportError as e:
            raise ValueError(f"--torch-model needs PyTorch (pip install 'autocnn[torch]'): {e}") from None
        # The model is built and traced on meta tensors.
        torch_uses = autocnn_torch.factory_problems(args.torch_model, args.input_shape, args.batch, precision,
                                                    args.layout)
    check_seed(args.seed)
    fixed = parse_fixed(args.fix)
    if torch_uses is not None:
        # --ops and --fix choose among the model's kernels as among a network's.
        if args.ops:
            ops = parse_ops(args.ops)
            torch_uses = [u for u in torch_uses if u.problem.op in ops]
            if not torch_uses:
                raise ValueError(f"--ops: {args.torch_model} runs no {', '.join(ops)} kernel")
        offering = _offering(fixed, [u.problem for u in torch_uses])
        torch_uses = [u for u in torch_uses if u.problem in offering]
    problems = _tune_problems(args, precision, op_problem, torch_uses)
    if problems is not None and torch_uses is None:
        problems = _offering(fixed, problems)
    whole_budget = bool(args.network or args.torch_model)   # --timeout is for all kernels together
    settings = TuneSettings(trials=args.trials, timeout_s=args.timeout if not whole_budget else None,
                            sampler=args.sampler, seed=args.seed, storage=args.storage,
                            fixed=fixed, vary=parse_vary(args.vary, problems))
    return TuneCommand(
        problems=None if problems is None else tuple(problems),
        torch_uses=None if torch_uses is None else tuple(torch_uses),
        stale_ops=tuple(parse_ops(args.ops)) if args.stale else (), precision=precision, missing=args.missing,
        whole_budget=whole_budget, trials=args.trials, timeout_s=args.timeout, settings=settings,
        sources=SourceChoice(tuple(args.replay) if args.replay else None, args.devices, args.device),
        cudnn=args.cudnn, json=args.json, progress=not args.no_progress)


def run_tune(command: TuneCommand) -> int:
    from autocnn.search.devices import each_problem, tune_on_devices
    from autocnn.search.network import plan_budgets
    from autocnn.search.tuner import Tuner
    from autocnn.store import TuningDatabase

    settings, fixed, precision = command.settings, dict(command.settings.fixed), command.precision
    problems = None if command.problems is None else list(command.problems)
    torch_uses = None if command.torch_uses is None else list(command.torch_uses)
    log = (lambda text: print(text, file=sys.stderr)) if not command.json else None
    # Not a terminal (a log file, CI): one line per finished problem instead of a redrawn bar.
    bar = command.progress and not command.json and sys.stderr.isatty()
    lines = log is not None and not bar

    def finished(outcome: Any) -> None:
        if lines:
            log(outcome.summary())

    db = quiet_database()
    # What the run needs at its end (directories, the storage, the replay files), before a source opens.
    tune_preflight(db, settings.storage, command.sources.replay, problems, fixed)
    opened = open_sources(command.sources)
    try:
        if problems is None:   # --stale
            stale = db.stale_problems(opened.device, list(command.stale_ops))
            problems = _offering(fixed, [p for p in stale if has_precision(p, precision)])
            if log:
                log(f"{len(problems)} shapes with stale records for {opened.device.name}")
            others = sorted({p.precision for p in stale if not has_precision(p, precision)})
            if others:   # said even with --json (on stderr): work this run leaves undone
                print(f"autocnn: {len(stale) - len(problems)} more stale shapes are {'/'.join(map(str, others))}: "
                      f"tune them with --precision {others[0]}", file=sys.stderr)
        if command.missing:
            problems, torch_uses = _missing_only(db, opened.device, problems, torch_uses)
        if not problems:   # --missing or --stale left nothing to tune (said on stderr)
            if command.json:
                print(json.dumps({"device": opened.device.to_dict(), "results": []}, indent=2))
            return 0
        if command.whole_budget:
            budgets = plan_budgets(problems, command.trials, command.timeout_s)
        else:
            budgets = each_problem(problems, command.trials, command.timeout_s)
        if len(opened.sources) > 1:
            outcomes = tune_on_devices(opened.sources, budgets, settings, db, log=log, on_outcome=finished)
        elif torch_uses is not None:   # its own split of the budget: by call count x expected time
            import autocnn.torch as autocnn_torch

            tuner = Tuner(opened.sources[0], db, settings, progress=bar, log=log)
            outcomes = autocnn_torch.tune_uses(tuner, torch_uses, command.trials, command.timeout_s, log)
            for outcome in outcomes:
                finished(outcome)
        else:
            tuner = Tuner(opened.sources[0], db, settings, progress=bar, log=log)
            outcomes = []
            for b in budgets:
                if log:
                    log(f"{b.problem.op} {b.problem.shape_string()}: {b.trials} trials")
                outcomes.append(tuner.tune(b.problem.op, b.problem, trials=b.trials, timeout_s=b.timeout_s))
                finished(outcomes[-1])
    finally:
        opened.close()
    notes: dict[str, str] = {}
    if not command.sources.replay and command.cudnn is not False:
        from autocnn.benchmark.baselines import open_baselines

        baselines = open_baselines()
        if command.cudnn or baselines.available:
            notes = _add_cudnn_times(outcomes, TuningDatabase(), baselines)
    rows = [_outcome_row(o) for o in outcomes]
    if command.json:
        print(json.dumps({"device": opened.device.to_dict(), "results": rows, "cudnn_notes": notes}, indent=2))
    else:
        print(_outcome_table(rows, notes))
    unsaved = [o for o in outcomes if o.unsaved_path is not None]
    for o in unsaved:   # nothing measured is lost: the record waits in its file
        say(f"{o.op} {o.problem.shape_string()}: the tuning database could not take the record; it is in "
            f"{o.unsaved_path}: `autocnn db import {o.unsaved_path}` adds it once the database is writable")
    return 0 if all(r["tuned_us"] is not None for r in rows) and not unsaved else 1


def _missing_only(db: Any, device: Any, problems: list[Any], torch_uses: list[Any] | None) -> tuple[list[Any], Any]:
    """--missing: the problems with no full record of their own for ``device``'s GPU (a quick record,
    another GPU's, a nearest shape's or a default is what the lookup would answer them now), and the
    torch uses of those; says on stderr how many were left as they are."""
    def own(problem: Any) -> bool:
        found = db.tuned(device, problem)
        return found is not None and found.source == "exact" and not found.record.quick

    keep = [p for p in problems if not own(p)]
    print(f"autocnn: --missing: {len(problems) - len(keep)} of {len(problems)} kernels have records of their own "
          f"for {device.name} and are left as they are; {len(keep)} to tune", file=sys.stderr)
    if torch_uses is not None:
        torch_uses = [u for u in torch_uses if u.problem in keep]
    return keep, torch_uses


def _add_cudnn_times(outcomes: list[Any], db: Any, baselines: Any) -> dict[str, str]:
    """Time PyTorch/cuDNN on each tuned shape (same protocol, at the problem's precision) and keep it
    in the stored record. A shape with no time keeps an empty cell: the footnotes returned (by op)
    say why, and those of ops timed as a sequence of PyTorch operators say which."""
    from autocnn.store import DatabaseError
    from autocnn.benchmark.baselines import BASELINE_NOTES

    notes: dict[str, str] = {}
    for o in outcomes:
        timed = baselines.time(o.op, o.problem)
        o.cudnn_us = timed.us
        if timed.reason is not None:
            notes.setdefault(o.op, f"none ({timed.reason})")
        elif o.op in BASELINE_NOTES:
            notes.setdefault(o.op, BASELINE_NOTES[o.op])
        if o.cudnn_us is not None and o.record is not None:
            o.record = dataclasses.replace(o.record, cudnn_time_us=o.cudnn_us)
            try:
                db.put(o.record)
            except (OSError, DatabaseError) as exc:   # the record is stored already; only its cuDNN time is not
                say(f"{o.op} {o.problem.shape_string()}: the cuDNN time was not added to the stored record: {exc}")
    return notes


def _outcome_row(o) -> dict[str, Any]:
    return {
        "op": o.op, "shape": o.problem.shape_string(), "precision": precision_text(o.problem),
        "default_us": o.default.time_us if o.default and o.default.ok else None,
        "tuned_us": o.best.time_us if o.best else None,
        "speedup": o.speedup, "cudnn_us": getattr(o, "cudnn_us", None),
        "vs_cudnn": (o.cudnn_us / o.best.time_us) if getattr(o, "cudnn_us", None) and o.best else None,
        "config": o.best.config.as_dict() if o.best else None,
        "measured": o.measured, "infeasible": o.infeasible, "reused": o.reused,
        "failures": dict(o.failures), "seconds": round(o.seconds, 2), "stopped": o.stopped_because,
        "study": o.study_name, "stored": o.record is not None,
    }


def _outcome_table(rows: list[dict[str, Any]], notes: dict[str, str] | None = None) -> str:
    width = max([len("shape"), *(len(r["shape"]) for r in rows)])   # never cut: the end names the precision
    lines = [f"{'op':14s} {'shape':{width}s} {'default us':>10s} {'tuned us':>10s} {'speed-up':>8s} {'cuDNN us':>9s} "
             f"{'vs cuDNN':>8s} {'trials':>6s} {'failed':>6s} {'seconds':>7s}  stopped after"]
    marks = {op: "*" * (i + 1) for i, op in enumerate(notes or {})}
    for r in rows:
        failed = sum(r["failures"].values())
        cudnn = fmt(r["cudnn_us"]) + marks.get(r["op"], "")
        lines.append(f"{r['op']:14s} {r['shape']:{width}s} {fmt(r['default_us']):>10s} {fmt(r['tuned_us']):>10s} "
                     f"{fmt(r['speedup'], '.2f'):>8s} {cudnn:>9s} {fmt(r['vs_cudnn'], '.2f'):>8s} "
                     f"{r['measured']:6d} {failed:6d} {r['seconds']:7.1f}  {r['stopped']}")
    lines += [f"{marks[op]} cuDNN column, {op}: {note}" for op, note in (notes or {}).items()]
    return "\n".join(lines)
