"""The learned cost model (autocnn.cost_model) on the CPU: trained on the replay files, it ranks
held-out problems' configs better than the nearest-shape rule (both measured here); its file
round-trips, and one that is missing, corrupt or of another format is refused with a warning and
the rule used; the lookup, quick tuning and the tuner's first trials follow its order."""
from __future__ import annotations

import dataclasses
import gzip
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from autocnn.cost_model import ranking
from autocnn.cost_model.evaluation import kendall, leave_shapes_out, spearman
from autocnn.cost_model.features import FeatureSchema
from autocnn.cost_model.model_file import (COST_MODEL_ENV, SHIPPED_MODEL, CostModel, CostModelWarning, HeldOut,
                                           ModelMetadata, active_model)
from autocnn.cost_model.training import fit, replay_measurements
from autocnn.kernels import get_operation
from autocnn.kernels.space import Config
from autocnn.store import RecordKey, TuningDatabase, TuningRecord, approve_all, now_utc
from autocnn.dispatch.quick import quick_candidates
from autocnn.measurement.sources import ReplayFile, ReplaySource
from autocnn.search.tuner import PREDICTED_FIRST_TRIALS, PREDICTED_SAMPLE, TuneSettings, Tuner

REPLAY = Path(__file__).parent / "data" / "replay"
FILES = [ReplayFile.load(p) for p in sorted(REPLAY.glob("*.json.gz"))]
WGRAD = next(f for f in FILES if f.path.name == "conv_wgrad__convnet18_c1.json.gz")
DEVICE, PROBLEM = WGRAD.device, WGRAD.problem


@pytest.fixture(scope="module")
def measurements():
    return replay_measurements(FILES)


@pytest.fixture(scope="module")
def model_file(measurements, tmp_path_factory) -> Path:
    """A model of every replay file but WGRAD's, so that WGRAD's shape is one it never saw."""
    training = [m for m in measurements if m.problem != PROBLEM]
    booster, schema = fit(training, rounds=60)
    nothing = HeldOut(0, 0.0, 0.0, 0, 0.0)
    path = tmp_path_factory.mktemp("model") / "model.json.gz"
    CostModel(booster, schema, ModelMetadata("now", len(training), 8, ("replay",), nothing, nothing, 2)).save(path)
    return path


