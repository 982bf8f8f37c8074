"""A study's trials as the tuner reads and writes them.

A trial carries its config (CONFIG_ATTR), its measurement (RESULT_ATTR: timing, registers,
failure class and message), its owner while it runs (leases.OWNER_ATTR) and, when its owner ended
before telling it, ABANDONED_ATTR. What the study holds is read here: results by config, configs in
flight, configs queued; abandoned trials are failed here and their configs handed back to be queued
again, so each is measured once more.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import optuna

from autocnn.errors import FailureClass, InvalidConfigError
from autocnn.kernels.space import Config, SearchSpace
from autocnn.search.leases import OWNER_ATTR, Liveness, Owner
from autocnn.measurement.sources import TrialResult

CONFIG_ATTR = "config"
RESULT_ATTR = "result"          # timing, registers, failure class and message of a told trial
ABANDONED_ATTR = "abandoned"    # why a trial's owner never told it (the config was queued again)

TrialState = optuna.trial.TrialState


def canonical(space: SearchSpace, values: dict[str, Any]) -> Config | None:
    """A config through the space (canonical order, nothing foreign), or None."""
    try:
        return space.validate(values, check_feasible=False)
    except InvalidConfigError:
        return None


def known_results(study: optuna.Study, space: SearchSpace) -> dict[str, TrialResult]:
    """Finished trials of the study (earlier runs, other processes), by config key. A reused answer
    and an abandoned trial are not results."""
    known: dict[str, TrialResult] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        cfg = t.user_attrs.get(CONFIG_ATTR)
        result = t.user_attrs.get(RESULT_ATTR, {})
        if cfg is None or result.get("reused"):
            continue
        config = canonical(space, cfg)
        if config is None:
            continue
        if t.state == TrialState.COMPLETE:
            known[config.key()] = TrialResult(config, True, t.value, timing=result.get("timing"))
        elif result.get("replay_miss"):
            # Asked and not in the replay file: not asked again in this (replayed) study, and no
            # failure of the config.
            known.setdefault(config.key(), TrialResult(config, False, message=result.get("message", ""),
                                                       replay_miss=True))
        elif result.get("failure"):
            known.setdefault(config.key(), TrialResult(config, False, failure=FailureClass(result["failure"]),
                                                       message=result.get("message", "")))
    return known


def measured_count(known: dict[str, TrialResult]) -> int:
    return sum(1 for r in known.values() if r.measured)


def config_of(trial: optuna.trial.FrozenTrial, space: SearchSpace) -> Config | None:
    """The config a trial holds: its config attribute, or the fixed parameters of a queued trial."""
    cfg = trial.user_attrs.get(CONFIG_ATTR)
    if cfg is not None:
        return canonical(space, cfg)
    fixed = trial.system_attrs.get("fixed_params") or {}
    if not fixed:
        return None
    values: dict[str, Any] = {}
    for p in space.params:
        if p.name in fixed:
            v = fixed[p.name]
            ints = all(isinstance(c, int) and not isinstance(c, bool) for c in p.choices)
            try:
                values[p.name] = sorted(p.choices)[int(v)] if ints and len(p.choices) > 1 else v
            except (IndexError, ValueError, TypeError):
                return None
        elif len(p.choices) == 1 and p.is_active(values):
            values[p.name] = p.choices[0]
    return canonical(space, values)


def queued_keys(study: optuna.Study, space: SearchSpace) -> set[str]:
    out = set()
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        config = config_of(t, space)
        if config is not None:
            out.add(config.key())
    return out


@dataclass
class InFlight:
    """Configs being measured now, and what was recovered from tuners that ended."""

    keys: set[str] = field(default_factory=set)           # every live RUNNING trial's config
    others: int = 0                                        # live RUNNING trials of other tuners
    abandoned: list[Config] = field(default_factory=list)  # configs of trials just failed as abandoned


def in_flight(study: optuna.Study, space: SearchSpace, me: Owner) -> InFlight:
    """The RUNNING trials: those of live tuners are in flight; those of tuners that ended are
    failed (ABANDONED_ATTR says why) and their configs returned, to be queued again. Call it under
    the study lock, so one tuner alone recovers each abandoned trial."""
    out = InFlight()
    liveness = Liveness.of(study.user_attrs)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = Owner.from_attr(t.user_attrs.get(OWNER_ATTR))
        config = config_of(t, space)
        why = liveness.gone(owner, t.datetime_start)
        if why is None:
            if config is not None:
                out.keys.add(config.key())
            if owner is None or owner.tuner != me.tuner:
                out.others += 1
            continue
        try:
            study._storage.set_trial_user_attr(t._trial_id, ABANDONED_ATTR, why[:300])
            study.tell(t.number, state=TrialState.FAIL)
        except (RuntimeError, ValueError):
            continue   # it finished after all (its owner told it between our reads)
        if config is not None:
            out.abandoned.append(config)
    return out


def tell(study: optuna.Study, trial: optuna.Trial, result: TrialResult, reused: bool = False) -> None:
    """Record a measurement (or a reused earlier one) and finish the trial. One attribute holds
    everything about the measurement: each attribute write is a storage commit."""
    outcome: dict[str, Any] = {}
    if result.timing:
        outcome["timing"] = result.timing
    if result.resources:
        outcome["registers"] = {k: v.get("registers") for k, v in result.resources.items()}
    if reused:
        outcome["reused"] = True
    if result.replay_miss:
        outcome["replay_miss"] = True
        outcome["message"] = result.message[:500]
    elif not result.ok:
        outcome["failure"] = result.failure.value if result.failure else "unknown"
        outcome["message"] = result.message[:500]
    trial.set_user_attr(RESULT_ATTR, outcome)
    if result.ok and result.time_us is not None:
        study.tell(trial, result.time_us)
    else:
        study.tell(trial, state=TrialState.FAIL)
