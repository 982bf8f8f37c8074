"""Proposing configs: Optuna's samplers as autocnn uses them, and the mapping between a config and
a trial's parameters (numbers as ordinal indices into their choices, so model-based samplers see
an order)."""
from __future__ import annotations

import warnings
from typing import Any

import optuna

from autocnn.errors import InfeasibleConfigError, InvalidConfigError
from autocnn.kernels.space import Config, SearchSpace

SAMPLERS = ("tpe", "random", "grid", "cmaes", "gp")


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
