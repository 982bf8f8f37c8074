"""Nothing measured is lost and nothing unmeasured is trusted: stored times are evidence (a physical
floor on import, the stored record's config measured again beside the winner), plan digests are
checked, duplicate keys of one import file resolved as --keep-faster says, replayed studies kept
apart from measured ones (a config missing from a replay file is no failure of the config), and a
record the database cannot take kept in a fallback file while the run goes on."""
from __future__ import annotations

import dataclasses
import errno
import json
from pathlib import Path

import optuna
import pytest

from autocnn import cli
from autocnn.kernels import get_operation
from autocnn.store import TuningDatabase, TuningRecord
from autocnn.store import files as store_files
from autocnn.measurement.sources import ReplayFile, ReplaySource, TrialResult
from autocnn.search.tuner import TuneSettings, Tuner

REPLAY = Path(__file__).parent / "data" / "replay"
POOL_FILE = REPLAY / "avgpool_fwd__kriz09_pool.json.gz"
POOL_BWD_FILE = REPLAY / "avgpool_bwd__kriz09_pool.json.gz"
WGRAD_FILE = REPLAY / "conv_wgrad__convnet18_c1.json.gz"


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "db"))
    monkeypatch.chdir(tmp_path)
    return TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "shipped")


def storage(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'optuna.db'}"


def recorded(rf: ReplayFile, rank: int = 0) -> TrialResult:
    return sorted((r for r in rf.results.values() if r.ok), key=lambda r: r.time_us)[rank]


def record_of(rf: ReplayFile, result: TrialResult, time_us: float, **changes) -> TuningRecord:
    from autocnn.store import RecordKey, now_utc

    operation = get_operation(rf.op)
    record = TuningRecord(
        key=RecordKey.for_(rf.device, rf.problem, operation.config_fingerprint(result.config)),
        config=result.config.as_dict(), time_us=time_us, spread=0.01, default_time_us=None, cudnn_time_us=None,
        trials=10, tuned_at=now_utc(), autocnn_version="0.1.0", sampler="tpe",
        plan_digest=operation.code_digest(rf.problem, result.config))
    return dataclasses.replace(record, **changes) if changes else record


def write_file(path: Path, records) -> Path:
    path.write_text(json.dumps({"format": 1, "records": [r.to_dict() for r in records]}))
    return path


# -- import: the floor, plan digests, duplicates -----------------------------------------------------

def test_import_refuses_a_time_below_the_physical_floor(db, tmp_path, capsys):
    rf = ReplayFile.load(POOL_FILE)
    bogus = record_of(rf, recorded(rf), 1e-9)
    source = write_file(tmp_path / "bogus.json", [bogus])
    assert cli.main(["db", "import", str(source)]) == 1
    out = capsys.readouterr().out
    assert "imported 0 of the 1 records" in out and "time_us 1e-09 us is below the" in out, out
    assert "it was not measured" in out and db.records() == []
    # One already in the database (written before the floor existed) is named by db check.
    store_files.atomic_write_json(db.path_for(bogus.key), store_files.file_document([bogus.to_dict()]))
    assert cli.main(["db", "check"]) == 1
    assert "time_us 1e-09 us is below the" in capsys.readouterr().out


def test_a_plan_digest_that_is_not_the_configs_is_refused_and_named(db, tmp_path, capsys):
    rf = ReplayFile.load(POOL_FILE)
    wrong = record_of(rf, recorded(rf), recorded(rf).time_us, plan_digest="0123456789abcdef")
    assert cli.main(["db", "import", str(write_file(tmp_path / "wrong.json", [wrong]))]) == 1
    assert "plan_digest: 0123456789abcdef is not the digest of its config's code" in capsys.readouterr().out
    store_files.atomic_write_json(db.path_for(wrong.key), store_files.file_document([wrong.to_dict()]))
    assert cli.main(["db", "check"]) == 1
    out = capsys.readouterr().out
    assert "0123456789abcdef is not the digest" in out and "consistent" not in out


