"""Quick tuning of shapes no record covers (autocnn.dispatch.quick): which candidates are measured,
the time budget, the choice of the fastest verified one, the quick record and the rule by which it
and a full tuning replace each other, the autotune modes and where they are set. CPU tests run on
recorded GPU measurements (tests/data/replay) or a scripted source; the GPU test at the end quick-
tunes one unseen shape end to end.
"""
from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from autocnn.device import DeviceInfo
from autocnn.errors import FailureClass, InfeasibleConfigError
from autocnn.kernels import ConvFwdProblem, get_operation
from autocnn.kernels.space import Config
from autocnn.store import RecordKey, TuningDatabase, TuningRecord, approve_all, now_utc
from autocnn.store.transfer import replaces
from autocnn.dispatch.quick import (AUTOTUNE_ENV, MODEL_BUDGET_ENV, MODEL_QUICK_BUDGET_S, Autotuner, QuickCandidate,
                                  TuningBudget, autotune_mode, check_autotune, model_budget, quick_candidates,
                                  quick_tune)
from autocnn.measurement.sources import ReplayFile, ReplaySource, TrialResult
from autocnn.search.tuner import TuneSettings, Tuner

REPLAY = Path(__file__).parent / "data" / "replay"
WGRAD = ReplayFile.load(REPLAY / "conv_wgrad__convnet18_c1.json.gz")   # 128x3x32x32, 32 filters of 5x5
DEVICE = WGRAD.device
PROBLEM = WGRAD.problem
OP = get_operation(PROBLEM.op)


@pytest.fixture
def db(tmp_path, monkeypatch) -> TuningDatabase:
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "db"))
    # No ptxas here: every borrowed config counts as runnable (the GPU source checks spills itself).
    return TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "shipped", resource_check=approve_all)


class ScriptedSource:
    """A MeasurementSource answering from a table (config key -> time in us, or a FailureClass);
    each measurement advances a fake clock by ``seconds_each``."""

    def __init__(self, times: dict[str, float | FailureClass], default_us: float = 500.0, seconds_each: float = 0.1):
        self.device = DEVICE
        self.times, self.default_us, self.seconds_each = times, default_us, seconds_each
        self.now = 0.0
        self.measured: list[str] = []
        self.closed = False

    def clock(self) -> float:
        return self.now

    def measure(self, op, problem, configs):
        for config in configs:
            self.now += self.seconds_each
            self.measured.append(config.key())
            answer = self.times.get(config.key(), self.default_us)
            if isinstance(answer, FailureClass):
                yield TrialResult(config, False, failure=answer, message="scripted failure")
            else:
                yield TrialResult(config, True, answer, timing={"median_us": answer, "spread": 0.01})

    def close(self) -> None:
        self.closed = True


def record(problem, config: Config | dict, time_us: float, device: DeviceInfo = DEVICE, **changes) -> TuningRecord:
    config = config.as_dict() if isinstance(config, Config) else config
    op = get_operation(problem.op)
    r = TuningRecord(key=RecordKey.for_(device, problem, op.config_fingerprint(config)), config=config,
                     time_us=time_us, spread=0.01, default_time_us=None, cudnn_time_us=None, trials=30,
                     tuned_at=now_utc(), autocnn_version="0.1.0", sampler="tpe")
    return dataclasses.replace(r, **changes) if changes else r


def space_configs(problem, formulation: str, count: int, seed: int = 0) -> list[Config]:
    space = OP.space(problem, DEVICE.limits()).restrict({"formulation": formulation})
    return space.sample(random.Random(seed), count)


def neighbours(db: TuningDatabase) -> dict[str, Config]:
    """Records of three nearby shapes: the nearest atomic (N=64), a farther atomic (N=32) and the
    nearest rows (H=W=16); their configs, valid for PROBLEM, by name."""
    atomic_near, atomic_far = space_configs(PROBLEM, "atomic", 2, seed=1)
    rows = space_configs(PROBLEM, "rows", 1, seed=2)[0]
    db.put_many([record(dataclasses.replace(PROBLEM, N=64), atomic_near, 30.0),
                 record(dataclasses.replace(PROBLEM, N=32), atomic_far, 20.0),
                 record(dataclasses.replace(PROBLEM, H=16, W=16), rows, 40.0)])
    return {"atomic_near": atomic_near, "atomic_far": atomic_far, "rows": rows}


# -- modes ----------------------------------------------------------------------------------------

