"""The search, the database and the command line on recorded GPU measurements (replay), on the CPU.

The replay files under tests/data/replay were recorded on an H200 with scripts/record_replay.py:
every config of a (restricted) search space verified and timed.
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest

from autocnn.store import TuningDatabase
from autocnn.errors import FailureClass
from autocnn.measurement.sources import ReplayFile, ReplaySource, TrialResult
from autocnn.search.tuner import TuneSettings, Tuner

REPLAY = Path(__file__).parent / "data" / "replay"
POOL_FILE = REPLAY / "avgpool_bwd__modern_pool.json.gz"
WGRAD_FILE = REPLAY / "conv_wgrad__convnet18_c1.json.gz"


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "db"))
    return TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "shipped")


def storage(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'optuna.db'}"


def tuner_for(files, db, tmp_path, **settings) -> tuple[Tuner, ReplaySource]:
    source = ReplaySource([ReplayFile.load(f) for f in files])
    fixed = ReplayFile.load(files[0]).space_filter
    s = TuneSettings(storage=storage(tmp_path), fixed=fixed, **settings)
    return Tuner(source, db, s, progress=False), source


def test_replay_files_are_real_and_exhaustive():
    files = sorted(REPLAY.glob("*.json.gz"))
    assert len(files) >= 9
    ops = {}
    for f in files:
        rf = ReplayFile.load(f)
        assert rf.exhaustive and rf.device.compute_capability == "9.0"
        ops.setdefault(rf.op, 0)
        ops[rf.op] += 1
        from autocnn.kernels import get_operation

        space = get_operation(rf.op).space(rf.problem, rf.device.limits())
        if rf.space_filter:
            space = space.restrict(rf.space_filter)
        # every config of the (restricted) space was recorded, each with a time or a failure class
        assert {c.key() for c in space.feasible_configs()} <= set(rf.results)
        assert all(r.ok == (r.time_us is not None) for r in rf.results.values())
    assert len(ops) >= 3 and all(n >= 3 for n in ops.values())


def test_search_honours_constraints_and_never_remeasures(db, tmp_path):
    tuner, source = tuner_for([WGRAD_FILE], db, tmp_path, trials=40, batch=8)
    rf = source.files[0]
    outcome = tuner.tune(rf.op, rf.problem)
    space = tuner.space_for(rf.op, rf.problem)
    searched = source.measured_keys[: outcome.measured]
    assert outcome.measured == 40
    assert len(searched) == len(set(searched)), "a config was measured twice during the search"
    for key in searched:
        assert space.is_feasible(rf.results[key].config)
    assert outcome.best is not None and outcome.best.ok
    # the stored winner is a recorded, verified config and its time is the re-timed median
    record = db.lookup(rf.device, rf.problem)
    assert record.source == "exact" and record.config.key() == outcome.best.config.key()
    assert record.record.time_us == pytest.approx(rf.results[outcome.best.config.key()].time_us)
    # the code measured, by its digest (records.validate_record keeps the record current while it holds)
    from autocnn.kernels import get_operation

    assert record.record.plan_digest == get_operation(rf.op).plan(rf.problem, outcome.best.config).code_digest
    assert outcome.record.plan_digest == record.record.plan_digest


def test_budget_in_trials_and_seconds(db, tmp_path):
    tuner, source = tuner_for([POOL_FILE], db, tmp_path, trials=7, batch=4)
    rf = source.files[0]
    outcome = tuner.tune(rf.op, rf.problem)
    assert outcome.measured == 7
    line = outcome.summary()   # what a run whose output is not a terminal writes per problem
    assert "\n" not in line and line.startswith(f"{rf.op} {rf.problem.shape_string()}: ")
    assert f"{outcome.best.time_us:.1f} us" in line and "7 trials measured" in line
    confirm = 3 * 3   # winner, runner-up and default, three rounds
    assert source.calls <= 7 + confirm
    tuner2, _ = tuner_for([WGRAD_FILE], db, tmp_path, trials=10_000, batch=4, timeout_s=0.5)
    rf2 = tuner2.source.files[0]
    outcome2 = tuner2.tune(rf2.op, rf2.problem)
    assert "timeout" in outcome2.stopped_because or "exhausted" in outcome2.stopped_because
    assert outcome2.measured < 10_000


def test_exhausted_space_stops(db, tmp_path):
    tuner, source = tuner_for([POOL_FILE], db, tmp_path, trials=500, batch=16, sampler="grid")
    rf = source.files[0]
    outcome = tuner.tune(rf.op, rf.problem)
    assert outcome.measured == len(rf.results) == 48
    assert outcome.best.time_us == pytest.approx(rf.best().time_us)


def test_failures_are_classified_and_never_stored(db, tmp_path):
    rf = ReplayFile.load(POOL_FILE)
    ranked = sorted((r for r in rf.results.values() if r.ok), key=lambda r: r.time_us)
    planted = {FailureClass.WRONG_RESULT: ranked[0], FailureClass.TIMEOUT: ranked[1],
               FailureClass.DEVICE_ERROR: ranked[2], FailureClass.COMPILE_ERROR: ranked[3]}
    results = dict(rf.results)
    for failure, r in planted.items():
        results[r.config.key()] = TrialResult(r.config, False, failure=failure, message=f"planted {failure.value}")
    broken = dataclasses.replace(rf, results=results)
    path = tmp_path / "broken.json"
    broken.save(path)
    tuner, source = tuner_for([path], db, tmp_path, trials=48, batch=16, sampler="grid")
    outcome = tuner.tune(rf.op, rf.problem)
    assert {FailureClass.WRONG_RESULT.value, FailureClass.TIMEOUT.value, FailureClass.DEVICE_ERROR.value,
            FailureClass.COMPILE_ERROR.value} <= set(outcome.failures)
    line = outcome.summary()   # the one-line report names each class with its count
    failed = sum(outcome.failures.values())
    assert f", {failed} failed (" in line
    for failure in planted:
        assert f"{failure.value} {outcome.failures[failure.value]}" in line
    bad_keys = {r.config.key() for r in planted.values()}
    assert outcome.best.config.key() not in bad_keys
    stored = db.lookup(rf.device, rf.problem)
    assert stored.source == "exact" and stored.config.key() not in bad_keys
    assert stored.record.time_us == pytest.approx(ranked[4].time_us)


class _Interrupt(Exception):
    pass


class InterruptingSource(ReplaySource):
    def __init__(self, files, after):
        super().__init__(files)
        self.after = after

    def measure(self, op, problem, configs):
        for r in super().measure(op, problem, configs):
            if self.calls > self.after:
                raise KeyboardInterrupt
            yield r


def test_interrupted_run_resumes_without_remeasuring(db, tmp_path):
    rf = ReplayFile.load(WGRAD_FILE)
    settings = TuneSettings(trials=20, storage=storage(tmp_path), fixed=rf.space_filter, batch=4)
    first = InterruptingSource([rf], after=9)
    with pytest.raises(KeyboardInterrupt):
        Tuner(first, db, settings, progress=False).tune(rf.op, rf.problem)
    done_before = set(first.measured_keys[:-1])
    second = ReplaySource([rf])
    outcome = Tuner(second, db, settings, progress=False).tune(rf.op, rf.problem)
    searched = second.measured_keys[: outcome.measured]
    assert outcome.measured >= 20 - len(done_before) - 1
    assert not (set(searched) & done_before), "a config measured before the interruption was measured again"
    assert db.lookup(rf.device, rf.problem).source == "exact"


def _share(args):
    path, storage_url, db_dir, log = args
    os.environ["AUTOCNN_TUNING_DB"] = db_dir
    rf = ReplayFile.load(path)

    class Logging(ReplaySource):
        def measure(self, op, problem, configs):
            import time

            for r in super().measure(op, problem, configs):
                time.sleep(0.01)   # the two processes overlap in time
                yield r

    source = Logging([rf])
    settings = TuneSettings(trials=40, storage=storage_url, fixed=rf.space_filter, batch=4, confirm_rounds=1)
    outcome = Tuner(source, TuningDatabase(), settings, progress=False).tune(rf.op, rf.problem)
    Path(log).write_text(json.dumps(source.measured_keys[: outcome.measured]))
    return outcome.measured


def test_two_processes_share_one_study(tmp_path):
    url = storage(tmp_path)
    logs = [tmp_path / "a.json", tmp_path / "b.json"]
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        counts = pool.map(_share, [(str(WGRAD_FILE), url, str(tmp_path / "db"), str(log)) for log in logs])
    a, b = (json.loads(p.read_text()) for p in logs)
    assert not (set(a) & set(b)), "both processes measured the same config"
    assert 40 <= len(a) + len(b) <= 40 + 2 * 4   # the study's budget, plus at most a batch each in flight
    assert min(counts) > 0, "one process did all the work"


def test_cli_end_to_end(tmp_path, monkeypatch, capsys):
    import autocnn.store.database
    from autocnn.cli import main

    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "db"))
    # No shipped records: a faster shipped record of this shape would keep the run's from being stored.
    (tmp_path / "shipped").mkdir()
    monkeypatch.setattr(autocnn.store.database, "default_shipped_dir", lambda: tmp_path / "shipped")
    rf = ReplayFile.load(POOL_FILE)
    shape = rf.problem.shape_string()
    code = main(["tune", "--op", rf.op, "--shape", shape, "--trials", "12", "--replay", str(POOL_FILE),
                 "--storage", storage(tmp_path), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)["results"][0]
    assert result["shape"] == shape and result["measured"] == 12 and result["stored"]
    assert result["tuned_us"] <= result["default_us"]
    assert main(["db", "list"]) == 0
    assert shape in capsys.readouterr().out
    exported = tmp_path / "export.json"
    expected = len(TuningDatabase().records(op=rf.op))
    assert main(["db", "export", str(exported), "--op", rf.op]) == 0
    assert f"wrote {expected} records" in capsys.readouterr().out
    assert main(["db", "remove", "--op", rf.op, "--shape", shape, "--yes"]) == 0
    assert "removed 1" in capsys.readouterr().out
    assert main(["db", "import", str(exported)]) == 0
    assert f"imported {expected}" in capsys.readouterr().out
    assert TuningDatabase().lookup(rf.device, rf.problem).source == "exact"


def test_cli_errors_are_actionable(tmp_path, monkeypatch, capsys):
    from autocnn.cli import main

    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "db"))
    assert main(["tune", "--op", "conv_fwd", "--trials", "3", "--replay", str(POOL_FILE)]) == 1
    assert "--shape" in capsys.readouterr().err
    assert main(["tune", "--op", "conv_fwd", "--shape", "N=1,C=1,H=4,W=4,K=1,R=9,S=3", "--replay",
                 str(POOL_FILE)]) == 1
    assert "R=9" in capsys.readouterr().err
    assert main(["tune", "--network", "lenet5", "--ops", "conv_fwdd", "--replay", str(POOL_FILE)]) == 1
    assert "unknown operation(s) ['conv_fwdd']" in capsys.readouterr().err
    assert main(["tune", "--network", "chellapilla06", "--ops", "avgpool_fwd", "--replay", str(POOL_FILE)]) == 1
    assert "chellapilla06 runs no avgpool_fwd kernel" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tune", "--op", "conv_fwd", "--shape", "N=1", "--sampler", "annealing"])


def test_cli_tunes_stale_shapes_again_and_removes_their_old_records(tmp_path, monkeypatch, capsys):
    """After a template change (here: a record's fingerprint made old), `tune --stale` finds the
    shape, tunes it again from the old winner and stores a current record; `db remove --stale`
    then clears the old one."""
    import autocnn.store.database
    from autocnn.cli import main

    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "db"))
    (tmp_path / "shipped").mkdir()   # no shipped records: a current one would make the shape fresh
    monkeypatch.setattr(autocnn.store.database, "default_shipped_dir", lambda: tmp_path / "shipped")
    rf = ReplayFile.load(POOL_FILE)
    shape = rf.problem.shape_string()
    assert main(["tune", "--op", rf.op, "--shape", shape, "--trials", "8", "--replay", str(POOL_FILE),
                 "--storage", storage(tmp_path), "--json"]) == 0
    capsys.readouterr()
    path = next((tmp_path / "db").glob("*.json"))
    doc = json.loads(path.read_text())
    old = doc["records"][0]
    old["key"]["fingerprint"] = "0000000000000000"
    path.write_text(json.dumps(doc))
    # A template change that left the code of its config as it was keeps it current (its plan digest).
    assert TuningDatabase().stale_problems(rf.device, [rf.op]) == []
    assert TuningDatabase().lookup(rf.device, rf.problem).source == "exact"
    old["plan_digest"] = "0000000000000000"   # one that changed it makes it stale
    path.write_text(json.dumps(doc))
    assert [p.shape_string() for p in TuningDatabase().stale_problems(rf.device, [rf.op])] == [shape]

    assert main(["tune", "--stale", "--ops", rf.op, "--trials", "8", "--replay", str(POOL_FILE),
                 "--storage", storage(tmp_path), "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert [(r["op"], r["shape"], r["stored"]) for r in results] == [(rf.op, shape, True)]
    assert TuningDatabase().stale_problems(rf.device, [rf.op]) == []
    assert TuningDatabase().lookup(rf.device, rf.problem).source == "exact"

    assert main(["db", "remove", "--stale", "--yes"]) == 0
    assert "removed 1" in capsys.readouterr().out
    assert TuningDatabase().stale_records() == [] and len(TuningDatabase().records(op=rf.op)) == 1
    assert main(["db", "remove", "--stale", "--yes"]) == 1
    assert "no matching stale record" in capsys.readouterr().out


class _StuckSampler:
    """A sampler that proposes one config forever: the lowest choice of every parameter. Stands in for
    a model-based sampler that keeps proposing configs that are infeasible or measured already."""

    def __new__(cls):
        import optuna

        class Stuck(optuna.samplers.BaseSampler):
            def infer_relative_search_space(self, study, trial):
                return {}

            def sample_relative(self, study, trial, search_space):
                return {}

            def sample_independent(self, study, trial, name, distribution):
                if isinstance(distribution, optuna.distributions.CategoricalDistribution):
                    return distribution.choices[0]
                return distribution.low

        return Stuck()


@pytest.mark.parametrize("sampler", ["tpe", "cmaes"])
def test_a_stuck_sampler_still_spends_the_budget_on_new_configs(db, tmp_path, monkeypatch, sampler):
    # Without the tuner's fallback to random unmeasured configs, such a sampler ends a search after
    # the few startup configs, and a tuner says the space is exhausted when it is not.
    import autocnn.search.tuner as tuner_module

    monkeypatch.setattr(tuner_module, "make_sampler", lambda name, seed: _StuckSampler())
    tuner, source = tuner_for([WGRAD_FILE], db, tmp_path, trials=30, batch=4, sampler=sampler)
    rf = source.files[0]
    outcome = tuner.tune(rf.op, rf.problem)
    searched = source.measured_keys[: outcome.measured]
    assert outcome.measured == 30, outcome.stopped_because
    assert outcome.stopped_because == "30 measured trials (in the whole study)"
    assert len(searched) == len(set(searched)), "a config was measured twice during the search"
    space = tuner.space_for(rf.op, rf.problem)
    assert all(space.is_feasible(rf.results[k].config) for k in searched)


def test_vary_tries_earlier_winners_at_every_other_choice_of_a_parameter():
    import dataclasses as dc

    from autocnn.device import DeviceLimits
    from autocnn.kernels import get_operation
    from autocnn.kernels.suite import seed_problems
    from autocnn.search.tuner import _variants

    operation = get_operation("conv_fwd")
    limits = DeviceLimits.for_arch("sm_90")
    problem = dc.replace(dict(seed_problems("conv_fwd"))["modern_14"], precision="tf32")
    space = operation.space(problem, limits)
    winner = operation.default_config(problem, limits, formulation="tc")
    variants = _variants(space, [winner], ("TF32_ROUND", "FRAG"))
    assert {(v["TF32_ROUND"], v["FRAG"]) for v in variants} == {
        ("zero", winner["FRAG"]), *(("nearest", f) for f in ("scalar", "pair", "quad") if f != winner["FRAG"])}
    assert all(space.is_feasible(v) for v in variants) and winner.key() not in {v.key() for v in variants}
    # A parameter the problem's space lacks (no TF32 rounding in fp32) varies nothing.
    fp32 = dc.replace(problem, precision="fp32")
    assert _variants(operation.space(fp32, limits), [operation.default_config(fp32, limits, formulation="tc")],
                     ("TF32_ROUND",)) == []
    with pytest.raises(ValueError, match="sequence of parameter names"):
        TuneSettings(vary="TF32_ROUND")


@pytest.mark.parametrize("precision, reason", [("fp32", "C must be a multiple of 4, not 3"),
                                               ("tf32", "C must be a multiple of 4, not 3")])
def test_held_parameters_that_rule_out_every_config_are_named_before_anything_runs(db, tmp_path, precision, reason):
    """--fix formulation=wgmma on a shape wgmma cannot serve: the outcome says which rule the held
    parameters break; no study is opened and nothing is measured."""
    from autocnn.kernels.problem import ConvFwdProblem

    source = ReplaySource([ReplayFile.load(WGRAD_FILE)])   # a Hopper GPU (the replay's H200)
    tuner = Tuner(source, db, TuneSettings(storage=storage(tmp_path), fixed={"formulation": "wgmma"}), progress=False)
    problem = ConvFwdProblem(N=8, C=3, H=8, W=8, K=8, R=3, S=3, padding=(1, 1, 1, 1), precision=precision)
    outcome = tuner.tune("conv_fwd", problem, trials=4)
    assert outcome.best is None and outcome.measured == 0 and source.calls == 0
    assert "no config of this shape satisfies formulation=wgmma" in outcome.stopped_because
    assert reason in outcome.stopped_because
    assert not (tmp_path / "optuna.db").exists()


def test_a_held_value_that_an_op_does_not_offer_leaves_that_problem_out(db, tmp_path):
    """formulation=halo over a network: the weight gradients (no halo) are left out, before
    a study is opened or anything measured, and the run goes on; a value no problem offers is refused."""
    from autocnn.errors import InvalidConfigError
    from autocnn.kernels.problem import ConvFwdProblem, ConvWgradProblem
    from autocnn.search.tuner import problems_offering

    source = ReplaySource([ReplayFile.load(WGRAD_FILE)])
    tuner = Tuner(source, db, TuneSettings(storage=storage(tmp_path), fixed={"formulation": "halo"}), progress=False)
    wgrad = ConvWgradProblem(N=8, C=8, H=8, W=8, K=8, R=3, S=3, padding=(1, 1, 1, 1), precision="tf32")
    outcome = tuner.tune("conv_wgrad", wgrad, trials=4)
    assert outcome.best is None and outcome.measured == 0 and source.calls == 0
    assert "conv_wgrad has no config with formulation=halo" in outcome.stopped_because
    assert "formulation='halo' is not allowed" in outcome.stopped_because
    assert not (tmp_path / "optuna.db").exists()
    fwd = ConvFwdProblem(N=8, C=8, H=8, W=8, K=8, R=3, S=3, padding=(1, 1, 1, 1), precision="tf32")
    assert problems_offering({"formulation": "halo"}, [wgrad, fwd]) == [fwd]
    assert problems_offering({}, [wgrad, fwd]) == [wgrad, fwd]
    with pytest.raises(InvalidConfigError, match="no problem of this run offers formulation=halo"):
        problems_offering({"formulation": "halo"}, [wgrad])


def test_a_held_search_slower_than_the_default_stores_the_default(db, tmp_path):
    """--fix outside the default (SPLITK=32, where the replay's best is 175 us against the default's
    88 us): the confirmation times the default too, and the faster of them becomes the record, so a
    held search never leaves a record slower than what a lookup answered without it."""
    from autocnn.kernels import get_operation

    rf = ReplayFile.load(WGRAD_FILE)
    source = ReplaySource([rf])
    fixed = {"formulation": "atomic", "SPLITK": 32}
    tuner = Tuner(source, db, TuneSettings(storage=storage(tmp_path), fixed=fixed, sampler="random", seed=3),
                  progress=False)
    outcome = tuner.tune(rf.op, rf.problem, trials=6)
    default = get_operation(rf.op).default_config(rf.problem, rf.device.limits())
    assert default.as_dict()["SPLITK"] == 128 and default.key() in source.measured_keys
    assert outcome.record is not None and outcome.record.config == default.as_dict()
    assert outcome.record.time_us == pytest.approx(rf.results[default.key()].time_us)
    assert outcome.study_measured == 6   # the search itself stayed inside the held parameters


def _held_search_over_a_planted_record(db, tmp_path, device=None, quick=False):
    """Plants a record of the replay's fastest config (on ``device``, default this GPU; quick or
    full) claiming 50 us, then tunes held to SPLITK=32 (175 us at best): the replay, the fastest
    result, the source and the outcome."""
    from autocnn.kernels import get_operation
    from autocnn.store import RecordKey, TuningRecord, now_utc

    rf = ReplayFile.load(WGRAD_FILE)
    fastest = min((r for r in rf.results.values() if r.ok), key=lambda r: r.time_us)
    operation = get_operation(rf.op)
    planted = TuningRecord(key=RecordKey.for_(device or rf.device, rf.problem,
                                              operation.config_fingerprint(fastest.config)),
                           config=fastest.config.as_dict(), time_us=50.0, spread=0.0, default_time_us=None,
                           cudnn_time_us=None, trials=1, tuned_at=now_utc(), autocnn_version="0", sampler="planted",
                           quick=quick)
    db.put_many([planted])
    found = db.tuned(rf.device, rf.problem)
    assert found.source == ("same_arch" if device else "exact") and found.record.quick == quick
    source = ReplaySource([rf])
    tuner = Tuner(source, db, TuneSettings(storage=storage(tmp_path), fixed={"formulation": "atomic", "SPLITK": 32},
                                           sampler="random", seed=3), progress=False)
    outcome = tuner.tune(rf.op, rf.problem, trials=6)
    assert fastest.config.key() in source.measured_keys
    assert outcome.record is not None and outcome.record.config == fastest.config.as_dict()
    assert outcome.record.time_us == pytest.approx(fastest.time_us)
    return rf, fastest, source, outcome


def test_a_held_search_never_stores_a_record_slower_than_another_gpus_answer(db, tmp_path):
    """The lookup answered with an H100's record of this shape (same architecture) before the tune:
    the confirmation times that config too, so a search held to slow configs (SPLITK=32, 175 us at
    best) stores the H100's config, measured here, instead of its own winner or the default (88 us)."""
    from autocnn.device import DeviceInfo

    h100 = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0", 132, 13000, 13000)
    rf, _, _, outcome = _held_search_over_a_planted_record(db, tmp_path, device=h100)
    assert outcome.record.key.gpu == rf.device.name   # this GPU's own record, timed on it
    assert outcome.record.runner_up is None or outcome.record.runner_up["config"]["SPLITK"] == 32


