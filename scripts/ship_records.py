#!/usr/bin/env python3
"""Merge tuned records (a GPU host's user database files, or `autocnn db export` files) into the
shipped tuning database, keeping the faster record of each key.

`autocnn db import` writes only user databases: the shipped directory is read-only to the library,
so that no tuning run can change what the package ships. Shipping records is a maintainer's step,
and this script is it: every record of each file is validated exactly as loading does (a record
whose config no longer plans to the code it was tuned with is rejected, never shipped), and it
replaces the shipped record of its key only when it is faster (`--keep-faster`'s rule). Afterwards
run scripts/stamp_plan_digests.py --check, which must report nothing stale.

    python scripts/ship_records.py /path/to/nvidia-h100-80gb-hbm3_sm90.json [more files] [--into DIR]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autocnn.store.records import DatabaseError  # noqa: E402
from autocnn.store.database import TuningDatabase  # noqa: E402

SHIPPED = Path(__file__).resolve().parent.parent / "tuning_db"


def ship(files: list[Path], into: Path) -> int:
    """Import each file into ``into`` with keep-faster; 1 when a file is missing or unreadable or
    any record was rejected (the rest of the file is still merged), else 0."""
    if not into.is_dir():
        print(f"ship_records: {into} is not a directory", file=sys.stderr)
        return 1
    missing = [f for f in files if not f.is_file()]
    if missing:
        print(f"ship_records: no such file: {', '.join(map(str, missing))}", file=sys.stderr)
        return 1
    locks_before = set(into.glob("*.lock"))
    status = 0
    # The shipped directory is the database's user side here, with an empty directory as its
    # shipped side: the keep-faster comparison is then against exactly the records in ``into``.
    with tempfile.TemporaryDirectory(prefix="autocnn-ship-") as empty:
        db = TuningDatabase(user_dir=into, shipped_dir=Path(empty))
        for path in files:
            try:
                report = db.import_file(path, keep_faster=True)
            except DatabaseError as exc:
                print(f"ship_records: {exc}", file=sys.stderr)
                status = 1
                continue
            for line in report.sentences(path):
                print(line)
            status |= int(report.failed)
    for lock in set(into.glob("*.lock")) - locks_before:   # the writes' lock files, not shipped
        lock.unlink(missing_ok=True)
    return status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="database or export files of tuned records")
    ap.add_argument("--into", type=Path, default=SHIPPED, help="the shipped database directory (default: %(default)s)")
    args = ap.parse_args(argv)
    return ship(args.files, args.into)


if __name__ == "__main__":
    sys.exit(main())
