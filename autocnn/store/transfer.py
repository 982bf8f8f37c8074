"""Moving records between a database and a file: export, import (validated exactly as loading
does), and the rule by which an imported or newly tuned record replaces a stored one."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from autocnn.device import DeviceInfo
from autocnn.store.files import (CorruptFile, ForeignFormat, atomic_write_json, describe_raw, file_document,
                                 read_raw)
from autocnn.store.records import DatabaseError, RecordError, RecordKey, TuningRecord, validate_record


@dataclass(frozen=True)
class ImportRejection:
    index: int          # position in the imported file's records list
    what: str           # op, shape and GPU where they could be read
    reason: str

    def __str__(self) -> str:
        what = f" ({self.what})" if self.what else ""
        return f"record {self.index}{what} was not imported: {self.reason}"


@dataclass(frozen=True)
class ImportReport:
    accepted: tuple[RecordKey, ...]
    rejected: tuple[ImportRejection, ...]
    # Valid records not stored because the database already had a record as fast (keep_faster).
    kept_existing: tuple[RecordKey, ...] = ()
    # Valid records left out for another record of the same key in the same file: the faster one
    # (keep_faster) or the last one.
    duplicates: tuple[RecordKey, ...] = ()
    keep_faster: bool = False

    @property
    def failed(self) -> bool:
        """True when any record was rejected: ``autocnn db import`` then exits non-zero."""
        return bool(self.rejected)

    @property
    def stored(self) -> int:
        """How many records the database holds now from the file."""
        return len(self.accepted) - len(self.duplicates) - len(self.kept_existing)

    def sentences(self, path: Path) -> list[str]:
        """What the import did, one plain sentence a line."""
        lines = [f"imported {self.stored} of the {len(self.accepted) + len(self.rejected)} records in {path}"
                 + (f"; kept {len(self.kept_existing)} existing records that are as fast or faster"
                    if self.kept_existing else "")]
        if self.duplicates:
            which = "the fastest" if self.keep_faster else "the last in the file"
            lines.append(f"left out {len(self.duplicates)} records whose key another record of the file has "
                         f"({which} of each key is the one imported)")
        lines += [str(r) for r in self.rejected]
        if self.rejected and not self.accepted:
            lines.append(f"no record of {path} was imported")
        return lines


def replaces(new: TuningRecord, old: TuningRecord | None) -> bool:
    """Whether ``new`` takes the place of ``old`` (same key) under ``keep_faster``.

    A full tuning always replaces a quick record (``TuningRecord.quick``), even when its winner
    timed slower: the quick one was chosen among a handful of candidates measured once, the full
    one was searched for and confirmed. A quick record never replaces a full one. Otherwise (both
    full, or both quick) only a faster record replaces."""
    if old is None:
        return True
    if old.quick != new.quick:
        return old.quick
    return new.time_us < old.time_us


def same_record(a: TuningRecord, b: TuningRecord) -> bool:
    """The very record (its key, config, time and tuning time), not only one of the same key."""
    return (a.key == b.key and a.config == b.config and a.time_us == b.time_us and a.tuned_at == b.tuned_at)


def faster_records(records: Sequence[TuningRecord], stored: Sequence[TuningRecord],
                   superseded: Sequence[TuningRecord] = ()) -> list[TuningRecord]:
    """The records that replace a ``stored`` one of the same key (``keep_faster``: see ``replaces``;
    a stored record that is one of ``superseded``, measured again by the caller, is replaced whatever
    its time); the cuDNN time of the record replaced is kept when the new one has none."""
    existing = {r.key.identity(): r for r in stored}
    chosen = []
    for r in records:
        old = existing.get(r.key.identity())
        measured_again = old is not None and any(same_record(old, s) for s in superseded)
        if not measured_again and not replaces(r, old):
            continue
        if old is not None and r.cudnn_time_us is None and old.cudnn_time_us is not None:
            r = dataclasses.replace(r, cudnn_time_us=old.cudnn_time_us)
        chosen.append(r)
    return chosen


def fastest_of_each_key(records: Sequence[TuningRecord]) -> list[TuningRecord]:
    """One record per key, the one ``replaces`` prefers (a full record over a quick one, else the
    faster; of equal ones the first), in the order of the keys' first records."""
    best: dict[str, TuningRecord] = {}
    for r in records:
        identity = r.key.identity()
        if identity not in best or replaces(r, best[identity]):
            best[identity] = r
    return list(best.values())


class RecordExchange:
    """Export and import of TuningDatabase. A mixin: it reads through ``records()`` and stores
    through ``put_many()``, which TuningDatabase provides."""

    def records(self, device: DeviceInfo | None = None, op: str | None = None, *,
                gpu: str | None = None, arch: str | None = None) -> list[TuningRecord]:
        raise NotImplementedError

    def put_many(self, records: Sequence[TuningRecord], keep_faster: bool = False,
                 superseded: Sequence[TuningRecord] = ()) -> list[TuningRecord]:
        raise NotImplementedError

    def export(self, path: Path, filter: Callable[[TuningRecord], bool] | None = None) -> int:
        """Write the valid records (those ``filter`` accepts) to one file of the database format."""
        chosen = [r for r in self.records() if filter is None or filter(r)]
        atomic_write_json(Path(path), file_document([r.to_dict() for r in chosen]))
        return len(chosen)

    def import_file(self, path: Path, keep_faster: bool = False) -> ImportReport:
        """Validate every record of a file exactly as loading does, and as evidence (no time under
        the physical floor, a plan digest its config plans to: ``evidence``), and store the
        accepted ones (with ``keep_faster``, only those faster than the database's record of the
        same key; of records of one key in the file, the fastest, else the last)."""
        from autocnn.store.evidence import evidence_problems

        path = Path(path)
        if path.is_dir():
            raise DatabaseError(f"{path} is a directory; give a file written by `autocnn db export` "
                                f"(or one of the directory's *.json files)")
        if not path.exists():
            raise DatabaseError(f"{path} does not exist; give a file written by `autocnn db export`")
        try:
            raws = read_raw(path)
        except (CorruptFile, ForeignFormat) as exc:
            raise DatabaseError(f"{path}: {exc}") from None
        except OSError as exc:
            raise DatabaseError(f"{path} cannot be read: {exc.strerror or exc}") from None
        accepted: list[TuningRecord] = []
        rejected: list[ImportRejection] = []
        for i, raw in enumerate(raws):
            try:
                original = TuningRecord.from_dict(raw)
                valid = validate_record(original)
            except RecordError as exc:
                rejected.append(ImportRejection(i, describe_raw(raw).strip(" ()"), str(exc)))
                continue
            why = evidence_problems(valid, original)
            if why:
                rejected.append(ImportRejection(i, describe_raw(raw).strip(" ()"), "; ".join(why)))
                continue
            accepted.append(valid.record)
        if keep_faster:
            chosen = fastest_of_each_key(accepted)
        else:
            chosen = list({r.key.identity(): r for r in accepted}.values())   # the last of each key
        chosen_ids = {id(r) for r in chosen}
        duplicates = tuple(r.key for r in accepted if id(r) not in chosen_ids)
        stored = self.put_many(chosen, keep_faster=keep_faster) if chosen else []
        stored_ids = {r.key.identity() for r in stored}
        kept = tuple(r.key for r in chosen if r.key.identity() not in stored_ids)
        return ImportReport(tuple(r.key for r in accepted), tuple(rejected), kept, duplicates, keep_faster)
