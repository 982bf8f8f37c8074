"""Backends: where the arrays live and what computes the five kernel operations.

A backend owns the array module (numpy or cupy) and the dtype, and runs every convolution and
pooling of a training step into output buffers the caller allocated beforehand. Layers allocate
all their buffers in ``build`` through ``Backend.zeros``; the training step itself only writes
into them, so a GPU backend can run a whole step without allocating activation memory.

Contract for a backend implementation (e.g. the CUDA backend):

* subclass ``Backend`` and call ``super().__init__(xp, dtype)``;
* implement ``prepare`` and the five ``_conv_fwd`` ... ``_avgpool_bwd`` hooks; the public
  methods (``conv_fwd`` ...) check shapes and dtypes, count the call in ``kernel_calls`` and then
  call the hook, so every backend is checked and counted the same way;
* override ``to_numpy``/``upload``/``synchronize`` where the array module needs it; the
  element-wise helpers (activations, matmul) work for any numpy-compatible ``xp`` and may be
  overridden with fused kernels;
* a backend that can record a training step and replay it (CUDA graphs) sets ``can_capture``
  and implements ``capture``.

This module is the interface only: the implementations are numpy_backend.NumpyBackend and
cuda_backend.CudaBackend, chosen by name in backend_choice.get_backend. It imports none of them,
nor the layers, losses or optimizers written against it (tests/test_nn_imports.py checks that).
"""
from __future__ import annotations

import abc
import collections
import contextlib
import importlib
from typing import Any, Callable, ClassVar, Iterator, Sequence

import numpy as np

from autocnn.dispatch.kernels import KernelDispatch
from autocnn.kernels.problem import (
    AvgPoolBwdProblem,
    AvgPoolFwdProblem,
    ConvBwdDataProblem,
    ConvFwdProblem,
    ConvWgradProblem,
)
from autocnn.nn import activations
from autocnn.nn.mixed_precision import CLEAN_STEPS, FOUND, SCALE, SKIPPED, ScaleUse
from autocnn.precision import FLOAT32, ElementType, precision_of