def test_autotune_mode_from_argument_environment_and_default(monkeypatch):
    monkeypatch.delenv(AUTOTUNE_ENV, raising=False)
    assert autotune_mode() == "quick"
    monkeypatch.setenv(AUTOTUNE_ENV, "OFF")
    assert autotune_mode() == "off"
    assert autotune_mode("full") == "full"      # the argument wins over the environment
    monkeypatch.setenv(AUTOTUNE_ENV, "fast")
    with pytest.raises(ValueError, match=r"\$AUTOCNN_AUTOTUNE must be one of off, quick, full, not 'fast'"):
        autotune_mode()
    for bad in ("on", "", 1, None):
        with pytest.raises(ValueError, match="autotune must be one of off, quick, full"):
            check_autotune(bad)


# -- candidates -----------------------------------------------------------------------------------

def test_candidates_are_the_lookup_the_nearest_of_each_formulation_and_each_default(db):
    n = neighbours(db)
    found = db.lookup(DEVICE, PROBLEM)
    assert found.source == "nearest_shape" and found.config.key() == n["atomic_near"].key()
    candidates = quick_candidates(PROBLEM, DEVICE, db, found)
    keys = [c.config.key() for c in candidates]
    assert len(keys) == len(set(keys))                               # each config once
    assert candidates[0] == QuickCandidate(found.config, "lookup")
    assert candidates[1] == QuickCandidate(n["rows"], "nearest rows")   # atomic's nearest is the lookup's
    assert n["atomic_far"].key() not in keys                         # only the nearest of a formulation
    limits = DEVICE.limits()
    for name in OP.formulation_names:
        try:
            first = next(iter(OP.default_configs(PROBLEM, limits, name)))
        except InfeasibleConfigError as exc:       # winograd serves 3x3 filters only, depthwise groups == C: no candidate
            assert (name == "winograd" and "3x3 stride-1" in str(exc)) or \
                (name == "depthwise" and "depthwise convolutions only" in str(exc)), name
            continue
        assert first.key() in keys, name
    assert {c.origin for c in candidates[2:]} >= {"default atomic", "default rows", "default unrolled"}


def test_candidates_without_any_record_are_the_defaults(db):
    found = db.lookup(DEVICE, PROBLEM)
    assert found.source == "default"
    candidates = quick_candidates(PROBLEM, DEVICE, db, found)
    assert candidates[0].origin == "lookup"
    assert all(c.origin.startswith("default ") for c in candidates[1:])
    assert len(candidates) >= 3


# -- measuring and choosing -------------------------------------------------------------------------

def test_fastest_verified_candidate_wins_failures_are_skipped_and_a_quick_record_is_stored(db):
    n = neighbours(db)
    found = db.lookup(DEVICE, PROBLEM)
    candidates = quick_candidates(PROBLEM, DEVICE, db, found)
    # The rows neighbour would be fastest but gives a wrong result; an unrolled default is next.
    unrolled = next(c.config for c in candidates if c.origin == "default unrolled")
    source = ScriptedSource({n["rows"].key(): FailureClass.WRONG_RESULT, unrolled.key(): 12.5,
                             found.config.key(): 80.0})
    out = quick_tune(PROBLEM, DEVICE, db, source, budget_s=60, clock=source.clock)
    assert source.measured == [c.config.key() for c in candidates]     # all of them, in order
    assert out.stopped_because == "every candidate measured"
    assert [r.config.key() for r in out.failed] == [n["rows"].key()]
    assert out.best.config.key() == unrolled.key() and out.config.key() == unrolled.key()
    stored = db.record_for(RecordKey.for_(DEVICE, PROBLEM))
    assert stored == out.record and stored.quick and stored.sampler == "quick"
    assert stored.time_us == 12.5 and stored.config == unrolled.as_dict()
    assert stored.trials == len(candidates)
    assert stored.runner_up["time_us"] == 80.0
    # The digest of the code measured: the record stays current while its config plans to it.
    assert stored.plan_digest == OP.plan(PROBLEM, unrolled).code_digest
    assert stored.plan_digest != OP.plan(PROBLEM, found.config).code_digest
    default = OP.default_config(PROBLEM, DEVICE.limits())
    assert stored.default_time_us == source.times.get(default.key(), source.default_us)
    again = db.lookup(DEVICE, PROBLEM)
    assert again.source == "exact" and again.record.quick and again.config.key() == unrolled.key()
    assert "quick-tuned" in out.summary() and "1 failed" in out.summary()


