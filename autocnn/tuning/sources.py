"""Where measurements come from: the GPU, or a file of recorded GPU measurements (replay).

The tuner, the benchmark and the tests ask a MeasurementSource to measure a batch of configs of one
problem and get one TrialResult per config. On the GPU, compilation runs ahead in a pool while a
worker process verifies and times what has been compiled; in replay, answers come from a file
recorded on a GPU, so the search and the database are tested on the CPU with real data.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Protocol, Sequence

from autocnn.device import DeviceInfo
from autocnn.errors import FailureClass
from autocnn.kernels import get_operation, problem_from_dict
from autocnn.kernels.space import Config


@dataclass(frozen=True)
class TrialResult:
    config: Config
    ok: bool
    time_us: float | None = None           # median of the timing protocol
    failure: FailureClass | None = None
    message: str = ""
    timing: dict[str, Any] | None = None   # median, quartiles, min, reps
    resources: dict[str, Any] = field(default_factory=dict)   # registers, spills per kernel

    @property
    def measured(self) -> bool:
        """True when GPU time was spent on it (a failure found only statically or at compile is not)."""
        return self.ok or self.failure in (FailureClass.WRONG_RESULT, FailureClass.TIMEOUT,
                                           FailureClass.DEVICE_ERROR, FailureClass.LAUNCH_ERROR)

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.as_dict(), "ok": self.ok, "time_us": self.time_us,
                "failure": self.failure.value if self.failure else None, "message": self.message,
                "timing": self.timing, "resources": self.resources}


class MeasurementSource(Protocol):
    device: DeviceInfo

    def measure(self, op: str, problem: Any, configs: Sequence[Config]) -> Iterator[TrialResult]:
        """Results in the order of ``configs``; a failure is a result, never an exception."""
        ...

    def close(self) -> None:
        ...


class GpuSource:
    """Measures on a CUDA device: nvcc in a compile pool, verification and timing in a worker process."""

    def __init__(self, device_id: int = 0, timeout_s: float = 60.0, budget_s: float = 0.1,
                 compile_workers: int | None = None, allow_spills: bool = False,
                 pools: dict[str, Any] | None = None, worker: Any = None):
        """``pools``: nvcc pools by architecture shared with other sources (GPUs of one host): this
        source takes its architecture's, or adds one, and leaves closing them to the owner.
        ``worker``: a MeasureWorker of ``device_id`` already launched (``open_gpu_sources`` starts
        several GPUs' workers at once); by default this source starts its own."""
        from autocnn.kernels.compiler import CompilePool
        from autocnn.tuning.worker import MeasureWorker

        if worker is None:
            self.worker = MeasureWorker(device_id, timeout_s=timeout_s)
            self.worker.start()
        else:
            self.worker = worker
            if worker.device is None:
                worker.wait_ready()
        assert self.worker.device is not None
        self.device = DeviceInfo.from_dict(self.worker.device)
        self._owns_pool = pools is None
        if pools is None:
            self.pool = CompilePool(self.device.arch, workers=compile_workers)
        else:
            self.pool = pools.get(self.device.arch) or pools.setdefault(
                self.device.arch, CompilePool(self.device.arch, workers=compile_workers))
        self.budget_s = budget_s
        self.allow_spills = allow_spills
        self.rng = random.Random()

    def measure(self, op: str, problem: Any, configs: Sequence[Config]) -> Iterator[TrialResult]:
        from autocnn.kernels.compiler import resource_violations
        from autocnn.tuning.worker import MeasureJob

        operation = get_operation(op)
        plans = [self.plan_for(operation, problem, c) for c in configs]
        futures = [self.pool.submit(p) for p in plans]
        for config, plan, fut in zip(configs, plans, futures):
            exc = fut.exception()
            if exc is not None:
                yield TrialResult(config, False, failure=FailureClass.COMPILE_ERROR, message=str(exc)[:2000])
                continue
            module = fut.result()
            resources = {k: asdict(v) for k, v in module.reports.items()}
            reasons = resource_violations(module, plan, self.device.regs_per_sm, self.device.max_smem_per_block,
                                          allow_spills=self.allow_spills)
            if reasons:
                yield TrialResult(config, False, failure=FailureClass.INFEASIBLE, message="; ".join(reasons),
                                  resources=resources)
                continue
            job = MeasureJob(op, problem.to_dict(), config.as_dict(), module.cubin_path,
                             seed=self.rng.randrange(2**31), budget_s=self.budget_s)
            r = self.worker.run(job)
            yield TrialResult(config, r.ok, r.median_us, r.failure_class, r.message, r.timing, resources)

    def plan_for(self, operation: Any, problem: Any, config: Config) -> Any:
        """The plan to compile for a config (a hook: the fault-injection run plants bad kernels here)."""
        return operation.plan(problem, config)

    def close(self) -> None:
        if self._owns_pool:
            self.pool.close()
        self.worker.close()


# -- replay ---------------------------------------------------------------------------------------

REPLAY_FORMAT = 1


@dataclass
class ReplayFile:
    """Recorded measurements of one problem on one GPU: config -> time or failure class."""

    device: DeviceInfo
    op: str
    problem: Any
    fingerprint: str
    space_filter: dict[str, Any]             # parameters held fixed when recording (empty: whole space)
    exhaustive: bool
    results: dict[str, TrialResult]          # by Config.key()

    def to_dict(self) -> dict[str, Any]:
        return {"format": REPLAY_FORMAT, "device": self.device.to_dict(), "op": self.op,
                "problem": self.problem.to_dict(), "fingerprint": self.fingerprint,
                "space_filter": self.space_filter, "exhaustive": self.exhaustive,
                "results": [r.to_dict() for r in self.results.values()]}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=0, sort_keys=True))

    @staticmethod
    def load(path: Path) -> "ReplayFile":
        path = Path(path)
        if path.suffix == ".gz":
            import gzip

            with gzip.open(path, "rt") as fh:
                data = json.load(fh)
        else:
            data = json.loads(path.read_text())
        if data.get("format") != REPLAY_FORMAT:
            raise ValueError(f"{path}: replay format {data.get('format')!r}, expected {REPLAY_FORMAT}")
        op = data["op"]
        results = {}
        for r in data["results"]:
            config = Config(op, tuple(r["config"].items()))
            failure = FailureClass(r["failure"]) if r.get("failure") else None
            results[config.key()] = TrialResult(config, bool(r["ok"]), r.get("time_us"), failure,
                                                r.get("message", ""), r.get("timing"), r.get("resources", {}))
        return ReplayFile(DeviceInfo.from_dict(data["device"]), op, problem_from_dict(data["problem"]),
                          data["fingerprint"], data.get("space_filter", {}), bool(data.get("exhaustive")),
                          results)

    def best(self) -> TrialResult | None:
        ok = [r for r in self.results.values() if r.ok and r.time_us is not None]
        return min(ok, key=lambda r: r.time_us) if ok else None


class ReplaySource:
    """Answers from recorded measurements; a config that was not recorded is reported as such."""

    NOT_RECORDED = "not recorded in the replay file"

    def __init__(self, files: Iterable[ReplayFile]):
        self.files = list(files)
        if not self.files:
            raise ValueError("a replay source needs at least one recorded file")
        self.device = self.files[0].device
        self.calls = 0
        self.measured_keys: list[str] = []

    def file_for(self, op: str, problem: Any) -> ReplayFile:
        for f in self.files:
            if f.op == op and f.problem == problem:
                return f
        raise KeyError(f"no replay file for {op} {problem.shape_string()}")

    def measure(self, op: str, problem: Any, configs: Sequence[Config]) -> Iterator[TrialResult]:
        f = self.file_for(op, problem)
        for config in configs:
            self.calls += 1
            self.measured_keys.append(config.key())
            r = f.results.get(config.key())
            if r is None:
                yield TrialResult(config, False, failure=FailureClass.INFEASIBLE, message=self.NOT_RECORDED)
            else:
                yield r

    def close(self) -> None:
        pass