@pytest.mark.parametrize("keep_faster, kept_us", [(True, 5.0), (False, 45.0)])
def test_duplicate_keys_of_one_file_resolved_and_counted(db, tmp_path, capsys, keep_faster, kept_us):
    rf = ReplayFile.load(POOL_FILE)
    # Both faster than the shipped record of the shape, which --keep-faster would keep otherwise.
    fast, slow = record_of(rf, recorded(rf), 5.0), record_of(rf, recorded(rf, 1), 45.0)
    source = write_file(tmp_path / "twice.json", [fast, slow])
    assert cli.main(["db", "import", str(source), *(["--keep-faster"] if keep_faster else [])]) == 0
    out = capsys.readouterr().out
    assert f"imported 1 of the 2 records in {source}" in out, out
    assert "left out 1 records whose key another record of the file has" in out
    assert [r.time_us for r in db.records()] == [kept_us]


# -- the stored record measured again -----------------------------------------------------------------

def tuner_for(files, db, tmp_path, source=None, **settings) -> Tuner:
    source = source or ReplaySource([ReplayFile.load(f) for f in files])
    return Tuner(source, db, TuneSettings(storage=storage(tmp_path), **settings), progress=False)


def test_a_bogus_fast_stored_record_cannot_keep_a_real_winner_out(db, tmp_path):
    rf = ReplayFile.load(POOL_FILE)
    slowest = sorted((r for r in rf.results.values() if r.ok), key=lambda r: r.time_us)[-1]
    lie = record_of(rf, slowest, slowest.time_us / 100)   # its config is the slowest; the record says fastest
    db.put(lie)
    outcome = tuner_for([POOL_FILE], db, tmp_path, trials=20, batch=4, sampler="grid").tune(rf.op, rf.problem)
    assert outcome.stored_retimed_us == pytest.approx(slowest.time_us)
    assert outcome.record is not None, outcome.stopped_because
    kept = db.record_for(lie.key)
    assert kept.config != lie.config and kept.time_us < slowest.time_us


def test_a_stored_record_whose_config_is_best_keeps_its_measured_time(db, tmp_path):
    rf = ReplayFile.load(POOL_FILE)
    best = recorded(rf)
    db.put(record_of(rf, best, best.time_us / 50))
    outcome = tuner_for([POOL_FILE], db, tmp_path, trials=6, batch=3).tune(rf.op, rf.problem)
    kept = db.record_for(outcome.record.key)
    assert kept.config == best.config.as_dict() and kept.time_us == pytest.approx(best.time_us)


# -- replayed studies apart; replay misses ----------------------------------------------------------------

class MeasuringSource:
    """A GPU stand-in (not replayed) that answers every config: its recorded time, else 1 ms."""

    replayed = False

    def __init__(self, rf: ReplayFile):
        self.rf, self.device, self.calls = rf, rf.device, 0

    def measure(self, op, problem, configs):
        for c in configs:
            self.calls += 1
            r = self.rf.results.get(c.key())
            yield r if r is not None else TrialResult(c, True, 1000.0)

    def close(self):
        pass


def test_a_replay_run_leaves_nothing_that_a_measured_run_reuses(db, tmp_path):
    rf = ReplayFile.load(WGRAD_FILE)
    # A file that lacks half of its configs: the replayed search meets misses.
    keys = sorted(rf.results)
    partial = dataclasses.replace(rf, results={k: rf.results[k] for k in keys[::2]})
    replayed = tuner_for(None, db, tmp_path, source=ReplaySource([partial]), trials=30, batch=8)
    first = replayed.tune(rf.op, rf.problem)
    assert first.replay_misses > 0 and first.measured == 30
    assert "infeasible" not in first.failures and sum(first.failures.values()) == 0, first.failures
    assert first.study_name.endswith("|replay:" + partial.digest)
    # No trial of the replayed study is a failure of its config.
    study = optuna.load_study(study_name=first.study_name, storage=storage(tmp_path))
    results = [t.user_attrs.get("result", {}) for t in study.trials]
    assert any(r.get("replay_miss") for r in results)
    # (the only failures: configs the sampler proposed that break the space's rules, found statically)
    assert all(r.get("stage") == "static" for r in results if r.get("failure")), results
    # A measured run on the same storage, shape and held parameters opens a study of its own.
    measured = MeasuringSource(rf)
    second = tuner_for(None, db, tmp_path, source=measured, trials=30, batch=8, fixed=rf.space_filter,
                       warm_start=False).tune(rf.op, rf.problem)
    assert second.study_name != first.study_name and not second.study_name.endswith(partial.digest)
    assert second.measured == 30 and measured.calls >= 30 and second.replay_misses == 0
    own = optuna.load_study(study_name=second.study_name, storage=storage(tmp_path))
    assert not any(t.user_attrs.get("result", {}).get("replay_miss") for t in own.trials)


