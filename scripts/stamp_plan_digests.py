#!/usr/bin/env python3
"""Give the shipped tuning records their plan digests, and write those current by digest only again.

A record is current when its fingerprint is its formulation's current one, or when its config
(completed with the first choice of any parameter added since) still plans to the code digest it
was tuned with (autocnn.store.records.validate_record). This script, run on a database directory
(the repository's tuning_db/ by default):

- adds ``plan_digest`` (the current code's) to every record that is current by its fingerprint and
  has none: run it before a template is edited, so that the digest describes the code the record
  was measured with;
- writes every record that is current by its plan digest only again with the current fingerprint
  and its completed config (after a template edit that left its code unchanged), so that loading
  need not plan it;
- leaves stale and invalid records as they are, and names them; with ``--drop-replaced``, removes
  each stale record whose shape has a current record for the same GPU in the same file (after a
  template edit changed a tuned config's code, `autocnn tune --stale` on the GPU tuned the shape
  again and scripts/ship_records.py added the new record beside the old one).

Files are written one record a line (autocnn.store.files._document_text), so diffs show only the
records that changed. ``--check`` writes nothing and exits 1 when anything would change.

    python scripts/stamp_plan_digests.py [--check] [--drop-replaced] [DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autocnn.kernels import get_operation  # noqa: E402
from autocnn.store.files import _document_text, describe_raw, file_document, read_raw  # noqa: E402
from autocnn.store.records import RecordError, StaleRecordError, TuningRecord, validate_record  # noqa: E402


def stamp(raws: list[Any]) -> tuple[list[Any], dict[str, int], list[str]]:
    """The entries with digests added and digest-only records re-keyed; counts and notes."""
    out: list[Any] = []
    counts = {"stamped": 0, "rekeyed": 0, "kept": 0, "skipped": 0}
    notes: list[str] = []
    for i, raw in enumerate(raws):
        try:
            record = TuningRecord.from_dict(raw)
            valid = validate_record(record)
        except RecordError as exc:
            counts["skipped"] += 1
            notes.append(f"record {i}{describe_raw(raw)} left as it is: {exc}")
            out.append(raw)
            continue
        if valid.record.key.fingerprint != record.key.fingerprint:
            counts["rekeyed"] += 1
            out.append(valid.record.to_dict())
            continue
        digest = get_operation(record.key.op).code_digest(valid.problem, valid.config)
        if record.plan_digest is None:
            counts["stamped"] += 1
            out.append({**raw, "plan_digest": digest})   # the raw entry as it was, plus its digest
            continue
        if record.plan_digest != digest:
            # Its fingerprint says the code is unchanged, its digest says otherwise: something that
            # decides the code is missing from the fingerprint. Leave the record for a person to judge.
            notes.append(f"record {i}{describe_raw(raw)}: plan digest {record.plan_digest}, but its config "
                         f"plans to {digest} under its own fingerprint")
        counts["kept"] += 1
        out.append(raw)
    return out, counts, notes


def _shape_key(record: TuningRecord) -> str:
    """GPU and problem: what a stale record and its replacement have in common."""
    return json.dumps([record.key.gpu, record.key.problem], sort_keys=True)


def drop_replaced(raws: list[Any]) -> tuple[list[Any], list[str]]:
    """The entries without the stale records whose GPU and problem a current record of the list
    also has; the dropped ones named."""
    current, stale = set(), {}
    for i, raw in enumerate(raws):
        try:
            record = TuningRecord.from_dict(raw)
        except RecordError:
            continue
        try:
            validate_record(record)
            current.add(_shape_key(record))
        except StaleRecordError:
            stale[i] = _shape_key(record)
        except RecordError:
            continue
    dropped = {i for i, key in stale.items() if key in current}
    return ([raw for i, raw in enumerate(raws) if i not in dropped],
            [f"record {i}{describe_raw(raws[i])} dropped: stale, and tuned again since" for i in sorted(dropped)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("directory", nargs="?", type=Path, default=Path(__file__).resolve().parent.parent / "tuning_db")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when anything would change")
    ap.add_argument("--drop-replaced", action="store_true",
                    help="remove stale records whose GPU and shape have a current record in the same file")
    args = ap.parse_args(argv)
    changed = False
    for path in sorted(args.directory.glob("*.json")):
        raws = read_raw(path)
        out, counts, notes = stamp(raws)
        if args.drop_replaced:
            out, dropped = drop_replaced(out)
            notes += dropped
        for note in notes:
            print(f"{path}: {note}")
        print(f"{path.name}: {counts['stamped']} records given a plan digest, {counts['rekeyed']} re-keyed, "
              f"{counts['kept']} unchanged, {counts['skipped']} left stale or invalid")
        if out == raws:
            continue
        changed = True
        if args.check:
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        tmp = path.with_name(f".{path.name}.stamp.tmp")
        tmp.write_text(_document_text(file_document(out)), encoding="utf-8")
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
