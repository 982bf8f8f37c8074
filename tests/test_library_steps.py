"""Library resources bound to streams (library_steps.StreamBound), on the CPU with a stand-in for
CuPy's stream-capture query: made outside a capture, taken over by a stream first met under one,
never made (allocated) while a capture runs, and a clear error when nothing can be taken over."""
from __future__ import annotations

import gc

import pytest

from autocnn.errors import DeviceError
from autocnn.kernels.library_steps import StreamBound
from tests.graph_capture import warm_up_then_capture


class _Runtime:
    class CUDARuntimeError(RuntimeError):   # CuPy's
        pass

    def __init__(self) -> None:
        self.capturing: set[int] = set()
        self.destroyed: set[int] = set()
        self.context_gone = False

    def streamIsCapturing(self, ptr: int) -> bool:   # noqa: N802 -- CuPy's name
        # Asking about a destroyed stream is undefined behaviour (a crash on a real GPU): a failure.
        assert ptr not in self.destroyed, f"stream {ptr} was queried after it was destroyed"
        if self.context_gone:
            raise self.CUDARuntimeError("cudaErrorContextIsDestroyed")
        return ptr in self.capturing


class _Stream:
    """A stand-in for CuPy's Stream: its CUDA stream is destroyed when the object goes."""

    def __init__(self, runtime: _Runtime, ptr: int) -> None:
        self.runtime, self.ptr = runtime, ptr

    def __del__(self) -> None:
        self.runtime.destroyed.add(self.ptr)


class _Cupy:
    def __init__(self) -> None:
        self.runtime = _Runtime()
        self.cuda = self

    def stream(self, ptr: int) -> _Stream:
        self.runtime.destroyed.discard(ptr)   # an address may come back for a new stream
        return _Stream(self.runtime, ptr)


def _resources():
    cp, made, bound = _Cupy(), [], []

    def make(key, stream):
        assert stream not in cp.runtime.capturing, "a resource was made (allocated) under a capture"
        made.append((key, stream))
        return {"key": key, "stream": stream, "id": len(made)}

    def rebind(resource, stream):
        bound.append((resource["id"], stream))
        resource["stream"] = stream

    return cp, StreamBound(cp, "test library", make, rebind), made, bound


def test_each_stream_gets_its_own_resource_outside_a_capture():
    cp, res, made, bound = _resources()
    one, two = cp.stream(1), cp.stream(2)
    a, b = res.get("plan", one), res.get("plan", two)
    assert a is res.get("plan", one) and a is not b
    assert made == [("plan", 1), ("plan", 2)] and bound == []
    assert res.get("other", one) is not a


def test_a_stream_met_under_capture_takes_over_a_resource_of_the_same_kind():
    cp, res, made, bound = _resources()
    side, capture = cp.stream(1), cp.stream(7)
    warm = res.get("plan", side)       # PyTorch's recipe: warm-up on a side stream
    res.get("other", side)
    cp.runtime.capturing.add(7)        # then the capture on another stream
    taken = res.get("plan", capture)
    assert taken is warm and taken["stream"] == 7 and bound == [(warm["id"], 7)]
    assert res.get("plan", capture) is taken  # kept for the capturing stream
    cp.runtime.capturing.clear()
    again = res.get("plan", side)      # the side stream makes a new one after the capture
    assert again is not warm and made[-1] == ("plan", 1)
    assert sorted(r["id"] for r in res.values()) == [1, 2, 3]   # the taken one, "other", the new one


def test_a_resource_of_a_destroyed_stream_is_taken_over_under_capture_without_asking_about_it():
    """A stream destroyed since its resource was made (an earlier test's, a model's that went) runs
    nothing: a capturing stream takes its resource over, and the runtime is never asked about it
    (the stand-in fails where a GPU would crash)."""
    cp, res, made, bound = _resources()
    gone, busy, capture = cp.stream(1), cp.stream(2), cp.stream(7)
    first = res.get("plan", gone)
    res.get("plan", busy)
    del gone
    gc.collect()
    assert cp.runtime.destroyed == {1}
    cp.runtime.capturing.update({2, 7})   # the other stream's resource is busy capturing
    assert res.get("plan", capture) is first and bound == [(first["id"], 7)] and len(made) == 2


