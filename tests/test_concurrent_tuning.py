"""Several tuner processes on one study (SQLite, Optuna's journal file, PostgreSQL), driven by
recorded GPU measurements (replay), in real processes started together:

- the study's trial budget holds (the study ends with exactly its budget of measured trials);
- no config is measured twice (what one process measured or is measuring is never handed out again);
- the tuning database ends with the study-wide best, whichever process found it, and a record is
  never replaced by a slower one;
- the tuning database's files, written by several processes at once, lose no record.
"""
from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from pathlib import Path

import pytest

from autocnn.errors import FailureClass
from autocnn.kernels import get_operation
from autocnn.store import TuningDatabase
from autocnn.measurement.sources import ReplayFile, TrialResult
from autocnn.search.trials import ABANDONED_ATTR, CONFIG_ATTR, RESULT_ATTR
from autocnn.search.tuner import open_storage, study_name
from tests.replay_workers import read_log, spawn

REPLAY = Path(__file__).parent / "data" / "replay"
WGRAD_FILE = REPLAY / "conv_wgrad__convnet18_c1.json.gz"
PROCESSES = 3
TRIALS = 30
BATCH = 4


def storage_url(kind: str, tmp_path: Path, request) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'optuna.db'}"
    if kind == "journal":
        return f"journal:{tmp_path / 'optuna.log'}"
    return request.getfixturevalue("postgres_url")


def study_trials(url: str, rf: ReplayFile) -> list:
    operation = get_operation(rf.op)
    # A replayed study: its name ends in the replay file's tag.
    name = study_name(rf.device, rf.op, rf.problem, operation.fingerprint(), rf.space_filter, f"replay:{rf.digest}")
    import optuna

    return optuna.load_study(study_name=name, storage=open_storage(url)).get_trials(deepcopy=False)


def measured_trials(trials) -> list:
    """Told trials that spent GPU time: complete, or failed by a measured failure class (not reused)."""
    out = []
    for t in trials:
        result = t.user_attrs.get(RESULT_ATTR)
        if result is None or result.get("reused") or t.user_attrs.get(CONFIG_ATTR) is None:
            continue
        if ABANDONED_ATTR in t.user_attrs:
            continue   # its tuner died between writing the result and telling the trial: not told
        failure = result.get("failure")
        if t.state.name == "COMPLETE" or (
                failure is not None and TrialResult(None, False, failure=FailureClass(failure)).measured):
            out.append(t)
    return out


def run_together(jobs: list[dict], tmp_path: Path, timeout_s: float = 240) -> list[dict]:
    """Start every job, let them go at once, wait for all; their result files."""
    go = tmp_path / "go"
    procs = [spawn({**job, "go": str(go)}) for job in jobs]
    deadline = time.monotonic() + timeout_s
    while not all(Path(job["log"] + ".ready").exists() for job in jobs):
        assert all(p.poll() is None for p in procs), [p.communicate()[0] for p in procs if p.poll() is not None]
        assert time.monotonic() < deadline, "tuner processes did not start"
        time.sleep(0.05)
    go.write_text("go")
    outputs = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out
    return [json.loads(Path(job["result"]).read_text()) for job in jobs]


def tuner_jobs(url: str, tmp_path: Path, replay: Path = WGRAD_FILE, n: int = PROCESSES, trials: int = TRIALS,
               **extra) -> list[dict]:
    return [{"replay": str(replay), "storage": url, "db_dir": str(tmp_path / "db"), "trials": trials,
             "batch": BATCH, "pace_s": 0.03, "log": str(tmp_path / f"log{i}"), "result": str(tmp_path / f"r{i}.json"),
             "seed": i, **extra} for i in range(n)]


