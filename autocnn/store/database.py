"""The tuning database: record keys, records, atomic storage and lookup with fallback.

A record says "on this GPU, with this CUDA runtime and driver, this config ran this problem of this
operation in this time, with the template family at this fingerprint". Records live as JSON, one
file per GPU kind (``<device.slug()>.json``): the shipped ones in the package's ``tuning_db``
directory (read-only), the user's in ``AUTOCNN_TUNING_DB`` or ``cache_root()/tuning_db``.

Nothing read from a file is trusted. Every record is validated on load: its problem must parse,
its operation must exist, its fingerprint must be the template family's current one, and its config
must be a point of the current search space (``SearchSpace.validate``), so a value a template
would paste into CUDA source is always one the space offers. A record that fails any check is
skipped with a warning naming the file, the record and the reason; it is never returned.

Lookup falls back in a fixed chain and says which step answered:
exact GPU identity -> same compute capability -> nearest tuned shape -> the heuristic default.

This module runs on CPU-only machines: it imports no CuPy.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import re
import tempfile
import time
import urllib.parse
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import filelock

from autocnn.kernels.compiler import cache_root
from autocnn.device import DeviceInfo, DeviceLimits
from autocnn.errors import InfeasibleConfigError, InvalidConfigError, InvalidProblemError
from autocnn.kernels import get_operation, problem_from_dict
from autocnn.kernels.space import Config, SearchSpace

RECORD_FORMAT = 1
# A tuned config is borrowed for another shape only this close (see shape_distance): e.g. H and W
# both 4x larger (4) and C 4x smaller (2) plus a different padding (1). Farther away, the op's
# problem-adaptive heuristic default is the better guess.
NEAREST_SHAPE_MAX_DISTANCE = 8.0
ENV_VAR = "AUTOCNN_TUNING_DB"
LOCK_TIMEOUT_S = 120.0   # a writer holds the lock for milliseconds; minutes means a stuck process

LookupSource = Literal["exact", "same_arch", "nearest_shape", "default"]
Origin = Literal["user", "shipped"]


# -- failures and warnings --------------------------------------------------------------------

class RecordError(ValueError):
    """A record (or its key) that is malformed, stale or foreign; names the field and why."""

    def __init__(self, field: str, reason: str):
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


class StaleRecordError(RecordError):
    """A well-formed record tuned against another version of the template family."""


class DatabaseError(RuntimeError):
    """A database file that cannot be read or written safely (e.g. written by a newer autocnn)."""


class InvalidRecordWarning(UserWarning):
    """A record or file was skipped because it is malformed, foreign or unsafe."""


class StaleRecordWarning(InvalidRecordWarning):
    """A record was skipped because its template family changed since it was tuned."""


# -- keys and records -----------------------------------------------------------------------------

_CC_RE = re.compile(r"^\d+\.\d+$")


def _require(cond: bool, field: str, reason: str) -> None:
    if not cond:
        raise RecordError(field, reason)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _json_copy(value: Any, field: str) -> Any:
    """A deep, JSON-only copy: a record never shares mutable state with its caller."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise RecordError(field, f"not plain JSON data ({exc})") from None


def _positive_time(value: Any, field: str, optional: bool = False) -> None:
    if optional and value is None:
        return
    _require(_is_number(value), field, f"{value!r} is not a number")
    _require(math.isfinite(value) and value > 0, field, f"{value!r} is not a finite positive time")


def _check_config_shape(config: Any, field: str) -> None:
    # Structure only; whether the values are points of the search space is validate_record's job.
    _require(isinstance(config, dict), field, f"{type(config).__name__} is not a mapping")
    for name, value in config.items():
        _require(isinstance(name, str), field, f"parameter name {name!r} is not a string")
        _require(isinstance(value, (bool, int, float, str)), f"{field}.{name}",
                 f"{value!r} is not a number, string or boolean")


