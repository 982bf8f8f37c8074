"""Several GPUs on one run (``search/devices.py``), with replay sources standing in for GPUs: one
measuring worker per GPU; a network's problems in parallel; one problem's trials across GPUs of
one kind; GPUs of another kind in studies of their own. On a GPU host (``-m gpu``) with two GPUs
or more, the same on real GPUs."""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict
from pathlib import Path

import optuna
import pytest

from autocnn.kernels import get_operation
from autocnn.store import TuningDatabase
from autocnn.search.devices import each_problem, merge_outcomes, parse_devices, resolve_devices, tune_on_devices
from autocnn.search.network import plan_budgets
from autocnn.measurement.sources import ReplayFile, ReplaySource
from autocnn.search.tuner import TuneSettings, open_storage, study_name
from tests.test_concurrent_tuning import measured_trials

REPLAY = Path(__file__).parent / "data" / "replay"
WGRAD = REPLAY / "conv_wgrad__scherer10_l1.json.gz"
# A network's problems: three pooling shapes whose whole spaces were recorded.
FILES = [REPLAY / "avgpool_fwd__kriz09_pool.json.gz", REPLAY / "avgpool_bwd__kriz09_pool.json.gz",
         REPLAY / "avgpool_fwd__modern_pool.json.gz"]


class PacedSource(ReplaySource):
    """A replayed GPU that takes time to measure and notes when it measured what."""

    def __init__(self, files, name: str, events: list, pace_s: float = 0.01):
        super().__init__(files)
        self.name, self.events, self.pace_s = name, events, pace_s
        self.searched: dict[str, list[str]] = defaultdict(list)   # problem -> config keys (search only)
        self.lock = threading.Lock()

    def measure(self, op, problem, configs):
        for r in super().measure(op, problem, configs):
            time.sleep(self.pace_s)
            with self.lock:
                self.events.append((time.monotonic(), self.name, f"{op} {problem.shape_string()}"))
                self.searched[f"{op} {problem.shape_string()}"].append(r.config.key())
            yield r


def _files(kind: str | None = None, paths=FILES) -> list[ReplayFile]:
    files = [ReplayFile.load(f) for f in paths]
    if kind is None:
        return files
    return [dataclasses.replace(f, device=dataclasses.replace(f.device, name=kind)) for f in files]


def _settings(tmp_path, files) -> TuneSettings:
    # The parameters held fixed when the files were recorded (the same for all of them).
    return TuneSettings(storage=f"sqlite:///{tmp_path / 'optuna.db'}", batch=4, confirm_rounds=1,
                        fixed=files[0].space_filter)


def _db(tmp_path) -> TuningDatabase:
    return TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "none")


def _study_measured(url: str, rf: ReplayFile, fixed) -> list:
    # A replayed study: its name ends in the replay file's tag.
    name = study_name(rf.device, rf.op, rf.problem, get_operation(rf.op).fingerprint(), fixed, f"replay:{rf.digest}")
    return measured_trials(optuna.load_study(study_name=name, storage=open_storage(url)).get_trials(deepcopy=False))


def test_one_problems_trials_are_split_across_gpus_of_one_kind(tmp_path):
    files = _files(paths=[WGRAD])
    wgrad = files[0]
    events: list = []
    gpus = [PacedSource(files, f"A{i}", events) for i in range(2)]
    settings = _settings(tmp_path, files)
    outcomes = tune_on_devices(gpus, each_problem([wgrad.problem], 24), settings, _db(tmp_path))
    assert len(outcomes) == 1
    o = outcomes[0]
    key = f"{wgrad.op} {wgrad.problem.shape_string()}"
    mine = [g.searched[key] for g in gpus]
    assert all(mine), "each GPU measured some of the problem's trials"
    both = [k for m in mine for k in m]
    confirmations = len(both) - len(set(both))   # each GPU re-times its contenders once at the end
    assert len(set(both)) == 24 and confirmations <= 2 * 3
    assert o.measured == o.study_measured == 24
    assert len(_study_measured(settings.storage, wgrad, settings.fixed)) == 24
    assert o.record is not None and o.device.count("GPU") == 2


def test_a_networks_problems_run_in_parallel_and_each_kind_tunes_for_itself(tmp_path):
    events: list = []
    a_files, b_files = _files(), _files("NVIDIA B200")
    gpus = [PacedSource(a_files, "A0", events), PacedSource(a_files, "A1", events),
            PacedSource(b_files, "B0", events)]
    settings = _settings(tmp_path, a_files)
    budgets = plan_budgets([f.problem for f in a_files], total_trials=36)
    heard = []
    outcomes = tune_on_devices(gpus, budgets, settings, _db(tmp_path), on_outcome=heard.append)
    assert len(outcomes) == 6 and len(heard) == 6          # every problem, once per kind
    assert {o.op for o in outcomes[:3]} == {f.op for f in a_files}
    assert [("B200" in o.device) for o in outcomes] == [False] * 3 + [True] * 3

    # Same-kind GPUs worked at once on different problems of the network.
    spans = defaultdict(list)
    for t, gpu, problem in events:
        spans[(gpu, problem)].append(t)
    def first(gpu):
        return min((ts[0], problem) for (g, problem), ts in spans.items() if g == gpu)[1]

    p0, p1 = first("A0"), first("A1")
    assert p0 != p1, "each A GPU started a problem of its own"
    assert max(spans[("A0", p0)][0], spans[("A1", p1)][0]) < min(spans[("A0", p0)][-1], spans[("A1", p1)][-1]), \
        "the two problems were measured at the same time"

    # Each kind's study holds its budget, measured by its own GPUs only; records for both kinds.
    db = _db(tmp_path)
    for b, rf_a, rf_b in zip(budgets, a_files, b_files):
        key = f"{rf_a.op} {rf_a.problem.shape_string()}"
        for rf, members in ((rf_a, gpus[:2]), (rf_b, gpus[2:])):
            trials = _study_measured(settings.storage, rf, settings.fixed)
            space = get_operation(rf.op).space(rf.problem, rf.device.limits()).restrict(settings.fixed)
            assert len(trials) == min(b.trials, len(space.feasible_configs()))
            searched = {k for g in members for k in g.searched[key]}
            assert {rf.results[k].config.key() for k in searched} >= {
                space.validate(t.user_attrs["config"], check_feasible=False).key() for t in trials}
        assert db.lookup(rf_a.device, rf_a.problem).source == "exact"
        assert db.lookup(rf_b.device, rf_b.problem).source == "exact"
    assert not gpus[2].searched.keys() - {f"{f.op} {f.problem.shape_string()}" for f in b_files}


