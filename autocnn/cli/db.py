"""``autocnn db``: list, show, export, import, remove and check tuned records (each with its precision)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autocnn.cli.checks import quiet_database
from autocnn.cli.problems import fmt, precision_text, shape_problem
from autocnn.errors import InvalidProblemError
from autocnn.precision import PRECISION_NAMES


def add_parser(sub: Any) -> None:
    """The ``db`` command's parsers, under the top-level ``sub``parsers."""
    d = sub.add_parser("db", help="list, show, export, import or remove tuned records")
    dsub = d.add_subparsers(title="database commands")
    dl = dsub.add_parser("list", help="one line per tuned kernel")
    db_filters(dl)
    dl.add_argument("--json", action="store_true")
    dl.set_defaults(func=lambda a: db_list(RecordFilter.of(a), a.json))
    ds = dsub.add_parser("show", help="every field of the matching records")
    db_filters(ds)
    ds.add_argument("--shape", help="shape string of the problem (with --op)")
    ds.set_defaults(func=lambda a: db_show(RecordFilter.of(a, a.shape)))
    de = dsub.add_parser("export", help="write matching records to a JSON file")
    de.add_argument("path", type=Path)
    db_filters(de)
    de.set_defaults(func=lambda a: db_export(a.path, RecordFilter.of(a)))
    di = dsub.add_parser("import", help="validate and add the records of a JSON file")
    di.add_argument("path", type=Path)
    di.add_argument("--keep-faster", action="store_true",
                    help="replace a record of the same problem only when the imported one is faster "
                         "(keeping its cuDNN time); default: the imported record replaces it")
    di.set_defaults(func=lambda a: db_import(a.path, a.keep_faster))
    dr = dsub.add_parser("remove", help="remove matching user records (shipped records stay)")
    db_filters(dr)
    dr.add_argument("--shape", help="shape string of the problem (with --op)")
    dr.add_argument("--stale", action="store_true",
                    help="match the stale records (tuned with templates that have changed since) instead")
    dr.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    dr.set_defaults(func=lambda a: db_remove(RecordFilter.of(a, a.shape, a.stale), a.yes))
    dc = dsub.add_parser("check", help="report unreadable files, records that are skipped, and records current by "
                                       "their plan digest only (old fingerprint, same code)")
    dc.add_argument("--rekey", action="store_true",
                    help="write the user records that are current by their plan digest only again with the "
                         "current fingerprint (shipped ones: scripts/stamp_plan_digests.py)")
    dc.set_defaults(func=lambda a: db_check(a.rekey))
    dm = dsub.add_parser("model", help="the cost model that ranks configs where no record of a problem exists, and "
                                       "how well it ranked held-out problems beside the nearest-shape rule")
    dm.set_defaults(func=lambda a: db_model())


@dataclass(frozen=True)
class RecordFilter:
    """Which records a db command is about: --gpu (a part of the name), --op, --precision, and for
    show and remove the problem --shape names and whether the stale records are meant."""

    gpu: str | None = None
    op: str | None = None
    precision: str | None = None
    shape: str | None = None
    stale: bool = False

    @staticmethod
    def of(args: argparse.Namespace, shape: str | None = None, stale: bool = False) -> "RecordFilter":
        return RecordFilter(args.gpu, args.op, args.precision, shape, stale)


def db_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", default=None, help="only GPUs whose name contains this text")
    p.add_argument("--op", default=None, help="only this operation")
    p.add_argument("--precision", choices=PRECISION_NAMES, default=None,
                   help="only records of this precision (float32 pooling records, which fp32 and tf32 runs "
                        "share, are left out)")


def check_filters(wanted: RecordFilter) -> None:
    """A filter that can match nothing by its spelling is named, not answered with "no record"."""
    from autocnn.kernels import OPERATIONS

    if wanted.op is not None and wanted.op not in OPERATIONS:
        raise ValueError(f"--op {wanted.op!r} is not an operation; choose from {', '.join(OPERATIONS)}")


