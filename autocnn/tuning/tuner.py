"""The search: one Optuna study per (GPU, operation, problem, template fingerprint).

Configs are proposed by an Optuna sampler in batches, so the compile pool works ahead of the GPU.
A config that breaks a static rule is marked infeasible without GPU time and is not counted; a
config measured before (in this study, also by another process or an interrupted run) is answered
from its earlier trial; only verified results become trial values. The winner is timed again,
interleaved with the runner-up and the default, before it is stored in the tuning database.
"""
from __future__ import annotations

import datetime as _dt
import math
import random
import statistics
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import optuna

from autocnn import __version__
from autocnn.device import DeviceInfo
from autocnn.errors import FailureClass, InfeasibleConfigError, InvalidConfigError
from autocnn.kernels import get_operation
from autocnn.tuning.sources import MeasurementSource, TrialResult
from autocnn.kernels.space import Config, SearchSpace

SAMPLERS = ("tpe", "random", "grid", "cmaes", "gp")
# Stop asking when this many proposals in a row brought nothing new to measure (space exhausted).
MAX_IDLE_PROPOSALS = 400
CONFIG_ATTR = "config"
RESULT_ATTR = "result"          # timing, registers, failure class and message of a told trial
# A RUNNING trial older than this belongs to a process that died (no measurement takes so long).
STALE_TRIAL_S = 900
# Feasible random configs that start a model-based search (TPE's own startup draws are independent).
STARTUP_TRIALS = 10


@dataclass(frozen=True)
class TuneSettings:
    trials: int = 100                    # measured trials per study (a re-run continues to this total)
    timeout_s: float | None = None       # wall-clock budget per study
    sampler: str = "tpe"
    seed: int | None = None
    storage: str | None = None           # Optuna storage URL or journal file; None: SQLite in the cache
    batch: int = 16                      # configs proposed at once (compiled in parallel)
    fixed: Mapping[str, Any] = field(default_factory=dict)   # parameters held at one value
    warm_start: bool = True              # enqueue the default, old winners of the shape, nearest shapes' winners
    confirm_rounds: int = 3              # interleaved re-timing rounds of winner, runner-up and default

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler {self.sampler!r} is not one of {', '.join(SAMPLERS)}")
        if self.trials < 1:
            raise ValueError(f"trials must be at least 1, not {self.trials}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"timeout must be positive, not {self.timeout_s}")
        if self.batch < 1:
            raise ValueError(f"batch must be at least 1, not {self.batch}")


@dataclass
class TuneOutcome:
    op: str
    problem: Any
    study_name: str
    best: TrialResult | None
    default: TrialResult | None
    measured: int = 0
    infeasible: int = 0
    reused: int = 0
    failures: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    record: Any = None
    stopped_because: str = ""

    @property
    def speedup(self) -> float | None:
        if self.best and self.default and self.default.ok and self.best.time_us:
            return self.default.time_us / self.best.time_us
        return None


def default_storage_url() -> str:
    from autocnn.kernels.compiler import cache_root

    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'optuna.db'}"


def open_storage(url: str | None) -> Any:
    """An Optuna storage from a URL (any RDB URL) or a journal file path (``*.log``, ``journal:PATH``)."""
    url = url or default_storage_url()
    if url == "memory":
        return optuna.storages.InMemoryStorage()   # nothing kept: studies of replay experiments
    if url.startswith("journal:") or url.endswith((".log", ".journal", ".jsonl")):
        path = url[len("journal:"):] if url.startswith("journal:") else url
        from optuna.storages import JournalStorage

        try:
            from optuna.storages.journal import JournalFileBackend as _Backend
        except ImportError:  # Optuna < 4
            from optuna.storages import JournalFileStorage as _Backend
        return JournalStorage(_Backend(path))
    if url.startswith("sqlite"):
        _sqlite_write_ahead_log()
        return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
    return optuna.storages.RDBStorage(url)


_WAL_INSTALLED = False