@dataclass(frozen=True, eq=False)
class RecordKey:
    """Everything that makes a timing true. Equal keys have equal canonical text (``identity``)."""

    gpu: str
    compute_capability: str
    sm_count: int
    cuda_runtime: int
    driver: int
    op: str
    problem: dict[str, Any]
    fingerprint: str
    format: int = RECORD_FORMAT

    def __post_init__(self) -> None:
        _require(isinstance(self.gpu, str) and self.gpu.strip() != "", "key.gpu", f"{self.gpu!r} is not a GPU name")
        _require(isinstance(self.compute_capability, str) and bool(_CC_RE.match(self.compute_capability)),
                 "key.compute_capability", f"{self.compute_capability!r} is not like '9.0'")
        _require(_is_int(self.sm_count) and self.sm_count > 0, "key.sm_count",
                 f"{self.sm_count!r} is not a positive integer")
        for name in ("cuda_runtime", "driver"):
            v = getattr(self, name)
            _require(_is_int(v) and v >= 0, f"key.{name}", f"{v!r} is not a version number like 13000")
        _require(isinstance(self.op, str) and self.op != "", "key.op", f"{self.op!r} is not an operation name")
        _require(isinstance(self.problem, dict), "key.problem", f"{type(self.problem).__name__} is not a mapping")
        _require(self.problem.get("op") == self.op, "key.problem",
                 f"its op {self.problem.get('op')!r} differs from the key's op {self.op!r}")
        _require(isinstance(self.fingerprint, str) and self.fingerprint != "", "key.fingerprint",
                 f"{self.fingerprint!r} is not a fingerprint")
        _require(_is_int(self.format), "key.format", f"{self.format!r} is not a format number")
        object.__setattr__(self, "problem", _json_copy(self.problem, "key.problem"))

    @staticmethod
    def for_(device: DeviceInfo, problem: Any, fingerprint: str | None = None) -> "RecordKey":
        """The key of ``problem`` on ``device`` (fingerprint: the operation's current one)."""
        op = get_operation(problem.op)
        return RecordKey(
            gpu=device.name, compute_capability=device.compute_capability, sm_count=device.sm_count,
            cuda_runtime=device.cuda_runtime, driver=device.driver, op=problem.op,
            problem=problem.to_dict(), fingerprint=fingerprint if fingerprint is not None else op.fingerprint(),
        )

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability.split(".")
        return f"sm_{major}{minor}"

    def slug(self) -> str:
        """The GPU kind's file name stem, as ``DeviceInfo.slug``."""
        return DeviceInfo(self.gpu, self.compute_capability, self.sm_count, self.cuda_runtime,
                          self.driver).slug()

    def same_gpu(self, device: DeviceInfo) -> bool:
        """Same GPU identity: name, compute capability, SMs, CUDA runtime and driver."""
        return (self.gpu, self.compute_capability, self.sm_count, self.cuda_runtime, self.driver) == (
            device.name, device.compute_capability, device.sm_count, device.cuda_runtime, device.driver)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _json_copy(getattr(self, f.name), f.name) for f in dataclasses.fields(self)}

    @staticmethod
    def from_dict(data: Any) -> "RecordKey":
        _require(isinstance(data, dict), "key", f"{type(data).__name__} is not a mapping")
        names = [f.name for f in dataclasses.fields(RecordKey)]
        missing = [n for n in names if n not in data]
        _require(not missing, f"key.{missing[0] if missing else ''}", "missing")
        extra = sorted(set(data) - set(names))
        _require(not extra, f"key.{extra[0] if extra else ''}", "unknown field")
        return RecordKey(**{n: data[n] for n in names})

    def identity(self) -> str:
        """Canonical text: sorted JSON of every field."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RecordKey) and self.identity() == other.identity()

    def __hash__(self) -> int:
        return hash(self.identity())


def redact_storage_url(url: str) -> str:
    """An Optuna storage URL fit to be stored and shown: any password becomes ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password or password == "***":
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


