"""Verification against the float64 reference, and the timing protocol.

Verification: fresh random inputs for every check, outputs poisoned with NaN before the run (an
element the kernel never wrote stays NaN, and NaN never passes), and the relative error
||out - ref|| / ||ref|| of every output within ``error_bound`` of its reduction length. Buffers are
of the problem's element types (element_arrays: a 16-bit precision's inputs drawn as float32 and
rounded to 16 bits, its outputs read back from 16 bits); the float64 reference is computed from the
values the kernel was given, so that the bound measures the kernel and not its inputs' rounding.

Timing: CUDA events around the launches; warm-up first; repetitions chosen by a time budget so
that short kernels get many; L2 flushed between repetitions by overwriting a buffer twice the
size of L2; the median and the interquartile spread reported.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from autocnn.errors import WrongResultError
from autocnn.gpu import require_cupy
from autocnn.kernels import reference
from autocnn.measurement import element_arrays
from autocnn.precision import DEFAULT_PRECISION, ElementType, KernelTypes, precision_named, precision_of

def error_bound(reduction_length: int, precision: Any = DEFAULT_PRECISION) -> float:
    """The largest relative error a kernel may show against the float64 reference: the precision's
    own bound (``Precision.error_bound``, where every bound is set) for this reduction length.
    ``precision`` is a Precision or its name."""
    return precision_named(precision).error_bound(reduction_length)


@dataclass(frozen=True)
class Verification:
    passed: bool
    errors: dict[str, float]
    bounds: dict[str, float]
    unwritten: dict[str, int]
    message: str

    def raise_if_failed(self) -> None:
        if not self.passed:
            worst = max(self.errors, key=lambda k: self.errors[k] / self.bounds[k] if self.bounds[k] else 0)
            raise WrongResultError(self.message, self.errors[worst], self.bounds[worst])


@dataclass(frozen=True)
class Timing:
    median_us: float
    p25_us: float
    p75_us: float
    min_us: float
    reps: int

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return (self.p75_us - self.p25_us) / self.median_us if self.median_us > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "spread": self.spread}


def element_type(problem: Any, name: str) -> ElementType:
    """The element type of one of a problem's tensors (its precision's, KernelTypes.of_tensor)."""
    return KernelTypes.of(precision_of(problem)).of_tensor(name)


def random_inputs(problem: Any, xp: Any, seed: int | None = None) -> dict[str, Any]:
    """Standard-normal inputs (never zeros: they hide unwritten outputs and wrong indexing), drawn
    in float32 and rounded to each tensor's element type, as the buffers the kernel reads."""
    shapes = reference.input_shapes(problem)
    if xp.__name__ == "cupy":
        gen = xp.random.RandomState(seed)
    else:
        gen = xp.random.default_rng(seed)
    drawn = {name: gen.standard_normal(shape, dtype=xp.float32) for name, shape in shapes.items()}
    return {name: element_arrays.rounded(v, element_type(problem, name), xp) for name, v in drawn.items()}


def output_buffers(problem: Any, xp: Any) -> dict[str, Any]:
    """The problem's outputs, each of its element type and filled with its NaN (an element a plan
    leaves unwritten stays NaN)."""
    return {name: element_arrays.nans(shape, element_type(problem, name), xp)
            for name, shape in reference.output_shapes(problem).items()}


def tensor_values(problem: Any, name: str, stored: Any) -> Any:
    """The values (float32) one of a problem's buffers holds, whatever its element type."""
    return element_arrays.values(stored, element_type(problem, name), _xp(stored))


