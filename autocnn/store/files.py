"""The database files: where they live, reading and validating one, and writing one atomically
under its lock.

Records live as JSON, one file per GPU kind (``<device.slug()>.json``): the shipped ones in the
package's ``tuning_db`` directory (read-only), the user's in ``AUTOCNN_TUNING_DB`` or
``cache_root()/tuning_db``. A record that fails any check on load is skipped with a warning naming
the file, the record and the reason; it is never returned.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import filelock

from autocnn.errors import InvalidProblemError
from autocnn.kernels import get_operation, problem_from_dict
from autocnn.kernels.compiler import cache_root
from autocnn.store.records import (RECORD_FORMAT, DatabaseError, InvalidRecordWarning, RecordError, RecordKey,
                                   StaleRecordError, StaleRecordWarning, TuningRecord, ValidRecord, is_int,
                                   validate_record)

ENV_VAR = "AUTOCNN_TUNING_DB"
LOCK_TIMEOUT_S = 120.0   # a writer holds the lock for milliseconds; minutes means a stuck process

Origin = Literal["user", "shipped"]


def default_shipped_dir() -> Path:
    """The package's read-only tuning_db directory (the repository's tuning_db/ in a source tree)."""
    try:
        from importlib.resources import files

        path = Path(str(files("autocnn.tuning_db")))
        if path.is_dir():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    # autocnn/store/files.py -> the repository root, where a source checkout keeps tuning_db/
    return Path(__file__).resolve().parents[2] / "tuning_db"


def default_user_dir() -> Path:
    """Where this user's records go: ``AUTOCNN_TUNING_DB`` if set, else ``cache_root()/tuning_db``."""
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else cache_root() / "tuning_db"


class CorruptFile(Exception):
    """A file that is not JSON or not a database file at all."""


class ForeignFormat(Exception):
    """A database file of a format this autocnn does not read (a newer one, typically)."""


def read_raw(path: Path) -> list[Any]:
    """The raw record entries of a database file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptFile(f"not UTF-8 text ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorruptFile(f"not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("records"), list) or not is_int(data.get("format")):
        raise CorruptFile('not a tuning database file: expected {"format": 1, "records": [...]}')
    if data["format"] != RECORD_FORMAT:
        raise ForeignFormat(f"format {data['format']} is not supported (this autocnn reads format {RECORD_FORMAT})")
    return data["records"]


def describe_raw(raw: Any) -> str:
    """A short name for a raw entry in a message: op, shape and GPU where they can be read."""
    if not isinstance(raw, dict) or not isinstance(raw.get("key"), dict):
        return ""
    key = raw["key"]
    shape = ""
    try:
        shape = problem_from_dict(key.get("problem")).shape_string()
    except Exception:  # noqa: BLE001 - a name for a message only; the record is judged elsewhere
        pass
    parts = [str(p) for p in (key.get("op"), shape, key.get("gpu")) if p]
    return " (" + " ".join(parts) + ")" if parts else ""


def canonical_identity(key: RecordKey) -> str:
    """The key's identity with its problem in canonical spelling where the problem parses."""
    try:
        key = dataclasses.replace(key, problem=problem_from_dict(key.problem).to_dict())
    except (InvalidProblemError, RecordError):
        pass
    return key.identity()


def as_loaded(record: TuningRecord) -> TuningRecord:
    """The record as loading keys it: re-keyed to the current fingerprint where it is current by its
    plan digest only (``validate_record``), otherwise as it is (stale and invalid ones included, which
    loading skips). Writers compare stored entries by this key, so a record tuned now replaces an
    entry of the same code written under an older fingerprint."""
    if record.plan_digest is None:
        return record
    try:
        if get_operation(record.key.op).config_fingerprint(record.config) in (None, record.key.fingerprint):
            return record   # current by its fingerprint (or invalid): nothing to plan
        return validate_record(record).record
    except (InvalidProblemError, RecordError):
        return record


def raw_identity(raw: Any) -> str | None:
    """The canonical key text of a raw entry as loaded (``as_loaded``), or None when it cannot be
    read (kept verbatim by writers)."""
    try:
        return canonical_identity(as_loaded(TuningRecord.from_dict(raw)).key)
    except RecordError:
        return None