def test_a_held_search_never_replaces_a_quick_record_with_a_slower_one(db, tmp_path):
    """A full tuning replaces this GPU's quick record whatever its time (TuningRecord.quick): the
    confirmation times the quick record's config too, so a search held to slow configs stores that
    config, measured anew, and not its own slower winner."""
    rf, fastest, _, outcome = _held_search_over_a_planted_record(db, tmp_path, quick=True)
    assert not outcome.record.quick
    assert db.tuned(rf.device, rf.problem).record.config == fastest.config.as_dict()


def test_vary_starts_from_this_shapes_current_record(db, tmp_path):
    """A current record of the very shape (its code unchanged by a new parameter's first choice) is
    where --vary starts: each of its other SPLITK values is measured before the search proper. Before,
    only stale records and other shapes' were varied, and a run just after a parameter was added
    (FFT_VEC, its first choice keeping every record's code) never measured the record's variants."""
    from autocnn.kernels import get_operation
    from autocnn.store import RecordKey, TuningRecord, now_utc
    from autocnn.search.tuner import _variants

    rf = ReplayFile.load(WGRAD_FILE)
    operation = get_operation(rf.op)
    slowest = max((r for r in rf.results.values() if r.ok), key=lambda r: r.time_us)   # far from where a search starts
    db.put_many([TuningRecord(key=RecordKey.for_(rf.device, rf.problem, operation.config_fingerprint(slowest.config)),
                              config=slowest.config.as_dict(), time_us=slowest.time_us, spread=0.0,
                              default_time_us=None, cudnn_time_us=None, trials=1, tuned_at=now_utc(),
                              autocnn_version="0", sampler="planted")])
    assert db.tuned(rf.device, rf.problem).source == "exact"
    source = ReplaySource([rf])
    tuner = Tuner(source, db, TuneSettings(storage=storage(tmp_path), fixed=rf.space_filter, vary=("SPLITK",),
                                           sampler="random", seed=3), progress=False)
    variants = _variants(tuner.space_for(rf.op, rf.problem), [slowest.config], ("SPLITK",))
    assert len(variants) >= 2
    outcome = tuner.tune(rf.op, rf.problem, trials=len(variants) + 6)
    searched = set(source.measured_keys[: outcome.measured])
    assert slowest.config.key() in searched
    assert {v.key() for v in variants} <= searched


def test_the_search_starts_from_and_confirms_the_default_a_lookup_answers_with(tmp_path):
    """Where the first default candidate cannot run (ptxas shows it spilling: chellapilla06_c2's
    backward-data with nvcc 13), the lookup answers with the next: the tuner's default, measured
    first and timed beside the winner, is that one too; without a database, the first candidate."""
    from autocnn.kernels import get_operation

    rf = ReplayFile.load(WGRAD_FILE)
    operation = get_operation(rf.op)
    candidates = list(operation.default_configs(rf.problem, rf.device.limits()))
    assert len(candidates) >= 2
    refusing = TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "shipped",
                              resource_check=lambda plan, device: (["spills registers (planted)"]
                                                                   if plan.config == candidates[0] else []))
    settings = TuneSettings(storage=storage(tmp_path))
    source = ReplaySource([rf])
    assert Tuner(source, refusing, settings, progress=False)._default(operation, rf.problem) == candidates[1]
    assert Tuner(source, None, settings, progress=False)._default(operation, rf.problem) == candidates[0]
    assert refusing.lookup(rf.device, rf.problem).config == candidates[1]
