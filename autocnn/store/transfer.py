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

    @property
    def failed(self) -> bool:
        """True when any record was rejected: ``autocnn db import`` then exits non-zero."""
        return bool(self.rejected)

    def sentences(self, path: Path) -> list[str]:
        """What the import did, one plain sentence a line."""
        stored = len(self.accepted) - len(self.kept_existing)
        lines = [f"imported {stored} of the {len(self.accepted) + len(self.rejected)} records in {path}"
                 + (f"; kept {len(self.kept_existing)} existing records that are as fast or faster"
                    if self.kept_existing else "")]
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


def faster_records(records: Sequence[TuningRecord], stored: Sequence[TuningRecord]) -> list[TuningRecord]:
    """The records that replace a ``stored`` one of the same key (``keep_faster``: see ``replaces``);
    the cuDNN time of the record replaced is kept when the new one has none."""
    existing = {r.key.identity(): r for r in stored}
    chosen = []
    for r in records:
        old = existing.get(r.key.identity())
        if not replaces(r, old):
            continue
        if old is not None and r.cudnn_time_us is None and old.cudnn_time_us is not None:
            r = dataclasses.replace(r, cudnn_time_us=old.cudnn_time_us)
        chosen.append(r)
    return chosen


class RecordExchange:
    """Export and import of TuningDatabase. A mixin: it reads through ``records()`` and stores
    through ``put_many()``, which TuningDatabase provides."""

    def records(self, device: DeviceInfo | None = None, op: str | None = None, *,
                gpu: str | None = None, arch: str | None = None) -> list[TuningRecord]:
        raise NotImplementedError

    def put_many(self, records: Sequence[TuningRecord], keep_faster: bool = False) -> list[TuningRecord]:
        raise NotImplementedError

    def export(self, path: Path, filter: Callable[[TuningRecord], bool] | None = None) -> int:
        """Write the valid records (those ``filter`` accepts) to one file of the database format."""
        chosen = [r for r in self.records() if filter is None or filter(r)]
        atomic_write_json(Path(path), file_document([r.to_dict() for r in chosen]))
        return len(chosen)

    def import_file(self, path: Path, keep_faster: bool = False) -> ImportReport:
        """Validate every record of a file exactly as loading does and store the accepted ones
        (with ``keep_faster``, only those faster than the database's record of the same key)."""
        path = Path(path)
        try:
            raws = read_raw(path)
        except (CorruptFile, ForeignFormat) as exc:
            raise DatabaseError(f"{path}: {exc}") from None
        accepted: list[TuningRecord] = []
        rejected: list[ImportRejection] = []
        for i, raw in enumerate(raws):
            try:
                accepted.append(validate_record(TuningRecord.from_dict(raw)).record)
            except RecordError as exc:
                rejected.append(ImportRejection(i, describe_raw(raw).strip(" ()"), str(exc)))
        stored = self.put_many(accepted, keep_faster=keep_faster) if accepted else []
        stored_ids = {r.key.identity() for r in stored}
        kept = tuple(r.key for r in accepted if r.key.identity() not in stored_ids)
        return ImportReport(tuple(r.key for r in accepted), tuple(rejected), kept)