def rekey_raws(raws: Sequence[Any]) -> tuple[list[Any], int]:
    """The entries with each record that is current by its plan digest only written as loading
    sees it (the current fingerprint, its config completed); every other entry verbatim. Returns
    the entries and how many were re-keyed."""
    out, count = [], 0
    for raw in raws:
        try:
            record = TuningRecord.from_dict(raw)
            loaded = as_loaded(record)
        except RecordError:
            loaded = record = None
        if record is not None and loaded.key.fingerprint != record.key.fingerprint:
            out.append(loaded.to_dict())
            count += 1
        else:
            out.append(raw)
    return out, count


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; directories cannot be opened this way on Windows.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_json(path: Path, data: Any) -> None:
    """Write, flush, fsync, rename over ``path``, fsync the directory: readers see old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_document_text(data))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


def file_document(raws: Sequence[Any]) -> dict[str, Any]:
    return {"format": RECORD_FORMAT, "records": list(raws)}


def _document_text(data: dict[str, Any]) -> str:
    """One record per line: diffs of shipped files show which records changed, and nothing else."""
    lines = [json.dumps(r, allow_nan=False) for r in data["records"]]
    body = ",\n".join(lines)
    return f'{{"format": {json.dumps(data["format"])}, "records": [\n{body}\n]}}\n'


def move_aside(path: Path) -> Path:
    """Rename a corrupt file out of the way (``db check`` lists it) rather than lose what it held."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    os.replace(path, aside)
    return aside


def rewrite_locked(path: Path, change: Callable[[list[Any]], list[Any]], create: bool = True,
                   on_wait: Callable[[str], None] | None = None) -> None:
    """Read-modify-write of one user file under its lock, atomically. ``on_wait`` hears a sentence
    when the lock is held elsewhere (another tuner or import), before this one waits for it; a lock
    held past LOCK_TIMEOUT_S is a DatabaseError naming the lock file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = str(path) + ".lock"
    lock = filelock.FileLock(lock_path, timeout=LOCK_TIMEOUT_S)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        if on_wait is not None:
            on_wait(f"waiting for {lock_path}, held by another autocnn process (up to {LOCK_TIMEOUT_S:.0f} s)")
        try:
            lock.acquire(timeout=LOCK_TIMEOUT_S)
        except filelock.Timeout:
            raise DatabaseError(f"{lock_path} was held by another process for {LOCK_TIMEOUT_S:.0f} s; if no autocnn "
                                f"process is running, delete it and run the command again") from None
    try:
        raws: list[Any] = []
        if path.exists():
            try:
                raws = read_raw(path)
            except CorruptFile as exc:
                aside = move_aside(path)
                # stacklevel 5: past TuningDatabase._rewrite, put_many and put, to the code that stores
                warnings.warn(f"{path}: {exc}; moved aside to {aside.name} and started afresh",
                              InvalidRecordWarning, stacklevel=5)
            except ForeignFormat as exc:
                raise DatabaseError(f"{path}: {exc}; not overwriting a file of another autocnn version") from None
        elif not create:
            return
        updated = change(list(raws))
        if updated == raws and path.exists():
            return
        atomic_write_json(path, file_document(updated))
    finally:
        lock.release()


# -- loaded state -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    valid: ValidRecord
    origin: Origin
    path: Path

    @property
    def record(self) -> TuningRecord:
        return self.valid.record


@dataclass(frozen=True)
class FileScan:
    entries: tuple[Entry, ...]
    problems: tuple[tuple[str, type[Warning]], ...]   # (message, warning category)
    # Records current by their plan digest only (an old fingerprint, the same code): used, and named
    # by ``autocnn db check`` so that they can be written again with the current fingerprint.
    rekeyed: tuple[str, ...] = ()


def scan_file(path: Path, origin: Origin) -> FileScan:
    try:
        raws = read_raw(path)
    except (CorruptFile, ForeignFormat) as exc:
        return FileScan((), ((f"{path}: whole file skipped: {exc}", InvalidRecordWarning),))
    except OSError as exc:
        return FileScan((), ((f"{path}: cannot be read: {exc}", InvalidRecordWarning),))
    entries: list[Entry] = []
    problems: list[tuple[str, type[Warning]]] = []
    rekeyed: list[str] = []
    for i, raw in enumerate(raws):
        try:
            record = TuningRecord.from_dict(raw)
            valid = validate_record(record)
        except RecordError as exc:
            category = StaleRecordWarning if isinstance(exc, StaleRecordError) else InvalidRecordWarning
            problems.append((f"{path}: record {i}{describe_raw(raw)} skipped: {exc}", category))
            continue
        if valid.record.key.fingerprint != record.key.fingerprint:
            rekeyed.append(f"{path}: record {i}{describe_raw(raw)} is current by its plan digest only: tuned with "
                           f"template fingerprint {record.key.fingerprint}, now {valid.record.key.fingerprint}, "
                           f"and its config ({valid.config}) generates the same code")
        entries.append(Entry(valid, origin, path))
    return FileScan(tuple(entries), tuple(problems), tuple(rekeyed))


def file_signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)