@dataclass(frozen=True)
class TuningRecord:
    """One tuned result. Construction checks types and ranges (raising RecordError naming the field);
    whether the config belongs to the current search space is checked by ``validate_record``."""

    key: RecordKey
    config: dict[str, Any]
    time_us: float                   # median of the confirmation runs
    spread: float                    # interquartile range / median of those runs
    default_time_us: float | None    # the heuristic default's median, measured alongside
    cudnn_time_us: float | None
    trials: int                      # configs measured during the search
    tuned_at: str                    # ISO-8601, UTC
    autocnn_version: str
    sampler: str
    study: str | None = None         # Optuna study name
    storage: str | None = None       # Optuna storage URL, password redacted
    runner_up: dict[str, Any] | None = None   # {"config": {...}, "time_us": float}

    def __post_init__(self) -> None:
        _require(isinstance(self.key, RecordKey), "key", f"{type(self.key).__name__} is not a RecordKey")
        _check_config_shape(self.config, "config")
        object.__setattr__(self, "config", _json_copy(self.config, "config"))
        _positive_time(self.time_us, "time_us")
        _require(_is_number(self.spread) and math.isfinite(self.spread) and self.spread >= 0, "spread",
                 f"{self.spread!r} is not a finite number >= 0")
        _positive_time(self.default_time_us, "default_time_us", optional=True)
        _positive_time(self.cudnn_time_us, "cudnn_time_us", optional=True)
        _require(_is_int(self.trials) and self.trials >= 0, "trials", f"{self.trials!r} is not a count")
        _require(isinstance(self.tuned_at, str), "tuned_at", f"{self.tuned_at!r} is not a string")
        try:
            when = _dt.datetime.fromisoformat(self.tuned_at)
        except ValueError:
            raise RecordError("tuned_at", f"{self.tuned_at!r} is not an ISO-8601 time") from None
        _require(when.utcoffset() == _dt.timedelta(0), "tuned_at", f"{self.tuned_at!r} is not in UTC")
        _require(isinstance(self.autocnn_version, str) and self.autocnn_version != "", "autocnn_version",
                 f"{self.autocnn_version!r} is not a version string")
        _require(isinstance(self.sampler, str) and self.sampler != "", "sampler",
                 f"{self.sampler!r} is not a sampler name")
        _require(self.study is None or isinstance(self.study, str), "study", f"{self.study!r} is not a string")
        _require(self.storage is None or isinstance(self.storage, str), "storage",
                 f"{self.storage!r} is not a string")
        if self.storage is not None:
            object.__setattr__(self, "storage", redact_storage_url(self.storage))
        if self.runner_up is not None:
            ru = self.runner_up
            _require(isinstance(ru, dict) and set(ru) == {"config", "time_us"}, "runner_up",
                     "not a mapping with exactly 'config' and 'time_us'")
            _check_config_shape(ru["config"], "runner_up.config")
            _positive_time(ru["time_us"], "runner_up.time_us")
            object.__setattr__(self, "runner_up", _json_copy(ru, "runner_up"))

    @property
    def speedup(self) -> float | None:
        """How many times faster than the heuristic default (None when the default was not timed)."""
        return None if self.default_time_us is None else self.default_time_us / self.time_us

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key.to_dict()}
        for f in dataclasses.fields(self):
            if f.name != "key":
                out[f.name] = _json_copy(getattr(self, f.name), f.name)
        return out

    @staticmethod
    def from_dict(data: Any) -> "TuningRecord":
        """Rebuild a record from ``to_dict`` output, raising RecordError naming the first bad field."""
        _require(isinstance(data, dict), "record", f"{type(data).__name__} is not a mapping")
        names = [f.name for f in dataclasses.fields(TuningRecord)]
        required = [f.name for f in dataclasses.fields(TuningRecord) if f.default is dataclasses.MISSING]
        missing = [n for n in required if n not in data]
        _require(not missing, missing[0] if missing else "", "missing")
        extra = sorted(set(data) - set(names))
        _require(not extra, extra[0] if extra else "", "unknown field")
        fields = {n: data[n] for n in names if n in data}
        fields["key"] = RecordKey.from_dict(data["key"])
        return TuningRecord(**fields)


# -- validation against the current code ----------------------------------------------------------

def _record_limits(key: RecordKey) -> DeviceLimits | None:
    """The static limits of the record's architecture, or None for one this autocnn has no table for."""
    try:
        return DeviceLimits.for_arch(key.arch)
    except ValueError:
        return None


