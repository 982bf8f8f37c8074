"""Quick tuning of shapes no record covers, as ``cudnn.benchmark`` does: a handful of candidates
measured once each within a time budget, the fastest verified one kept as a record marked quick.

The candidates are the lookup's answer, the config of the nearest tuned shape of every
formulation, and each formulation's default (``quick_candidates``), after the lookup's answer in
the cost model's order where one is in use. They are measured through a
MeasurementSource (``GpuSource``: compiled ahead in a pool, verified against float64 in the worker
process before timing), in that order, until the budget is spent (``quick_tune``). A candidate
that fails (compile error, spills, wrong result) is skipped. The winner is stored with
``TuningRecord.quick`` set: a full tuning of the same key always replaces it, and it never
replaces a full record (``autocnn.store.transfer.replaces``).

``Autotuner`` is what a backend's ``prepare`` calls per problem, by mode (``AUTOTUNE_MODES``):
"off" keeps the lookup's answer, "quick" runs ``quick_tune`` and "full" the regular tuner with a
small trial budget, both only where the lookup found no record of this problem ("nearest_shape"
or "default"). ``autotune_mode`` reads the mode from an argument or ``AUTOCNN_AUTOTUNE``.

A ``TuningBudget`` bounds what one prepare of a whole model spends tuning (autocnn.torch's
``prepare``: ``model_budget``, from an argument or ``AUTOCNN_QUICK_BUDGET``): each problem's quick
tuning is held to what is left of it, and once it is spent the problems after take the lookup's
answer untuned. Nothing is lost by stopping: a problem left untuned has no record yet, so the next
prepare (in any process) tunes it, while the problems tuned are remembered as quick records.
"""
from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Literal

from autocnn import __version__
from autocnn.cost_model.ranking import predicted_order
from autocnn.errors import DeviceError, InfeasibleConfigError, InvalidConfigError
from autocnn.kernels import get_operation
from autocnn.kernels.space import Config
from autocnn.measurement.sources import MeasurementSource, TrialResult

if TYPE_CHECKING:   # the tuner's modules import Optuna: only "full" needs them
    from autocnn.search.settings import TuneSettings

AutotuneMode = Literal["off", "quick", "full"]
AUTOTUNE_MODES: tuple[str, ...] = ("off", "quick", "full")
AUTOTUNE_ENV = "AUTOCNN_AUTOTUNE"
DEFAULT_AUTOTUNE: AutotuneMode = "quick"
# About what cudnn.benchmark spends on a new shape, and little next to a training run.
QUICK_BUDGET_S = 2.0
MODEL_BUDGET_ENV = "AUTOCNN_QUICK_BUDGET"
# A model's tuning at first use, once per GPU model: at about 2 s a problem, the 30-odd problems of
# a ResNet-18 training step and the larger half of a ResNet-50's (tuned in order of their share of
# the step), which then never cost it again. What a budget leaves is tuned by the next prepare.
MODEL_QUICK_BUDGET_S = 120.0
# Enough to try the warm-start configs (default, nearest shapes' winners) and a few searched ones.
FULL_AUTOTUNE_TRIALS = 24
# At most this many candidates: the lookup's, one nearest record and one default per formulation.
MAX_QUICK_CANDIDATES = 12
# Lookup answers that no record of this very problem backs: what quick and full tuning are for.
UNSEEN_SOURCES = ("nearest_shape", "default")


def check_autotune(value: Any, what: str = "autotune") -> AutotuneMode:
    """``value`` if it is one of AUTOTUNE_MODES, else a ValueError naming what is allowed."""
    if not isinstance(value, str) or value.lower() not in AUTOTUNE_MODES:
        raise ValueError(f"{what} must be one of {', '.join(AUTOTUNE_MODES)}, not {value!r}")
    return value.lower()  # type: ignore[return-value]


