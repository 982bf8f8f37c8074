"""The search: one Optuna study per (GPU, operation, problem, template fingerprint).

Configs are proposed by an Optuna sampler in batches, so the compile pool works ahead of the GPU.
A config that breaks a static rule is marked infeasible without GPU time and is not counted; a
config measured before (in this study, also by another process or an interrupted run) is answered
from its earlier trial; only verified results become trial values. When the sampler keeps proposing
nothing new (a model-based sampler on a tightly constrained space can, for hundreds of asks), the
tuner queues random feasible configs no one has measured, so the budget is spent on new configs.
The winner is timed again, interleaved with the runner-up and the default, before it is stored in
the tuning database.

Several tuners (processes, hosts, or one per GPU) may share a study. Each proposal happens under
the study's lock (``study_lock``): the tuner reads what the study holds, takes only configs no one
has measured or is measuring, and no more than the budget leaves once the other tuners' configs in
flight are counted, so the study's trial budget holds and no config is measured twice. A trial
whose tuner ended before telling it (killed, host down) is failed and its config queued again
(``trials.in_flight``, ``leases``).

Modules: ``settings`` (TuneSettings, TuneOutcome), ``storage`` (storage URLs), ``study_lock``,
``leases`` (trial owners, heartbeats), ``trials`` (reading and telling a study's trials),
``samplers``, ``confirm`` (re-timing and storing the winner), ``network`` (a network's problems,
budgets), ``devices`` (several GPUs). This module re-exports their public names.
"""
from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import optuna

from autocnn.cost_model.ranking import model_in_use, predicted_order
from autocnn.device import DeviceInfo, DeviceLimits
from autocnn.errors import FailureClass, InfeasibleConfigError, InvalidConfigError
from autocnn.kernels import get_operation
from autocnn.kernels.space import Config, SearchSpace
from autocnn.search.confirm import confirm_and_store
from autocnn.search.leases import HEARTBEATS, OWNER_ATTR, Owner, new_owner, retire
from autocnn.search.samplers import (SAMPLERS, ExhaustiveSampler, enqueue_params, make_sampler,  # noqa: F401
                                     suggest_config)
from autocnn.search.settings import TuneOutcome, TuneSettings, check_timeout  # noqa: F401
from autocnn.measurement.sources import MeasurementSource, TrialResult, held_for, study_tag
from autocnn.search.storage import (StorageSpec, StorageUrlError, default_storage_url, open_storage,  # noqa: F401
                                    parse_storage)
from autocnn.search.study_lock import shared_storage, study_lock
from autocnn.search.trials import (ABANDONED_ATTR, CONFIG_ATTR, RESULT_ATTR, in_flight, known_results,  # noqa: F401
                                   measured_count, queued_keys, tell)

# Stop asking when this many proposals in a row brought nothing new to measure (space exhausted).
MAX_IDLE_PROPOSALS = 400
# Feasible random configs that start a model-based search (TPE's own startup draws are independent).
STARTUP_TRIALS = 10
# How often a tuner whose budget other tuners hold in flight looks whether they finished.
WAIT_FOR_OTHERS_S = 0.25
# Asks in a row that bring nothing to measure (infeasible, measured before, in flight) after which a
# proposal queues random feasible configs no one has measured. A model-based sampler on a tightly
# constrained space can go on proposing infeasible or known configs for hundreds of asks; without
# this a tuner could stop short of its budget while unmeasured feasible configs remain.
FALLBACK_AFTER = 24


# A sampler that keeps proposing configs a replay file lacks stops after this many misses (the
# file was recorded over a smaller space than the one searched).
MAX_REPLAY_MISSES = 200
# Where a cost model is in use, its best few of a sample of the space join the first trials.
PREDICTED_FIRST_TRIALS = 3
PREDICTED_SAMPLE = 64


def study_name(device: DeviceInfo, op: str, problem: Any, fingerprint: str, fixed: Any,
               replay: str | None = None) -> str:
    """``replay``: the tag of a replayed study (``sources.study_tag``), which never shares a study
    with measurements of the same GPU and shape: a replay file's misses, or its recorded times
    of another run, are no measurement of this host's GPU."""
    text = f"{device.slug()}|{op}|{problem.shape_string()}|{fingerprint}"
    if fixed:
        text += "|fixed:" + fixed_text(fixed)
    if replay:
        text += "|" + replay
    return text