def test_rank_correlations_count_ties_and_order():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([4, 3, 2, 1], [10, 20, 30, 40]) == pytest.approx(-1.0)
    assert kendall([1, 2, 3], [3, 1, 2]) == pytest.approx(-1 / 3)
    assert spearman([1, 1, 1], [1, 2, 3]) == 0.0 == kendall([1, 1], [1, 2])   # a ranking that tells nothing apart
    assert kendall([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / np.sqrt(2 * 3))   # tau-b


def test_the_model_ranks_held_out_problems_better_than_the_nearest_shape_rule(measurements):
    # Each of the nine recorded problems left out in turn: the model trained on the other eight,
    # the rule ranking by the nearest training problem that measured each config.
    evaluation = leave_shapes_out(measurements, folds=len(FILES))
    assert len(evaluation.groups) == len(FILES)
    model, rule = evaluation.model, evaluation.nearest_shape
    print(f"held-out Spearman: model {model.spearman:.3f}, nearest-shape rule {rule.spearman:.3f}; "
          f"Kendall: model {model.kendall:.3f}, rule {rule.kendall:.3f}")
    assert model.spearman > rule.spearman + 0.1
    assert model.kendall > rule.kendall
    assert model.spearman > 0.5
    model_slowdown, rule_slowdown = evaluation.slowdowns()
    assert model_slowdown <= rule_slowdown


def test_the_shipped_model_loads_and_says_how_well_it_ranked(monkeypatch):
    monkeypatch.setenv(COST_MODEL_ENV, str(SHIPPED_MODEL))
    model = active_model()
    assert model is not None and model.metadata is not None
    held = model.metadata
    assert held.model.groups >= len(FILES) and held.model.spearman > held.nearest_shape.spearman
    assert "nearest-shape rule" in held.summary()
    from autocnn.cost_model.model_file import in_use_text   # what `autocnn db model` and `report` say

    assert f"model {held.model.spearman:.3f}, nearest-shape rule {held.nearest_shape.spearman:.3f}" in in_use_text()
    # Its columns are its own: a parameter the model never saw is not a column, and reads as missing.
    row = model.schema.row(PROBLEM, {**WGRAD.best().config.as_dict(), "NEW_PARAM": 3}, DEVICE.arch, DEVICE.sm_count)
    assert len(row) == len(model.schema.columns) == model.booster.num_feature()


def test_a_saved_model_predicts_as_it_did(model_file, measurements):
    model = CostModel.load(model_file)
    configs = [m.config for m in measurements if m.problem == PROBLEM][:20]
    again = CostModel.load(model_file).predict(PROBLEM, configs, DEVICE.arch, DEVICE.sm_count)
    assert np.array_equal(model.predict(PROBLEM, configs, DEVICE.arch, DEVICE.sm_count), again)
    assert len(set(again.round(6))) > 1


def _corrupt(path: Path) -> None:
    path.write_bytes(b"\x1f\x8b\x08not a gzip stream")


def _other_format(path: Path, source: Path) -> None:
    with gzip.open(source, "rt") as fh:
        document = json.load(fh)
    document["format"] = 99
    with gzip.open(path, "wt") as fh:
        json.dump(document, fh)


def _not_a_model(path: Path) -> None:
    with gzip.open(path, "wt") as fh:
        json.dump({"format": 1, "records": []}, fh)


@pytest.mark.parametrize("spoil, why", [(None, "does not exist"), ("corrupt", "cannot be read"),
                                        ("format", "of format 99"), ("foreign", "not an autocnn cost model")])
def test_a_bad_model_file_is_refused_with_one_warning_and_the_rule_answers(spoil, why, tmp_path, monkeypatch,
                                                                           model_file):
    path = tmp_path / "bad.json.gz"
    if spoil == "corrupt":
        _corrupt(path)
    elif spoil == "format":
        _other_format(path, model_file)
    elif spoil == "foreign":
        _not_a_model(path)
    db = _db(tmp_path)
    monkeypatch.setenv(COST_MODEL_ENV, "off")
    rule = db.lookup(DEVICE, PROBLEM)
    monkeypatch.setenv(COST_MODEL_ENV, str(path))
    with pytest.warns(CostModelWarning, match=why):
        assert active_model() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # once per file, not once per lookup
        answer = db.lookup(DEVICE, PROBLEM)
    assert (answer.config, answer.source) == (rule.config, rule.source)
    assert "cost model" not in answer.detail


class ColumnBooster:
    """Trees stand-in whose prediction is one column, negated: the larger the value, the faster."""

    def __init__(self, column: int):
        self.column = column

    def predict(self, rows, num_threads=1):
        return -np.nan_to_num(np.asarray(rows)[:, self.column], nan=-1e9)

    def num_feature(self):
        return None


def _column_model(monkeypatch, measurements, param: str) -> CostModel:
    schema = FeatureSchema.of(measurements)
    model = CostModel(ColumnBooster(list(schema.columns).index(f"param:{param}")), schema)
    monkeypatch.setattr(ranking, "active_model", lambda: model)
    return model


def _record(problem, config: dict, time_us: float) -> TuningRecord:
    op = get_operation(problem.op)
    return TuningRecord(key=RecordKey.for_(DEVICE, problem, op.config_fingerprint(config)), config=config,
                        time_us=time_us, spread=0.01, default_time_us=None, cudnn_time_us=None, trials=30,
                        tuned_at=now_utc(), autocnn_version="0.1.0", sampler="tpe")


def _db(tmp_path) -> TuningDatabase:
    """Two tuned neighbours of WGRAD's shape: the nearer with BM=16, the farther with BM=32."""
    db = TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "shipped", resource_check=approve_all)
    configs = [r.config.as_dict() for r in WGRAD.results.values() if r.ok]
    near = next(c for c in configs if c["BM"] == 16)
    far = next(c for c in configs if c["BM"] == 32)
    db.put_many([_record(dataclasses.replace(PROBLEM, N=64), near, 50.0),
                 _record(dataclasses.replace(PROBLEM, N=32, K=64), far, 40.0)])
    return db


def test_the_lookup_hands_out_the_models_first_choice(tmp_path, monkeypatch, measurements):
    db = _db(tmp_path)
    rule = db.lookup(DEVICE, PROBLEM)
    assert rule.source == "nearest_shape" and rule.config["BM"] == 16   # the nearer shape's
    _column_model(monkeypatch, measurements, "BM")
    answer = db.lookup(DEVICE, PROBLEM)
    assert answer.config["BM"] == max(c.get("BM", 0) for c in _lookup_pool(db))
    assert answer.config["BM"] > rule.config["BM"] and "ranked first by the cost model" in answer.detail


def _lookup_pool(db) -> list[Config]:
    from autocnn.store.lookup import formulation_defaults

    operation = get_operation(PROBLEM.op)
    space = operation.space(PROBLEM, DEVICE.limits())
    return ([c for _, _, c in db._nearest(db._entries_of(PROBLEM.op), PROBLEM, DEVICE.arch, space)]
            + [c for _, c in formulation_defaults(operation, PROBLEM, DEVICE)])


def test_the_lookup_with_the_trained_model_ranks_its_candidates(tmp_path, monkeypatch, model_file):
    db = _db(tmp_path)
    monkeypatch.setenv(COST_MODEL_ENV, str(model_file))
    answer = db.lookup(DEVICE, PROBLEM)
    first = ranking.predicted_order(PROBLEM, DEVICE, _lookup_pool(db))[0]
    assert answer.config.key() == first.key() and "ranked first by the cost model" in answer.detail


