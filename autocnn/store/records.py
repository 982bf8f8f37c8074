"""Record keys and tuning records: what a stored timing says, checked field by field on
construction, and checked again against the current code (``validate_record``) before it is used.

Nothing read from a file is trusted: a record's problem must parse, its operation must exist, its
fingerprint must be its formulation's current one (or, where the templates changed since, the code
its config generates must be exactly the code it was tuned with: ``validate_record``), and its config
must be a point of the current search space (``SearchSpace.validate``), so a value a template would
paste into CUDA source is always one the space offers.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any, Mapping

from autocnn.device import DeviceInfo, DeviceLimits
from autocnn.errors import InfeasibleConfigError, InvalidConfigError, InvalidProblemError
from autocnn.kernels import get_operation, problem_from_dict
from autocnn.kernels.space import Config, SearchSpace

RECORD_FORMAT = 1


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


def is_int(v: Any) -> bool:
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
        _require(is_int(self.sm_count) and self.sm_count > 0, "key.sm_count",
                 f"{self.sm_count!r} is not a positive integer")
        for name in ("cuda_runtime", "driver"):
            v = getattr(self, name)
            _require(is_int(v) and v >= 0, f"key.{name}", f"{v!r} is not a version number like 13000")
        _require(isinstance(self.op, str) and self.op != "", "key.op", f"{self.op!r} is not an operation name")
        _require(isinstance(self.problem, dict), "key.problem", f"{type(self.problem).__name__} is not a mapping")
        _require(self.problem.get("op") == self.op, "key.problem",
                 f"its op {self.problem.get('op')!r} differs from the key's op {self.op!r}")
        _require(isinstance(self.fingerprint, str) and self.fingerprint != "", "key.fingerprint",
                 f"{self.fingerprint!r} is not a fingerprint")
        _require(is_int(self.format), "key.format", f"{self.format!r} is not a format number")
        object.__setattr__(self, "problem", _json_copy(self.problem, "key.problem"))

    @staticmethod
    def for_(device: DeviceInfo, problem: Any, fingerprint: str | None = None) -> "RecordKey":
        """The key of ``problem`` on ``device`` (fingerprint: the operation's current one, as lookups ask;
        a record stores its config's formulation's, ``Operation.config_fingerprint``)."""
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
        """Canonical text: sorted JSON of every field, the fingerprint as the operation counts it
        (``Operation.key_fingerprint``: any formulation's current one is one key per shape and GPU)."""
        data = self.to_dict()
        try:
            data["fingerprint"] = get_operation(self.op).key_fingerprint(self.fingerprint)
        except InvalidProblemError:   # an unknown operation: such a record is never used
            pass
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

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
    # Chosen by quick tuning (a handful of candidates, autocnn.dispatch.quick), not by a search: any
    # full tuning of the key replaces it, and it never replaces a full record (transfer.faster_records).
    quick: bool = False
    # Scratch memory the config's plan allocates (Operation.workspace_bytes); None in records made
    # before it was written. A lookup hands the config out only under a workspace limit this fits.
    workspace_bytes: int | None = None
    # The code digest of the config's plan for the key's problem when it was tuned
    # (KernelPlan.code_digest); None in records made before it was written. Where the templates
    # change, a record whose config still plans to this digest stays current (validate_record).
    plan_digest: str | None = None

    def __post_init__(self) -> None:
        _require(isinstance(self.key, RecordKey), "key", f"{type(self.key).__name__} is not a RecordKey")
        _check_config_shape(self.config, "config")
        object.__setattr__(self, "config", _json_copy(self.config, "config"))
        _positive_time(self.time_us, "time_us")
        _require(_is_number(self.spread) and math.isfinite(self.spread) and self.spread >= 0, "spread",
                 f"{self.spread!r} is not a finite number >= 0")
        _positive_time(self.default_time_us, "default_time_us", optional=True)
        _positive_time(self.cudnn_time_us, "cudnn_time_us", optional=True)
        _require(is_int(self.trials) and self.trials >= 0, "trials", f"{self.trials!r} is not a count")
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
        _require(isinstance(self.quick, bool), "quick", f"{self.quick!r} is not true or false")
        _require(self.workspace_bytes is None or (is_int(self.workspace_bytes) and self.workspace_bytes >= 0),
                 "workspace_bytes", f"{self.workspace_bytes!r} is not a byte count")
        _require(self.plan_digest is None or (isinstance(self.plan_digest, str) and self.plan_digest.strip() != ""),
                 "plan_digest", f"{self.plan_digest!r} is not a digest")

    @property
    def speedup(self) -> float | None:
        """How many times faster than the heuristic default (None when the default was not timed)."""
        return None if self.default_time_us is None else self.default_time_us / self.time_us

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key.to_dict()}
        for f in dataclasses.fields(self):
            if f.name != "key":
                out[f.name] = _json_copy(getattr(self, f.name), f.name)
        if not self.quick:
            del out["quick"]   # written only when true: records of full tunings keep their bytes
        if self.workspace_bytes is None:
            del out["workspace_bytes"]
        if self.plan_digest is None:
            del out["plan_digest"]
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