def _sqlite_write_ahead_log() -> None:
    """WAL journaling with synchronous=NORMAL: a commit no longer waits for an fsync (one per trial
    attribute would cost ~10 ms each), and a crash still loses nothing committed before the last
    checkpoint but the newest transactions."""
    global _WAL_INSTALLED
    if _WAL_INSTALLED:
        return
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _pragmas(dbapi_connection, _record):  # noqa: ANN001
        if isinstance(dbapi_connection, sqlite3.Connection):
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

    _WAL_INSTALLED = True


def study_name(device: DeviceInfo, op: str, problem: Any, fingerprint: str, fixed: Mapping[str, Any]) -> str:
    text = f"{device.slug()}|{op}|{problem.shape_string()}|{fingerprint}"
    if fixed:
        text += "|fixed:" + ",".join(f"{k}={fixed[k]}" for k in sorted(fixed))
    return text


class ExhaustiveSampler(optuna.samplers.BruteForceSampler):
    """Optuna's brute-force sampler, which ends ``study.optimize`` when every config was tried; with
    ask-and-tell there is no optimize loop to end, so exhaustion is kept as a flag the tuner reads."""

    exhausted = False

    def after_trial(self, study, trial, state, values) -> None:  # noqa: ANN001
        stop = study.stop

        def mark_exhausted() -> None:
            self.exhausted = True

        study.stop = mark_exhausted   # type: ignore[method-assign]
        try:
            super().after_trial(study, trial, state, values)
        finally:
            study.stop = stop   # type: ignore[method-assign]


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    # Multivariate TPE, brute force and GP are marked experimental by Optuna; they are what we want.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return _make_sampler(name, seed)


def _make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True,
                                          n_startup_trials=10)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return ExhaustiveSampler(seed=seed)
    if name == "cmaes":
        # CMA-ES models the ordinal parameters; formulation branches fall back to independent sampling.
        return optuna.samplers.CmaEsSampler(seed=seed, independent_sampler=optuna.samplers.TPESampler(seed=seed))
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    raise ValueError(f"sampler {name!r} is not one of {', '.join(SAMPLERS)}")


def suggest_config(trial: optuna.trial.BaseTrial, space: SearchSpace) -> tuple[Config | None, list[str]]:
    """Define-by-run: suggest each active parameter; numbers as ordinal indices into their choices."""
    values: dict[str, Any] = {}
    for p in space.params:
        if not p.is_active(values):
            continue
        if len(p.choices) == 1:
            values[p.name] = p.choices[0]
        elif all(isinstance(c, int) and not isinstance(c, bool) for c in p.choices):
            ordered = sorted(p.choices)
            values[p.name] = ordered[trial.suggest_int(p.name, 0, len(ordered) - 1)]
        else:
            values[p.name] = trial.suggest_categorical(p.name, list(p.choices))
        reasons = space.violations(values)
        if reasons:
            return None, reasons
    try:
        return space.validate(values), []
    except (InvalidConfigError, InfeasibleConfigError) as exc:
        return None, [str(exc)]


def enqueue_params(space: SearchSpace, config: Config) -> dict[str, Any]:
    """The trial parameters that make ``suggest_config`` reproduce ``config``."""
    params = {}
    for p in space.params:
        if p.name not in config or len(p.choices) == 1:
            continue
        v = config[p.name]
        if all(isinstance(c, int) and not isinstance(c, bool) for c in p.choices):
            params[p.name] = sorted(p.choices).index(v)
        else:
            params[p.name] = v
    return params


