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
    # A replay file holds no measurement of this config: nothing is known of the config itself, so
    # it is neither a result nor a failure (not ok, no failure class, not measured).
    replay_miss: bool = False

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
    # Recorded answers rather than measurements: the tuner keeps such studies apart
    # (``study_tag``) and applies the parameters the recording held (``held_for``).
    replayed: bool

    def measure(self, op: str, problem: Any, configs: Sequence[Config]) -> Iterator[TrialResult]:
        """Results in the order of ``configs``; a failure is a result, never an exception."""
        ...

    def close(self) -> None:
        ...


class GpuSource:
    """Measures on a CUDA device: nvcc in a compile pool, verification and timing in a worker process."""

    replayed = False

    def __init__(self, device_id: int = 0, timeout_s: float = 60.0, budget_s: float = 0.1,
                 compile_workers: int | None = None, allow_spills: bool = False,
                 pools: dict[str, Any] | None = None, worker: Any = None):
        """``pools``: nvcc pools by architecture shared with other sources (GPUs of one host): this
        source takes its architecture's, or adds one, and leaves closing them to the owner.
        ``worker``: a MeasureWorker of ``device_id`` already launched (``open_gpu_sources`` starts
        several GPUs' workers at once); by default this source starts its own."""
        from autocnn.kernels.compiler import CompilePool
        from autocnn.measurement.worker import MeasureWorker

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
        from autocnn.measurement.worker import MeasureJob

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


class ReplayFileError(ValueError):
    """A replay file that cannot be read, or that does not serve the run it is given to; names the file."""


@dataclass
class ReplayFile:
    """Recorded measurements of one problem on one GPU: config -> time or failure class.

    ``space_filter`` holds the parameters that were held at one value while recording (what
    ``autocnn tune --fix`` holds): the file answers only configs with those values, so a tune that
    replays it holds them too (``held``); a config outside it is a replay miss, not a failure."""

    device: DeviceInfo
    op: str
    problem: Any
    fingerprint: str
    space_filter: dict[str, Any]             # parameters held fixed when recording (empty: whole space)
    exhaustive: bool
    results: dict[str, TrialResult]          # by Config.key()
    path: Path | None = None                 # where it was read from, for messages

    @property
    def held(self) -> dict[str, Any]:
        """The held parameters (--fix) this file serves."""
        return dict(self.space_filter)

    @property
    def digest(self) -> str:
        """A short hash of what the file answers: replayed studies of different files stay apart."""
        import hashlib

        text = json.dumps([self.op, self.problem.to_dict(), self.fingerprint, self.device.to_dict(),
                           sorted(self.results)], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def name(self) -> str:
        return str(self.path) if self.path is not None else f"the replay file of {self.op} {self.problem.shape_string()}"

    def to_dict(self) -> dict[str, Any]:
        return {"format": REPLAY_FORMAT, "device": self.device.to_dict(), "op": self.op,
                "problem": self.problem.to_dict(), "fingerprint": self.fingerprint,
                "space_filter": self.space_filter, "exhaustive": self.exhaustive,
                "results": [r.to_dict() for r in self.results.values()]}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=0, sort_keys=True))

    @staticmethod
    def load(path: Path) -> "ReplayFile":
        """Read a replay file; ReplayFileError naming the file where it is missing, not a replay file
        or of another format."""
        path = Path(path)
        try:
            if path.suffix == ".gz":
                import gzip

                with gzip.open(path, "rt", encoding="utf-8") as fh:
                    data = json.load(fh)
            else:
                data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ReplayFileError(f"replay file {path} does not exist") from None
        except IsADirectoryError:
            raise ReplayFileError(f"replay file {path} is a directory; give the recorded files themselves") from None
        except (OSError, EOFError, UnicodeDecodeError, ValueError) as exc:   # gzip, JSON, text
            raise ReplayFileError(f"replay file {path} cannot be read: {type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
        if not isinstance(data, dict) or data.get("format") != REPLAY_FORMAT:
            found = data.get("format") if isinstance(data, dict) else None
            raise ReplayFileError(f"replay file {path}: replay format {found!r}, expected {REPLAY_FORMAT} "
                                  f"(files written by scripts/record_replay.py)")
        try:
            op = data["op"]
            results = {}
            for r in data["results"]:
                config = Config(op, tuple(r["config"].items()))
                failure = FailureClass(r["failure"]) if r.get("failure") else None
                results[config.key()] = TrialResult(config, bool(r["ok"]), r.get("time_us"), failure,
                                                    r.get("message", ""), r.get("timing"), r.get("resources", {}))
            held = data.get("space_filter", {})
            if not isinstance(held, dict):
                raise TypeError(f"space_filter is {type(held).__name__}, not a mapping")
            return ReplayFile(DeviceInfo.from_dict(data["device"]), op, problem_from_dict(data["problem"]),
                              data["fingerprint"], held, bool(data.get("exhaustive")), results, path)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ReplayFileError(f"replay file {path} is malformed: {type(exc).__name__}: {exc}") from None

    def best(self) -> TrialResult | None:
        ok = [r for r in self.results.values() if r.ok and r.time_us is not None]
        return min(ok, key=lambda r: r.time_us) if ok else None


class ReplaySource:
    """Answers from recorded measurements; a config that was not recorded is a replay miss."""

    NOT_RECORDED = "not recorded in the replay file"
    replayed = True

    def __init__(self, files: Iterable[ReplayFile]):
        self.files = list(files)
        if not self.files:
            raise ValueError("a replay source needs at least one recorded file")
        self.device = self.files[0].device
        self.calls = 0
        self.measured_keys: list[str] = []

    def find(self, op: str, problem: Any) -> ReplayFile | None:
        for f in self.files:
            if f.op == op and f.problem == problem:
                return f
        return None

    def file_for(self, op: str, problem: Any) -> ReplayFile:
        found = self.find(op, problem)
        if found is None:
            have = "; ".join(f"{f.name()}: {f.op} {f.problem.shape_string()}" for f in self.files)
            raise ReplayFileError(f"no replay file holds {op} {problem.shape_string()} (given: {have})")
        return found

    def study_tag(self, op: str, problem: Any) -> str:
        """What a replayed study's name ends in: never the name of a measured study, and apart for
        each recorded file (a config one file lacks another may hold)."""
        found = self.find(op, problem)
        return f"replay:{found.digest}" if found is not None else "replay"

    def held_for(self, op: str, problem: Any) -> dict[str, Any]:
        """The parameters the recording of this problem held (--fix); {} where no file holds it
        (measuring it then says so)."""
        found = self.find(op, problem)
        return found.held if found is not None else {}

    def measure(self, op: str, problem: Any, configs: Sequence[Config]) -> Iterator[TrialResult]:
        f = self.file_for(op, problem)
        for config in configs:
            self.calls += 1
            self.measured_keys.append(config.key())
            r = f.results.get(config.key())
            if r is None:
                yield TrialResult(config, False, message=self.NOT_RECORDED, replay_miss=True)
            else:
                yield r

    def close(self) -> None:
        pass


def study_tag(source: Any, op: str, problem: Any) -> str | None:
    """The tag that keeps a replayed study apart from measured ones (None for a measuring source)."""
    return source.study_tag(op, problem) if getattr(source, "replayed", False) else None


def held_for(source: Any, op: str, problem: Any) -> dict[str, Any]:
    """The parameters a replay source's recording held for this problem ({} for a measuring source)."""
    return source.held_for(op, problem) if getattr(source, "replayed", False) else {}