def check_budget(seconds: Any, what: str = "the quick-tuning budget") -> float:
    """A quick-tuning budget: a positive, finite number of seconds."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, not {seconds!r}")
    return float(seconds)


def model_budget(seconds: Any = None) -> float:
    """A model's tuning budget in seconds: ``seconds`` when given, else $AUTOCNN_QUICK_BUDGET when
    set, else MODEL_QUICK_BUDGET_S; a ValueError naming what is allowed otherwise."""
    if seconds is not None:
        return check_budget(seconds, "the model's tuning budget (budget_s)")
    env = os.environ.get(MODEL_BUDGET_ENV, "").strip()
    if not env:
        return MODEL_QUICK_BUDGET_S
    what = f"${MODEL_BUDGET_ENV} (the model's tuning budget)"
    try:
        value = float(env)
    except ValueError:
        raise ValueError(f"{what} must be a positive number of seconds, not {env!r}") from None
    return check_budget(value, what)


@dataclass
class TuningBudget:
    """Seconds that several problems' tuning shares (one prepare of a model), and what is spent."""

    seconds: float
    spent_s: float = 0.0

    def __post_init__(self) -> None:
        self.seconds = check_budget(self.seconds, "the model's tuning budget")

    @property
    def left_s(self) -> float:
        return max(0.0, self.seconds - self.spent_s)

    @property
    def spent(self) -> bool:
        return self.spent_s >= self.seconds


def autotune_mode(value: str | None = None) -> AutotuneMode:
    """The mode asked for: ``value`` when given, else $AUTOCNN_AUTOTUNE when set, else "quick"."""
    if value is not None:
        return check_autotune(value)
    env = os.environ.get(AUTOTUNE_ENV, "").strip()
    return check_autotune(env, f"${AUTOTUNE_ENV}") if env else DEFAULT_AUTOTUNE


@dataclass(frozen=True)
class QuickCandidate:
    config: Config
    origin: str     # "lookup", "nearest <formulation>" or "default <formulation>"


@dataclass(frozen=True)
class QuickOutcome:
    """What quick tuning of one problem measured, chose and stored."""

    problem: Any
    lookup: Any                            # the LookupResult it started from
    candidates: tuple[QuickCandidate, ...]
    results: tuple[TrialResult, ...]       # one per candidate measured, in candidate order
    best: TrialResult | None               # the fastest verified result
    record: Any                            # the TuningRecord stored, or None
    seconds: float
    stopped_because: str

    @property
    def config(self) -> Config:
        """The config to run: the fastest verified candidate, else the lookup's answer."""
        return self.best.config if self.best is not None else self.lookup.config

    @property
    def failed(self) -> tuple[TrialResult, ...]:
        return tuple(r for r in self.results if not r.ok)

    def summary(self) -> str:
        if self.best is None:
            chosen = f"no candidate verified, kept the lookup's {self.lookup.source} config"
        else:
            origin = next(c.origin for c in self.candidates if c.config.key() == self.best.config.key())
            chosen = f"{self.best.time_us:.1f} us ({origin})"
        return (f"quick-tuned: {chosen}; {len(self.results)} of {len(self.candidates)} candidates measured"
                + (f", {len(self.failed)} failed" if self.failed else "")
                + f" in {self.seconds:.1f} s; {self.stopped_because}"
                + ("" if self.record is not None or self.best is None else "; not stored"))


def _formulation_name(operation: Any, config: Config) -> str:
    f = operation.formulation_of(config)
    return f.formulation if f is not None else "?"


def quick_candidates(problem: Any, device: Any, db: Any, lookup: Any) -> list[QuickCandidate]:
    """The lookup's answer, the nearest tuned shape's config of every formulation (nearest
    first), then each formulation's first default that fits, in the operation's order; distinct
    configs only, MAX_QUICK_CANDIDATES at most."""
    operation = get_operation(problem.op)
    limits = device.limits()
    space = operation.space(problem, limits)
    out = [QuickCandidate(lookup.config, "lookup")]
    nearest_seen: set[str] = set()
    # neighbour_configs ranks by shape distance; the first config of each formulation is its nearest.
    for config in db.neighbour_configs(device, problem, space, limit=4 * MAX_QUICK_CANDIDATES):
        name = _formulation_name(operation, config)
        if name not in nearest_seen:
            nearest_seen.add(name)
            out.append(QuickCandidate(config, f"nearest {name}"))
    for name in operation.formulation_names:
        try:
            config = next(iter(operation.default_configs(problem, limits, name)), None)
        except (InfeasibleConfigError, InvalidConfigError, KeyError):
            continue   # this formulation cannot serve the problem (e.g. winograd for a 5x3 filter)
        if config is not None:
            out.append(QuickCandidate(config, f"default {name}"))
    distinct: dict[str, QuickCandidate] = {}
    for c in out:
        distinct.setdefault(c.config.key(), c)
    return predicted_candidates(problem, device, list(distinct.values()))[:MAX_QUICK_CANDIDATES]


