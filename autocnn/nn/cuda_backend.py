"""The cuda backend: CuPy arrays, and every convolution and pooling run by a generated kernel.

``prepare`` (called when a model is built for a batch size) hands the kernel problems to
autocnn.dispatch (``GpuKernels``: lookup in the tuning database, quick tuning where no record
covers a problem, plan, compile and load, workspaces reserved), so the training step only launches
and allocates nothing.

Activations, the Dense epilogue and their gradients run as fused kernels (autocnn.nn.fused), and
``capture`` records a training step as a CUDA graph. Memory the step allocates while it is
captured (CuPy's temporaries) comes from a pool private to the captured graphs, so nothing else
can reuse it while a graph that writes there may still be replayed.
"""
from __future__ import annotations

import collections
import contextlib
import warnings
from typing import Any, Callable, ClassVar, Iterator, Sequence

import numpy as np

from autocnn.dispatch.kernels import GpuKernels, KernelDispatch
from autocnn.dispatch.quick import autotune_mode
from autocnn.errors import DeviceError
from autocnn.nn import fused
from autocnn.nn.backend import Backend, CapturedStep
from autocnn.precision import BFLOAT16, FLOAT16, FLOAT32, ElementType


class CudaGraphStep(CapturedStep):
    """A training step recorded as a CUDA graph, with the kernel operations it holds."""

    def __init__(self, backend: "CudaBackend", graph: Any, calls: collections.Counter[str],
                 generated: collections.Counter[str]) -> None:
        self.backend = backend
        self.graph = graph
        self.calls = calls
        self.generated = generated

    def replay(self) -> None:
        self.graph.launch(stream=self.backend.cp.cuda.get_current_stream())
        self.backend.kernel_calls.update(self.calls)
        self.backend.generated_launches.update(self.generated)


