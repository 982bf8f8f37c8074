"""The tuning database: shipped (read-only) and user records, validated on load, written
atomically under a lock, looked up with fallback.

A record says "on this GPU, with this CUDA runtime and driver, this config ran this problem of this
operation in this time, with the template family at this fingerprint" (``records``). The files and
their checks are ``files``; lookup and stale records are ``lookup``; export and import ``transfer``.
TuningDatabase composes them.

This module runs on CPU-only machines: it imports no CuPy.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from autocnn.device import DeviceInfo
from autocnn.store.feasibility import ResourceCheck
from autocnn.store.files import (Entry, FileScan, Origin, as_loaded, canonical_identity, default_shipped_dir,
                                 default_user_dir, file_signature, raw_identity, rekey_raws, rewrite_locked,
                                 scan_file)
from autocnn.store.lookup import RecordLookup
from autocnn.store.records import DatabaseError, RecordError, RecordKey, TuningRecord, validate_record
from autocnn.store.transfer import RecordExchange, faster_records, fastest_of_each_key


@dataclass(frozen=True)
class SummaryRow:
    """One line of ``autocnn db list``."""

    gpu: str
    arch: str
    op: str
    shape: str
    config: str
    time_us: float
    default_time_us: float | None
    speedup: float | None
    origin: Origin
    quick: bool = False      # tuned quickly on first use (AUTOCNN_AUTOTUNE=quick); a full tuning replaces it


class TuningDatabase(RecordLookup, RecordExchange):
    """Shipped (read-only) and user records, validated on load, written atomically under a lock."""

    # Hears a sentence when a write waits for a file's lock held by another process (the command
    # line says it on stderr, so that a wait of up to LOCK_TIMEOUT_S is not silent).
    on_lock_wait: Callable[[str], None] | None = None

    def __init__(self, user_dir: Path | None = None, shipped_dir: Path | None = None,
                 resource_check: ResourceCheck | None = None):
        if resource_check is not None:   # default: ptxas_check (see RecordLookup.lookup)
            self.resource_check = resource_check
        self.user_dir = Path(user_dir) if user_dir is not None else default_user_dir()
        self.shipped_dir = Path(shipped_dir) if shipped_dir is not None else default_shipped_dir()
        # path -> (stat signature, scan): a file is validated again only when it changed
        self._scans: dict[Path, tuple[tuple[int, int, int], FileScan]] = {}
        self._merged: tuple[Any, list[Entry], list[FileScan]] | None = None   # (files' scans, merged entries, scans)

    # -- paths --
    def path_for(self, device: DeviceInfo | RecordKey) -> Path:
        """The user file that holds records of this GPU kind."""
        return self.user_dir / f"{device.slug()}.json"

    def _files(self) -> list[tuple[Path, Origin]]:
        out: list[tuple[Path, Origin]] = []
        # Shipped first, so that user records of the same key replace them.
        for directory, origin in ((self.shipped_dir, "shipped"), (self.user_dir, "user")):
            if directory.is_dir():
                out += [(p, origin) for p in sorted(directory.glob("*.json")) if p.is_file()]
        return out

    # -- reading --
    def _scan(self, path: Path, origin: Origin, warn: bool) -> FileScan:
        sig = file_signature(path)
        cached = self._scans.get(path)
        if sig is not None and cached is not None and cached[0] == sig:
            return cached[1]
        scan = scan_file(path, origin)
        if sig is not None:
            self._scans[path] = (sig, scan)
        if warn:
            for message, category in scan.problems:
                warnings.warn(message, category, stacklevel=4)
        return scan

    def _entries(self) -> list[Entry]:
        """Every valid record; a user record replaces a shipped one with the same key. Merged again
        only when a file changed (a lookup asks several times a problem, and keying thousands of
        shipped records each time was most of a small search's time)."""
        scans = [(path, self._scan(path, origin, warn=True)) for path, origin in self._files()]
        signature = tuple((path, id(scan)) for path, scan in scans)
        if self._merged is not None and self._merged[0] == signature:
            return self._merged[1]
        by_key: dict[str, Entry] = {}
        for _, scan in scans:
            for entry in scan.entries:
                by_key[entry.record.key.identity()] = entry
        entries = list(by_key.values())
        # The scans themselves are held in the signature's place, so no id is reused while cached.
        self._merged = (signature, entries, [scan for _, scan in scans])
        return entries

    def records(self, device: DeviceInfo | None = None, op: str | None = None, *,
                gpu: str | None = None, arch: str | None = None) -> list[TuningRecord]:
        """All valid records, optionally only those of one exact GPU identity (``device``), one
        operation, one GPU name (case-insensitive) or one architecture (e.g. "sm_90")."""
        out = []
        for e in self._entries():
            k = e.record.key
            if device is not None and not k.same_gpu(device):
                continue
            if op is not None and k.op != op:
                continue
            if gpu is not None and k.gpu.lower() != gpu.lower():
                continue
            if arch is not None and k.arch != arch:
                continue
            out.append(e.record)
        return out

    def check(self) -> list[str]:
        """Every problem in every file (shipped and user), without warnings; empty when all is well:
        records skipped on load, and records whose times or plan digests cannot be true
        (``evidence``)."""
        from autocnn.store.evidence import file_evidence

        problems: list[str] = []
        for path, origin in self._files():
            problems += [message for message, _ in scan_file(path, origin).problems]
            # Records that load but whose numbers cannot be true: a time under the physical floor,
            # a plan digest that is not their config's.
            problems += file_evidence(path)
        if self.user_dir.is_dir():
            for aside in sorted(self.user_dir.glob("*.json.corrupt-*")):
                problems.append(f"{aside}: a corrupted database file moved aside; inspect or delete it")
        return problems

    def current_by_digest(self) -> list[str]:
        """Every record (shipped and user) that is current by its plan digest only, one sentence
        each: its fingerprint is old, but its config (completed with the first choice of any
        parameter added since) generates the code it was tuned with. Such records are used as
        current; ``rekey`` writes the user ones again with the current fingerprint."""
        notes: list[str] = []
        for path, origin in self._files():
            notes += list(scan_file(path, origin).rekeyed)
        return notes

    def rekey(self) -> int:
        """Write every user record that is current by its plan digest only again as loading sees
        it: the current fingerprint and its completed config (``files.rekey_raws``). Returns how many."""
        total = 0
        if not self.user_dir.is_dir():
            return 0
        for path in sorted(self.user_dir.glob("*.json")):
            def change(raws: list[Any]) -> list[Any]:
                nonlocal total
                out, count = rekey_raws(raws)
                total += count
                return out
            self._rewrite(path, change, create=False)
        return total

    # -- writing --
    def put(self, record: TuningRecord) -> None:
        """Store a record (replacing one with the same key) in the user file of its GPU kind."""
        self.put_many([record])

    def put_many(self, records: Sequence[TuningRecord], keep_faster: bool = False,
                 superseded: Sequence[TuningRecord] = ()) -> list[TuningRecord]:
        """Store several records, one locked rewrite per file; returns the records stored. Every
        record is validated first (RecordError), so nothing is written that loading would skip.
        Of records with one key, the last is stored, or with ``keep_faster`` the one that
        ``transfer.replaces`` prefers (the faster, a full one over a quick one).

        ``keep_faster``: a record replaces one with the same key (user or shipped) only when it is
        faster, except that a full tuning always replaces a quick record and a quick one never
        replaces a full record (``transfer.replaces``); the cuDNN time of the record it replaces is kept when the new one has none. The
        user file is compared under its lock, so of tuners storing the same key at once the
        fastest record stays, whichever writes last. ``superseded``: records the caller measured
        again (the tuner's confirmation runs the stored record's config beside its winner): one of
        them still stored is replaced whatever its time, since what was measured now decides; a
        record stored meanwhile by someone else is compared as above.
        """
        valid = [validate_record(r).record for r in records]
        if keep_faster:
            valid = fastest_of_each_key(valid)
        shipped = [e.record for e in self._entries() if e.origin == "shipped"] if keep_faster else []
        by_file: dict[Path, list[TuningRecord]] = {}
        for r in valid:
            by_file.setdefault(self.path_for(r.key), []).append(r)
        stored: list[TuningRecord] = []
        for path, group in by_file.items():
            def change(raws: list[Any], group: list[TuningRecord] = group) -> list[Any]:
                new = {r.key.identity(): r for r in group}   # the last of equal keys wins
                if keep_faster:
                    current = [as_loaded(TuningRecord.from_dict(raw)) for raw in raws
                               if raw_identity(raw) in new]   # user over shipped
                    new = {r.key.identity(): r for r in faster_records(list(new.values()), shipped + current,
                                                                       superseded)}
                stored.extend(new.values())
                return [raw for raw in raws if raw_identity(raw) not in new] + [r.to_dict() for r in new.values()]
            self._rewrite(path, change)
        return stored

    def record_for(self, key: RecordKey) -> TuningRecord | None:
        """The valid record (user over shipped) with this key, or None."""
        identity = key.identity()
        return next((e.record for e in self._entries() if e.record.key.identity() == identity), None)

    def remove(self, what: RecordKey | Callable[[TuningRecord], bool]) -> int:
        """Remove user records with this key, or for which the predicate is true; returns how many.

        Shipped records cannot be removed (a user record of the same key overrides one instead).
        """
        if isinstance(what, RecordKey):
            target = canonical_identity(what)

            def matches(record: TuningRecord) -> bool:
                return canonical_identity(record.key) == target
        else:
            matches = what
        removed = 0
        if not self.user_dir.is_dir():
            return 0
        for path in sorted(self.user_dir.glob("*.json")):
            def drop(raws: list[Any]) -> list[Any]:
                nonlocal removed
                kept = []
                for raw in raws:
                    try:
                        hit = matches(as_loaded(TuningRecord.from_dict(raw)))   # keyed as loading keys it
                    except RecordError:
                        hit = False   # unreadable entries are kept: they may be a newer autocnn's
                    if hit:
                        removed += 1
                    else:
                        kept.append(raw)
                return kept
            self._rewrite(path, drop, create=False)
        return removed

    def _rewrite(self, path: Path, change: Callable[[list[Any]], list[Any]], create: bool = True) -> None:
        """Read-modify-write of one user file under its lock, atomically."""
        if self.shipped_dir.resolve() == path.parent.resolve():
            raise DatabaseError(f"{path} is in the shipped (read-only) tuning database")
        rewrite_locked(path, change, create, on_wait=self.on_lock_wait)

    # -- listing --
    def summary_rows(self) -> list[SummaryRow]:
        rows = []
        for e in self._entries():
            r, k = e.record, e.record.key
            rows.append(SummaryRow(gpu=k.gpu, arch=k.arch, op=k.op, shape=e.valid.problem.shape_string(),
                                   config=str(e.valid.config), time_us=r.time_us,
                                   default_time_us=r.default_time_us, speedup=r.speedup, origin=e.origin,
                                   quick=r.quick))
        rows.sort(key=lambda row: (row.gpu, row.op, row.shape))
        return rows