def _validate_config(space: SearchSpace, config: Mapping[str, Any], field: str, check_feasible: bool) -> Config:
    try:
        return space.validate(config, check_feasible=check_feasible)
    except (InvalidConfigError, InfeasibleConfigError) as exc:
        raise RecordError(field, str(exc)) from None


@dataclass(frozen=True)
class ValidRecord:
    """A record that passed every check, with its parsed problem and validated config."""

    record: TuningRecord
    problem: Any
    config: Config


def validate_record(record: TuningRecord) -> ValidRecord:
    """Check a record against the current code: format, problem, operation, fingerprint, config.

    The config is validated in the search space of the record's problem with the static limits of
    the record's architecture (``DeviceLimits.for_arch``); for an architecture without such a table
    only membership in the space is checked (feasibility is checked again on lookup against the
    actual device). Raises RecordError (StaleRecordError for an old fingerprint).
    """
    key = record.key
    _require(key.format == RECORD_FORMAT, "key.format",
             f"format {key.format} is not supported (this autocnn reads format {RECORD_FORMAT})")
    try:
        operation = get_operation(key.op)
    except InvalidProblemError as exc:
        raise RecordError("key.op", f"unknown operation: {exc}") from None
    try:
        problem = problem_from_dict(key.problem)
    except InvalidProblemError as exc:
        raise RecordError("key.problem", f"does not parse: {exc}") from None
    current = operation.fingerprint()
    if key.fingerprint != current:
        raise StaleRecordError("key.fingerprint",
                               f"stale: tuned with template fingerprint {key.fingerprint}, "
                               f"the {key.op} templates are now {current} "
                               f"(`autocnn tune --stale` tunes such shapes again on their GPU)")
    limits = _record_limits(key)
    space = operation.space(problem, limits if limits is not None else DeviceLimits(key.arch))
    config = _validate_config(space, record.config, "config", check_feasible=limits is not None)
    if record.runner_up is not None:
        _validate_config(space, record.runner_up["config"], "runner_up.config", check_feasible=limits is not None)
    canonical = problem.to_dict()
    if canonical != key.problem:   # e.g. padding written as one number: store and compare one spelling
        record = dataclasses.replace(record, key=dataclasses.replace(key, problem=canonical))
    return ValidRecord(record, problem, config)


# -- shape distance ---------------------------------------------------------------------------------

def shape_distance(a: Any, b: Any) -> float:
    """How far apart two problems of the same operation are, for borrowing a tuned config.

    Sizes count by ratio: each of N, C, H, W, K, R, S (conv) or N, C, H, W, window height and width
    (pooling) adds |log2(a / b)|, so doubling any one size costs 1. Strides change the access
    pattern more than sizes do (alignment, reuse of staged input), so each axis adds
    2 * |log2(stride_a / stride_b)|. Each padding side that differs adds 0.25, and so does each
    differing flag (bias, activation, count_pad). Different dtypes are infinitely far apart.
    """
    if a.op != b.op or a.dtype != b.dtype:
        return math.inf
    ga, gb = a.geometry(), b.geometry()
    sizes = ["N", "C", "H", "W"]
    pairs = [(ga[n], gb[n]) for n in sizes]
    if "K" in ga:
        pairs += [(ga[n], gb[n]) for n in ("K", "R", "S")]
    else:
        pairs += list(zip(ga["window"], gb["window"]))
    d = sum(abs(math.log2(x / y)) for x, y in pairs)
    d += 2.0 * sum(abs(math.log2(x / y)) for x, y in zip(ga["stride"], gb["stride"]))
    d += 0.25 * sum(1 for x, y in zip(ga["padding"], gb["padding"]) if x != y)
    for flag in ("bias", "activation", "count_pad"):
        if getattr(a, flag, None) != getattr(b, flag, None):
            d += 0.25
    return d


# -- files ----------------------------------------------------------------------------------------

def default_shipped_dir() -> Path:
    """The package's read-only tuning_db directory (the repository's tuning_db/ in a source tree)."""
    try:
        from importlib.resources import files

        path = Path(str(files("autocnn.tuning_db")))
        if path.is_dir():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parent.parent / "tuning_db"