Array = Any  # numpy.ndarray or cupy.ndarray
KernelProblem = Any  # one of the five frozen problem dataclasses of autocnn.kernels.problem


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run here (no CuPy, no GPU, backend not installed)."""


class CapturedStep(abc.ABC):
    """A recorded sequence of device work (a training step) that can be run again as a whole.

    Replaying counts, in the backend's ``kernel_calls`` (and any launch counters it keeps), the
    kernel operations the recording holds, as running them one by one would.
    """

    @abc.abstractmethod
    def replay(self) -> None:
        """Queue the recorded work once more (on the current stream), without waiting for it."""


def array_module(array: Array) -> Any:
    """numpy or cupy, whichever ``array`` belongs to (without importing cupy for numpy arrays)."""
    if type(array).__module__.split(".")[0] == "cupy":
        return importlib.import_module("cupy")
    return np


class Backend(abc.ABC):
    """Array module, dtype and the five kernel operations, run into preallocated outputs."""

    name: ClassVar[str] = "abstract"
    # Whether ``capture`` can record device work for replay (CUDA graphs); False on the CPU.
    can_capture: ClassVar[bool] = False

    def __init__(self, xp: Any, dtype: Any):
        self.xp = xp
        self.dtype = np.dtype(dtype)
        # op name -> number of calls; tests and profiling read it, nothing else depends on it.
        self.kernel_calls: collections.Counter[str] = collections.Counter()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dtype={self.dtype.name})"

    # -- memory --------------------------------------------------------------------------------
    def zeros(self, shape: Sequence[int], dtype: Any = None) -> Array:
        return self.xp.zeros(tuple(shape), dtype=self.dtype if dtype is None else dtype)

    def asarray(self, a: Any, dtype: Any = None) -> Array:
        """``a`` as an array of this backend (in the backend's float dtype unless ``dtype`` says)."""
        return self.xp.asarray(a, dtype=self.dtype if dtype is None else dtype)

    def to_numpy(self, a: Array) -> np.ndarray:
        return np.asarray(a)

    def upload(self, host: np.ndarray, out: Array) -> Array:
        """Copy a host array into an existing backend buffer of the same shape."""
        out[...] = self.xp.asarray(host)
        return out

    def synchronize(self) -> None:
        """Wait for queued work (a no-op on the CPU); called before timing an epoch."""

    # -- element types (mixed precision: autocnn.nn.mixed_precision) -----------------------------
    def storage_dtype(self, element: ElementType) -> np.dtype:
        """The dtype of this backend's arrays that hold ``element``'s values. Here (the CPU) every
        type is emulated in the backend's dtype: a 16-bit tensor is an array of its values, which
        ``round_to`` keeps on the 16-bit grid after every operation that writes one."""
        return self.dtype

    def round_to(self, element: ElementType, a: Array) -> Array:
        """Round ``a``'s values to ``element`` in place, to nearest even (a float16 beyond 65504
        becomes +-Inf), as a GPU kernel storing a 16-bit output does; nothing for float32. A backend
        whose arrays store the 16-bit types themselves has nothing to do."""
        if element.size == 2:
            from autocnn.measurement import element_arrays

            a[...] = element_arrays.values(element_arrays.rounded(a, element, self.xp), element, self.xp)
        return a

    def cast(self, src: Array, src_element: ElementType, dst: Array, dst_element: ElementType,
             scaler_state: Array | None, use: Any) -> Array:
        """dst = src, from one element type into another (FP32 to 16-bit or back), multiplied by the
        loss scale (``use`` SCALE_UP), divided by it (SCALE_DOWN) or kept (KEEP); ``scaler_state``
        None: no scaler, a scale of 1."""
        factor = 1.0
        if scaler_state is not None and use is not ScaleUse.KEEP:
            scale = float(scaler_state[SCALE])
            factor = scale if use is ScaleUse.SCALE_UP else 1.0 / scale
        with np.errstate(over="ignore", invalid="ignore"):
            self.xp.multiply(src.reshape(dst.shape), np.float32(factor), out=dst)
        return self.round_to(dst_element, dst)

    def gradients_to_fp32(self, g32: Array, g16: Array, element: ElementType, runs: Sequence[tuple[int, int]],
                           scaler_state: Array | None) -> None:
        """g32 = g16 / scale inside ``runs`` ([lo, hi) element ranges: the 16-bit layers'
        parameters), g32 kept elsewhere; with a scaler, a non-finite value anywhere in g32 sets the
        state's found flag, which the optimizer reads to skip its update."""
        inverse = 1.0 if scaler_state is None else 1.0 / float(scaler_state[SCALE])
        with np.errstate(over="ignore", invalid="ignore"):
            for lo, hi in runs:
                self.xp.multiply(g16[lo:hi], np.float32(inverse), out=g32[lo:hi])
        if scaler_state is not None and not bool(self.xp.isfinite(g32).all()):
            scaler_state[FOUND] = 1.0

    def loss_scale_update(self, state: Array, settings: Any) -> None:
        """The dynamic loss scale's step (mixed_precision.LossScaler): on a flagged step the scale
        times ``backoff_factor`` and the clean count restarts; otherwise the count grows, and at
        ``growth_interval`` the scale grows by ``growth_factor``. The flag moves to the skipped slot."""
        scale, clean, found = float(state[SCALE]), float(state[CLEAN_STEPS]), bool(state[FOUND])
        if found:
            scale, clean = scale * settings.backoff_factor, 0.0
        else:
            clean += 1
            if clean >= settings.growth_interval:
                grown = np.float32(scale * settings.growth_factor)
                scale, clean = (float(grown) if np.isfinite(grown) else scale), 0.0
        values = np.zeros(len(state), dtype=state.dtype)
        values[SCALE], values[CLEAN_STEPS], values[FOUND], values[SKIPPED] = scale, clean, 0.0, float(found)
        state[:] = values

    def copy_into(self, dst: Array, src: Array) -> Array:
        """dst[...] = src for arrays of one shape and dtype (queued, not waited for, on a GPU)."""
        self.xp.copyto(dst, src)
        return dst

    def copy(self, src: Array) -> Array:
        """A new array holding src's values (queued, not waited for, on a GPU)."""
        return self.copy_into(self.xp.empty_like(src), src)

    @contextlib.contextmanager
    def parameter_gradients(self) -> Iterator[None]:
        """Work queued inside may run beside the work queued after it (a weight gradient beside
        the next layer's backward pass), until ``join_parameter_gradients``.

        It may read what was written before it; nothing after it may write what it reads or
        read what it writes until the join. The CPU runs it in order.
        """
        yield

    def join_parameter_gradients(self) -> None:
        """Wait (on the device) for everything queued in ``parameter_gradients`` blocks."""

    def zero_gradients(self, grads: Array) -> None:
        """Called at the start of a step with the flat gradient buffer (a ParameterArena's).

        A backend whose weight-gradient kernels accumulate into zeroed outputs clears the whole
        buffer here, beside the forward pass, instead of each output just before its kernel (on
        the backward pass's critical path). The CPU writes every gradient directly: nothing to do.
        """

    def gradients_ready(self) -> None:
        """Called after the forward pass: gradient writes may follow (``zero_gradients`` is done)."""

    def capture(self, step: Callable[[], None]) -> CapturedStep:
        """Record the device work ``step`` queues, without running it, for replay.

        Only for backends with ``can_capture``; ``step`` must neither wait for the device nor
        keep memory it allocates beyond its own end.
        """
        raise NotImplementedError(f"the {self.name} backend cannot capture device work for replay")

    # -- kernel problems -----------------------------------------------------------------------
    @abc.abstractmethod
    def prepare(self, problems: Sequence[KernelProblem]) -> list[KernelDispatch]:
        """Get ready to run these problems; one KernelDispatch per problem, in the same order.

        Called by ``Sequential.build`` with every (deduplicated) problem of the model at the
        built batch size, before any kernel runs.
        """

    # -- the five kernel operations (checked, counted, then run by the hooks) ------------------
    def conv_fwd(self, problem: ConvFwdProblem, x: Array, w: Array, bias: Array | None, out: Array) -> Array:
        """out = activation(conv(x, w) + bias); bias is used only when ``problem.bias``."""
        self._expect(problem, "x", x, problem.x_shape)
        self._expect(problem, "w", w, problem.w_shape)
        self._expect(problem, "out", out, problem.y_shape)
        self._expect_bias(problem, bias)
        self.kernel_calls[problem.op] += 1
        self._conv_fwd(problem, x, w, bias if problem.bias else None, out)
        self._stored(problem, out)
        return out

    def conv_bwd_data(self, problem: ConvBwdDataProblem, dy: Array, w: Array, out: Array) -> Array:
        """out = dX, the gradient of the convolution's input."""
        self._expect(problem, "dy", dy, problem.y_shape)
        self._expect(problem, "w", w, problem.w_shape)
        self._expect(problem, "out", out, problem.x_shape)
        self.kernel_calls[problem.op] += 1
        self._conv_bwd_data(problem, dy, w, out)
        self._stored(problem, out)
        return out

    def conv_wgrad(self, problem: ConvWgradProblem, x: Array, dy: Array, dw_out: Array,
                   db_out: Array | None) -> Array:
        """dw_out = dW and (when ``problem.bias``) db_out = db, summed over the batch."""
        self._expect(problem, "x", x, problem.x_shape)
        self._expect(problem, "dy", dy, problem.y_shape)
        self._expect_weight_gradients(problem, dw_out, db_out)
        self.kernel_calls[problem.op] += 1
        self._conv_wgrad(problem, x, dy, dw_out, db_out)
        self._stored(problem, dw_out, db_out)
        return dw_out

    def conv_bwd_fused(self, problem: Any, x: Array, dy: Array, w: Array, dx_out: Array, dw_out: Array,
                       db_out: Array | None) -> Array:
        """dx_out = dX, dw_out = dW and (when ``problem.bias``) db_out = db in one operation
        (kernels.conv_bwd_fused): the backward a layer runs where ``tuned_faster`` says so."""
        self._expect(problem, "x", x, problem.x_shape)
        self._expect(problem, "dy", dy, problem.y_shape)
        self._expect(problem, "w", w, problem.w_shape)
        self._expect(problem, "dx_out", dx_out, problem.x_shape)
        self._expect_weight_gradients(problem, dw_out, db_out)
        self.kernel_calls[problem.op] += 1
        self._conv_bwd_fused(problem, x, dy, w, dx_out, dw_out, db_out)
        self._stored(problem, dx_out, dw_out, db_out)
        return dx_out

    def _expect_bias(self, problem: Any, bias: Array | None) -> None:
        # conv_fwd's and conv_pool_fwd's bias: given, of K values, when the problem has one.
        if problem.bias:
            if bias is None:
                raise ValueError(f"{problem.op}: the problem has bias=True but no bias array was given")
            self._expect(problem, "bias", bias, (problem.K,))

    def _expect_weight_gradients(self, problem: Any, dw_out: Array, db_out: Array | None) -> None:
        # conv_wgrad's and conv_bwd_fused's outputs: dW, and db exactly when the problem has a bias.
        self._expect(problem, "dw_out", dw_out, problem.w_shape)
        if problem.bias:
            if db_out is None:
                raise ValueError(f"{problem.op}: the problem has bias=True but no db_out buffer was given")
            self._expect(problem, "db_out", db_out, (problem.K,))
        elif db_out is not None:
            raise ValueError(f"{problem.op}: the problem has bias=False but a db_out buffer was given")

    def tuned_faster(self, alternative: Sequence[KernelProblem], replaced: Sequence[KernelProblem]) -> bool:
        """Whether the ``alternative`` problems (a fused backward, a convolution fused with its
        pooling) should run instead of the ``replaced`` ones. Only a backend with tuned kernels can
        say yes."""
        return False

    def _conv_bwd_fused(self, problem: Any, x: Array, dy: Array, w: Array, dx_out: Array, dw_out: Array,
                        db_out: Array | None) -> None:
        # The same results as the split pair by definition: a backend without a fused kernel runs those.
        geometry = problem.geometry()
        self._conv_bwd_data(ConvBwdDataProblem(**geometry), dy, w, dx_out)
        self._conv_wgrad(ConvWgradProblem(**geometry, bias=problem.bias), x, dy, dw_out, db_out)

    def conv_pool_fwd(self, problem: Any, x: Array, w: Array, bias: Array | None, y_out: Array, a_out: Array) -> Array:
        """y_out = avgpool(a) and a_out = a = act(conv(x, w) + bias) in one operation (kernels.conv_pool,
        ``keep_activation``): a convolution layer and the averaging after it, where ``tuned_faster``
        says so."""
        if not problem.keep_activation:
            raise ValueError(f"{problem.op}: training keeps the activation for the backward; the problem "
                             f"has keep_activation=False")
        self._expect(problem, "x", x, problem.x_shape)
        self._expect(problem, "w", w, problem.w_shape)
        self._expect(problem, "y_out", y_out, problem.pool.y_shape)
        self._expect(problem, "a_out", a_out, problem.y_shape)
        self._expect_bias(problem, bias)
        self.kernel_calls[problem.op] += 1
        self._conv_pool_fwd(problem, x, w, bias if problem.bias else None, y_out, a_out)
        self._stored(problem, y_out, a_out)
        return y_out

    def conv_pool_dz(self, problem: Any, dy: Array, a: Array, dz_out: Array) -> Array:
        """dz_out = act'(a) * supersample(dy): the averaging's backward and the convolution layer's
        activation gradient in one pass (kernels.conv_pool), where ``tuned_faster`` says so."""
        self._expect(problem, "dy", dy, problem.y_shape)
        self._expect(problem, "a", a, problem.x_shape)
        self._expect(problem, "dz_out", dz_out, problem.x_shape)
        self.kernel_calls[problem.op] += 1
        self._conv_pool_dz(problem, dy, a, dz_out)
        self._stored(problem, dz_out)
        return dz_out

    def _conv_pool_fwd(self, problem: Any, x: Array, w: Array, bias: Array | None, y_out: Array, a_out: Array) -> None:
        # A backend without the fused kernel runs the pair it replaces: the same results.
        self._conv_fwd(problem.conv, x, w, bias, a_out)
        self._avgpool_fwd(problem.pool, a_out, y_out)

    def _conv_pool_dz(self, problem: Any, dy: Array, a: Array, dz_out: Array) -> None:
        geometry = problem.geometry()
        self._avgpool_bwd(AvgPoolBwdProblem(**geometry), dy, dz_out)
        if problem.activation != "none":
            activation_grad(self, problem.activation, a, dz_out, dz_out)

    def avgpool_fwd(self, problem: AvgPoolFwdProblem, x: Array, out: Array) -> Array:
        self._expect(problem, "x", x, problem.x_shape)
        self._expect(problem, "out", out, problem.y_shape)
        self.kernel_calls[problem.op] += 1
        self._avgpool_fwd(problem, x, out)
        self._stored(problem, out)
        return out

    def avgpool_bwd(self, problem: AvgPoolBwdProblem, dy: Array, out: Array) -> Array:
        self._expect(problem, "dy", dy, problem.y_shape)
        self._expect(problem, "out", out, problem.x_shape)
        self.kernel_calls[problem.op] += 1
        self._avgpool_bwd(problem, dy, out)
        self._stored(problem, out)
        return out

    @abc.abstractmethod
    def _conv_fwd(self, problem: ConvFwdProblem, x: Array, w: Array, bias: Array | None, out: Array) -> None: ...

    @abc.abstractmethod
    def _conv_bwd_data(self, problem: ConvBwdDataProblem, dy: Array, w: Array, out: Array) -> None: ...

    @abc.abstractmethod
    def _conv_wgrad(self, problem: ConvWgradProblem, x: Array, dy: Array, dw_out: Array,
                    db_out: Array | None) -> None: ...

    @abc.abstractmethod
    def _avgpool_fwd(self, problem: AvgPoolFwdProblem, x: Array, out: Array) -> None: ...

    @abc.abstractmethod
    def _avgpool_bwd(self, problem: AvgPoolBwdProblem, dy: Array, out: Array) -> None: ...

    def _stored(self, problem: KernelProblem, *outputs: Array | None) -> None:
        # What a kernel of the problem's precision stores: its outputs on the 16-bit grid (round_to).
        element = precision_of(problem).x
        for out in outputs:
            if out is not None:
                self.round_to(element, out)

    def _expect(self, problem: KernelProblem, what: str, array: Array, shape: tuple[int, ...]) -> None:
        # Cheap checks that turn a wiring mistake into a message instead of a wrong result or a crash.
        if tuple(array.shape) != tuple(shape):
            raise ValueError(f"{problem.op} ({problem.shape_string()}): {what} has shape "
                             f"{tuple(array.shape)}, expected {tuple(shape)}")
        expected = self.storage_dtype(precision_of(problem).x)
        if array.dtype != expected:
            raise TypeError(f"{problem.op}: {what} has dtype {array.dtype}; at precision {precision_of(problem).name} "
                            f"the {self.name} backend holds it in {np.dtype(expected).name}")

    # -- dense layers and element-wise work (generic over xp) ----------------------------------
    def matmul(self, a: Array, b: Array, out: Array | None = None) -> Array:
        """a @ b (numpy: BLAS; cupy: cuBLAS), into ``out`` when given."""
        return self.xp.matmul(a, b, out=out)

    def activation(self, name: str, z: Array, out: Array) -> Array:
        """out = act(z); ``out`` may be ``z`` (in place)."""
        return activations.forward(self.xp, name, z, out)

    def bias_activation(self, y: Array, bias: Array | None, name: str) -> Array:
        """y = act(y + bias) in place, the bias broadcast along the last axis (a Dense epilogue)."""
        if bias is not None:
            y += bias
        if name != "none":
            self.activation(name, y, out=y)
        return y

    def dense_dispatch(self, in_features: int, out_features: int, head: bool,
                       element: ElementType = FLOAT32) -> tuple[str, str]:
        """(source, detail) of what runs a Dense layer; ``head``: the last layer, run with the loss;
        ``element``: what its tensors are stored in (a 16-bit layer's emulated here)."""
        emulated = f" on {element.name} values (emulated)" if element != FLOAT32 else ""
        return "matmul", f"{self.xp.__name__}.matmul{emulated}" + (" (then the loss, separately)" if head else "")

    def dense_loss_step(self, x: Array, w: Array, bias: Array | None, labels: Array, weights: Array, *,
                        logits: Array, dlogits: Array, db: Array | None, dx: Array | None, loss_out: Array,
                        acc_out: Array, loss: Any, metric: Any) -> None:
        """The classifier head of a training step: logits = x @ w (+ bias), the softmax cross-entropy
        ``loss`` (its value into ``loss_out``, dL/dlogits into ``dlogits``), the accuracy by ``metric``
        into ``acc_out``, the bias gradient into ``db`` and dL/dx into ``dx`` (when not None). The
        weight gradient is left to the caller. A backend may fuse it (then ``logits`` is not written).
        """
        self.matmul(x, w, out=logits)
        if bias is not None:
            self.bias_activation(logits, bias, "none")
        loss.loss_grad_accuracy(logits, labels, weights, grad_out=dlogits, loss_out=loss_out, acc_out=acc_out,
                                metric=metric)
        if db is not None:
            self.xp.sum(dlogits, axis=0, out=db)
        if dx is not None:
            self.matmul(dlogits, w.T, out=dx)

    def bias_activation_into(self, z: Array, bias: Array | None, y: Array, name: str, element: ElementType) -> Array:
        """y = act(z + bias), the bias broadcast along the last axis, stored as ``element`` (rounded
        once): a 16-bit Dense layer's epilogue after its GEMM's FP32 result ``z``."""
        self.xp.copyto(y, z)
        self.bias_activation(y, bias, name)
        return self.round_to(element, y)

    def activation_grad_bias(self, name: str, y: Array, dy: Array, out: Array | None, db_out: Array,
                             element: ElementType = FLOAT32) -> Array:
        """A Dense layer's backward epilogue: dL/dz through the activation (into ``out``; with no
        activation ``out`` may be None and dz is dy) and its sum over the batch into ``db_out``,
        each stored as ``element`` (a 16-bit layer's: rounded once). Returns dz."""
        if name == "none":
            dz = dy
        else:
            dz = self.round_to(element, activation_grad(self, name, y, dy, out=out))
        self.xp.sum(dz, axis=0, out=db_out)
        self.round_to(element, db_out)
        return dz

    def activation_grad(self, name: str, y: Array, dy: Array, out: Array) -> Array:
        """out = dL/dz given the activation's OUTPUT y and dL/dy; ``out`` may be ``dy``."""
        return activations.gradient(self.xp, name, y, dy, out)


def activation_grad(backend: Backend, name: str, y: Array, dy: Array, out: Array) -> Array:
    """out = dL/dz from the activation's output ``y`` and dL/dy, as ``backend.activation_grad``.

    With the generic element-wise code (a backend that does not override activation_grad) this
    writes every intermediate into ``out`` instead of temporaries, with the same results bit for
    bit; a backend's own (e.g. fused) implementation is used as it is. ``out`` must not be ``y``.
    """
    if type(backend).activation_grad is not Backend.activation_grad:
        return backend.activation_grad(name, y, dy, out=out)
    return activations.gradient_without_temporaries(backend.xp, name, y, dy, out)