def test_the_time_budget_stops_the_measurements(db):
    neighbours(db)
    found = db.lookup(DEVICE, PROBLEM)
    candidates = quick_candidates(PROBLEM, DEVICE, db, found)
    assert len(candidates) >= 4
    source = ScriptedSource({candidates[2].config.key(): 5.0}, seconds_each=1.0)
    source.now = 100.0
    out = quick_tune(PROBLEM, DEVICE, db, source, budget_s=2.5, clock=source.clock)
    # The budget counts from the first result (what comes before it is compiling): at 1, 2 and 3 s
    # after it the fourth result spends it.
    assert len(source.measured) == 4 and len(out.results) == 4
    assert out.stopped_because == "the 2.5 s budget was spent"
    assert out.best.time_us == 5.0 and out.record.quick
    # However small the budget, the lookup's config and the one after it are measured (the budget
    # starts with the first result).
    tiny = ScriptedSource({candidates[1].config.key(): 600.0}, seconds_each=1.0)
    db.remove(RecordKey.for_(DEVICE, PROBLEM))
    out = quick_tune(PROBLEM, DEVICE, db, tiny, budget_s=0.01, lookup=found, clock=tiny.clock)
    assert tiny.measured == [c.config.key() for c in candidates[:2]]
    assert out.best.config.key() == found.config.key()
    with pytest.raises(ValueError, match="positive number of seconds"):
        quick_tune(PROBLEM, DEVICE, db, tiny, budget_s=0)


def test_no_verified_candidate_stores_nothing_and_keeps_the_lookup(db):
    failing = ScriptedSource({})
    failing.measure = lambda op, problem, configs: (TrialResult(c, False, failure=FailureClass.INFEASIBLE,
                                                                message="spills") for c in configs)
    out = quick_tune(PROBLEM, DEVICE, db, failing, budget_s=60)
    assert out.best is None and out.record is None
    assert out.config.key() == out.lookup.config.key()
    assert db.records() == []
    assert "no candidate verified" in out.summary()


def test_replayed_measurements_only_recorded_candidates_verify(db):
    """On real H200 measurements (the atomic formulation recorded, the others not)."""
    source = ReplaySource([WGRAD])
    out = quick_tune(PROBLEM, DEVICE, db, source, budget_s=60)
    assert source.measured_keys == [c.config.key() for c in out.candidates]
    recorded = [c for c in out.candidates if c.config.key() in WGRAD.results]
    assert recorded and len(out.failed) == len(out.candidates) - len(recorded)
    fastest = min(recorded, key=lambda c: WGRAD.results[c.config.key()].time_us)
    assert out.best.config.key() == fastest.config.key()
    assert out.record.quick and out.record.time_us == WGRAD.results[fastest.config.key()].time_us


# -- quick and full records -------------------------------------------------------------------------

def _full_tune(db, tmp_path, trials: int = 12):
    settings = TuneSettings(storage=f"sqlite:///{tmp_path / 'optuna.db'}", fixed=WGRAD.space_filter,
                            trials=trials, seed=3)
    return Tuner(ReplaySource([WGRAD]), db, settings, progress=False).tune(PROBLEM.op, PROBLEM)


def test_a_full_tuning_replaces_a_quick_record_even_when_slower(db, tmp_path):
    quick = record(PROBLEM, OP.default_config(PROBLEM, DEVICE.limits()), 0.5, quick=True, sampler="quick")
    db.put_many([quick], keep_faster=True)
    assert db.record_for(quick.key).quick
    outcome = _full_tune(db, tmp_path)
    stored = db.record_for(quick.key)
    assert outcome.record is not None and stored == outcome.record
    assert not stored.quick and stored.time_us > 0.5 and stored.sampler == "tpe"


def test_quick_tuning_never_replaces_a_full_record(db, tmp_path):
    outcome = _full_tune(db, tmp_path)
    full = db.record_for(RecordKey.for_(DEVICE, PROBLEM))
    assert full == outcome.record and not full.quick
    source = ScriptedSource({}, default_us=0.01)    # far faster than anything real
    out = quick_tune(PROBLEM, DEVICE, db, source, budget_s=60)
    assert out.best.time_us == 0.01 and out.record is None
    assert db.record_for(full.key) == full