def test_a_new_stream_at_a_destroyed_ones_address_keeps_its_binding_watched():
    """CUDA hands a destroyed stream's address to a new stream: the binding found there is watched
    through the new object, so the new stream going is seen too."""
    cp, res, made, bound = _resources()
    old = cp.stream(1)
    first = res.get("plan", old)
    del old
    gc.collect()
    new, capture = cp.stream(1), cp.stream(7)
    assert res.get("plan", new) is first and len(made) == 1
    cp.runtime.capturing.add(1)           # the new stream is being captured: not taken
    cp.runtime.capturing.add(7)
    with pytest.raises(DeviceError, match="made before the capture"):
        res.get("plan", capture)
    cp.runtime.capturing.discard(1)
    del new
    gc.collect()
    assert res.get("plan", capture) is first and bound == [(first["id"], 7)]


def test_a_stream_of_a_context_that_went_is_free():
    cp, res, _, bound = _resources()
    other, capture = cp.stream(1), cp.stream(7)
    first = res.get("plan", other)
    cp.runtime.capturing.add(7)
    cp.runtime.context_gone = True
    assert res._free(1, res._bound[("plan", 1)][1])   # noqa: SLF001 -- the query fails: nothing runs
    cp.runtime.context_gone = False
    assert res.get("plan", capture) is first and bound == [(first["id"], 7)]


def test_nothing_to_take_over_under_capture_is_an_error_that_says_what_to_do():
    cp, res, made, _ = _resources()
    one, capture = cp.stream(1), cp.stream(7)
    res.get("plan", one)
    cp.runtime.capturing.update({1, 7})   # the only plan of its kind is itself under capture
    with pytest.raises(DeviceError, match="no test library resource for it was made before the capture.*warm-up"):
        res.get("plan", capture)
    with pytest.raises(DeviceError, match="made before the capture"):
        res.get("never made", capture)
    assert made == [("plan", 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("formulation, change", [("unrolled", {}), ("fft", {}),
                                                 ("fft", {"MAC": "cublas", "XFORM_A": "cufft"})])
def test_a_plan_warmed_on_one_stream_is_captured_on_another(formulation, change):
    """PyTorch's graph recipe with a plan that has library steps (cuBLAS GEMMs, real and complex,
    cuFFT transforms, plane-major and frequency-major): run once on a side stream, captured on a
    second stream, replayed; the replay writes what an eager run writes, bit for bit."""
    import cupy as cp   # the gpu mark skips this test where there is no GPU with CuPy (conftest)

    from autocnn.device import current_device
    from autocnn.kernels import OPERATIONS
    from autocnn.kernels.problem import ConvFwdProblem
    from autocnn.kernels.reference import output_shapes
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import random_inputs

    problem = ConvFwdProblem(N=3, C=5, H=13, W=11, K=6, R=5, S=5, padding=2, bias=True, activation="relu")
    operation = OPERATIONS["conv_fwd"]
    limits = current_device(0).limits()
    config = operation.default_config(problem, limits, formulation=formulation)
    if change:   # the generated multiply-accumulate's parameters go with it
        kept = {k: v for k, v in config.as_dict().items() if k not in ("FB", "BL", "MAC_ORDER", "IT", "JT")}
        config = operation.space(problem, limits).validate({**kept, **change})
    loaded = KernelLoader().load(operation.plan(problem, config))
    assert loaded.plan.library_gemms or loaded.plan.library_ffts
    assert bool(loaded.plan.library_complex_gemms) == bool(change)
    inputs = random_inputs(problem, cp, seed=3)
    out = {name: cp.full(shape, cp.nan, dtype=cp.float32) for name, shape in output_shapes(problem).items()}
    buffers = {**inputs, **out, **loaded.workspaces()}
    eager, graph, capture = warm_up_then_capture(cp, loaded, buffers, out["y"])
    graph.launch(stream=capture)
    capture.synchronize()
    assert bool(cp.array_equal(out["y"], eager))
