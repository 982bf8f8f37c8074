"""The measurements a cost model learns from, and the fit.

Measurements come from tuning records (each record's config and its runner-up, on the GPU kind of
its key), from replay files (every verified config of a recorded problem) and from Optuna studies
(every completed trial of a study the tuner made). Only verified times count: a failed config has
no time, and a record skipped on load (stale, malformed) is left out as the lookup leaves it out.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from autocnn.cost_model.features import FeatureSchema, Measurement, target
from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError, InvalidConfigError
from autocnn.kernels import get_operation, problem_from_dict
from autocnn.store.files import CorruptFile, ForeignFormat, read_raw
from autocnn.store.records import RecordError, TuningRecord, validate_record
from autocnn.measurement.sources import ReplayFile

# Small trees, slowly: a few thousand measurements of a few hundred problems.
LIGHTGBM_PARAMS: dict[str, Any] = {
    "objective": "regression", "learning_rate": 0.05, "num_leaves": 15, "min_data_in_leaf": 4,
    "min_data_per_group": 4, "cat_smooth": 1.0, "feature_fraction": 0.8, "lambda_l2": 1.0,
    "num_threads": 1, "deterministic": True, "force_row_wise": True, "seed": 0, "verbose": -1,
}
BOOST_ROUNDS = 300


def group_of(slug: str, op: str, problem: Any) -> str:
    """The ranking group: one problem on one GPU kind."""
    return f"{slug}|{op}|{json.dumps(problem.to_dict(), sort_keys=True)}"


def config_identity(config: Any) -> str:
    return json.dumps(dict(config), sort_keys=True)


def record_measurements(records: Iterable[TuningRecord]) -> list[Measurement]:
    """Each valid record's config and runner-up as measurements of its GPU kind."""
    out = []
    for record in records:
        try:
            valid = validate_record(record)
        except RecordError:
            continue
        key = record.key
        group = group_of(key.slug(), key.op, valid.problem)
        out.append(Measurement(valid.problem, valid.config.as_dict(), record.time_us, key.arch, key.sm_count, group))
        runner = record.runner_up or {}
        if isinstance(runner.get("config"), dict) and isinstance(runner.get("time_us"), (int, float)):
            out.append(Measurement(valid.problem, dict(runner["config"]), float(runner["time_us"]), key.arch,
                                   key.sm_count, group))
    return out


@dataclass(frozen=True)
class TunedOverDefault:
    """A record whose config ran clearly faster than its default did (DEFAULT_GAP): which of the
    two a ranking puts first tells whether it would hand out the tuned config or the default."""

    problem: Any
    arch: str
    sm_count: int
    group: str
    tuned: Mapping[str, Any]
    default: Mapping[str, Any]


# A default at least this much slower than the record's config: clearly the worse of the two.
DEFAULT_GAP = 1.1


def tuned_over_default(records: Iterable[TuningRecord]) -> list[TunedOverDefault]:
    """The records whose default time is DEFAULT_GAP over their own, with the operation's first
    default candidate for the problem now. The record does not name the config its default time
    is of; the first candidate is what a lookup answers unless it spills, and the defaults of some
    operations have changed since some records were tuned, so this is a check of the model, never
    a measurement it learns from."""
    out = []
    for record in records:
        if record.default_time_us is None or record.default_time_us < DEFAULT_GAP * record.time_us:
            continue
        try:
            valid = validate_record(record)
            default = get_operation(record.key.op).default_config(valid.problem, DeviceLimits.for_arch(record.key.arch))
        except (RecordError, InvalidConfigError, InfeasibleConfigError, ValueError):
            continue
        if default.key() != valid.config.key():
            out.append(TunedOverDefault(valid.problem, record.key.arch, record.key.sm_count,
                                        group_of(record.key.slug(), record.key.op, valid.problem),
                                        valid.config.as_dict(), default.as_dict()))
    return out