def test_replay_applies_the_parameters_its_recording_held(db, tmp_path):
    rf = ReplayFile.load(WGRAD_FILE)
    assert rf.held == {"BK": 16, "PAD_A": 1, "PAD_B": 1, "UNROLL_K": 0, "formulation": "atomic"}
    tuner = tuner_for([WGRAD_FILE], db, tmp_path, trials=12, batch=6)   # no --fix given
    outcome = tuner.tune(rf.op, rf.problem)
    assert outcome.measured == 12 and outcome.replay_misses == 0 and not outcome.failures
    assert "|fixed:BK=16,PAD_A=1,PAD_B=1,UNROLL_K=0,formulation=atomic|replay:" in outcome.study_name


def test_the_cli_applies_them_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "db"))
    rf = ReplayFile.load(WGRAD_FILE)
    code = cli.main(["tune", "--op", rf.op, "--shape", rf.problem.shape_string(), "--replay", str(WGRAD_FILE),
                     "--trials", "10", "--storage", storage(tmp_path), "--json"])
    err = capsys.readouterr()
    assert code == 0, err.err
    assert "holding BK=16,PAD_A=1,PAD_B=1,UNROLL_K=0,formulation=atomic" in err.err
    row = json.loads(err.out)["results"][0]
    assert row["measured"] == 10 and row["failures"] == {}


# -- a store that fails anyway ----------------------------------------------------------------------------

def full_disk(monkeypatch, directory: Path) -> None:
    real = store_files.atomic_write_json

    def write(path, data):
        if Path(path).parent == directory:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)
    monkeypatch.setattr(store_files, "atomic_write_json", write)


def test_a_failed_store_keeps_every_winner_and_the_run_goes_on(db, tmp_path, monkeypatch):
    from autocnn.store import fallback
    from autocnn.search.network import tune_problems

    monkeypatch.setattr(fallback, "_kept", [])
    monkeypatch.setattr(fallback, "_path", None)
    full_disk(monkeypatch, db.user_dir)
    files = [ReplayFile.load(POOL_FILE), ReplayFile.load(POOL_BWD_FILE)]
    tuner = tuner_for(None, db, tmp_path, source=ReplaySource(files), trials=5, batch=5)
    outcomes = tune_problems(tuner, [f.problem for f in files], 16)
    assert len(outcomes) == 2 and all(o.best is not None and o.record is None for o in outcomes)
    paths = {o.unsaved_path for o in outcomes}
    assert len(paths) == 1 and "No space left on device" in outcomes[0].stopped_because
    (path,) = paths
    assert path.parent == tmp_path and str(path) in outcomes[1].stopped_because
    # Once the database takes writes again, the file restores both records as measured.
    monkeypatch.undo()
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(db.user_dir))
    report = TuningDatabase(user_dir=db.user_dir, shipped_dir=db.shipped_dir).import_file(path)
    assert report.stored == 2
    assert {r.time_us for r in db.records()} == {o.best.time_us for o in outcomes}


def test_the_cli_names_the_fallback_file_and_exits_non_zero(tmp_path, monkeypatch, capsys):
    from autocnn.store import fallback

    monkeypatch.setattr(fallback, "_kept", [])
    monkeypatch.setattr(fallback, "_path", None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "db"))
    full_disk(monkeypatch, tmp_path / "db")
    rf = ReplayFile.load(POOL_FILE)
    code = cli.main(["tune", "--op", rf.op, "--shape", rf.problem.shape_string(), "--replay", str(POOL_FILE),
                     "--trials", "4", "--storage", storage(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    line = next(x for x in err.splitlines() if x.startswith("autocnn: ") and "could not take the record" in x)
    assert "autocnn db import" in line and str(tmp_path) in line