def predicted_candidates(problem: Any, device: Any, candidates: list[QuickCandidate]) -> list[QuickCandidate]:
    """The lookup's answer first, then the others in the cost model's order (where one is in use):
    the budget may end before the last are measured."""
    ranked = predicted_order(problem, device, candidates[1:], lambda c: c.config)
    return candidates if ranked is None else [candidates[0], *ranked]


def quick_tune(problem: Any, device: Any, db: Any, source: MeasurementSource, budget_s: float = QUICK_BUDGET_S,
               lookup: Any = None, clock: Callable[[], float] = time.monotonic) -> QuickOutcome:
    """Measure ``quick_candidates`` of ``problem`` on ``source`` until ``budget_s`` is spent, and
    store the fastest verified one in ``db`` as a quick record of ``device`` (kept only where no
    full record of the key exists). ``lookup``: the database's answer, when the caller has it.

    The budget counts from the first result: a GPU source compiles every candidate at once in its
    pool before that one arrives (on a cold kernel cache, nvcc's seconds), after which results come
    at the pace of verification and timing. Counted from the start, a cold cache would leave time
    for the lookup's config alone, which is always measured."""
    budget_s = check_budget(budget_s)
    operation = get_operation(problem.op)
    operation.check_problem(problem)
    start = clock()
    found = lookup if lookup is not None else db.lookup(device, problem)
    candidates = quick_candidates(problem, device, db, found)
    results: list[TrialResult] = []
    stopped = "every candidate measured"
    measuring = source.measure(problem.op, problem, [c.config for c in candidates])
    first_at = None
    try:
        for r in measuring:
            results.append(r)
            now = clock()
            first_at = now if first_at is None else first_at
            if len(results) < len(candidates) and now - first_at >= budget_s:
                stopped = f"the {budget_s:g} s budget was spent"
                break
    finally:
        close = getattr(measuring, "close", None)
        if close is not None:
            close()   # a GPU source's compiles still queued are abandoned with it
    verified = sorted((r for r in results if r.ok and r.time_us is not None), key=lambda r: r.time_us)
    best = verified[0] if verified else None
    record = None
    if best is not None and db is not None:
        record = _store(db, device, operation, problem, best, verified[1:2], results)
    return QuickOutcome(problem, found, tuple(candidates), tuple(results), best, record, clock() - start, stopped)


def _store(db: Any, device: Any, operation: Any, problem: Any, best: TrialResult, runner: list[TrialResult],
           results: list[TrialResult]) -> Any:
    from autocnn.store import RecordKey, TuningRecord, now_utc

    default = operation.default_config(problem, device.limits())
    default_time = next((r.time_us for r in results if r.ok and r.config.key() == default.key()), None)
    record = TuningRecord(
        key=RecordKey.for_(device, problem, operation.config_fingerprint(best.config)),
        config=best.config.as_dict(), time_us=best.time_us, spread=float((best.timing or {}).get("spread", 0.0)),
        default_time_us=default_time, cudnn_time_us=None, trials=sum(1 for r in results if r.measured),
        tuned_at=now_utc(), autocnn_version=__version__, sampler="quick",
        runner_up={"config": runner[0].config.as_dict(), "time_us": runner[0].time_us} if runner else None,
        quick=True, workspace_bytes=operation.workspace_bytes(problem, best.config),
        plan_digest=operation.code_digest(problem, best.config))
    stored = db.put_many([record], keep_faster=True)
    return stored[0] if stored else None