def default_user_dir() -> Path:
    """Where this user's records go: ``AUTOCNN_TUNING_DB`` if set, else ``cache_root()/tuning_db``."""
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else cache_root() / "tuning_db"


class _CorruptFile(Exception):
    """A file that is not JSON or not a database file at all."""


class _ForeignFormat(Exception):
    """A database file of a format this autocnn does not read (a newer one, typically)."""


def _read_raw(path: Path) -> list[Any]:
    """The raw record entries of a database file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise _CorruptFile(f"not UTF-8 text ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _CorruptFile(f"not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("records"), list) or not _is_int(data.get("format")):
        raise _CorruptFile('not a tuning database file: expected {"format": 1, "records": [...]}')
    if data["format"] != RECORD_FORMAT:
        raise _ForeignFormat(f"format {data['format']} is not supported (this autocnn reads format {RECORD_FORMAT})")
    return data["records"]


def _describe_raw(raw: Any) -> str:
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


def _canonical_identity(key: RecordKey) -> str:
    """The key's identity with its problem in canonical spelling where the problem parses."""
    try:
        key = dataclasses.replace(key, problem=problem_from_dict(key.problem).to_dict())
    except (InvalidProblemError, RecordError):
        pass
    return key.identity()


def _raw_identity(raw: Any) -> str | None:
    """The canonical key text of a raw entry, or None when it cannot be read (kept verbatim by writers)."""
    try:
        return _canonical_identity(TuningRecord.from_dict(raw).key)
    except RecordError:
        return None


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


def _atomic_write_json(path: Path, data: Any) -> None:
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


def _file_document(raws: Sequence[Any]) -> dict[str, Any]:
    return {"format": RECORD_FORMAT, "records": list(raws)}


def _document_text(data: dict[str, Any]) -> str:
    """One record per line: diffs of shipped files show which records changed, and nothing else."""
    lines = [json.dumps(r, allow_nan=False) for r in data["records"]]
    body = ",\n".join(lines)
    return f'{{"format": {json.dumps(data["format"])}, "records": [\n{body}\n]}}\n'


# -- loaded state -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Entry:
    valid: ValidRecord
    origin: Origin
    path: Path

    @property
    def record(self) -> TuningRecord:
        return self.valid.record


@dataclass(frozen=True)
class _FileScan:
    entries: tuple[_Entry, ...]
    problems: tuple[tuple[str, type[Warning]], ...]   # (message, warning category)


def _scan_file(path: Path, origin: Origin) -> _FileScan:
    try:
        raws = _read_raw(path)
    except (_CorruptFile, _ForeignFormat) as exc:
        return _FileScan((), ((f"{path}: whole file skipped: {exc}", InvalidRecordWarning),))
    except OSError as exc:
        return _FileScan((), ((f"{path}: cannot be read: {exc}", InvalidRecordWarning),))
    entries: list[_Entry] = []
    problems: list[tuple[str, type[Warning]]] = []
    for i, raw in enumerate(raws):
        try:
            valid = validate_record(TuningRecord.from_dict(raw))
        except RecordError as exc:
            category = StaleRecordWarning if isinstance(exc, StaleRecordError) else InvalidRecordWarning
            problems.append((f"{path}: record {i}{_describe_raw(raw)} skipped: {exc}", category))
            continue
        entries.append(_Entry(valid, origin, path))
    return _FileScan(tuple(entries), tuple(problems))


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


# -- results ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LookupResult:
    """The config to run, where it came from, and a sentence for people about why."""

    config: Config
    source: LookupSource
    record: TuningRecord | None
    detail: str


@dataclass(frozen=True)
class ImportRejection:
    index: int          # position in the imported file's records list
    what: str           # op, shape and GPU where they could be read
    reason: str


@dataclass(frozen=True)
class ImportReport:
    accepted: tuple[RecordKey, ...]
    rejected: tuple[ImportRejection, ...]
    # Valid records not stored because the database already had a record as fast (keep_faster).
    kept_existing: tuple[RecordKey, ...] = ()


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


# -- the database -------------------------------------------------------------------------------

