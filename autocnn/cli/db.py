"""``autocnn db``: list, show, export, import, remove and check tuned records (each with its precision)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from autocnn.cli_problems import fmt, precision_text, shape_problem
from autocnn.errors import InvalidProblemError
from autocnn.precision import PRECISION_NAMES


def db_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", default=None, help="only GPUs whose name contains this text")
    p.add_argument("--op", default=None, help="only this operation")
    p.add_argument("--precision", choices=PRECISION_NAMES, default=None,
                   help="only convolution records of this precision (pooling records have none and are "
                        "left out)")


def check_filters(args: argparse.Namespace) -> None:
    """A filter that can match nothing by its spelling is named, not answered with "no record"."""
    from autocnn.kernels import OPERATIONS

    if args.op is not None and args.op not in OPERATIONS:
        raise ValueError(f"--op {args.op!r} is not an operation; choose from {', '.join(OPERATIONS)}")


def _matching(db, args: argparse.Namespace, shape: str | None = None, stale: bool = False):
    from autocnn.kernels import problem_from_dict

    check_filters(args)

    wanted: dict[str, Any] = {}   # op -> the problem --shape (and --precision) names for it

    def named(op: str) -> Any:
        if op not in wanted:
            try:
                wanted[op] = shape_problem(op, shape, args.precision)
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
        if args.precision and precision_text(problem) != args.precision:
            continue
        if shape is not None and named(rec.key.op) != problem:
            continue
        out.append(rec)
    return out


def cmd_db_list(args: argparse.Namespace) -> int:
    from autocnn.store import TuningDatabase

    from autocnn.kernels import parse_shape

    check_filters(args)
    db = TuningDatabase()
    rows = []
    for r in db.summary_rows():
        # The shape string is the problem's canonical text (a tf32 one ends in precision=tf32), so
        # parsing it back gives the precision without a second pass over the records.
        precision = precision_text(parse_shape(r.op, r.shape))
        if ((not args.gpu or args.gpu.lower() in r.gpu.lower()) and (not args.op or r.op == args.op)
                and (not args.precision or precision == args.precision)):
            rows.append((r, precision))
    # Nothing found exits 1, as `db show` and `db remove` do for the same filters.
    if args.json:
        print(json.dumps([{**dataclasses.asdict(r), "precision": precision} for r, precision in rows], indent=2))
        return 0 if rows else 1
    if not rows:
        print("no tuned records (run autocnn tune first)" if not (args.gpu or args.op or args.precision)
              else "no tuned record matches the filters")
        return 1
    # Shapes are never cut: their ends (epilogue, precision) tell records apart.
    width = max([len("shape"), *(len(r.shape) for r, _ in rows)])
    print(f"{'gpu':22s} {'op':14s} {'precision':9s} {'shape':{width}s} {'tuned us':>9s} {'default us':>10s} "
          f"{'speed-up':>8s}  tuning")
    for r, precision in rows:
        print(f"{r.gpu[:22]:22s} {r.op:14s} {precision:9s} {r.shape:{width}s} {fmt(r.time_us):>9s} "
              f"{fmt(r.default_time_us):>10s} {fmt(r.speedup, '.2f'):>8s}  {'quick' if r.quick else 'full'}")
    return 0


def cmd_db_show(args: argparse.Namespace) -> int:
    from autocnn.store import TuningDatabase

    recs = _matching(TuningDatabase(), args, args.shape)
    if not recs:
        print("no matching record")
        return 1
    from autocnn.kernels import get_operation
    from autocnn.store.records import validate_record

    shown = []
    for r in recs:
        valid = validate_record(r)
        # The stored key leaves fp32 out (records made before precision existed keep their keys): say
        # it; and records made before workspaces were written get theirs from their config's plan.
        workspace = r.workspace_bytes
        if workspace is None:
            workspace = get_operation(r.key.op).workspace_bytes(valid.problem, valid.config)
        shown.append({"precision": precision_text(valid.problem), **r.to_dict(), "workspace_bytes": workspace})
    print(json.dumps(shown, indent=2))
    return 0


def cmd_db_export(args: argparse.Namespace) -> int:
    from autocnn.store import TuningDatabase

    from autocnn.preflight import writable_directory

    if args.path.is_dir():
        raise ValueError(f"db export {args.path}: is a directory; give a file name")
    writable_directory(args.path.parent, f"db export {args.path}: the directory", "give a path you can write")
    db = TuningDatabase()
    keys = {r.key for r in _matching(db, args)}
    count = db.export(args.path, lambda rec: rec.key in keys)
    print(f"wrote {count} records to {args.path}")
    return 0


def cmd_db_import(args: argparse.Namespace) -> int:
    from autocnn.cli_checks import quiet_database
    from autocnn.preflight import check_database

    db = quiet_database()
    check_database(db)   # before the file is read and validated
    report = db.import_file(args.path, keep_faster=args.keep_faster)
    for line in report.sentences(args.path):
        print(line)
    return 1 if report.failed else 0


def cmd_db_remove(args: argparse.Namespace) -> int:
    from autocnn.cli_checks import quiet_database
    from autocnn.preflight import check_database

    db = quiet_database()
    check_database(db)   # before anything is matched or asked
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

    db = TuningDatabase()
    if getattr(args, "rekey", False):
        from autocnn.preflight import check_database

        check_database(db)
        print(f"re-keyed {db.rekey()} user records that are current by their plan digest only")
    # Records whose templates changed but whose configs generate the code they were tuned with:
    # used as current (the fingerprint in their files is old); not a problem, but worth writing again.
    rekeyed = db.current_by_digest()
    for note in rekeyed:
        print(note)
    if rekeyed:
        print(f"{len(rekeyed)} records are current by their plan digest only (used as current; "
              f"`autocnn db check --rekey` writes the user ones with the current fingerprint, "
              f"scripts/stamp_plan_digests.py the shipped ones)")
    problems = db.check()
    for p in problems:
        print(p)
    if not problems:
        print("the tuning database is consistent")
    return 0 if not problems else 1