def test_quick_tuning_measures_its_candidates_in_the_models_order(tmp_path, monkeypatch, measurements):
    db = _db(tmp_path)
    found = db.lookup(DEVICE, PROBLEM)
    unranked = quick_candidates(PROBLEM, DEVICE, db, found)
    model = _column_model(monkeypatch, measurements, "BM")
    ranked = quick_candidates(PROBLEM, DEVICE, db, found)
    assert ranked[0] == unranked[0]   # the lookup's answer comes first either way
    assert {c.config.key() for c in ranked} == {c.config.key() for c in unranked}
    predicted = model.predict(PROBLEM, [c.config.as_dict() for c in ranked[1:]], DEVICE.arch, DEVICE.sm_count)
    assert list(predicted) == sorted(predicted) and [c.origin for c in ranked] != [c.origin for c in unranked]


def test_the_tuner_measures_the_models_favourites_first(tmp_path, monkeypatch, measurements):
    _column_model(monkeypatch, measurements, "SPLITK")
    source = ReplaySource([WGRAD])
    settings = TuneSettings(storage=f"sqlite:///{tmp_path / 'optuna.db'}", fixed=WGRAD.space_filter, trials=12,
                            seed=3, sampler="random")
    tuner = Tuner(source, None, settings, progress=False)
    space = tuner.space_for(PROBLEM.op, PROBLEM)
    import random

    pool = space.sample(random.Random(3), PREDICTED_SAMPLE)
    favourites = sorted(pool, key=lambda c: -c["SPLITK"])[:PREDICTED_FIRST_TRIALS]
    tuner.tune(PROBLEM.op, PROBLEM)
    first = source.measured_keys[:1 + PREDICTED_FIRST_TRIALS]   # the default, then the model's
    assert [c.key() for c in favourites] == first[1:]


def test_autocnn_db_says_how_well_the_model_ranked(tmp_path, monkeypatch, capsys, model_file):
    import autocnn.store.database
    from autocnn.cli import main

    db = _db(tmp_path)
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(db.user_dir))
    monkeypatch.setattr(autocnn.store.database, "default_shipped_dir", lambda: db.shipped_dir)
    monkeypatch.setenv(COST_MODEL_ENV, str(SHIPPED_MODEL))
    assert main(["db", "model"]) == 0
    last = capsys.readouterr().out.splitlines()[0]
    metadata = CostModel.load(SHIPPED_MODEL).metadata
    assert f"model {metadata.model.spearman:.3f}, nearest-shape rule {metadata.nearest_shape.spearman:.3f}" in last
    monkeypatch.setenv(COST_MODEL_ENV, str(tmp_path / "missing.json.gz"))
    with pytest.warns(CostModelWarning):
        assert main(["db", "model"]) == 1
    assert "cost model: refused" in capsys.readouterr().out
    assert main(["db", "check"]) == 0   # the database's own state is not the model's


def test_a_tuners_studies_are_measurements_to_learn_from(tmp_path):
    from autocnn.cost_model.training import study_measurements

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    settings = TuneSettings(storage=url, fixed=WGRAD.space_filter, trials=6, seed=1, sampler="random")
    Tuner(ReplaySource([WGRAD]), None, settings, progress=False).tune(PROBLEM.op, PROBLEM)
    found = study_measurements(url)
    assert len(found) >= 5 and {m.problem for m in found} == {PROBLEM}
    for m in found:
        assert m.time_us == WGRAD.results[Config(PROBLEM.op, tuple(m.config.items())).key()].time_us


def test_records_whose_default_ran_clearly_slower_check_the_model_against_todays_default():
    from autocnn.cost_model.training import DEFAULT_GAP, tuned_over_default

    tuned = WGRAD.best().config.as_dict()
    slower = dataclasses.replace(_record(PROBLEM, tuned, 40.0), default_time_us=40.0 * DEFAULT_GAP * 2)
    close = dataclasses.replace(_record(PROBLEM, tuned, 40.0), default_time_us=41.0)
    [pair] = tuned_over_default([slower, close, dataclasses.replace(slower, default_time_us=None)])
    assert pair.tuned == tuned
    assert pair.default == get_operation(PROBLEM.op).default_config(PROBLEM, DEVICE.limits()).as_dict()


def test_the_training_script_writes_a_model_with_its_held_out_figures(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_cost_model", Path(__file__).parents[1] / "scripts" /
                                                  "train_cost_model.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    (tmp_path / "db").mkdir()
    out = tmp_path / "model.json.gz"
    assert script.main(["--db", str(tmp_path / "db"), "--replay", *map(str, REPLAY.glob("*.json.gz")),
                        "--folds", str(len(FILES)), "--out", str(out)]) == 0
    metadata = CostModel.load(out).metadata
    assert metadata.folds == len(FILES) and metadata.model.groups == len(FILES)
    assert f"model {metadata.model.spearman:.3f}, nearest-shape rule" in capsys.readouterr().out
    assert metadata.model.spearman > metadata.nearest_shape.spearman
