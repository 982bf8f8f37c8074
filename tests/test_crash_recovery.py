"""Crash recovery: a replay-driven tuner process is killed with SIGKILL at random points (seeded;
the seed is printed), resumed, killed again, and finally run to the end. Afterwards the storage
shows that

- each killed run lost at most one measurement (one worker: measured, but never told);
- no trial is left RUNNING: the trials of the dead processes were failed (marked abandoned) and
  their configs measured again (once more for each killed run that lost them);
- no completed config was ever measured again, and the study ends with exactly its budget.
"""
from __future__ import annotations

import json
import random
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from autocnn.search.leases import OWNER_ATTR
from autocnn.measurement.sources import ReplayFile
from autocnn.search.trials import ABANDONED_ATTR, CONFIG_ATTR
from tests.replay_workers import read_log, spawn
from tests.test_concurrent_tuning import WGRAD_FILE, measured_trials, storage_url, study_trials

TRIALS = 24
KILLS = 3
SEED = 20261123


def _key(trial) -> str:
    return json.dumps(trial.user_attrs[CONFIG_ATTR], sort_keys=True)


def _wait_for_lines(log: Path, pid: int, count: int, proc, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sum(1 for p, _, _ in read_log(log) if p == str(pid)) >= count:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("kind", ["sqlite", "journal", "postgresql"])
def test_killed_tuners_resume_losing_at_most_one_trial(kind, tmp_path, request):
    seed = SEED + ["sqlite", "journal", "postgresql"].index(kind)
    rng = random.Random(seed)
    print(f"kill points drawn with seed {seed}")
    url = storage_url(kind, tmp_path, request)
    rf = ReplayFile.load(WGRAD_FILE)
    log = tmp_path / "log"
    job = {"replay": str(WGRAD_FILE), "storage": url, "db_dir": str(tmp_path / "db"), "trials": TRIALS,
           "batch": 4, "pace_s": 0.1, "log": str(log), "result": str(tmp_path / "result.json")}
    killed: list[int] = []
    for run in range(KILLS):
        proc = spawn({**job, "seed": run})
        if run == 0:
            # Anywhere: importing, creating the study, queueing its first configs, or measuring.
            time.sleep(rng.uniform(0.3, 3.0))
        else:
            assert _wait_for_lines(log, proc.pid, 1, proc), proc.communicate()[0]
            time.sleep(rng.uniform(0.0, 0.6))
        if proc.poll() is None:
            proc.kill()
            killed.append(proc.pid)
        proc.wait()
        assert not (tmp_path / "result.json").exists(), "a run finished before its kill: draw earlier points"
    final = spawn({**job, "seed": KILLS})
    try:
        out = final.communicate(timeout=180)[0]
    finally:
        final.kill()   # never left running (a no-op once it has ended)
    assert final.returncode == 0, out
    result = json.loads((tmp_path / "result.json").read_text())

    trials = study_trials(url, rf)
    states = Counter(t.state.name for t in trials)
    assert states["RUNNING"] == 0, states
    measured = measured_trials(trials)
    assert len(measured) == TRIALS and result["study_measured"] == TRIALS
    keys = [_key(t) for t in measured]
    assert len(keys) == len(set(keys)), "a config was measured (and told) twice"

    # Each killed run lost at most one measurement: logged by its source, never told.
    entries = [(int(p), phase, key) for p, phase, key in read_log(log)]
    told_by = defaultdict(set)
    for t in measured:
        owner = t.user_attrs.get(OWNER_ATTR)
        if owner:
            told_by[owner["pid"]].add(_key(t))
    for pid in killed:
        logged = [key for p, phase, key in entries if p == pid and phase == "search"]
        lost = [key for key in logged if _norm(rf, key) not in told_by[pid]]
        assert len(lost) <= 1, f"process {pid} lost {len(lost)} measurements: {lost}"

    # The dead processes' trials were failed and their configs measured again, each once; no
    # completed config was measured again.
    abandoned = [t for t in trials if ABANDONED_ATTR in t.user_attrs]
    assert all(t.state.name == "FAIL" for t in abandoned)
    assert {_key(t) for t in abandoned if CONFIG_ATTR in t.user_attrs} <= set(keys)
    searched = [_norm(rf, key) for _, phase, key in entries if phase == "search"]
    repeats = [key for key, n in Counter(searched).items() if n > 1]
    lost_everywhere = {_norm(rf, key) for p, phase, key in entries
                       if p in killed and phase == "search" and _norm(rf, key) not in told_by[p]}
    assert set(repeats) <= lost_everywhere, "a completed config was measured again"
    # A config is measured once per killed run that lost it, plus the once that was told: a
    # requeued config can be lost again when the run that took it over is killed too.
    lost_count = Counter(_norm(rf, key) for p, phase, key in entries
                         if p in killed and phase == "search" and _norm(rf, key) not in told_by[p])
    over = {key: n for key, n in Counter(searched).items() if n > 1 + lost_count[key]}
    assert not over, f"configs measured more often than their losses explain: {over}"


def _norm(rf: ReplayFile, key: str) -> str:
    """A logged config key as the canonical JSON of its config."""
    return json.dumps(rf.results[key].config.as_dict(), sort_keys=True)
