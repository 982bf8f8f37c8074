"""Several GPUs on one tuning run: one measuring worker (a MeasurementSource) per GPU.

GPUs are grouped by kind (the identity a record's key holds: name, compute capability, SMs, CUDA
runtime and driver); only GPUs of one kind share a study, and each kind tunes every problem for
itself, since a record is true for its kind only. Within a kind, the problems run in parallel, the
longest expected first, one per GPU; a GPU with no unstarted problem left joins the running
problem with the most expected time per GPU on it, and the study's lock (``study_lock``) splits that
problem's trials between them without measuring a config twice. A problem ends for everyone once
any of its tuners ends (its study's budget spent, its time up, or its space exhausted).
"""
from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from autocnn.search.network import ProblemBudget
from autocnn.search.settings import TuneOutcome, TuneSettings, check_timeout
from autocnn.measurement.sources import MeasurementSource
from autocnn.search.study_lock import shared_storage


def parse_devices(text: str | None) -> list[int] | str:
    """``--devices``: "0,1,3" -> [0, 1, 3]; "all" -> "all"; None -> [0]. Checked before any GPU is touched."""
    if text is None:
        return [0]
    text = text.strip()
    if text.lower() == "all":
        return "all"
    ids: list[int] = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit():
            raise ValueError(f"--devices takes GPU indices separated by commas (0,1,2) or all, not {text!r}")
        if int(item) in ids:
            raise ValueError(f"--devices names GPU {int(item)} twice in {text!r}")
        ids.append(int(item))
    return ids


def device_count() -> int:
    """How many CUDA GPUs this host has (DeviceError where CuPy or the driver is missing)."""
    from autocnn.errors import DeviceError
    from autocnn.gpu import require_cupy

    cp = require_cupy()
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except cp.cuda.runtime.CUDARuntimeError as exc:
        raise DeviceError(f"cannot count the GPUs: {exc}") from None


def resolve_devices(devices: list[int] | str, count: int) -> list[int]:
    """The GPU indices to use, checked against the ``count`` this host has."""
    if devices == "all":
        if count < 1:
            raise ValueError("--devices all: this host has no CUDA GPU")
        return list(range(count))
    missing = [d for d in devices if d >= count]
    if missing:
        raise ValueError(f"--devices: GPU {missing[0]} does not exist; this host has {count} "
                         f"(indices 0 to {count - 1})")
    return list(devices)


@dataclass
class GpuSources:
    """The sources of several GPUs and the nvcc pools they share; ``close`` ends them all."""

    sources: list[Any]
    pools: dict[str, Any]

    @property
    def device(self) -> Any:
        """The first source's GPU (all of a run's kinds are its sources' devices)."""
        return self.sources[0].device

    def close(self) -> None:
        for source in self.sources:
            source.close()
        for pool in self.pools.values():
            pool.close()

    def __enter__(self) -> "GpuSources":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_gpu_sources(device_ids: Sequence[int], timeout_s: float = 60.0, budget_s: float = 0.1) -> GpuSources:
    """One GpuSource (measuring worker) per GPU; GPUs of one architecture share one nvcc pool,
    which has the host's cores. The workers start together: each takes seconds to hold its GPU."""
    from autocnn.measurement.sources import GpuSource
    from autocnn.measurement.worker import MeasureWorker

    opened = GpuSources([], {})
    workers = [MeasureWorker(device_id, timeout_s=timeout_s) for device_id in device_ids]
    try:
        for worker in workers:
            worker.launch()
        for device_id, worker in zip(device_ids, workers):
            opened.sources.append(GpuSource(device_id, timeout_s=timeout_s, budget_s=budget_s, pools=opened.pools,
                                            worker=worker))
    except BaseException:
        opened.close()
        for worker in workers[len(opened.sources):]:   # launched, not yet a source's
            worker.close()
        raise
    return opened


def kind_of(source: MeasurementSource) -> tuple:
    """What makes two GPUs one kind: the GPU identity a record's key holds."""
    d = source.device
    return (d.name, d.compute_capability, d.sm_count, d.cuda_runtime, d.driver)


def each_problem(problems: Sequence[Any], trials: int, timeout_s: float | None = None) -> list[ProblemBudget]:
    """Every distinct problem with the full budget (a shape, a suite, stale shapes)."""
    from autocnn.search.network import expected_seconds

    check_timeout(timeout_s)
    unique: list[Any] = []
    for p in problems:
        if p not in unique:
            unique.append(p)
    return [ProblemBudget(p, trials, timeout_s, expected_seconds(p.op, p)) for p in unique]


@dataclass
class _Work:
    budget: ProblemBudget
    order: int
    workers: set[int] = field(default_factory=set)   # every GPU that took it
    active: int = 0                                   # GPUs on it now
    done: bool = False                                # a tuner ended: its study is finished
    outcomes: list[TuneOutcome] = field(default_factory=list)


