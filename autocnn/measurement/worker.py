"""Measurement in a worker process, so that a bad variant cannot end the run that tries it.

A variant that reads out of bounds breaks the CUDA context for good; one that never finishes
blocks the process. Both are contained here: the parent waits for each job with a timeout, kills
and restarts the worker after a timeout or a sticky CUDA error, and hands back a typed result.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

from autocnn.errors import FailureClass

DEFAULT_TIMEOUT_S = 60.0
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class MeasureJob:
    op: str
    problem: dict[str, Any]           # problem.to_dict()
    config: dict[str, Any]            # config.as_dict(); validated again in the worker
    cubin_path: str | None = None     # nvcc output; None compiles with NVRTC in the worker
    seed: int | None = None
    time_it: bool = True
    budget_s: float = 0.25


@dataclass(frozen=True)
class MeasureResult:
    ok: bool
    failure: str | None = None        # a FailureClass value
    message: str = ""
    timing: dict[str, Any] | None = None
    errors: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failure_class(self) -> FailureClass | None:
        return FailureClass(self.failure) if self.failure else None

    @property
    def median_us(self) -> float | None:
        return None if self.timing is None else float(self.timing["median_us"])


def _serve(conn: Any, device_id: int) -> None:
    """The worker's loop: one job in, one result out, until the pipe closes or the context breaks."""
    os.environ.setdefault("CUPY_CACHE_IN_MEMORY", "0")
    from autocnn.errors import AutocnnError, DeviceError, LaunchError
    from autocnn.gpu import require_cupy

    try:
        cp = require_cupy()
        cp.cuda.Device(device_id).use()
        from autocnn.device import current_device
        from autocnn.measurement.measure import L2Flusher, check_candidate
        from autocnn.kernels import get_operation, problem_from_dict
        from autocnn.kernels.runtime import KernelLoader

        info = current_device(device_id)
        flusher = L2Flusher(info.l2_bytes)
        loader = KernelLoader()
        conn.send(("ready", info.to_dict()))
    except Exception as exc:  # no GPU, no CuPy: the parent reports it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return

    while True:
        try:
            job: MeasureJob = conn.recv()
        except (EOFError, OSError):
            return
        start = time.perf_counter()
        sticky = False
        try:
            operation = get_operation(job.op)
            problem = problem_from_dict(job.problem)
            space = operation.space(problem, info.limits())
            config = space.validate(job.config)
            plan = operation.plan(problem, config)
            loaded = loader.load(plan, job.cubin_path)
            check = check_candidate(loaded, problem, seed=job.seed, time_it=job.time_it, flusher=flusher,
                                    budget_s=job.budget_s)
            cp.cuda.get_current_stream().synchronize()
            v = check.verification
            if v.passed:
                result = MeasureResult(True, None, "ok", check.timing.to_dict() if check.timing else None,
                                       v.errors, time.perf_counter() - start)
            else:
                result = MeasureResult(False, FailureClass.WRONG_RESULT.value, v.message, None, v.errors,
                                       time.perf_counter() - start)
        except LaunchError as exc:
            result = MeasureResult(False, exc.failure_class.value, str(exc), seconds=time.perf_counter() - start)
        except AutocnnError as exc:
            sticky = isinstance(exc, DeviceError)
            result = MeasureResult(False, exc.failure_class.value, str(exc), seconds=time.perf_counter() - start)
        except (cp.cuda.runtime.CUDARuntimeError, cp.cuda.driver.CUDADriverError) as exc:
            # Illegal addresses and the like poison the context: report, then let the parent restart us.
            sticky = True
            result = MeasureResult(False, FailureClass.DEVICE_ERROR.value, f"{type(exc).__name__}: {exc}",
                                   seconds=time.perf_counter() - start)
        except Exception as exc:
            sticky = True
            result = MeasureResult(False, FailureClass.DEVICE_ERROR.value,
                                   f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}",
                                   seconds=time.perf_counter() - start)
        conn.send(("result", result))
        if sticky:
            return


class MeasureWorker:
    """One measurement process bound to one GPU; restarted whenever a job breaks it."""

    def __init__(self, device_id: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.device_id = device_id
        self.timeout_s = timeout_s
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self.device: dict[str, Any] | None = None
        self.restarts = 0
        self._launched: Any = None   # (process, pipe) between launch and wait_ready

    def start(self) -> None:
        """Start the process and wait until it holds its GPU (DeviceError when it cannot)."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the process without waiting for it: several GPUs' workers then start together
        (each spends seconds importing CuPy and creating its CUDA context)."""
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, args=(child, self.device_id), daemon=True)
        proc.start()
        child.close()
        self._launched = (proc, parent)

    def wait_ready(self) -> None:
        """Wait until the launched process holds its GPU (DeviceError when it cannot)."""
        proc, parent = self._launched
        self._launched = None
        if not parent.poll(START_TIMEOUT_S):
            proc.kill()
            raise RuntimeError(f"the measurement worker for GPU {self.device_id} did not start")
        kind, payload = parent.recv()
        if kind != "ready":
            proc.join(5)
            from autocnn.errors import DeviceError

            raise DeviceError(f"the measurement worker cannot use GPU {self.device_id}: {payload}")
        self._proc, self._conn, self.device = proc, parent, payload

    def _stop(self) -> None:
        if self._launched is not None:   # launched, never waited for
            proc, parent = self._launched
            self._launched = None
            proc.kill()
            proc.join(10)
            parent.close()
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(10)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def run(self, job: MeasureJob, timeout_s: float | None = None) -> MeasureResult:
        if self._proc is None or not self._proc.is_alive():
            self._stop()
            self.start()
        limit = self.timeout_s if timeout_s is None else timeout_s
        start = time.perf_counter()
        self._conn.send(job)
        if not self._conn.poll(limit):
            self._stop()
            self.restarts += 1
            return MeasureResult(False, FailureClass.TIMEOUT.value,
                                 f"no result within {limit:.0f} s; the worker was stopped",
                                 seconds=time.perf_counter() - start)
        try:
            kind, result = self._conn.recv()
        except (EOFError, OSError):
            self._stop()
            self.restarts += 1
            return MeasureResult(False, FailureClass.DEVICE_ERROR.value, "the measurement worker died",
                                 seconds=time.perf_counter() - start)
        if result.failure == FailureClass.DEVICE_ERROR.value:
            self._stop()   # the worker exits after a sticky error; reap it now
            self.restarts += 1
        return result

    def close(self) -> None:
        self._stop()

    def __enter__(self) -> "MeasureWorker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