def reference_outputs(problem: Any, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The float64 reference, computed with the inputs' array module (NumPy, or CuPy on the GPU),
    from the values the input buffers hold."""
    xp = _xp(next(iter(inputs.values())))
    return reference.run_problem(problem, {k: tensor_values(problem, k, v).astype(xp.float64) for k, v in inputs.items()})


def verify_outputs(problem: Any, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   ref: Mapping[str, Any] | None = None) -> Verification:
    """Compare the outputs (of their element types) with the float64 reference; every element is checked."""
    xp = _xp(next(iter(inputs.values())))
    if ref is None:
        ref = reference_outputs(problem, inputs)
    errors, bounds, unwritten = {}, {}, {}
    problems = []
    for name, expected in ref.items():
        got = tensor_values(problem, name, outputs[name])
        nan = int(xp.count_nonzero(~xp.isfinite(got)))
        diff = got.astype(xp.float64) - expected
        ref_norm = float(xp.linalg.norm(expected.ravel()))
        err_norm = float(xp.linalg.norm(xp.nan_to_num(diff, nan=0.0).ravel()))
        rel = err_norm / ref_norm if ref_norm > 0 else err_norm
        if nan:
            rel = float("nan")
        bound = error_bound(reference.reduction_length(problem, name), precision_of(problem))
        errors[name], bounds[name], unwritten[name] = rel, bound, nan
        if nan:
            problems.append(f"{name}: {nan} elements not finite (unwritten or NaN)")
        elif not rel <= bound:
            problems.append(f"{name}: relative error {rel:.3g} exceeds {bound:.3g}")
    passed = not problems
    return Verification(passed, errors, bounds, unwritten, "; ".join(problems) or "ok")


def _xp(array: Any) -> Any:
    if type(array).__module__.startswith("cupy"):
        return require_cupy()
    import numpy

    return numpy


class L2Flusher:
    """Overwrites a buffer of twice the L2 size, so every repetition starts with a cold cache."""

    def __init__(self, l2_bytes: int):
        cp = require_cupy()
        self.nbytes = max(2 * l2_bytes, 8 * 1024 * 1024)
        self.buffer = cp.empty(self.nbytes // 4, dtype=cp.float32)

    def __call__(self, stream: Any) -> None:
        cp = require_cupy()
        cp.cuda.runtime.memsetAsync(self.buffer.data.ptr, 0, self.nbytes, stream.ptr)


def time_callable(run: Callable[[], None], *, flusher: L2Flusher | None = None, budget_s: float = 0.25,
                  warmup: int = 3, min_reps: int = 10, max_reps: int = 500) -> Timing:
    """Median time of ``run`` (which enqueues work on the current stream) under the timing protocol."""
    cp = require_cupy()
    stream = cp.cuda.get_current_stream()
    for _ in range(warmup):
        if flusher:
            flusher(stream)
        run()
    stream.synchronize()
    # One timed probe sets the repetition count for the budget.
    probe = _time_once(run, flusher, stream)
    reps = int(min(max_reps, max(min_reps, budget_s * 1e6 / max(probe, 1.0))))
    samples = []
    events = []
    for _ in range(reps):
        if flusher:
            flusher(stream)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        run()
        end.record(stream)
        events.append((start, end))
    stream.synchronize()
    for start, end in events:
        samples.append(cp.cuda.get_elapsed_time(start, end) * 1000.0)
    samples.sort()
    q = statistics.quantiles(samples, n=4) if len(samples) >= 4 else [samples[0], samples[len(samples) // 2], samples[-1]]
    return Timing(median_us=statistics.median(samples), p25_us=q[0], p75_us=q[2], min_us=samples[0], reps=len(samples))


def _time_once(run: Callable[[], None], flusher: L2Flusher | None, stream: Any) -> float:
    cp = require_cupy()
    if flusher:
        flusher(stream)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    run()
    end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1000.0


def plan_buffers(loaded: Any, problem: Any, seed: int | None = None) -> tuple[dict, dict, dict]:
    """Fresh random inputs and outputs filled with NaN, of the problem's element types (an element a
    plan leaves unwritten stays NaN), and the plan's workspaces on the current device, filled with
    NaN too: a plan must write every
    element of a workspace it reads, or clear it first (``zero_first``), as the runtime hands out
    workspaces uninitialized, and a fresh allocation's zeros would hide an element left unwritten
    (the tma formulation's halo grid, say). Returns (inputs, outputs, every buffer by name)."""
    cp = require_cupy()
    inputs = random_inputs(problem, cp, seed)
    outputs = output_buffers(problem, cp)
    workspaces = loaded.workspaces()
    for buffer in workspaces.values():
        buffer.fill(cp.nan)
    return inputs, outputs, {**inputs, **outputs, **workspaces}


@dataclass(frozen=True)
class CandidateCheck:
    verification: Verification
    timing: Timing | None


def check_candidate(loaded: Any, problem: Any, *, seed: int | None = None, time_it: bool = True,
                    flusher: L2Flusher | None = None, budget_s: float = 0.25) -> CandidateCheck:
    """Verify a loaded plan on fresh random inputs and, if it is right, time it.

    The outputs are verified once before timing and once more after the timed runs: a result that
    changes between runs of the same inputs is a race, and fails like any wrong result.
    """
    cp = require_cupy()
    inputs, outputs, buffers = plan_buffers(loaded, problem, seed)
    loaded(buffers)
    cp.cuda.get_current_stream().synchronize()
    ref = reference_outputs(problem, inputs)
    first = verify_outputs(problem, inputs, outputs, ref)
    if not first.passed or not time_it:
        return CandidateCheck(first, None)
    timing = time_callable(lambda: loaded(buffers), flusher=flusher, budget_s=budget_s)
    again = verify_outputs(problem, inputs, outputs, ref)
    if not again.passed:
        return CandidateCheck(Verification(False, again.errors, again.bounds, again.unwritten,
                                           "result changed across repeated runs (a race): " + again.message), None)
    return CandidateCheck(first, timing)