class CudaBackend(Backend):
    name: ClassVar[str] = "cuda"
    can_capture: ClassVar[bool] = True

    def __init__(self, dtype: Any = np.float32, device_id: int = 0, database: Any = None,
                 autotune: str | None = None):
        """``autotune``: what ``prepare`` does for a problem that no record of this problem covers
        (the lookup borrowed a nearest shape's config or fell back to the default): "quick"
        measures a handful of candidates in about 2 s and keeps the fastest verified one as a quick
        record (autocnn.dispatch.quick), "full" runs the tuner with a small trial budget, "off" runs
        the lookup's config untuned. None: $AUTOCNN_AUTOTUNE, else "quick". May be changed later
        (``backend.autotune = "off"``); it applies to the problems prepared after."""
        from autocnn.device import current_device
        from autocnn.gpu import require_cupy

        if np.dtype(dtype) != np.float32:
            raise ValueError(f"the cuda backend runs float32 kernels; dtype {np.dtype(dtype).name} is not "
                             f"supported (use the numpy backend for float64 gradient checks)")
        autotune = autotune_mode(autotune)   # checked (and $AUTOCNN_AUTOTUNE read) before the GPU is touched
        cp = require_cupy()
        cp.cuda.Device(device_id).use()
        super().__init__(cp, np.float32)
        self.cp = cp
        self.device = current_device(device_id)
        self.device_id = device_id
        if database is None:
            from autocnn.store import TuningDatabase

            database = TuningDatabase()
        self.db = database
        self.kernels = GpuKernels(cp, device_id, self.device, database, autotune)
        self._graph_pool: Any = None
        self._gemm: Any = None  # autocnn.nn.cublas.Gemm once made; False when cuBLAS cannot be loaded
        # The stream weight gradients run on beside the backward pass, and the events to join.
        self._side_stream: Any = None
        self._side_done: list[Any] = []
        # The gradient buffer zeroed at the start of this step: (first byte, end, event), or None.
        self._zeroed: tuple[int, int, Any] | None = None
        self._head_scratch: Any = None   # the fused classifier head's self-zeroing accumulators
        self._capture_stream: Any = None
        self._runs: dict[tuple[tuple[int, int], ...], Any] = {}   # gradient runs -> their int64 device copy

    # -- memory ----------------------------------------------------------------------------------
    def to_numpy(self, a: Any) -> np.ndarray:
        return self.cp.asnumpy(a)

    def upload(self, host: np.ndarray, out: Any) -> Any:
        out.set(np.ascontiguousarray(host, dtype=out.dtype))
        return out

    def synchronize(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()

    # -- element types: 16-bit tensors stored as such (mixed precision) --------------------------
    def storage_dtype(self, element: ElementType) -> np.dtype:
        """float32, float16, and bfloat16 as the uint16 bit patterns of its values (CuPy has no
        bfloat16), as autocnn.measurement.element_arrays holds them."""
        from autocnn.measurement.element_arrays import storage_dtype

        return np.dtype(storage_dtype(element))

    def round_to(self, element: ElementType, a: Any) -> Any:
        # The arrays store the element type itself: the kernel that wrote them rounded already.
        return a

    def _element(self, a: Any) -> ElementType:
        """The element type a device array of this backend stores."""
        return {np.dtype(np.float16): FLOAT16, np.dtype(np.uint16): BFLOAT16}.get(np.dtype(a.dtype), FLOAT32)

    def cast(self, src: Any, src_element: ElementType, dst: Any, dst_element: ElementType, scaler_state: Any,
             use: Any) -> Any:
        from autocnn.nn import fused_sixteen_bit

        return fused_sixteen_bit.cast(src, src_element, dst, dst_element, scaler_state, use)

    def gradients_to_fp32(self, g32: Any, g16: Any, element: ElementType, runs: Any, scaler_state: Any) -> None:
        from autocnn.nn import fused_sixteen_bit

        device_runs = self._runs.get(tuple(runs))
        if device_runs is None:   # made by the first (eager) step, before any capture
            flat = np.array([v for run in runs for v in run] or [0, 0], dtype=np.int64)
            device_runs = self._runs[tuple(runs)] = self.cp.asarray(flat)
        fused_sixteen_bit.gradients_to_fp32(g32, g16, element, device_runs, len(runs), scaler_state)

    def loss_scale_update(self, state: Any, settings: Any) -> None:
        from autocnn.nn import fused_sixteen_bit

        fused_sixteen_bit.loss_scale_update(state, settings.growth_factor, settings.backoff_factor,
                                            settings.growth_interval)

    def copy_into(self, dst: Any, src: Any) -> Any:
        # One asynchronous device-to-device copy: cheaper to issue than an element-wise kernel.
        if dst.shape != src.shape or dst.dtype != src.dtype:
            raise ValueError(f"copy_into: {src.shape} {src.dtype} into {dst.shape} {dst.dtype}")
        if not (dst.flags.c_contiguous and src.flags.c_contiguous):
            return super().copy_into(dst, src)
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, rt.memcpyDeviceToDevice,
                       self.cp.cuda.get_current_stream().ptr)
        return dst

    # -- weight gradients beside the backward pass -------------------------------------------------
    @contextlib.contextmanager
    def parameter_gradients(self) -> Iterator[None]:
        # Fork: the side stream waits for the work queued so far, takes the block's launches and
        # is joined later. Captured in a graph this becomes a parallel branch.
        side = self._fork()
        with side:
            yield
        self._side_done.append(self._event(side))

    def join_parameter_gradients(self) -> None:
        main = self.cp.cuda.get_current_stream()
        for done in self._side_done:
            main.wait_event(done)
        self._side_done.clear()
        self._zeroed = None

    def zero_gradients(self, grads: Any) -> None:
        # On the side stream, beside the forward pass; the weight gradients that follow there
        # are ordered after it, the main stream waits for it in gradients_ready, and the step's
        # join waits for it in any case (a captured branch must rejoin).
        side = self._fork()
        self.cp.cuda.runtime.memsetAsync(grads.data.ptr, 0, grads.nbytes, side.ptr)
        done = self._event(side)
        self._side_done.append(done)
        self._zeroed = (grads.data.ptr, grads.data.ptr + grads.nbytes, done)

    def gradients_ready(self) -> None:
        if self._zeroed is not None:
            self.cp.cuda.get_current_stream().wait_event(self._zeroed[2])

    def _fork(self) -> Any:
        """The side stream, made to wait for the work queued so far on the current stream."""
        cp = self.cp
        if self._side_stream is None:
            self._side_stream = cp.cuda.Stream(non_blocking=True)
        self._side_stream.wait_event(self._event(cp.cuda.get_current_stream()))
        return self._side_stream

    def _event(self, stream: Any) -> Any:
        event = self.cp.cuda.Event(block=False, disable_timing=True, interprocess=False)
        event.record(stream)
        return event

    def _prezeroed(self, *arrays: Any) -> frozenset[int]:
        """Indices of the arrays that lie in the gradient buffer zeroed at the start of this step."""
        if self._zeroed is None:
            return frozenset()
        lo, hi, _ = self._zeroed
        return frozenset(i for i, a in enumerate(arrays)
                         if a is not None and lo <= a.data.ptr and a.data.ptr + a.nbytes <= hi)

    # -- graphs ----------------------------------------------------------------------------------
    def capture(self, step: Callable[[], None]) -> CudaGraphStep:
        """Record ``step``'s device work as a CUDA graph (nothing runs until it is replayed).

        The kernel-call counters are put back as they were: the work counts when it is replayed.
        """
        cp = self.cp
        self.kernels.workspaces.captured = True   # from now on a grown workspace buffer keeps the old one alive
        if self._graph_pool is None:
            self._graph_pool = cp.cuda.MemoryPool()
            self._capture_stream = cp.cuda.Stream(non_blocking=True)
        stream = self._capture_stream
        if self._gemm:
            self._gemm.prepare(stream.ptr)
        # Plans with library steps (cuBLAS, cuFFT) make their handles and FFT plans now: inside a
        # capture they cannot. The weight gradients' side stream is captured too.
        if self._side_stream is None:
            self._side_stream = cp.cuda.Stream(non_blocking=True)
        for loaded in self.kernels.plans.values():
            for s in (stream, self._side_stream):
                loaded.prepare_stream(s)
        calls_before = collections.Counter(self.kernel_calls)
        generated_before = collections.Counter(self.generated_launches)
        # Work queued before on the current stream is ordered before the replays anyway (they go
        # to the current stream); the capture stream itself queues nothing.
        try:
            with cp.cuda.using_allocator(self._graph_pool.malloc), stream:
                stream.begin_capture()
                try:
                    step()
                except BaseException:
                    try:
                        stream.end_capture()  # leave the stream usable; the step's error is what counts
                    except Exception:  # noqa: BLE001
                        pass
                    raise
                graph = stream.end_capture()
        finally:
            calls = self.kernel_calls - calls_before
            generated = self.generated_launches - generated_before
            self.kernel_calls.clear()
            self.kernel_calls.update(calls_before)
            self.generated_launches.clear()
            self.generated_launches.update(generated_before)
        return CudaGraphStep(self, graph, calls, generated)

    # -- dense layers ----------------------------------------------------------------------------
    def matmul(self, a: Any, b: Any, out: Any = None) -> Any:
        """a @ b by cuBLAS: SGEMM for float32, GemmEx (FP32 compute) for 16-bit operands, through a
        handle of our own when writing into ``out`` (so a captured training step can hold it),
        through CuPy otherwise (float32 only: CuPy would multiply bfloat16's bit patterns)."""
        sixteen = self._element(a) != FLOAT32
        if sixteen and (out is None or a.ndim != 2 or b.ndim != 2):
            raise ValueError("matmul of 16-bit arrays runs through cuBLAS GemmEx: 2-D operands into an out= array")
        if out is None or (a.dtype != np.float32 and not sixteen) or a.ndim != 2 or b.ndim != 2:
            return super().matmul(a, b, out=out)
        if self._gemm is None:
            from autocnn.nn.cublas import CublasUnavailableError, Gemm

            try:
                self._gemm = Gemm(self.cp)
            except (CublasUnavailableError, OSError, RuntimeError) as exc:
                warnings.warn(f"{exc}; dense layers use CuPy's matmul, which a CUDA graph cannot capture",
                              RuntimeWarning, stacklevel=2)
                self._gemm = False
        if self._gemm is False:
            if sixteen:
                raise RuntimeError("16-bit Dense layers need cuBLAS GemmEx, and cuBLAS could not be loaded")
            return super().matmul(a, b, out=out)
        return self._gemm(a, b, out)

    # -- element-wise work, fused ----------------------------------------------------------------
    def activation(self, name: str, z: Any, out: Any) -> Any:
        if name == "none":
            return super().activation(name, z, out)
        if self._element(z) != FLOAT32:
            from autocnn.nn import fused_sixteen_bit

            return fused_sixteen_bit.activation(self._element(z), name, z, out)
        return fused.activation(name, z, out)

    def bias_activation(self, y: Any, bias: Any, name: str) -> Any:
        if bias is None:
            return self.activation(name, y, out=y)
        return fused.bias_activation(y, bias, name)

    def dense_dispatch(self, in_features: int, out_features: int, head: bool,
                       element: ElementType = FLOAT32) -> tuple[str, str]:
        if element != FLOAT32:
            return "cuBLAS", (f"cuBLAS GemmEx ({element.name} operands, FP32 compute; a handle per stream, "
                              f"graph-capturable), epilogues nn_bias_activation_to / nn_activation_grad_colsum")
        gemm = "cuBLAS SGEMM (a handle per stream, graph-capturable)"
        if self._gemm is False:
            gemm = "CuPy matmul (cuBLAS could not be loaded: no CUDA graphs)"
        if head and fused.head_fits(in_features, out_features):
            return "fused head", f"nn_dense_softmax_xent (logits, loss, dlogits, db, dx); weight gradient by {gemm}"
        return "cuBLAS", gemm + (" and the loss separately (too large for the fused head)" if head else "")

    def dense_loss_step(self, x: Any, w: Any, bias: Any, labels: Any, weights: Any, *, logits: Any, dlogits: Any,
                        db: Any, dx: Any, loss_out: Any, acc_out: Any, loss: Any, metric: Any) -> None:
        fits = (fused.head_fits(int(w.shape[0]), int(w.shape[1])) and x.dtype == np.float32
                and labels.dtype == np.int64 and weights.dtype == np.float32 and x.flags.c_contiguous)
        if not fits:
            return super().dense_loss_step(x, w, bias, labels, weights, logits=logits, dlogits=dlogits, db=db,
                                           dx=dx, loss_out=loss_out, acc_out=acc_out, loss=loss, metric=metric)
        if self._head_scratch is None:
            self._head_scratch = self.cp.zeros(3 + fused.HEAD_MAX_CLASSES, dtype=np.float64)
        fused.dense_softmax_xent(x, w, bias, labels, weights, dlogits, db, dx, loss_out, acc_out,
                                 self._head_scratch)

    def bias_activation_into(self, z: Any, bias: Any, y: Any, name: str, element: ElementType) -> Any:
        if element == FLOAT32:
            return super().bias_activation_into(z, bias, y, name, element)
        from autocnn.nn import fused_sixteen_bit

        return fused_sixteen_bit.bias_activation_to(element, z, bias, y, name)

    def activation_grad_bias(self, name: str, y: Any, dy: Any, out: Any, db_out: Any,
                             element: ElementType = FLOAT32) -> Any:
        if element != FLOAT32:
            from autocnn.nn import fused_sixteen_bit

            return fused_sixteen_bit.activation_grad_colsum(element, name, y, dy, out, db_out)
        if dy.ndim != 2:
            return super().activation_grad_bias(name, y, dy, out, db_out)
        return fused.activation_grad_colsum(name, y, dy, out, db_out)

    def activation_grad(self, name: str, y: Any, dy: Any, out: Any) -> Any:
        if name == "none":
            return super().activation_grad(name, y, dy, out)
        if self._element(y) != FLOAT32:
            from autocnn.nn import fused_sixteen_bit

            return fused_sixteen_bit.activation_grad(self._element(y), name, y, dy, out)
        return fused.activation_grad(name, y, dy, out)

    # -- kernels ---------------------------------------------------------------------------------
    @property
    def autotune(self) -> str:
        """"off", "quick" or "full": see ``__init__``."""
        return self.kernels.autotune

    @autotune.setter
    def autotune(self, value: str | None) -> None:
        self.kernels.autotune = value

    @property
    def quick_budget_s(self) -> float:
        return self.kernels.quick_budget_s

    @quick_budget_s.setter
    def quick_budget_s(self, seconds: float) -> None:
        self.kernels.quick_budget_s = seconds

    @property
    def generated_launches(self) -> collections.Counter[str]:
        """Launches of generated kernels per op: the tests compare it with kernel_calls."""
        return self.kernels.generated_launches

    def prepare(self, problems: Sequence[Any]) -> list[KernelDispatch]:
        return self.kernels.prepare(problems)

    def forget(self, problems: Sequence[Any]) -> None:
        """Drop the kernels chosen for these problems (after tuning, so the next prepare looks again)."""
        self.kernels.forget(problems)

    def _run(self, problem: Any, buffers: dict[str, Any], prezeroed: frozenset[str] = frozenset()) -> None:
        self.kernels.run(problem, buffers, prezeroed)

    def run_operation(self, problem: Any, buffers: dict[str, Any]) -> None:
        """Run the prepared plan of any registered operation's problem (e.g. sep_conv_fwd) on named
        buffers (its inputs, outputs and optional ones as None), counted in ``kernel_calls``."""
        self.kernel_calls[problem.op] += 1
        self._run(problem, buffers)

    def _conv_fwd(self, problem, x, w, bias, out):
        self._run(problem, {"x": x, "w": w, "bias": bias, "y": out})

    def _conv_bwd_data(self, problem, dy, w, out):
        self._run(problem, {"dy": dy, "w": w, "dx": out})

    def _conv_wgrad(self, problem, x, dy, dw_out, db_out):
        self._run(problem, {"x": x, "dy": dy, "dw": dw_out, "db": db_out},
                  prezeroed=self._gradients_zeroed(dw_out, db_out))

    def _conv_bwd_fused(self, problem, x, dy, w, dx_out, dw_out, db_out):
        self._run(problem, {"x": x, "dy": dy, "w": w, "dx": dx_out, "dw": dw_out, "db": db_out},
                  prezeroed=self._gradients_zeroed(dw_out, db_out))

    def _conv_pool_fwd(self, problem, x, w, bias, y_out, a_out):
        self._run(problem, {"x": x, "w": w, "bias": bias, "y": y_out, "a": a_out})

    def _conv_pool_dz(self, problem, dy, a, dz_out):
        self._run(problem, {"dy": dy, "a": a if problem.activation != "none" else None, "dz": dz_out})

    def _gradients_zeroed(self, dw_out: Any, db_out: Any) -> frozenset[str]:
        """Which of dw, db the step's zeroing already cleared (their kernel need not), with the current
        stream made to wait for that zeroing unless it runs on the side stream after it."""
        zeroed = self._prezeroed(dw_out, db_out)
        if zeroed and (self._side_stream is None or self.cp.cuda.get_current_stream().ptr != self._side_stream.ptr):
            self.cp.cuda.get_current_stream().wait_event(self._zeroed[2])
        return frozenset(("dw", "db")[i] for i in zeroed)

    def tuned_faster(self, alternative: Sequence[Any], replaced: Sequence[Any]) -> bool:
        """Yes where this GPU's tuning records say so: a usable record (exact, or of the same
        architecture) of every problem on both sides, all tuned on one GPU model, and the
        alternative's times summed below the replaced ones' (the rule: tuned faster than the
        kernels it replaces; work without a record, such as an element-wise pass the alternative
        also saves, or two kernels overlapping on two streams, is left out of the sums)."""
        records = []
        for problem in (*alternative, *replaced):
            found = self.db.tuned(self.device, problem)   # records only: nothing is compiled here
            if found is None or found.record is None:
                return False
            records.append(found.record)
        if len({r.key.gpu for r in records}) != 1:
            return False
        n = len(alternative)
        return sum(r.time_us for r in records[:n]) < sum(r.time_us for r in records[n:])

    def _avgpool_fwd(self, problem, x, out):
        self._run(problem, {"x": x, "y": out})

    def _avgpool_bwd(self, problem, dy, out):
        self._run(problem, {"dy": dy, "dx": out})


__all__ = ["CudaBackend", "DeviceError"]