def database_records(paths: Iterable[Path]) -> list[TuningRecord]:
    """The records of database files (tuning_db/*.json) that parse; validity is checked by the users."""
    records = []
    for path in paths:
        try:
            raws = read_raw(Path(path))
        except (CorruptFile, ForeignFormat, OSError):
            continue
        for raw in raws:
            try:
                records.append(TuningRecord.from_dict(raw))
            except RecordError:
                continue
    return records


def database_file_measurements(paths: Iterable[Path]) -> list[Measurement]:
    """``record_measurements`` of the records in database files."""
    return record_measurements(database_records(paths))


def replay_measurements(files: Iterable[ReplayFile]) -> list[Measurement]:
    """Every verified config of each replay file."""
    out = []
    for f in files:
        group = group_of(f.device.slug(), f.op, f.problem)
        for r in f.results.values():
            if r.ok and r.time_us is not None and r.time_us > 0:
                out.append(Measurement(f.problem, r.config.as_dict(), float(r.time_us), f.device.arch,
                                       f.device.sm_count, group))
    return out


def study_measurements(storage: Any) -> list[Measurement]:
    """The verified trials of every study in an Optuna storage that the tuner made (it names the
    study's operation, problem and device in the study's attributes, each trial's config in the
    trial's); a trial that reused an earlier answer is not a measurement of its own."""
    import optuna

    from autocnn.device import DeviceInfo
    from autocnn.search.trials import CONFIG_ATTR, RESULT_ATTR

    out = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        attrs = summary.user_attrs
        if not {"op", "problem", "device"} <= set(attrs):
            continue
        try:
            problem = problem_from_dict(attrs["problem"])
            device = DeviceInfo.from_dict(attrs["device"])
        except (KeyError, TypeError, ValueError):
            continue
        group = group_of(device.slug(), attrs["op"], problem)
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            config = trial.user_attrs.get(CONFIG_ATTR)
            if (not isinstance(config, dict) or trial.user_attrs.get(RESULT_ATTR, {}).get("reused")
                    or trial.value is None or not math.isfinite(trial.value) or trial.value <= 0):
                continue
            out.append(Measurement(problem, dict(config), float(trial.value), device.arch, device.sm_count, group))
    return out


def distinct(measurements: Iterable[Measurement]) -> list[Measurement]:
    """One measurement per (group, config): the first given (records before replays, so that a
    record's confirmed time wins over a replayed one)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for m in measurements:
        key = (m.group, config_identity(m.config))
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


def weights(measurements: Sequence[Measurement]) -> np.ndarray:
    """1 / sqrt(group size): a replay file's hundreds of configs teach how configs of one problem
    differ without drowning the hundreds of problems that records hold two configs of."""
    sizes = Counter(m.group for m in measurements)
    return np.array([1.0 / math.sqrt(sizes[m.group]) for m in measurements])


def fit(measurements: Sequence[Measurement], schema: FeatureSchema | None = None,
        rounds: int = BOOST_ROUNDS) -> tuple[Any, FeatureSchema]:
    """A LightGBM booster over ``schema``'s columns (the measurements' own schema by default)
    that predicts log2(time / roofline)."""
    import lightgbm

    if not measurements:
        raise ValueError("a cost model needs measurements to learn from")
    schema = schema or FeatureSchema.of(measurements)
    data = lightgbm.Dataset(schema.matrix(measurements), label=np.array([target(m) for m in measurements]),
                            weight=weights(measurements), feature_name=[_column(c) for c in schema.columns],
                            categorical_feature=list(schema.categorical), free_raw_data=True,
                            params={"verbose": -1, "min_data_in_bin": 1, "max_bin": 63})
    booster = lightgbm.train(LIGHTGBM_PARAMS, data, num_boost_round=rounds)
    return booster, schema


def _column(name: str) -> str:
    # LightGBM refuses the characters JSON gives a meaning to in feature names (":" among them).
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