class TuningDatabase:
    """Shipped (read-only) and user records, validated on load, written atomically under a lock."""

    def __init__(self, user_dir: Path | None = None, shipped_dir: Path | None = None):
        self.user_dir = Path(user_dir) if user_dir is not None else default_user_dir()
        self.shipped_dir = Path(shipped_dir) if shipped_dir is not None else default_shipped_dir()
        # path -> (stat signature, scan): a file is validated again only when it changed
        self._scans: dict[Path, tuple[tuple[int, int, int], _FileScan]] = {}

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
    def _scan(self, path: Path, origin: Origin, warn: bool) -> _FileScan:
        sig = _signature(path)
        cached = self._scans.get(path)
        if sig is not None and cached is not None and cached[0] == sig:
            return cached[1]
        scan = _scan_file(path, origin)
        if sig is not None:
            self._scans[path] = (sig, scan)
        if warn:
            for message, category in scan.problems:
                warnings.warn(message, category, stacklevel=4)
        return scan

    def _entries(self) -> list[_Entry]:
        """Every valid record; a user record replaces a shipped one with the same key."""
        by_key: dict[str, _Entry] = {}
        for path, origin in self._files():
            for entry in self._scan(path, origin, warn=True).entries:
                by_key[entry.record.key.identity()] = entry
        return list(by_key.values())

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
        """Every problem in every file (shipped and user), without warnings; empty when all is well."""
        problems: list[str] = []
        for path, origin in self._files():
            problems += [message for message, _ in _scan_file(path, origin).problems]
        if self.user_dir.is_dir():
            for aside in sorted(self.user_dir.glob("*.json.corrupt-*")):
                problems.append(f"{aside}: a corrupted database file moved aside; inspect or delete it")
        return problems

    # -- lookup --
    def lookup(self, device: DeviceInfo, problem: Any) -> LookupResult:
        """The config to run ``problem`` on ``device``: exact > same_arch > nearest_shape > default."""
        operation = get_operation(problem.op)
        operation.check_problem(problem)
        limits = device.limits()
        space = operation.space(problem, limits)
        key = RecordKey.for_(device, problem)
        identity = key.identity()
        canonical = problem.to_dict()
        arch = device.arch
        entries = [e for e in self._entries() if e.record.key.op == problem.op]

        def usable(record: TuningRecord) -> Config | None:
            # Feasibility is checked again against this device's limits (shared memory may differ).
            try:
                return space.validate(record.config)
            except (InvalidConfigError, InfeasibleConfigError):
                return None

        for e in entries:
            if e.record.key.identity() == identity:
                config = usable(e.record)
                if config is not None:
                    return LookupResult(config, "exact", e.record,
                                        f"tuned on this GPU ({_gpu_text(e.record.key)}) on "
                                        f"{e.record.tuned_at}: {e.record.time_us:.1f} us ({e.origin} record)")

        same_problem = sorted(
            (e for e in entries if e.record.key.arch == arch and e.record.key.problem == canonical),
            key=lambda e: (e.record.time_us, e.record.key.identity()))
        for e in same_problem:
            config = usable(e.record)
            if config is not None:
                return LookupResult(config, "same_arch", e.record,
                                    f"tuned on another {arch} GPU ({_gpu_text(e.record.key)}): "
                                    f"{e.record.time_us:.1f} us there ({e.origin} record)")

        for distance, e, config in self._nearest(entries, problem, arch, space):
            return LookupResult(config, "nearest_shape", e.record,
                                f"borrowed from the nearest tuned {problem.op} shape "
                                f"{e.valid.problem.shape_string()} on {_gpu_text(e.record.key)} "
                                f"(distance {distance:.2f}; {e.origin} record)")

        config = operation.default_config(problem, limits)
        return LookupResult(config, "default", None,
                            f"no tuned {problem.op} record usable for {problem.shape_string()} on {arch}: "
                            f"heuristic default")

    def _nearest(self, entries: Iterable[_Entry], problem: Any, arch: str,
                 space: SearchSpace) -> Iterable[tuple[float, _Entry, Config]]:
        """Tuned shapes of the same operation and architecture within NEAREST_SHAPE_MAX_DISTANCE,
        nearest first, whose configs are valid (and feasible) for ``problem``; the exact problem
        itself is not a neighbour."""
        canonical = problem.to_dict()
        ranked = []
        for e in entries:
            if e.record.key.arch != arch or e.record.key.problem == canonical:
                continue
            d = shape_distance(problem, e.valid.problem)
            if d <= NEAREST_SHAPE_MAX_DISTANCE:
                ranked.append((d, e.record.time_us, e.record.key.identity(), e))
        ranked.sort(key=lambda t: t[:3])
        for d, _, _, e in ranked:
            try:
                config = space.validate(e.record.config)
            except (InvalidConfigError, InfeasibleConfigError):
                continue
            yield d, e, config

    def neighbour_configs(self, device: DeviceInfo, problem: Any, space: SearchSpace,
                          limit: int = 3) -> list[Config]:
        """Up to ``limit`` distinct configs of the nearest tuned shapes (same op and architecture)
        that are valid in ``space``: good first guesses for a search."""
        entries = [e for e in self._entries() if e.record.key.op == problem.op]
        out: list[Config] = []
        seen: set[str] = set()
        for _, _, config in self._nearest(entries, problem, device.arch, space):
            if config.key() not in seen:
                seen.add(config.key())
                out.append(config)
            if len(out) >= limit:
                break
        return out

    # -- stale records: tuned with templates that have changed since --
    def stale_records(self) -> list[tuple[TuningRecord, Any]]:
        """Every record (shipped and user) skipped only because its template fingerprint is old,
        with its parsed problem. They are never run; they say which shapes to tune again."""
        out = []
        for path, _origin in self._files():
            try:
                raws = _read_raw(path)
            except (_CorruptFile, _ForeignFormat, OSError):
                continue
            for raw in raws:
                try:
                    validate_record(TuningRecord.from_dict(raw))
                except StaleRecordError:
                    record = TuningRecord.from_dict(raw)
                    out.append((record, problem_from_dict(record.key.problem)))
                except RecordError:
                    continue
        return out

    def stale_problems(self, device: DeviceInfo, ops: Sequence[str] | None = None) -> list[Any]:
        """The problems of this GPU kind whose records are stale and that have no current record
        of this kind yet: what ``autocnn tune --stale`` tunes again. Each problem once."""
        def ident(op: str, problem: Any) -> str:
            return f"{op}|{json.dumps(problem.to_dict(), sort_keys=True)}"

        slug = device.slug()
        fresh = {ident(r.key.op, problem_from_dict(r.key.problem)) for r in self.records() if r.key.slug() == slug}
        out, seen = [], set(fresh)
        for record, problem in self.stale_records():
            if record.key.slug() != slug or (ops is not None and record.key.op not in ops):
                continue
            i = ident(record.key.op, problem)
            if i not in seen:
                seen.add(i)
                out.append(problem)
        return out

    def stale_configs(self, device: DeviceInfo, problem: Any, space: SearchSpace) -> list[Config]:
        """Configs of stale records of this problem on this architecture that the current space
        still accepts: first guesses for tuning it again (measured anew, never trusted)."""
        canonical = problem.to_dict()
        out: list[Config] = []
        for record, p in self.stale_records():
            if record.key.op != problem.op or record.key.arch != device.arch or p.to_dict() != canonical:
                continue
            try:
                config = space.validate(record.config)
            except (InvalidConfigError, InfeasibleConfigError):
                continue
            if all(config.key() != c.key() for c in out):
                out.append(config)
        return out

    # -- writing --
    def put(self, record: TuningRecord) -> None:
        """Store a record (replacing one with the same key) in the user file of its GPU kind."""
        self.put_many([record])

    def put_many(self, records: Sequence[TuningRecord], keep_faster: bool = False) -> list[TuningRecord]:
        """Store several records, one locked rewrite per file; returns the records stored. Every
        record is validated first (RecordError), so nothing is written that loading would skip.

        ``keep_faster``: a record replaces one with the same key (user or shipped) only when it is
        faster; the cuDNN time of the record it replaces is kept when the new one has none.
        """
        valid = [validate_record(r).record for r in records]
        if keep_faster:
            existing = {r.key.identity(): r for r in self.records()}
            chosen = []
            for r in valid:
                old = existing.get(r.key.identity())
                if old is not None and old.time_us <= r.time_us:
                    continue
                if old is not None and r.cudnn_time_us is None and old.cudnn_time_us is not None:
                    r = dataclasses.replace(r, cudnn_time_us=old.cudnn_time_us)
                chosen.append(r)
            valid = chosen
        by_file: dict[Path, list[TuningRecord]] = {}
        for r in valid:
            by_file.setdefault(self.path_for(r.key), []).append(r)
        for path, group in by_file.items():
            new = {r.key.identity(): r.to_dict() for r in group}   # the last of equal keys wins
            self._rewrite(path, lambda raws: [raw for raw in raws if _raw_identity(raw) not in new] + list(new.values()))
        return valid

    def remove(self, what: RecordKey | Callable[[TuningRecord], bool]) -> int:
        """Remove user records with this key, or for which the predicate is true; returns how many.

        Shipped records cannot be removed (a user record of the same key overrides one instead).
        """
        if isinstance(what, RecordKey):
            target = _canonical_identity(what)

            def matches(record: TuningRecord) -> bool:
                return _canonical_identity(record.key) == target
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
                        hit = matches(TuningRecord.from_dict(raw))
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
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S)
        with lock:
            raws: list[Any] = []
            if path.exists():
                try:
                    raws = _read_raw(path)
                except _CorruptFile as exc:
                    aside = _move_aside(path)
                    warnings.warn(f"{path}: {exc}; moved aside to {aside.name} and started afresh",
                                  InvalidRecordWarning, stacklevel=4)
                except _ForeignFormat as exc:
                    raise DatabaseError(f"{path}: {exc}; not overwriting a file of another autocnn version") from None
            elif not create:
                return
            updated = change(list(raws))
            if updated == raws and path.exists():
                return
            _atomic_write_json(path, _file_document(updated))

    # -- exchange --
    def export(self, path: Path, filter: Callable[[TuningRecord], bool] | None = None) -> int:
        """Write the valid records (those ``filter`` accepts) to one file of the database format."""
        chosen = [r for r in self.records() if filter is None or filter(r)]
        _atomic_write_json(Path(path), _file_document([r.to_dict() for r in chosen]))
        return len(chosen)

    def import_file(self, path: Path, keep_faster: bool = False) -> ImportReport:
        """Validate every record of a file exactly as loading does and store the accepted ones
        (with ``keep_faster``, only those faster than the database's record of the same key)."""
        path = Path(path)
        try:
            raws = _read_raw(path)
        except (_CorruptFile, _ForeignFormat) as exc:
            raise DatabaseError(f"{path}: {exc}") from None
        accepted: list[TuningRecord] = []
        rejected: list[ImportRejection] = []
        for i, raw in enumerate(raws):
            try:
                accepted.append(validate_record(TuningRecord.from_dict(raw)).record)
            except RecordError as exc:
                rejected.append(ImportRejection(i, _describe_raw(raw).strip(" ()"), str(exc)))
        stored = self.put_many(accepted, keep_faster=keep_faster) if accepted else []
        stored_ids = {r.key.identity() for r in stored}
        kept = tuple(r.key for r in accepted if r.key.identity() not in stored_ids)
        return ImportReport(tuple(r.key for r in accepted), tuple(rejected), kept)

    def summary_rows(self) -> list[SummaryRow]:
        rows = []
        for e in self._entries():
            r, k = e.record, e.record.key
            rows.append(SummaryRow(gpu=k.gpu, arch=k.arch, op=k.op, shape=e.valid.problem.shape_string(),
                                   config=str(e.valid.config), time_us=r.time_us,
                                   default_time_us=r.default_time_us, speedup=r.speedup, origin=e.origin))
        rows.sort(key=lambda row: (row.gpu, row.op, row.shape))
        return rows


def _gpu_text(key: RecordKey) -> str:
    return f"{key.gpu}, {key.sm_count} SMs, CUDA {key.cuda_runtime}, driver {key.driver}"


def _move_aside(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    os.replace(path, aside)
    return aside


def now_utc() -> str:
    """The ``tuned_at`` of a record made now."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
