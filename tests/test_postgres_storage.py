"""Storages: the URL forms autocnn accepts (and the sentence for any other), and PostgreSQL, the
way to share studies between hosts, against a real server (tests/postgres_server.py): a study
that resumes, the advisory lock that orders tuners on every host (and that a killed tuner does not
leave held), and owners on other hosts judged by their heartbeats."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autocnn.kernels import get_operation
from autocnn.store import TuningDatabase
from autocnn.search import leases
from autocnn.search.leases import HEARTBEAT_GRACE_S, HEARTBEAT_PREFIX, OWNER_ATTR, Owner, new_owner, retire
from autocnn.measurement.sources import ReplayFile, ReplaySource
from autocnn.search.storage import StorageUrlError, open_storage, parse_storage
from autocnn.search.study_lock import StudyLockTimeout, study_lock
from autocnn.search.trials import ABANDONED_ATTR, CONFIG_ATTR, in_flight
from autocnn.search.tuner import TuneSettings, Tuner

REPO = Path(__file__).resolve().parents[1]
POOL_FILE = REPO / "tests" / "data" / "replay" / "avgpool_bwd__modern_pool.json.gz"


@pytest.mark.parametrize("url, kind", [
    ("sqlite:///tmp/x.db", "sqlite"), ("sqlite:////abs/x.db", "sqlite"), ("journal:/tmp/j", "journal"),
    ("runs/study.log", "journal"), ("memory", "memory"), ("postgresql://me@db.example/autocnn", "postgresql"),
    ("postgres://me:pw@db.example:5433/autocnn", "postgresql"),
    ("postgresql+psycopg2://me@db.example/autocnn", "postgresql"),
])
def test_accepted_storage_forms(url, kind):
    spec = parse_storage(url)
    assert spec.kind == kind
    assert spec.local == (kind in ("sqlite", "journal"))


@pytest.mark.parametrize("url, why", [
    ("notaurl", "neither a URL nor a journal file name"), ("sqlite://x.db", "three slashes"),
    ("sqlite:///", "names no SQLite file"), ("sqlite:///:memory:", "names no SQLite file"),
    ("postgresql://me@db.example", "names no database"), ("postgresql://me@db.example:port/x", "does not parse"),
    ("mysql://me@db.example/autocnn", "scheme 'mysql'"), ("journal:", "names no journal file"), ("", "empty"),
])
def test_other_storage_values_are_refused_naming_the_accepted_forms(url, why):
    with pytest.raises(StorageUrlError) as err:
        parse_storage(url)
    text = str(err.value)
    assert why in text
    for form in ("sqlite:///PATH", "postgresql://USER", "journal:PATH", ".log"):
        assert form in text


def test_storage_errors_come_before_any_device(tmp_path):
    with pytest.raises(StorageUrlError, match="notaurl"):
        TuneSettings(storage="notaurl")
    with pytest.raises(ValueError, match="positive number of seconds"):
        TuneSettings(timeout_s=-5)
    # A password never appears in the message.
    with pytest.raises(StorageUrlError) as err:
        parse_storage("postgresql://me:secret@db.example")
    assert "secret" not in str(err.value)


def test_a_postgres_study_resumes_without_measuring_again(postgres_url, tmp_path):
    rf = ReplayFile.load(POOL_FILE)
    db = TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "none")
    settings = TuneSettings(trials=10, storage=postgres_url, batch=4, confirm_rounds=1)
    first = ReplaySource([rf])
    one = Tuner(first, db, settings, progress=False).tune(rf.op, rf.problem)
    assert one.study_measured == 10 and one.record is not None
    second = ReplaySource([rf])
    more = TuneSettings(trials=20, storage=postgres_url, batch=4, confirm_rounds=1)
    two = Tuner(second, db, more, progress=False).tune(rf.op, rf.problem)
    assert two.study_measured == 20 and two.measured == 10
    searched_first = set(first.measured_keys[:10])
    assert not searched_first & set(second.measured_keys[:10])
    # The study's own attribute says which process kept it alive (heartbeats of PostgreSQL studies).
    study = optuna.load_study(study_name=one.study_name, storage=open_storage(postgres_url))
    assert any(k.startswith(HEARTBEAT_PREFIX) for k in study.user_attrs)


_HOLDER = """
import sys, time
from autocnn.search.storage import parse_storage
from autocnn.search.study_lock import study_lock
with study_lock(parse_storage(sys.argv[1]), "s"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_the_advisory_lock_orders_processes_and_dies_with_its_holder(postgres_url):
    spec = parse_storage(postgres_url)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, postgres_url], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StudyLockTimeout, match="advisory lock of study s"):
            with study_lock(spec, "s", timeout_s=0.5):
                pass
        with study_lock(spec, "another study", timeout_s=0.5):   # one lock per study
            pass
        holder.kill()   # SIGKILL: the server ends its session, and with it the lock
        holder.wait()
        start = time.monotonic()
        with study_lock(spec, "s", timeout_s=30):
            pass
        assert time.monotonic() - start < 30
    finally:
        holder.kill()
        holder.wait()


def test_owners_on_other_hosts_are_judged_by_their_heartbeats(postgres_url, monkeypatch):
    rf = ReplayFile.load(POOL_FILE)
    space = get_operation(rf.op).space(rf.problem, rf.device.limits())
    configs = list(space.feasible_configs())[:5]
    study = optuna.create_study(study_name="remote", storage=open_storage(postgres_url))
    beating = Owner("elsewhere/1", 42, 7, "a")
    silent = Owner("elsewhere/1", 43, 7, "b")
    study.set_user_attr(HEARTBEAT_PREFIX + beating.process, time.time())
    study.set_user_attr(HEARTBEAT_PREFIX + silent.process, time.time() - HEARTBEAT_GRACE_S - 5)
    trials = []
    for owner, config in zip((beating, silent, None, None), configs):
        t = study.ask()
        t.set_user_attr(CONFIG_ATTR, config.as_dict())
        if owner is not None:
            t.set_user_attr(OWNER_ATTR, owner.to_attr())
        trials.append(t)
    me = new_owner()
    try:
        flight = in_flight(study, space, me)
        # An owner-less RUNNING trial seen under the study's lock was being taken by a tuner that died.
        assert flight.keys == {configs[0].key()}
        assert [c.key() for c in flight.abandoned] == [configs[1].key(), configs[2].key(), configs[3].key()]
        # A remote owner that never wrote a heartbeat counts as gone only after STALE_TRIAL_S.
        mute = Owner("elsewhere/2", 44, 7, "c")
        t = study.ask()
        t.set_user_attr(CONFIG_ATTR, configs[4].as_dict())
        t.set_user_attr(OWNER_ATTR, mute.to_attr())
        trials.append(t)
        assert in_flight(study, space, me).keys == {configs[0].key(), configs[4].key()}
        monkeypatch.setattr(leases, "STALE_TRIAL_S", 0.0)
        flight = in_flight(study, space, me)
        assert flight.keys == {configs[0].key()} and [c.key() for c in flight.abandoned] == [configs[4].key()]
    finally:
        retire(me)
    states = [study.get_trials(deepcopy=False)[t.number] for t in trials]
    assert [s.state.name for s in states] == ["RUNNING", "FAIL", "FAIL", "FAIL", "FAIL"]
    assert "no heartbeat" in states[1].user_attrs[ABANDONED_ATTR]