@pytest.mark.parametrize("kind", ["sqlite", "journal", "postgresql"])
def test_tuners_sharing_a_study_keep_budget_measure_once_and_store_the_best(kind, tmp_path, request):
    url = storage_url(kind, tmp_path, request)
    rf = ReplayFile.load(WGRAD_FILE)
    jobs = tuner_jobs(url, tmp_path)
    results = run_together(jobs, tmp_path)

    trials = study_trials(url, rf)
    measured = measured_trials(trials)
    # The budget holds study-wide: exactly TRIALS measured (at most one per tuner more is what the
    # issue allows; handing out no more than the budget leaves once others' in-flight configs are
    # counted makes it exact).
    assert len(measured) == TRIALS, Counter(t.state.name for t in trials)
    assert not any(t.state.name == "RUNNING" for t in trials)
    assert not any(ABANDONED_ATTR in t.user_attrs for t in trials)
    # No config measured twice: in the study, and by the processes' own accounts.
    keys = [json.dumps(t.user_attrs[CONFIG_ATTR], sort_keys=True) for t in measured]
    assert len(set(keys)) == len(keys)
    searched = [key for job in jobs for _, phase, key in read_log(Path(job["log"])) if phase == "search"]
    assert len(searched) == len(set(searched)) == TRIALS
    assert sum(r["measured"] for r in results) == TRIALS
    assert sum(1 for r in results if r["measured"] > 0) >= 2, results
    # Every tuner ends with the study-wide view, and the database with the study-wide best.
    best = min((t for t in measured if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert all(r["study_measured"] == TRIALS for r in results)
    assert all(r["best_us"] == pytest.approx(best.value) for r in results)
    record = TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "db" / "no-shipped").lookup(
        rf.device, rf.problem)
    assert record.source == "exact"
    assert record.config.as_dict() == best.user_attrs[CONFIG_ATTR]
    assert record.record.time_us == pytest.approx(best.value)


def _config(rf: ReplayFile):
    return next(iter(rf.results.values())).config


def _record(rf: ReplayFile, time_us: float):
    from autocnn.store import RecordKey, TuningRecord, now_utc

    config = _config(rf)
    return TuningRecord(key=RecordKey.for_(rf.device, rf.problem, get_operation(rf.op).config_fingerprint(config)),
                        config=config.as_dict(), time_us=time_us, spread=0.0, default_time_us=None,
                        cudnn_time_us=None, trials=1, tuned_at=now_utc(), autocnn_version="0", sampler="planted")


def test_a_record_is_never_replaced_by_a_slower_one(tmp_path, monkeypatch):
    from autocnn.measurement.sources import ReplaySource
    from autocnn.search.tuner import TuneSettings, Tuner

    rf = ReplayFile.load(WGRAD_FILE)
    db = TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "shipped")
    settings = TuneSettings(trials=8, storage=f"sqlite:///{tmp_path / 'o.db'}", fixed=rf.space_filter, batch=4)
    fastest = min(r.time_us for r in rf.results.values() if r.ok)
    planted = _record(rf, fastest / 2)
    db.put(planted)
    # A faster record whose config this tune cannot measure again (the replay file lacks it) stays.
    lacking = dataclasses.replace(rf, results={k: r for k, r in rf.results.items() if k != _config(rf).key()})
    outcome = Tuner(ReplaySource([lacking]), db, settings, progress=False).tune(rf.op, rf.problem)
    assert outcome.best is not None and outcome.record is None
    assert "keeps its faster record" in outcome.stopped_because
    assert db.record_for(planted.key).time_us == pytest.approx(fastest / 2)
    # Where the tune measures its config again, what it measures decides: the planted time was no
    # measurement, and the record becomes the fastest config timed now.
    outcome = Tuner(ReplaySource([rf]), db, dataclasses.replace(settings, storage=f"sqlite:///{tmp_path / 'p.db'}"),
                    progress=False).tune(rf.op, rf.problem)
    assert outcome.record is not None and outcome.stored_retimed_us == pytest.approx(rf.results[_config(rf).key()].time_us)
    assert db.record_for(planted.key).time_us == pytest.approx(outcome.best.time_us)
    # A slower stored record is replaced by the tuned one.
    db.put(_record(rf, fastest * 100))
    outcome = Tuner(ReplaySource([rf]), db, dataclasses.replace(settings, trials=12), progress=False).tune(
        rf.op, rf.problem)
    assert outcome.record is not None
    assert db.record_for(planted.key).time_us == pytest.approx(outcome.best.time_us)
    assert outcome.best.time_us < fastest * 100


def _writer(args) -> None:
    """Put this writer's own records one at a time, and its time for the shared key."""
    user_dir, writer, count, shared_us = args
    from autocnn.kernels import ConvFwdProblem

    rf = ReplayFile.load(WGRAD_FILE)
    db = TuningDatabase(user_dir=Path(user_dir), shipped_dir=Path(user_dir) / "none")
    limits = rf.device.limits()
    for i in range(count):
        problem = ConvFwdProblem(N=writer + 1, C=i + 1, H=8, W=8, K=4, R=3, S=3)
        config = get_operation("conv_fwd").default_config(problem, limits)
        record = dataclasses.replace(_record(rf, 1.0 + i), config=config.as_dict(),
                                     key=dataclasses.replace(_record(rf, 1.0).key, op="conv_fwd",
                                                             problem=problem.to_dict(),
                                                             fingerprint=get_operation("conv_fwd").config_fingerprint(config)))
        db.put(record)
        if i == count // 2:
            db.put_many([_record(rf, shared_us)], keep_faster=True)


def test_database_files_lose_no_record_under_concurrent_writers(tmp_path):
    import multiprocessing as mp

    writers, count = 4, 12
    shared = [7.0, 3.0, 5.0, 4.0]
    with mp.get_context("spawn").Pool(writers) as pool:
        pool.map(_writer, [(str(tmp_path / "db"), w, count, shared[w]) for w in range(writers)])
    db = TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "none")
    records = db.records()
    assert len(records) == writers * count + 1
    conv = {(r.key.problem["N"], r.key.problem["C"]) for r in records if r.key.op == "conv_fwd"}
    assert conv == {(w + 1, i + 1) for w in range(writers) for i in range(count)}
    rf = ReplayFile.load(WGRAD_FILE)
    assert db.record_for(_record(rf, 1.0).key).time_us == min(shared)