@dataclass(frozen=True)
class AutotuneChoice:
    """The config a backend runs for one problem, and what to tell people about it."""

    config: Config
    source: str          # a lookup source, or "quick" / "full" when this run tuned it
    detail: str
    outcome: Any = None  # the QuickOutcome or TuneOutcome, when tuning ran
    tune_s: float = 0.0  # seconds spent tuning it (starting the worker included)
    over_budget: bool = False   # tuning was due, but the shared TuningBudget was spent
    time_us: float | None = None   # its time on this GPU, where known (tuned now, or this GPU's record)

    @property
    def tuned_now(self) -> bool:
        return self.outcome is not None


class Autotuner:
    """Per problem of a backend's ``prepare``: the lookup's config, tuned first where no record of
    the problem exists and the mode asks for it. The measurement source is made on first need
    (``source_factory``: on a GPU, a GpuSource, whose worker takes seconds to start) and closed
    by ``close``. ``budget_s``: each problem's quick tuning; ``shared``: a TuningBudget that the
    problems' tuning draws on together (each quick tuning held to what is left, none once spent);
    ``clock``: what tuning time is measured with."""

    def __init__(self, mode: str | None, db: Any, device: Any, source_factory: Callable[[], MeasurementSource],
                 budget_s: float = QUICK_BUDGET_S, full_settings: TuneSettings | None = None,
                 shared: TuningBudget | None = None, clock: Callable[[], float] = time.monotonic):
        self.mode = autotune_mode(mode)
        self.budget_s = check_budget(budget_s)
        self.db, self.device = db, device
        self.source_factory = source_factory
        self.full_settings = full_settings
        self.shared = shared
        self.clock = clock
        self._source: MeasurementSource | None = None

    def choose(self, problem: Any) -> AutotuneChoice:
        found = self.db.lookup(self.device, problem)
        here = found.record.time_us if found.source == "exact" and found.record is not None else None
        if found.source == "exact" and found.record is not None and found.record.quick:
            return AutotuneChoice(found.config, "quick", found.detail + ", quick-tuned", time_us=here)
        if self.mode == "off" or found.source not in UNSEEN_SOURCES:
            return AutotuneChoice(found.config, found.source, found.detail, time_us=here)
        if self.shared is not None and self.shared.spent:
            return AutotuneChoice(found.config, found.source,
                                  f"{found.detail}; untuned: the {self.shared.seconds:g} s tuning budget was spent",
                                  over_budget=True)
        start = self.clock()
        try:
            choice = self._tune(problem, found)
        finally:
            if self.shared is not None:
                self.shared.spent_s += self.clock() - start
        return replace(choice, tune_s=self.clock() - start)

    def _tune(self, problem: Any, found: Any) -> AutotuneChoice:
        try:
            source = self.source
        except (DeviceError, RuntimeError, OSError) as exc:
            # Lookups alone still give a kernel that runs: a worker that cannot start must not
            # stop a model from being built.
            warnings.warn(f"autotune={self.mode}: the measuring worker did not start ({exc}); the looked-up "
                          f"configs run untuned (${AUTOTUNE_ENV}=off skips tuning)", RuntimeWarning, stacklevel=3)
            self.mode = "off"
            return AutotuneChoice(found.config, found.source, found.detail)
        if self.mode == "quick":
            budget_s = self.budget_s if self.shared is None else min(self.budget_s, max(self.shared.left_s, 1e-3))
            outcome = quick_tune(problem, self.device, self.db, source, budget_s, lookup=found, clock=self.clock)
            if outcome.best is None:
                return AutotuneChoice(found.config, found.source, f"{found.detail}; {outcome.summary()}", outcome)
            return AutotuneChoice(outcome.config, "quick", outcome.summary(), outcome, time_us=outcome.best.time_us)
        from autocnn.search.tuner import Tuner, TuneSettings

        settings = self.full_settings or TuneSettings(trials=FULL_AUTOTUNE_TRIALS)
        outcome = Tuner(source, self.db, settings, progress=False).tune(problem.op, problem)
        if outcome.best is None:
            return AutotuneChoice(found.config, found.source, f"{found.detail}; tuning found no verified config",
                                  outcome)
        return AutotuneChoice(outcome.best.config, "full", f"tuned now: {outcome.summary()}", outcome,
                              time_us=outcome.best.time_us)

    @property
    def source(self) -> MeasurementSource:
        if self._source is None:
            self._source = self.source_factory()
        return self._source

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None