class Tuner:
    """Searches one problem at a time against a measurement source, storing winners in a database."""

    def __init__(self, source: MeasurementSource, database: Any = None, settings: TuneSettings | None = None,
                 progress: bool = True, log: Callable[[str], None] | None = None):
        self.source = source
        self.db = database
        self.settings = settings or TuneSettings()
        self.progress = progress
        self.log = log or (lambda text: None)
        self._storage = None

    @property
    def storage(self) -> Any:
        if self._storage is None:
            self._storage = open_storage(self.settings.storage)
        return self._storage

    def space_for(self, op: str, problem: Any) -> SearchSpace:
        space = get_operation(op).space(problem, self.source.device.limits())
        return space.restrict(self.settings.fixed) if self.settings.fixed else space

    def tune(self, op: str, problem: Any, trials: int | None = None, timeout_s: float | None = None) -> TuneOutcome:
        s = self.settings
        trials = trials or s.trials
        timeout_s = timeout_s if timeout_s is not None else s.timeout_s
        operation = get_operation(op)
        operation.check_problem(problem)
        device = self.source.device
        space = self.space_for(op, problem)
        fingerprint = operation.fingerprint()
        name = study_name(device, op, problem, fingerprint, s.fixed)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        default = operation.default_config(problem, device.limits())
        rng = random.Random(s.seed)
        # Creating the storage and the study, and queueing the first configs, under the same lock
        # as proposals: processes that start together would otherwise race on all three.
        with _proposal_lock(s.storage or default_storage_url()):
            study = optuna.create_study(study_name=name, storage=self.storage, direction="minimize",
                                        sampler=make_sampler(s.sampler, s.seed), load_if_exists=True)
            if study.user_attrs.get("op") != op:
                study.set_user_attr("op", op)
                study.set_user_attr("problem", problem.to_dict())
                study.set_user_attr("device", device.to_dict())
                study.set_user_attr("fingerprint", fingerprint)
            known = self._known_results(study, space)
            queued = {self._config_of(t, space) for t in study.get_trials(
                deepcopy=False, states=(optuna.trial.TrialState.WAITING,))}
            first: list[Config] = []
            if s.warm_start:
                first += [default, *self._stale_winners(problem, space), *self._neighbour_winners(op, problem, space)]
            if s.sampler in ("tpe", "cmaes", "gp") and sum(1 for r in known.values() if r.ok) < STARTUP_TRIALS:
                # Model-based samplers begin with independent random draws, which on a small layer
                # are almost all infeasible; feasible random configs from the space's walk start them.
                first += space.sample(rng, min(STARTUP_TRIALS, max(2, trials // 4)),
                                      exclude=[r.config for r in known.values()] + [default])
            self._enqueue(study, space, [c for c in first if c.key() not in known and c.key() not in queued])

        outcome = TuneOutcome(op, problem, name, None, None)
        start = time.perf_counter()
        measured = sum(1 for r in known.values() if r.measured)
        bar = _progress_bar(self.progress, trials, f"{op} {problem.shape_string()}", measured)
        idle = 0
        try:
            while measured < trials:
                if timeout_s is not None and time.perf_counter() - start > timeout_s:
                    outcome.stopped_because = f"timeout of {timeout_s:.0f} s"
                    break
                for key, result in self._known_results(study, space).items():
                    known.setdefault(key, result)
                measured = sum(1 for r in known.values() if r.measured)
                if measured >= trials:
                    outcome.stopped_because = f"{trials} measured trials (in the whole study)"
                    break
                if getattr(study.sampler, "exhausted", False):
                    outcome.stopped_because = "the search space is exhausted"
                    break
                if outcome.infeasible > max(1000, 50 * trials):
                    outcome.stopped_because = f"the sampler proposed {outcome.infeasible} infeasible configs"
                    break
                want = min(s.batch, trials - measured)
                if s.sampler == "random":
                    # Random search over the feasible configs: draws from the space's walk, enqueued.
                    self._enqueue(study, space, space.sample(rng, want, exclude=[r.config for r in known.values()]))
                batch, duplicates = self._propose(study, space, known, outcome, want)
                if not batch and not duplicates:
                    idle += 1
                    if idle * max(1, s.batch) >= MAX_IDLE_PROPOSALS:
                        outcome.stopped_because = "the search space is exhausted"
                        break
                    continue
                idle = 0
                for (trial, config), result in zip(batch, self.source.measure(op, problem, [c for _, c in batch])):
                    known[config.key()] = result
                    self._tell(study, trial, result)
                    if result.measured:
                        outcome.measured += 1
                    if not result.ok:
                        outcome.failures[result.failure.value if result.failure else "unknown"] += 1
                    if bar:
                        bar.update(1 if result.measured else 0)
                for trial, config in duplicates:
                    self._tell(study, trial, known[config.key()], reused=True)
                    outcome.reused += 1
                best = _best(known.values())
                if bar and best:
                    bar.set_postfix_str(f"best {best.time_us:.1f} us")
            else:
                outcome.stopped_because = f"{trials} measured trials"
        except KeyboardInterrupt:
            outcome.stopped_because = "interrupted (the study keeps every finished trial; re-run to resume)"
            raise
        finally:
            if bar:
                bar.close()
            outcome.seconds = time.perf_counter() - start

        outcome.default = known.get(default.key())
        outcome.best = _best(known.values())
        if outcome.best is not None:
            outcome = self._confirm_and_store(study, space, operation, problem, default, known, outcome)
        return outcome

    # -- the pieces ---------------------------------------------------------------------------
    def _propose(self, study, space, known, outcome, want):
        # Processes sharing a local storage take turns proposing, so that a config's "in flight" mark
        # is committed before another process can propose it. (A remote RDB shared by machines has
        # no such lock: two machines may, rarely, measure the same config at the same moment.)
        lock = _proposal_lock(self.settings.storage or default_storage_url())
        with lock:
            return self._propose_locked(study, space, known, outcome, want)

    def _propose_locked(self, study, space, known, outcome, want):
        batch: list[tuple[Any, Config]] = []
        duplicates: list[tuple[Any, Config]] = []
        keys = set()
        # Read what the study holds now, under the lock: results another process finished since our
        # last look are answers, not configs to measure again. In-flight first: a trial that finishes
        # between the two reads then shows up in the second one instead of in neither.
        in_flight = self._in_flight(study)
        for key, result in self._known_results(study, space).items():
            known.setdefault(key, result)
        asks = 0
        while len(batch) < want and asks < MAX_IDLE_PROPOSALS:
            asks += 1
            trial = study.ask()
            config, reasons = suggest_config(trial, space)
            if config is None:
                outcome.infeasible += 1
                trial.set_user_attr(RESULT_ATTR, {"failure": FailureClass.INFEASIBLE.value, "stage": "static",
                                                  "message": "; ".join(reasons)[:500]})
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            trial.set_user_attr(CONFIG_ATTR, config.as_dict())
            key = config.key()
            if key in known:
                duplicates.append((trial, config))
                if len(duplicates) >= want:
                    break
                continue
            if key in keys or key in in_flight:
                # Being measured right now (in this batch, or by another process sharing the study).
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            keys.add(key)
            batch.append((trial, config))
        return batch, duplicates

    def _tell(self, study, trial, result: TrialResult, reused: bool = False) -> None:
        # One attribute holds everything about the measurement: each write is a storage commit.
        outcome: dict[str, Any] = {}
        if result.timing:
            outcome["timing"] = result.timing
        if result.resources:
            outcome["registers"] = {k: v.get("registers") for k, v in result.resources.items()}
        if reused:
            outcome["reused"] = True
        if not result.ok:
            outcome["failure"] = result.failure.value if result.failure else "unknown"
            outcome["message"] = result.message[:500]
        trial.set_user_attr(RESULT_ATTR, outcome)
        if result.ok and result.time_us is not None:
            study.tell(trial, result.time_us)
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def _known_results(self, study, space: SearchSpace) -> dict[str, TrialResult]:
        """Finished trials of the study (earlier runs, other processes), by config key."""
        known: dict[str, TrialResult] = {}
        for t in study.get_trials(deepcopy=False):
            cfg = t.user_attrs.get(CONFIG_ATTR)
            result = t.user_attrs.get(RESULT_ATTR, {})
            if cfg is None or result.get("reused"):
                continue
            try:
                # Through the space: canonical parameter order, and nothing foreign gets in.
                config = space.validate(cfg, check_feasible=False)
            except InvalidConfigError:
                continue
            if t.state == optuna.trial.TrialState.COMPLETE:
                known[config.key()] = TrialResult(config, True, t.value, timing=result.get("timing"))
            elif t.state == optuna.trial.TrialState.FAIL and result.get("failure"):
                known.setdefault(config.key(), TrialResult(config, False, failure=FailureClass(result["failure"]),
                                                           message=result.get("message", "")))
        return known

    def _in_flight(self, study) -> set[str]:
        """Configs other processes are measuring now; trials a dead process left RUNNING are failed."""
        keys = set()
        op = study.user_attrs.get("op", "")
        now = _dt.datetime.now()
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            cfg = t.user_attrs.get(CONFIG_ATTR)
            if t.datetime_start is not None and (now - t.datetime_start).total_seconds() > STALE_TRIAL_S:
                try:
                    study.tell(t.number, state=optuna.trial.TrialState.FAIL)
                except (RuntimeError, ValueError):
                    pass   # another process finished or failed it first
                continue
            if cfg is not None:
                keys.add(Config(op, tuple(cfg.items())).key())
        return keys

    @staticmethod
    def _config_of(trial, space: SearchSpace) -> str | None:
        """The config key a queued trial will produce (from its fixed parameters)."""
        fixed = trial.system_attrs.get("fixed_params") or {}
        values = {}
        for p in space.params:
            if p.name in fixed:
                v = fixed[p.name]
                ints = all(isinstance(c, int) and not isinstance(c, bool) for c in p.choices)
                values[p.name] = sorted(p.choices)[int(v)] if ints and len(p.choices) > 1 else v
            elif len(p.choices) == 1 and p.is_active(values):
                values[p.name] = p.choices[0]
        try:
            return space.validate(values, check_feasible=False).key()
        except InvalidConfigError:
            return None

    def _enqueue(self, study, space, configs: Sequence[Config]) -> None:
        for config in configs:
            try:
                space.validate(config.as_dict())
            except (InvalidConfigError, InfeasibleConfigError):
                continue
            study.enqueue_trial(enqueue_params(space, config), skip_if_exists=True)

    def _stale_winners(self, problem: Any, space: SearchSpace) -> list[Config]:
        # The winners of this very shape under older templates: often unchanged code, so a retune
        # after a template change starts from the old best instead of below it.
        if self.db is None or not hasattr(self.db, "stale_configs"):
            return []
        return self.db.stale_configs(self.source.device, problem, space)

    def _neighbour_winners(self, op: str, problem: Any, space: SearchSpace, limit: int = 3) -> list[Config]:
        if self.db is None:
            return []
        try:
            return self.db.neighbour_configs(self.source.device, problem, space, limit)
        except AttributeError:
            return []

    def _confirm_and_store(self, study, space, operation, problem, default, known, outcome):
        """Time the winner again, interleaved with the runner-up and the default, then store it."""
        ranked = sorted((r for r in known.values() if r.ok and r.time_us is not None), key=lambda r: r.time_us)
        contenders = [r.config for r in ranked[:2]]
        if default.key() not in {c.key() for c in contenders} and default.key() in known and known[default.key()].ok:
            contenders.append(default)
        rounds = max(1, self.settings.confirm_rounds)
        sequence = [c for _ in range(rounds) for c in contenders]
        times: dict[str, list[float]] = {c.key(): [] for c in contenders}
        last: dict[str, TrialResult] = {}
        for r in self.source.measure(outcome.op, problem, sequence):
            if r.ok and r.time_us is not None:
                times[r.config.key()].append(r.time_us)
                last[r.config.key()] = r
            else:
                times[r.config.key()].append(math.inf)   # a winner that fails once is not a winner
        medians = {k: statistics.median(v) for k, v in times.items() if v}
        finite = {k: v for k, v in medians.items() if math.isfinite(v)}
        if not finite:
            outcome.best = None
            outcome.stopped_because += "; no contender verified again, nothing stored"
            return outcome
        winner_key = min(finite, key=finite.get)
        winner = last[winner_key]
        outcome.best = TrialResult(winner.config, True, finite[winner_key], timing=winner.timing)
        runner = [k for k in finite if k != winner_key and k != default.key()]
        if default.key() in finite:
            outcome.default = TrialResult(default, True, finite[default.key()])
        if self.db is not None:
            from autocnn.store import RecordKey, TuningRecord

            timing = winner.timing or {}
            record = TuningRecord(
                key=RecordKey.for_(self.source.device, problem, operation.config_fingerprint(winner.config)),
                config=winner.config.as_dict(),
                time_us=finite[winner_key],
                spread=float(timing.get("spread", 0.0)),
                default_time_us=finite.get(default.key()),
                cudnn_time_us=None,
                trials=sum(1 for r in known.values() if r.measured),
                tuned_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                autocnn_version=__version__,
                sampler=self.settings.sampler,
                study=outcome.study_name,
                storage=_redact(self.settings.storage or default_storage_url()),
                runner_up={"config": last[runner[0]].config.as_dict(), "time_us": finite[runner[0]]} if runner else None,
            )
            self.db.put(record)
            outcome.record = record
        return outcome


def _proposal_lock(url: str):
    """A file lock beside a local storage (SQLite file or journal), or a no-op for remote databases."""
    import contextlib

    from filelock import FileLock

    path = None
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
    elif url.startswith("journal:"):
        path = url[len("journal:"):]
    elif url.endswith((".log", ".journal", ".jsonl")):
        path = url
    if not path or path == ":memory:":
        return contextlib.nullcontext()
    return FileLock(path + ".propose.lock", timeout=600)


def _best(results: Iterable[TrialResult]) -> TrialResult | None:
    ok = [r for r in results if r.ok and r.time_us is not None]
    return min(ok, key=lambda r: r.time_us) if ok else None


def _redact(url: str) -> str:
    """A storage URL without its password, fit to be stored and shown."""
    if "://" in url and "@" in url.split("://", 1)[1]:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url


def _progress_bar(enabled: bool, total: int, desc: str, initial: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=min(initial, total), desc=desc, unit="trial", leave=True, dynamic_ncols=True)


# -- several problems (a network) ----------------------------------------------------------------

# Rough rates that turn a problem into an expected share of a training step's time.
_EXPECTED_FLOPS = 25e12
_EXPECTED_BYTES = 3e12


def expected_seconds(op: str, problem: Any) -> float:
    operation = get_operation(op)
    if op.startswith("conv"):
        return operation.flops(problem) / _EXPECTED_FLOPS
    return operation.min_bytes(problem) / _EXPECTED_BYTES


def split_budget(problems: Sequence[Any], total: int, minimum: int = 8) -> list[int]:
    """Trials per problem in proportion to its expected time, at least ``minimum`` each."""
    if not problems:
        return []
    weights = [expected_seconds(p.op, p) for p in problems]
    spare = max(0, total - minimum * len(problems))
    whole = sum(weights) or 1.0
    return [minimum + int(round(spare * w / whole)) for w in weights]


def tune_problems(tuner: "Tuner", problems: Sequence[Any], total_trials: int,
                  timeout_s: float | None = None, log: Callable[[str], None] | None = None) -> list[TuneOutcome]:
    """Tune every distinct problem, spending the budget where the network spends its time."""
    unique: list[Any] = []
    for p in problems:
        if p not in unique:
            unique.append(p)
    trials = split_budget(unique, total_trials)
    weights = [expected_seconds(p.op, p) for p in unique]
    outcomes = []
    for problem, n, w in zip(unique, trials, weights):
        share = None if timeout_s is None else max(5.0, timeout_s * w / (sum(weights) or 1.0))
        if log:
            log(f"{problem.op} {problem.shape_string()}: {n} trials")
        outcomes.append(tuner.tune(problem.op, problem, trials=n, timeout_s=share))
    return outcomes