def test_replace_rule():
    cfg = OP.default_config(PROBLEM, DEVICE.limits())
    full_fast, full_slow = record(PROBLEM, cfg, 10.0), record(PROBLEM, cfg, 20.0)
    quick_fast, quick_slow = (record(PROBLEM, cfg, t, quick=True) for t in (5.0, 30.0))
    assert replaces(full_slow, quick_fast)        # full always replaces quick
    assert not replaces(quick_fast, full_slow)    # quick never replaces full
    assert replaces(quick_fast, quick_slow) and not replaces(quick_slow, quick_fast)
    assert replaces(full_fast, full_slow) and not replaces(full_slow, full_fast)
    assert replaces(quick_slow, None) and replaces(full_slow, None)


def test_quick_field_is_written_only_when_true():
    cfg = OP.default_config(PROBLEM, DEVICE.limits())
    full = record(PROBLEM, cfg, 10.0)
    assert "quick" not in full.to_dict()        # records of full tunings keep their bytes
    assert TuningRecord.from_dict(full.to_dict()) == full
    quick = dataclasses.replace(full, quick=True)
    data = json.loads(json.dumps(quick.to_dict()))
    assert data["quick"] is True and TuningRecord.from_dict(data) == quick
    with pytest.raises(ValueError, match="quick: 'yes' is not true or false"):
        TuningRecord.from_dict({**data, "quick": "yes"})


# -- the prepare path: Autotuner ------------------------------------------------------------------

class Factory:
    def __init__(self, source):
        self.source, self.calls = source, 0

    def __call__(self):
        self.calls += 1
        return self.source


def test_off_measures_nothing_and_returns_the_lookup(db):
    neighbours(db)
    factory = Factory(ScriptedSource({}))
    tuner = Autotuner("off", db, DEVICE, factory)
    chosen = tuner.choose(PROBLEM)
    tuner.close()
    assert factory.calls == 0 and chosen.outcome is None
    assert chosen.source == "nearest_shape" and chosen.config.key() == db.lookup(DEVICE, PROBLEM).config.key()
    assert db.record_for(RecordKey.for_(DEVICE, PROBLEM)) is None


def test_quick_tunes_unseen_problems_once_with_one_source(db, monkeypatch):
    monkeypatch.delenv(AUTOTUNE_ENV, raising=False)
    source = ScriptedSource({})
    factory = Factory(source)
    tuner = Autotuner(None, db, DEVICE, factory)      # the default mode: quick
    assert tuner.mode == "quick"
    other = dataclasses.replace(PROBLEM, N=100)
    first, second = tuner.choose(PROBLEM), tuner.choose(other)
    assert first.source == second.source == "quick" and factory.calls == 1
    measured = len(source.measured)
    again = tuner.choose(PROBLEM)                     # now the quick record answers: nothing measured
    tuner.close()
    assert len(source.measured) == measured and source.closed
    assert again.source == "quick" and again.config.key() == first.config.key()
    assert "quick-tuned" in again.detail and again.outcome is None


def test_a_worker_that_cannot_start_leaves_the_lookup_with_a_warning(db):
    from autocnn.errors import DeviceError

    def broken():
        raise DeviceError("the measurement worker cannot use GPU 0: no device")

    tuner = Autotuner("quick", db, DEVICE, broken)
    with pytest.warns(RuntimeWarning, match="the measuring worker did not start .*cannot use GPU 0"):
        chosen = tuner.choose(PROBLEM)
    assert chosen.source == "default" and chosen.outcome is None and tuner.mode == "off"
    assert tuner.choose(dataclasses.replace(PROBLEM, N=100)).source == "default"   # warned once
    tuner.close()


def test_a_shared_budget_holds_each_quick_tuning_to_what_is_left_then_leaves_the_lookup(db):
    source = ScriptedSource({}, seconds_each=1.0)
    budget = TuningBudget(3.5)
    tuner = Autotuner("quick", db, DEVICE, Factory(source), shared=budget, clock=source.clock)
    first, second, third = (tuner.choose(dataclasses.replace(PROBLEM, N=n)) for n in (100, 101, 102))
    # The first: its own 2 s from its first result (3 results); the second: the 0.5 s left (2 results).
    assert first.tuned_now and first.tune_s == 3.0 and len(first.outcome.results) == 3
    assert second.tuned_now and second.tune_s == 2.0 and second.outcome.stopped_because == "the 0.5 s budget was spent"
    assert budget.spent and budget.spent_s == 5.0 and budget.left_s == 0.0
    # The lookup's answer: here a config borrowed from the quick records just made (the nearest shapes).
    assert third.over_budget and not third.tuned_now and third.tune_s == 0.0 and third.source == "nearest_shape"
    assert third.detail.endswith("untuned: the 3.5 s tuning budget was spent")
    assert len(source.measured) == 5 and len(db.records()) == 2
    # A problem with a record of its own is answered however spent the budget is.
    again = tuner.choose(dataclasses.replace(PROBLEM, N=100))
    tuner.close()
    assert again.source == "quick" and not again.over_budget and again.time_us == first.time_us
    with pytest.raises(ValueError, match="the model's tuning budget must be a positive number of seconds, not -1"):
        TuningBudget(-1)