UNLIMITED_WORKSPACE = 2**62


def _record_limits(key: RecordKey) -> DeviceLimits | None:
    """The static limits of the record's architecture, or None for one this autocnn has no table for."""
    try:
        limits = DeviceLimits.for_arch(key.arch)
    except ValueError:
        return None
    # No workspace limit when a record is read: it was tuned under the limit of its own run, and
    # the lookup holds it to the limit in force (device.workspace_limit()) when it hands it out.
    return dataclasses.replace(limits, workspace_bytes=UNLIMITED_WORKSPACE)


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
    """Check a record against the current code: format, problem, operation, currency, config.

    A record is current when its key's fingerprint is its config's formulation's current one
    (``Operation.config_fingerprint``), or else when it has a plan digest and its config, completed
    with the first choice of any parameter added since (``SearchSpace.complete``), plans to that
    digest now (``Operation.code_digest``): the very kernels, launched the same way, that it was
    timed with. Such a record is returned re-keyed (the current fingerprint, the completed config),
    so that everything downstream treats it as current; only records whose fingerprint is old are
    ever planned here.

    The config is validated in the search space of the record's problem with the static limits of
    the record's architecture (``DeviceLimits.for_arch``); for an architecture without such a table
    only membership in the space is checked (feasibility is checked again on lookup against the
    actual device). Raises RecordError (StaleRecordError for an old fingerprint whose code differs).
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
    current = operation.config_fingerprint(record.config)   # its formulation's (None: the config is invalid)
    stale = current is not None and key.fingerprint != current
    if stale and record.plan_digest is None:
        raise StaleRecordError("key.fingerprint", _stale_reason(key, current, "it has no plan digest to compare"))
    limits = _record_limits(key)
    space = operation.space(problem, limits if limits is not None
                            else DeviceLimits(key.arch, workspace_bytes=UNLIMITED_WORKSPACE))
    feasible = limits is not None
    if stale:
        record, config = _current_by_digest(record, operation, problem, space, feasible, current)
    else:
        config = _validate_config(space, record.config, "config", check_feasible=feasible)
    if record.runner_up is not None:
        # For information only (nothing runs it), and possibly of a formulation that gained a
        # parameter since: completed as a stale record's config is, then validated like the winner's.
        try:
            runner = space.complete(record.runner_up["config"], check_feasible=feasible)
        except (InvalidConfigError, InfeasibleConfigError) as exc:
            raise RecordError("runner_up.config", str(exc)) from None
        if runner.as_dict() != record.runner_up["config"]:
            record = dataclasses.replace(record, runner_up={**record.runner_up, "config": runner.as_dict()})
    canonical = problem.to_dict()
    if canonical != record.key.problem:   # e.g. padding written as one number: store and compare one spelling
        record = dataclasses.replace(record, key=dataclasses.replace(record.key, problem=canonical))
    return ValidRecord(record, problem, config)


def _stale_reason(key: RecordKey, current: str, why: str) -> str:
    return (f"stale: tuned with template fingerprint {key.fingerprint}, the {key.op} templates of its "
            f"formulation are now {current}, and {why} "
            f"(`autocnn tune --stale` tunes such shapes again on their GPU)")


def _current_by_digest(record: TuningRecord, operation: Any, problem: Any, space: SearchSpace, feasible: bool,
                       current: str) -> tuple[TuningRecord, Config]:
    """The record re-keyed to the current code when its completed config plans to its plan digest
    (validate_record); StaleRecordError when it does not."""
    key = record.key
    try:
        config = space.complete(record.config, check_feasible=feasible)
    except (InvalidConfigError, InfeasibleConfigError) as exc:
        raise StaleRecordError("key.fingerprint", _stale_reason(
            key, current, f"its config is not a point of the current space ({exc})")) from None
    try:
        digest = operation.code_digest(problem, config)
    except Exception as exc:  # noqa: BLE001 - code that cannot be planned is not the code it was tuned with
        raise StaleRecordError("key.fingerprint", _stale_reason(
            key, current, f"its config cannot be planned now ({type(exc).__name__}: {exc})")) from None
    if digest != record.plan_digest:
        raise StaleRecordError("key.fingerprint", _stale_reason(
            key, current, f"the code its config generates differs (plan digest {record.plan_digest}, now {digest})"))
    fingerprint = operation.config_fingerprint(config)
    rekeyed = dataclasses.replace(record, key=dataclasses.replace(key, fingerprint=fingerprint),
                                  config=config.as_dict())
    return rekeyed, config


def now_utc() -> str:
    """The ``tuned_at`` of a record made now."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