class _Schedule:
    """Which problem each GPU of one kind takes next."""

    def __init__(self, budgets: Sequence[ProblemBudget]):
        self.items = [_Work(b, i) for i, b in enumerate(budgets)]
        self.lock = threading.Lock()

    def next_for(self, worker: int) -> _Work | None:
        with self.lock:
            waiting = [w for w in self.items if not w.workers]
            if waiting:
                work = max(waiting, key=lambda w: (w.budget.weight, -w.order))
            else:
                running = [w for w in self.items if not w.done and w.active and worker not in w.workers]
                if not running:
                    return None
                work = max(running, key=lambda w: (w.budget.weight / w.active, -w.order))
            work.workers.add(worker)
            work.active += 1
            return work

    def finished(self, work: _Work, outcome: TuneOutcome | None) -> TuneOutcome | None:
        """Note a GPU's end on a problem; the problem's merged outcome once its last GPU is done."""
        with self.lock:
            work.done = True
            work.active -= 1
            if outcome is not None:
                work.outcomes.append(outcome)
            if work.active == 0 and work.outcomes:
                return merge_outcomes(work.outcomes)
            return None


def tune_on_devices(sources: Sequence[MeasurementSource], budgets: Sequence[ProblemBudget], settings: TuneSettings,
                    db: Any, log: Callable[[str], None] | None = None,
                    on_outcome: Callable[[TuneOutcome], None] | None = None) -> list[TuneOutcome]:
    """Tune every problem on every kind of GPU among ``sources``, each GPU one measuring worker.
    One outcome per (kind, problem), in the order of the kinds' first GPUs and of ``budgets``;
    ``on_outcome`` hears of each as soon as its last GPU is done with it (one line per problem)."""
    from autocnn.search.tuner import Tuner

    if not sources:
        raise ValueError("tuning on devices needs at least one measurement source")
    groups: dict[tuple, list[int]] = {}
    for i, source in enumerate(sources):
        groups.setdefault(kind_of(source), []).append(i)
    schedules = {kind: _Schedule(budgets) for kind in groups}
    storage = shared_storage(settings.storage_spec)   # one for every GPU (also an in-memory one)
    errors: list[BaseException] = []
    report_lock = threading.Lock()

    def worker(index: int, schedule: _Schedule) -> None:
        source = sources[index]
        while not errors:
            work = schedule.next_for(index)
            if work is None:
                return
            b = work.budget
            if log:
                log(f"{_label(source, index)}: {b.problem.op} {b.problem.shape_string()} ({b.trials} trials)")
            try:
                outcome = Tuner(source, db, settings, progress=False, log=log, storage=storage).tune(
                    b.problem.op, b.problem, trials=b.trials, timeout_s=b.timeout_s)
                outcome.device = _label(source, index)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(exc)
                schedule.finished(work, None)
                return
            merged = schedule.finished(work, outcome)
            if merged is not None and on_outcome is not None:
                with report_lock:
                    on_outcome(merged)

    threads = [threading.Thread(target=worker, args=(i, schedules[kind]), name=f"autocnn-tune-{i}", daemon=True)
               for kind, members in groups.items() for i in members]
    for t in threads:
        t.start()
    _join_all(threads)   # daemon threads: an interrupt ends the run; the studies keep what was told
    if errors:
        raise errors[0]
    return [merge_outcomes(work.outcomes) for kind in groups for work in schedules[kind].items if work.outcomes]


def _join_all(threads: Sequence[threading.Thread]) -> None:
    for t in threads:
        while t.is_alive():
            t.join(0.5)   # a timed join keeps the main thread interruptible


def _label(source: Any, index: int) -> str:
    device_id = getattr(getattr(source, "worker", None), "device_id", None)
    return f"GPU {device_id if device_id is not None else index} ({source.device.name})"


def merge_outcomes(outcomes: Sequence[TuneOutcome]) -> TuneOutcome:
    """One problem's outcome from the tuners (one per GPU) that worked on its study."""
    first = outcomes[0]
    ranked = sorted((o for o in outcomes if o.best is not None), key=lambda o: o.best.time_us)
    stored = [o for o in outcomes if o.record is not None]
    last = max(outcomes, key=lambda o: o.study_measured)
    failures: Counter = Counter()
    for o in outcomes:
        failures.update(o.failures)
    return replace(
        first,
        best=ranked[0].best if ranked else None,
        default=next((o.default for o in outcomes if o.default is not None), None),
        measured=sum(o.measured for o in outcomes), infeasible=sum(o.infeasible for o in outcomes),
        reused=sum(o.reused for o in outcomes), failures=failures, seconds=max(o.seconds for o in outcomes),
        record=min(stored, key=lambda o: o.record.time_us).record if stored else None,
        stopped_because=last.stopped_because, study_measured=last.study_measured,
        recovered=sum(o.recovered for o in outcomes), device=", ".join(o.device for o in outcomes),
        replay_misses=sum(o.replay_misses for o in outcomes),
        unsaved_path=next((o.unsaved_path for o in outcomes if o.unsaved_path is not None), None))