def test_model_budget_from_argument_environment_and_default(monkeypatch):
    monkeypatch.delenv(MODEL_BUDGET_ENV, raising=False)
    assert model_budget() == MODEL_QUICK_BUDGET_S
    monkeypatch.setenv(MODEL_BUDGET_ENV, " 45 ")
    assert model_budget() == 45.0 and model_budget(10) == 10.0
    for bad, shown in (("0", "0.0"), ("-2", "-2.0"), ("inf", "inf"), ("a while", "'a while'")):
        monkeypatch.setenv(MODEL_BUDGET_ENV, bad)
        with pytest.raises(ValueError, match=rf"\$AUTOCNN_QUICK_BUDGET \(the model's tuning budget\) must be a "
                                             rf"positive number of seconds, not {shown}"):
            model_budget()
    for bad in (-1, 0, float("nan"), True, "60"):
        with pytest.raises(ValueError, match=r"budget \(budget_s\) must be a positive number of seconds"):
            model_budget(bad)


def test_quick_leaves_a_tuned_problem_alone(db, tmp_path):
    _full_tune(db, tmp_path)
    factory = Factory(ScriptedSource({}))
    tuner = Autotuner("quick", db, DEVICE, factory)
    chosen = tuner.choose(PROBLEM)
    assert chosen.source == "exact" and factory.calls == 0


def test_full_runs_the_tuner_on_unseen_problems(db, tmp_path):
    settings = TuneSettings(storage=f"sqlite:///{tmp_path / 'optuna.db'}", fixed=WGRAD.space_filter, trials=8)
    tuner = Autotuner("full", db, DEVICE, Factory(ReplaySource([WGRAD])), full_settings=settings)
    chosen = tuner.choose(PROBLEM)
    tuner.close()
    assert chosen.source == "full" and chosen.outcome.record is not None
    stored = db.record_for(RecordKey.for_(DEVICE, PROBLEM))
    assert not stored.quick and stored.config == chosen.config.as_dict()


# -- where the option is set -------------------------------------------------------------------------

def test_model_train_and_cli_check_the_option(monkeypatch):
    from autocnn import nn
    from autocnn.cli import build_parser
    from autocnn.nn.training import train

    layers = [nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Dense(2 * 6 * 6, 3)]
    with pytest.raises(ValueError, match="autotune must be one of off, quick, full, not 'fast'"):
        nn.Sequential(layers, (1, 8, 8), autotune="fast")
    model = nn.Sequential([nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Dense(2 * 6 * 6, 3)], (1, 8, 8))
    assert model.autotune is None                   # the numpy backend tunes nothing
    model.autotune = "FULL"
    assert model.autotune == "full"
    with pytest.raises(ValueError, match="autotune must be one of"):
        model.autotune = "sometimes"
    with pytest.raises(ValueError, match="autotune must be one of"):
        train("lenet5", dataset="no-such-data", autotune="always")   # refused before the data set
    parser = build_parser()
    assert parser.parse_args(["train", "--network", "lenet5", "--autotune", "off"]).autotune == "off"
    assert parser.parse_args(["train", "--network", "lenet5"]).autotune is None
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--network", "lenet5", "--autotune", "sometimes"])


# -- the benchmark's random shapes ------------------------------------------------------------------