def test_a_failing_gpu_ends_the_run_with_its_error(tmp_path):
    class Broken(ReplaySource):
        def measure(self, op, problem, configs):
            raise RuntimeError("the GPU fell off the bus")

    files = _files()
    with pytest.raises(RuntimeError, match="fell off the bus"):
        tune_on_devices([Broken(files)], each_problem([files[1].problem], 8), _settings(tmp_path, files),
                        _db(tmp_path))


def test_merged_outcome_counts_every_gpus_work():
    from autocnn.search.settings import TuneOutcome
    from autocnn.measurement.sources import TrialResult

    config = next(iter(_files()[1].results.values())).config
    a = TuneOutcome("op", None, "s", TrialResult(config, True, 5.0), None, measured=3, study_measured=5,
                    device="GPU 0", stopped_because="first")
    b = TuneOutcome("op", None, "s", TrialResult(config, True, 4.0), None, measured=2, study_measured=6,
                    device="GPU 1", stopped_because="last")
    m = merge_outcomes([a, b])
    assert (m.measured, m.study_measured, m.best.time_us, m.device, m.stopped_because) == (
        5, 6, 4.0, "GPU 0, GPU 1", "last")


@pytest.mark.parametrize("text, expected", [(None, [0]), ("0", [0]), ("0,1, 3", [0, 1, 3]), ("all", "all"),
                                            ("ALL", "all")])
def test_devices_argument(text, expected):
    assert parse_devices(text) == expected


@pytest.mark.parametrize("text", ["", "0,,1", "-1", "gpu0", "0,0", "1.5"])
def test_devices_argument_refused(text):
    with pytest.raises(ValueError, match="--devices"):
        parse_devices(text)


def test_devices_resolved_against_the_host():
    assert resolve_devices("all", 4) == [0, 1, 2, 3]
    assert resolve_devices([1, 0], 2) == [1, 0]
    with pytest.raises(ValueError, match="GPU 2 does not exist; this host has 2"):
        resolve_devices([0, 2], 2)
    with pytest.raises(ValueError, match="no CUDA GPU"):
        resolve_devices("all", 0)


@pytest.mark.gpu
def test_every_gpu_of_this_host_tunes_a_network(tmp_path):
    """On a host with two GPUs or more: lenet5's kernels tuned on all of them at once; each GPU
    measures, every problem gets a verified record for its kind."""
    from autocnn.nn.zoo import load_network
    from autocnn.search.devices import device_count, open_gpu_sources

    count = device_count()
    if count < 2:
        pytest.skip(f"needs two GPUs or more; this host has {count}")
    problems = load_network("lenet5").problems(64)
    settings = TuneSettings(storage=f"sqlite:///{tmp_path / 'optuna.db'}", batch=8)
    db = _db(tmp_path)
    with open_gpu_sources(resolve_devices("all", count)) as opened:
        outcomes = tune_on_devices(opened.sources, plan_budgets(problems, 16 * len(set(problems))), settings, db)
    assert outcomes and all(o.record is not None for o in outcomes)
    gpus_used = {d for o in outcomes for d in o.device.split(", ")}
    assert len(gpus_used) >= 2, gpus_used


def test_gpus_share_an_in_memory_study_and_separate_runs_do_not(tmp_path):
    files = _files()
    gpus = [PacedSource(files, f"A{i}", [], pace_s=0.0) for i in range(2)]
    settings = dataclasses.replace(_settings(tmp_path, files), storage="memory")
    o = tune_on_devices(gpus, each_problem([files[1].problem], 16), settings, _db(tmp_path))[0]
    both = [k for g in gpus for k in g.searched[f"{files[1].op} {files[1].problem.shape_string()}"]]
    assert o.measured == o.study_measured == 16 and len(set(both)) == 16
    # A second run on "memory" starts afresh (replay experiments rely on it).
    again = tune_on_devices(gpus[:1], each_problem([files[1].problem], 16), settings, _db(tmp_path))[0]
    assert again.measured == 16


def test_workers_that_cannot_hold_their_gpus_leave_no_process_behind():
    """``open_gpu_sources`` launches every GPU's worker before waiting for any; when one cannot hold
    its GPU (here GPU 99, which no host has; on a host without a GPU, GPU 0 already), the error names
    the GPU and every launched worker is stopped."""
    import multiprocessing

    from autocnn.errors import DeviceError
    from autocnn.search.devices import open_gpu_sources

    with pytest.raises(DeviceError, match=r"the measurement worker cannot use GPU (0|99)"):
        open_gpu_sources([0, 99], timeout_s=30)
    assert not [p for p in multiprocessing.active_children() if p.is_alive()]