@dataclass
class Proposal:
    """One turn at the study's lock: what to measure, and what the study held at that moment."""

    batch: list[tuple[Any, Config]] = field(default_factory=list)
    known: dict[str, TrialResult] = field(default_factory=dict)
    study_measured: int = 0
    others_in_flight: int = 0
    recovered: int = 0
    asked: int = 0            # trials asked (infeasible and duplicates included)


class Tuner:
    """Searches one problem at a time against a measurement source, storing winners in a database."""

    def __init__(self, source: MeasurementSource, database: Any = None, settings: TuneSettings | None = None,
                 progress: bool = True, log: Callable[[str], None] | None = None, storage: Any = None):
        """``storage``: an opened Optuna storage to use (tuners of several GPUs pass one); default:
        the process's storage for ``settings.storage``."""
        self.source = source
        self.db = database
        self.settings = settings or TuneSettings()
        self.progress = progress
        self.log = log or (lambda text: None)
        self._storage = storage
        self.spec: StorageSpec = self.settings.storage_spec

    @property
    def storage(self) -> Any:
        if self._storage is None:
            self._storage = shared_storage(self.spec)
        return self._storage

    def fixed_for(self, op: str, problem: Any) -> dict[str, Any]:
        """The parameters held for this problem: --fix, and what a replay file's recording held
        (it answers nothing else). InvalidConfigError where the two disagree."""
        held = held_for(self.source, op, problem)
        fixed = dict(self.settings.fixed)
        for name, value in held.items():
            if name in fixed and fixed[name] != value:
                raise InvalidConfigError(op, name, fixed[name], f"the replay file of {problem.shape_string()} "
                                                                f"was recorded with {fixed_text(held)} held")
            fixed[name] = value
        return fixed

    def space_for(self, op: str, problem: Any) -> SearchSpace:
        space = get_operation(op).space(problem, self.source.device.limits())
        fixed = self.fixed_for(op, problem)
        return space.restrict(fixed) if fixed else space

    def tune(self, op: str, problem: Any, trials: int | None = None, timeout_s: float | None = None) -> TuneOutcome:
        s = self.settings
        trials = trials or s.trials
        timeout_s = check_timeout(timeout_s, "timeout") if timeout_s is not None else s.timeout_s
        operation = get_operation(op)
        operation.check_problem(problem)
        device = self.source.device
        try:
            fixed = self.fixed_for(op, problem)
        except InvalidConfigError as exc:
            outcome = TuneOutcome(op, problem, "", None, None, device=device.name)
            outcome.stopped_because = f"finding that --fix and the replay file disagree: {exc}"
            return outcome
        name = study_name(device, op, problem, operation.fingerprint(), fixed, study_tag(self.source, op, problem))
        try:
            space = self.space_for(op, problem)
        except InvalidConfigError as exc:
            # A held value this op does not offer (a network's weight gradients under
            # formulation=wgmma): this problem is left out, the run goes on (the command line leaves
            # such problems out before it starts: problems_offering).
            outcome = TuneOutcome(op, problem, name, None, None, device=device.name)
            outcome.stopped_because = f"finding that {op} has no config with {fixed_text(fixed)}: {exc}"
            return outcome
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        default = self._default(operation, problem)
        outcome = TuneOutcome(op, problem, name, None, None, device=device.name)
        if fixed and not space.sample(random.Random(0), 1, max_attempts=1000):
            # The held parameters rule out every config (a formulation that cannot serve this shape
            # or this GPU): say why, before a study is opened or anything measured.
            outcome.stopped_because = (f"finding that no config of this shape satisfies {fixed_text(fixed)}: "
                                       f"{_why_empty(space, fixed)}")
            return outcome
        owner = new_owner()
        try:
            study = self._open_study(name, op, problem, operation, space, default, trials, owner, outcome)
            beating = (HEARTBEATS.beating(self.storage, study._study_id) if self.spec.kind == "postgresql"
                       else contextlib.nullcontext())
            with beating:
                known = self._search(study, space, op, problem, trials, timeout_s, owner, outcome)
        finally:
            retire(owner)
        outcome.default = known.get(default.key())
        outcome.best = _best(known.values())
        outcome.study_measured = measured_count(known)
        if outcome.best is not None:
            outcome = confirm_and_store(self.source, self.db, s, operation, problem, default, known,
                                        outcome.study_measured, outcome, self._incumbent(problem),
                                        self._stored(problem))
        return outcome

    # -- the pieces ---------------------------------------------------------------------------
    def _open_study(self, name, op, problem, operation, space, default, trials, owner, outcome) -> optuna.Study:
        """Create or load the study and queue its first configs, under the study's lock: tuners
        that start together would otherwise race on all three."""
        s = self.settings
        with study_lock(self.spec, name):
            study = optuna.create_study(study_name=name, storage=self.storage, direction="minimize",
                                        sampler=make_sampler(s.sampler, s.seed), load_if_exists=True)
            if study.user_attrs.get("op") != op:
                study.set_user_attr("op", op)
                study.set_user_attr("problem", problem.to_dict())
                study.set_user_attr("device", self.source.device.to_dict())
                study.set_user_attr("fingerprint", operation.fingerprint())
            flight = in_flight(study, space, owner)
            known = known_results(study, space)
            outcome.recovered += self._requeue(study, space, flight.abandoned, known, flight.keys)
            queued = queued_keys(study, space)
            first: list[Config] = []
            if s.warm_start:
                earlier = [*self._current_winner(problem, space), *self._stale_winners(problem, space),
                           *self._neighbour_winners(op, problem, space)]
                first += [default, *earlier, *self._predicted_firsts(problem, space),
                          *_variants(space, earlier, s.vary)]
            if s.sampler in ("tpe", "cmaes", "gp") and sum(1 for r in known.values() if r.ok) < STARTUP_TRIALS:
                # Model-based samplers begin with independent random draws, which on a small layer
                # are almost all infeasible; feasible random configs from the space's walk start them.
                first += space.sample(random.Random(s.seed), min(STARTUP_TRIALS, max(2, trials // 4)),
                                      exclude=[r.config for r in known.values()] + [default])
            self._enqueue(study, space, [c for c in first if c.key() not in known and c.key() not in queued
                                         and c.key() not in flight.keys])
        return study

    def _search(self, study, space, op, problem, trials, timeout_s, owner, outcome) -> dict[str, TrialResult]:
        """Propose, measure and tell until the study's budget is spent (or time, or the space)."""
        s = self.settings
        rng = random.Random(s.seed)
        start = time.perf_counter()
        known = known_results(study, space)
        bar = _progress_bar(self.progress, trials, f"{op} {problem.shape_string()}", measured_count(known))
        idle = 0
        try:
            while True:
                if timeout_s is not None and time.perf_counter() - start > timeout_s:
                    outcome.stopped_because = f"timeout of {timeout_s:.0f} s"
                    break
                if getattr(study.sampler, "exhausted", False):
                    outcome.stopped_because = "the search space is exhausted"
                    break
                if outcome.infeasible > max(1000, 50 * trials):
                    outcome.stopped_because = f"the sampler proposed {outcome.infeasible} infeasible configs"
                    break
                if outcome.replay_misses > max(MAX_REPLAY_MISSES, trials):
                    outcome.stopped_because = (f"{outcome.replay_misses} configs proposed that the replay file "
                                               f"does not hold (it was recorded over a smaller space)")
                    break
                p = self._propose(study, space, trials, owner, outcome, rng)
                known = p.known
                if p.study_measured >= trials:
                    outcome.stopped_because = f"{trials} measured trials (in the whole study)"
                    break
                if p.study_measured + p.others_in_flight >= trials:
                    # The rest of the budget is in flight elsewhere: wait for it, so that this tuner
                    # confirms the study-wide best (and takes over what a failed measurement frees).
                    time.sleep(WAIT_FOR_OTHERS_S)
                    continue
                if not p.batch:
                    idle += 1
                    if idle * max(1, s.batch) >= MAX_IDLE_PROPOSALS:
                        outcome.stopped_because = "the search space is exhausted"
                        break
                    continue
                idle = 0
                self._measure(study, op, problem, p.batch, known, outcome, bar)
                best = _best(known.values())
                if bar and best:
                    bar.set_postfix_str(f"best {best.time_us:.1f} us")
        except KeyboardInterrupt:
            outcome.stopped_because = "interrupted (the study keeps every finished trial; re-run to resume)"
            raise
        finally:
            if bar:
                bar.close()
            outcome.seconds = time.perf_counter() - start
        # Everything the study holds now, other tuners' results included: the winner is the study's.
        for key, result in known_results(study, space).items():
            known.setdefault(key, result)
        return known

    def _measure(self, study, op, problem, batch, known, outcome, bar) -> None:
        for (trial, config), result in zip(batch, self.source.measure(op, problem, [c for _, c in batch])):
            known[config.key()] = result
            try:
                tell(study, trial, result)
            except RuntimeError as exc:   # another tuner judged this one gone and failed the trial
                self.log(f"trial {trial.number} was finished by another tuner ({exc}); its result is dropped")
                continue
            if result.measured:
                outcome.measured += 1
            if result.replay_miss:
                outcome.replay_misses += 1
            elif not result.ok:
                outcome.failures[result.failure.value if result.failure else "unknown"] += 1
            if bar:
                bar.update(1 if result.measured else 0)

    def _propose(self, study, space, trials, owner: Owner, outcome, rng) -> Proposal:
        """Under the study's lock: recover abandoned trials, read the study, and take up to what the
        budget leaves of configs no tuner has measured or is measuring."""
        s = self.settings
        with study_lock(self.spec, study.study_name):
            # In-flight first: a trial that finishes between the two reads then shows up in the
            # second one too (counted twice, so the budget is never overrun) instead of in neither.
            flight = in_flight(study, space, owner)
            p = Proposal(known=known_results(study, space), others_in_flight=flight.others)
            p.recovered = self._requeue(study, space, flight.abandoned, p.known, flight.keys)
            outcome.recovered += p.recovered
            p.study_measured = measured_count(p.known)
            room = trials - p.study_measured - p.others_in_flight
            if room <= 0:
                return p
            want = min(s.batch, room)
            if s.sampler == "random":
                # Random search over the feasible configs: draws from the space's walk, enqueued.
                taken = [r.config for r in p.known.values()]
                self._enqueue(study, space, [c for c in space.sample(rng, want, exclude=taken)
                                             if c.key() not in flight.keys])
            keys: set[str] = set()
            reused = 0
            streak = 0   # asks in a row that brought nothing to measure
            while len(p.batch) < want and p.asked < MAX_IDLE_PROPOSALS:
                if streak >= FALLBACK_AFTER or reused >= want:
                    # The sampler is stuck (on infeasible or known configs): random unmeasured ones.
                    if not self._queue_unmeasured(study, space, rng, want - len(p.batch),
                                                  set(p.known) | flight.keys | keys):
                        break   # nothing new found: the idle count in _search judges exhaustion
                    streak = reused = 0
                p.asked += 1
                streak += 1
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
                if key in p.known:
                    # The sampler asked for a config measured before: its earlier result answers.
                    tell(study, trial, p.known[key], reused=True)
                    outcome.reused += 1
                    reused += 1
                    continue
                if key in keys or key in flight.keys:
                    # Being measured right now (in this batch, or by another tuner).
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    continue
                trial.set_user_attr(OWNER_ATTR, owner.to_attr())
                keys.add(key)
                p.batch.append((trial, config))
                streak = 0
        return p

    def _queue_unmeasured(self, study, space, rng, count: int, taken: set[str]) -> int:
        """Queue up to ``count`` random feasible configs outside ``taken`` (measured, in flight or in
        this batch) and the queue; how many unmeasured configs wait in the queue now (0: the random
        walks found nothing new and none was queued before)."""
        queued = queued_keys(study, space)
        fresh = space.sample(rng, count, exclude_keys=taken | queued)
        self._enqueue(study, space, fresh)
        if fresh:
            self.log(f"{study.study_name}: the sampler proposed nothing new in {FALLBACK_AFTER} asks; "
                     f"{len(fresh)} random unmeasured configs queued")
        return len(fresh) + len(queued - taken)

    def _requeue(self, study, space, abandoned: Sequence[Config], known, flying: set[str]) -> int:
        """Queue again the configs of abandoned trials that no one has measured or is measuring."""
        queued = queued_keys(study, space) if abandoned else set()
        again = []
        for config in abandoned:
            if config.key() not in known and config.key() not in flying and config.key() not in queued:
                again.append(config)
                queued.add(config.key())
        for config in again:
            study.enqueue_trial(enqueue_params(space, config))
        if again:
            self.log(f"{study.study_name}: {len(again)} trials of ended tuners queued again")
        return len(again)

    def _enqueue(self, study, space, configs: Sequence[Config]) -> None:
        for config in configs:
            try:
                space.validate(config.as_dict())
            except (InvalidConfigError, InfeasibleConfigError):
                continue
            study.enqueue_trial(enqueue_params(space, config), skip_if_exists=True)

    def _default(self, operation: Any, problem: Any) -> Config:
        """The default a lookup answers with where no record serves (the database's heuristic
        default: the first candidate whose ptxas report shows it runs here without spills), which
        the search starts from and the confirmation times beside the winner; without a database,
        the first candidate."""
        if self.db is not None and hasattr(self.db, "heuristic_default"):
            return self.db.heuristic_default(self.source.device, problem).config
        return operation.default_config(problem, self.source.device.limits())

    def _incumbent(self, problem: Any) -> Config | None:
        """The config a lookup answers for ``problem`` now from another GPU's record of this
        architecture (same_arch), or from this GPU's quick record, which the confirmation times beside
        the winner: a tune never leaves a record slower than what ran before it (an H200 run held to
        wgmma stored 590 us for a 7x7 forward whose lookup had answered with an H100's fft record,
        457 us on the H200; an H100 run held to wgmma stored 392 us for a ResNet-18 weight gradient
        over a quick record of 250 us, since a full record always replaces a quick one). This GPU's
        own full record needs no such care (the database keeps the faster of two)."""
        if self.db is None or not hasattr(self.db, "tuned"):
            return None
        found = self.db.tuned(self.source.device, problem)
        if found is None:
            return None
        quick = found.record is not None and found.record.quick
        return found.config if found.source == "same_arch" or quick else None

    def _stored(self, problem: Any) -> Any:
        """This GPU's own full record of the problem (user or shipped), whose config the confirmation
        measures again beside the winner: a stored time is evidence to be checked, not truth, so a
        record whose time was never real (imported, or of other code) cannot keep a real winner out."""
        if self.db is None or not hasattr(self.db, "tuned"):
            return None
        found = self.db.tuned(self.source.device, problem)
        if found is None or found.source != "exact" or found.record is None or found.record.quick:
            return None
        return found

    def _current_winner(self, problem: Any, space: SearchSpace) -> list[Config]:
        # The config this shape's current record runs (this GPU's, or another of its architecture),
        # where the space searched holds it: the start that --vary varies after a new parameter's
        # first choice kept the record's code (the record stays current; only stale winners came
        # before, so `--vary FFT_VEC` right after FFT_VEC was added measured no variant of the record).
        if self.db is None or not hasattr(self.db, "tuned"):
            return []
        found = self.db.tuned(self.source.device, problem)
        if found is None:
            return []
        try:
            return [space.validate(found.config.as_dict())]
        except (InvalidConfigError, InfeasibleConfigError):
            return []   # another formulation's, or outside what --fix holds

    def _stale_winners(self, problem: Any, space: SearchSpace) -> list[Config]:
        # The winners of this very shape under older templates: often unchanged code, so a retune
        # after a template change starts from the old best instead of below it.
        if self.db is None or not hasattr(self.db, "stale_configs"):
            return []
        return self.db.stale_configs(self.source.device, problem, space)

    def _predicted_firsts(self, problem: Any, space: SearchSpace) -> list[Config]:
        # No record of this shape says where to start; the cost model's favourites of a sample of
        # the space (the formulation drawn first, so every one is in it) are better guesses than
        # the sampler's first random draws.
        if not model_in_use():
            return []
        pool = space.sample(random.Random(self.settings.seed), PREDICTED_SAMPLE)
        ranked = predicted_order(problem, self.source.device, pool)
        return [] if ranked is None else ranked[:PREDICTED_FIRST_TRIALS]

    def _neighbour_winners(self, op: str, problem: Any, space: SearchSpace, limit: int = 3) -> list[Config]:
        if self.db is None or not hasattr(self.db, "neighbour_configs"):
            return []
        return self.db.neighbour_configs(self.source.device, problem, space, limit)


# At most this many variants of earlier winners (TuneSettings.vary) go into one warm start.
MAX_VARIANTS = 16
# A variant's repair never moves its formulation: that would be another kernel, not a neighbour.
REPAIR_HELD = ("formulation",)


def _variants(space: SearchSpace, configs: Sequence[Config], names: Sequence[str]) -> list[Config]:
    """Each config with one of ``names`` set to each other choice it may take (names that are not
    parameters of this space, as a tf32 parameter in an fp32 problem, pass). Parameters a choice
    turns off go, and ones it turns on take their first choice (SearchSpace.with_choice): fft's
    record with MAC "cublas" has no IT or FB. Where the rules refuse a choice as it stands, up to two
    of the parameters named by the broken rules move to their nearest feasible values
    (SearchSpace.nearest_with_choice): on the shipped H200 records 27% of all one-parameter changes
    broke a rule (a wgmma tile's columns against its registers, a stage count against shared
    memory), and those choices were never measured. A choice that no such repair saves is left out."""
    params = {p.name: p for p in space.params}
    out: list[Config] = []
    seen = {c.key() for c in configs}
    for config in configs:
        for name in names:
            if name not in params or name not in config:
                continue
            for value in params[name].choices:
                if value == config[name]:
                    continue
                if len(out) >= MAX_VARIANTS:
                    return out   # full: no more repairs to search for
                try:
                    variant = space.nearest_with_choice(config, name, value, held=REPAIR_HELD)
                except (InvalidConfigError, InfeasibleConfigError):
                    continue
                if variant.key() not in seen:
                    seen.add(variant.key())
                    out.append(variant)
    return out


def problems_offering(fixed: Mapping[str, Any], problems: Sequence[Any]) -> list[Any]:
    """The problems of a run that some config may serve: those whose ops offer the held parameters
    (--fix; formulation=wgmma over a network that also has weight gradients: those have no wgmma),
    and of those, the ones whose held formulation (or, none held, some formulation of their op)
    can serve them at all (Operation.refusals: tc cannot compute a bf16 problem); the others are
    left out. Held values that no problem offers are a mistake (a misspelt name or value), refused
    before anything runs, with what the first problem's op allows; a run whose every problem is
    left out for such a refusal is refused likewise, with the first refusal's reason."""
    limits = DeviceLimits.for_arch("sm_90")   # parameters, choices and refusals do not depend on the GPU
    offering, first, refused = [], None, None
    for problem in problems:
        operation = get_operation(problem.op)
        refusals = operation.refusals(problem, limits)
        held = fixed.get("formulation")
        why = refusals.get(held) if isinstance(held, str) else None
        if why is None and refusals and set(operation.formulation_names) <= set(refusals):
            why = "; ".join(dict.fromkeys(refusals.values()))
        if why is not None:
            refused = refused or InfeasibleConfigError(problem.op, [f"{problem.shape_string()}: {why}"])
            continue
        try:
            if fixed:
                operation.space(problem, limits).restrict(fixed)
            offering.append(problem)
        except InvalidConfigError as exc:
            first = first or exc
    if not offering and refused is not None:
        raise refused
    if not offering and first is not None:
        raise InvalidConfigError(first.op, first.param, first.value,
                                 f"{first.allowed} (no problem of this run offers {fixed_text(fixed)})")
    return offering


def fixed_text(fixed) -> str:
    """Held parameters as name=value pairs in name order (as in a study's name, and in messages)."""
    return ",".join(f"{k}={fixed[k]}" for k in sorted(fixed))


def _why_empty(space: SearchSpace, fixed) -> str:
    """A rule that the held parameters break (the first one met with every other parameter at its
    first choice)."""
    try:
        space.complete(dict(fixed))
    except (InvalidConfigError, InfeasibleConfigError) as exc:
        return str(exc)
    return "random walks over the space found no config that meets its rules"


def _best(results: Iterable[TrialResult]) -> TrialResult | None:
    ok = [r for r in results if r.ok and r.time_us is not None]
    return min(ok, key=lambda r: r.time_us) if ok else None


def _progress_bar(enabled: bool, total: int, desc: str, initial: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=min(initial, total), desc=desc, unit="trial", leave=True, dynamic_ncols=True)