def test_random_shapes_are_seeded_valid_and_unseen():
    from autocnn.benchmark.random_shapes import CONV_OPS, MAX_ELEMENTS, draw_conv, unseen_problems

    first = [draw_conv(random.Random(7), "conv_wgrad") for _ in range(2)]
    assert first[0] == first[1]                            # the seed decides
    rng = random.Random(11)
    drawn = [draw_conv(rng, op) for op in CONV_OPS * 20]
    assert len({json.dumps(p.to_dict(), sort_keys=True) for p in drawn}) > 50
    for p in drawn:
        assert max(p.N * p.C * p.H * p.W, p.N * p.K * p.P * p.Q) <= MAX_ELEMENTS
    assert {p.stride for p in drawn} == {(1, 1), (2, 2)} and any(p.R != p.S for p in drawn)
    with pytest.raises(ValueError, match="op must be one of conv_fwd, conv_bwd_data, conv_wgrad"):
        draw_conv(rng, "avgpool_fwd")

    class Covered:
        """A database whose records cover every problem with an even batch."""

        def lookup(self, device, problem):
            return SimpleNamespace(source="exact" if problem.N % 2 == 0 else "default")

    got = list(unseen_problems(Covered(), DEVICE, ("conv_fwd", "conv_wgrad"), 6, random.Random(3)))
    assert len(got) == 6 and all(p.N % 2 == 1 and looked.source == "default" for p, looked in got)
    assert [p.op for p, _ in got] == ["conv_fwd", "conv_wgrad"] * 3


# -- on the GPU -------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_quick_tuning_of_an_unseen_shape_on_the_gpu(tmp_path):
    """13x7x31x29 input, 19 filters of 5x3 (no record covers it): the cuda backend's prepare quick-
    tunes it, stores a verified quick record, and the chosen kernel computes the convolution."""
    from autocnn.nn.cuda_backend import CudaBackend
    from autocnn.nn.numpy_backend import NumpyBackend

    db = TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "shipped")
    problem = ConvFwdProblem(N=13, C=7, H=31, W=29, K=19, R=5, S=3)
    backend = CudaBackend(database=db, autotune="quick")
    assert db.lookup(backend.device, problem).source == "default"
    backend.quick_budget_s = 60.0   # a cold nvcc pool: let every candidate be measured once
    dispatch = backend.prepare([problem])[0]
    assert dispatch.source == "quick-tuned", dispatch.detail
    stored = db.record_for(RecordKey.for_(backend.device, problem))
    assert stored is not None and stored.quick and stored.sampler == "quick" and stored.trials >= 1
    assert db.lookup(backend.device, problem).source == "exact"
    assert dispatch.detail.startswith(str(Config(problem.op, tuple(stored.config.items()))) + " (quick-tuned")

    rng = np.random.default_rng()
    x = rng.standard_normal(problem.x_shape).astype(np.float32)
    w = rng.standard_normal(problem.w_shape).astype(np.float32)
    expected = NumpyBackend(dtype=np.float64).conv_fwd(problem, x.astype(np.float64), w.astype(np.float64), None,
                                                       np.zeros(problem.y_shape))
    out = backend.zeros(problem.y_shape)
    backend.conv_fwd(problem, backend.cp.asarray(x), backend.cp.asarray(w), None, out)
    got = backend.to_numpy(out)
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) <= 1e-5

    # A second backend finds the quick record and measures nothing.
    again = CudaBackend(database=db, autotune="quick").prepare([problem])[0]
    assert again.source == "quick-tuned" and "quick-tuned" in again.detail


@pytest.mark.gpu
def test_a_model_on_the_cuda_backend_quick_tunes_its_unseen_kernels_unless_off(tmp_path, monkeypatch):
    from autocnn import nn
    from autocnn.nn.cuda_backend import CudaBackend

    db = TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "shipped")

    def model(backend, autotune=None):
        layers = [nn.Conv2d(3, 5, 3, padding=1), nn.Activation("relu"), nn.AvgPool2d(2), nn.Flatten(), nn.Dense(5 * 5 * 6, 4)]
        return nn.Sequential(layers, (3, 11, 13), backend=backend, seed=5, autotune=autotune)

    off = model(CudaBackend(database=db), autotune="off").build(3)
    assert off.autotune == "off" and db.records() == []
    assert all(d.source != "quick-tuned" for d in off.dispatch)

    monkeypatch.delenv("AUTOCNN_AUTOTUNE", raising=False)   # conftest turns it off for GPU tests
    quick = model(CudaBackend(database=db)).build(3)   # the default: quick
    assert quick.autotune == "quick"
    assert quick.dispatch and all(d.source == "quick-tuned" for d in quick.dispatch), quick.dispatch_report()
    stored = db.records()
    assert len(stored) == len(quick.dispatch) and all(r.quick for r in stored)

    x = np.random.default_rng(0).standard_normal((3, 3, 11, 13)).astype(np.float32)
    reference = model("numpy").build(3).predict(x, batch_size=3)
    got = quick.predict(x, batch_size=3)
    assert np.linalg.norm(got - reference) / np.linalg.norm(reference) <= 1e-4