def _matching(db, filters: RecordFilter):
    from autocnn.kernels import problem_from_dict

    check_filters(filters)

    wanted: dict[str, Any] = {}   # op -> the problem --shape (and --precision) names for it

    def named(op: str) -> Any:
        if op not in wanted:
            try:
                wanted[op] = shape_problem(op, filters.shape, filters.precision)
            except InvalidProblemError:
                wanted[op] = None   # a shape of another kind of operation: no record of this op matches
        return wanted[op]

    out = []
    for rec in ([r for r, _ in db.stale_records()] if filters.stale else db.records()):
        if filters.gpu and filters.gpu.lower() not in rec.key.gpu.lower():
            continue
        if filters.op and rec.key.op != filters.op:
            continue
        problem = problem_from_dict(rec.key.problem)
        if filters.precision and precision_text(problem) != filters.precision:
            continue
        if filters.shape is not None and named(rec.key.op) != problem:
            continue
        out.append(rec)
    return out


def db_list(filters: RecordFilter, as_json: bool) -> int:
    from autocnn.kernels import parse_shape
    from autocnn.store import TuningDatabase

    check_filters(filters)
    db = TuningDatabase()
    rows = []
    for r in db.summary_rows():
        # The shape string is the problem's canonical text (a tf32 one ends in precision=tf32), so
        # parsing it back gives the precision without a second pass over the records.
        precision = precision_text(parse_shape(r.op, r.shape))
        if ((not filters.gpu or filters.gpu.lower() in r.gpu.lower()) and (not filters.op or r.op == filters.op)
                and (not filters.precision or precision == filters.precision)):
            rows.append((r, precision))
    # Nothing found exits 1, as `db show` and `db remove` do for the same filters.
    if as_json:
        print(json.dumps([{**dataclasses.asdict(r), "precision": precision} for r, precision in rows], indent=2))
        return 0 if rows else 1
    if not rows:
        print("no tuned records (run autocnn tune first)" if not (filters.gpu or filters.op or filters.precision)
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


def db_model() -> int:
    """The cost model in use; exit 1 where none is (off, or its file refused)."""
    from autocnn.cost_model.model_file import active_model, in_use_text

    print(in_use_text())
    model = active_model()
    if model is not None and model.metadata is not None:
        slow = model.metadata.extra.get("top_pick_slowdown")
        if slow:
            print(f"first-ranked config's time over the fastest, held out: model {slow['model']:.3f}x, "
                  f"nearest-shape rule {slow['nearest_shape']:.3f}x")
        versus = model.metadata.extra.get("tuned_over_default")
        if versus and versus.get("asked"):
            print(f"held-out records whose default ran clearly slower: the tuned config ranked first for "
                  f"{versus['right']} of {versus['asked']}")
        print(f"trained on: {', '.join(model.metadata.sources)}")
    return 0 if model is not None else 1


def db_show(filters: RecordFilter) -> int:
    from autocnn.store import TuningDatabase

    recs = _matching(TuningDatabase(), filters)
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


def db_export(path: Path, filters: RecordFilter) -> int:
    from autocnn.preflight import writable_directory
    from autocnn.store import TuningDatabase

    if path.is_dir():
        raise ValueError(f"db export {path}: is a directory; give a file name")
    writable_directory(path.parent, f"db export {path}: the directory", "give a path you can write")
    db = TuningDatabase()
    keys = {r.key for r in _matching(db, filters)}
    count = db.export(path, lambda rec: rec.key in keys)
    print(f"wrote {count} records to {path}")
    return 0


def db_import(path: Path, keep_faster: bool) -> int:
    from autocnn.preflight import check_database

    db = quiet_database()
    check_database(db)   # before the file is read and validated
    report = db.import_file(path, keep_faster=keep_faster)
    for line in report.sentences(path):
        print(line)
    return 1 if report.failed else 0


def db_remove(filters: RecordFilter, yes: bool) -> int:
    from autocnn.preflight import check_database

    db = quiet_database()
    check_database(db)   # before anything is matched or asked
    recs = _matching(db, filters)
    if not recs:
        print("no matching stale record" if filters.stale else "no matching record")
        return 1
    if not yes:
        if not sys.stdin.isatty():
            raise ValueError(f"{len(recs)} records match; add --yes to remove them without a prompt")
        answer = input(f"remove {len(recs)} records? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            return 1
    removed = db.remove(lambda rec: any(rec.key == r.key for r in recs))
    print(f"removed {removed} records")
    return 0


def db_check(rekey: bool) -> int:
    from autocnn.store import TuningDatabase

    db = TuningDatabase()
    if rekey:
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
    from autocnn.cost_model.model_file import in_use_text

    print(in_use_text())
    problems = db.check()
    for p in problems:
        print(p)
    if not problems:
        print("the tuning database is consistent")
    return 0 if not problems else 1
