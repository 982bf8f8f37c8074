"""The cuda backend's mixed-precision kernels (nn_sixteen_bit.cu.j2, beside this module): casts
between FP32 and the 16-bit tensors of bf16 and fp16 layers, the weight gradients' way back into
the FP32 gradient buffer (loss scale undone, non-finite values flagged), the loss scale's update,
and activations on 16-bit tensors.

A module of its own, apart from nn_step.cu.j2: it includes the 16-bit types' headers, which NVRTC
finds only through the CUDA include directory (autocnn.kernels.compiler.nvrtc_options), so a model
of float32 layers never needs them. Every launch reads the loss scale from device memory, so a
CUDA graph replays them as they are.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from autocnn.kernels.problem import ACTIVATIONS
from autocnn.nn.fused import MAX_BLOCKS, THREADS, _code, _contiguous
from autocnn.nn.mixed_precision import ScaleUse
from autocnn.nn.source_kernels import SourceKernels
from autocnn.precision import BFLOAT16, FLOAT16, FLOAT32, ElementType

# The 16-bit element types by the suffix their kernels carry.
SUFFIXES: dict[ElementType, str] = {BFLOAT16: "bf16", FLOAT16: "fp16"}


def render_source() -> str:
    """The CUDA source of the mixed-precision kernels (no GPU needed; the tests compile it with nvcc)."""
    from autocnn.kernels.codegen import make_environment

    return make_environment(Path(__file__).resolve().parent).get_template("nn_sixteen_bit.cu.j2").render(
        activations=ACTIVATIONS, types=[(SUFFIXES[e], e.c_type) for e in (BFLOAT16, FLOAT16)])


def _options(source: str) -> tuple[str, ...]:
    from autocnn.kernels.compiler import nvrtc_options

    return nvrtc_options(source)   # C++17 and the 16-bit headers


KERNELS = SourceKernels(render_source, _options)
_kernel = KERNELS.kernel   # what each launch below calls (tests stand in for it)


def _grid(n: int) -> tuple[int]:
    return (max(1, min(MAX_BLOCKS, (n + THREADS - 1) // THREADS)),)


def _suffix(element: ElementType) -> str:
    try:
        return SUFFIXES[element]
    except KeyError:
        raise ValueError(f"no 16-bit kernels for {element.name} (known: bfloat16, float16)") from None


def _state(state: Any | None) -> Any:
    # No scaler: a null pointer, which the kernels take as a scale of 1 and nothing to flag.
    if state is None:
        return np.uint64(0)
    if state.dtype != np.float32:
        raise TypeError(f"the loss scaler's state is float32, got {state.dtype}")
    return state


def cast(src: Any, src_element: ElementType, dst: Any, dst_element: ElementType, state: Any | None,
         use: ScaleUse) -> Any:
    """dst = src (times the loss scale, or divided by it, as ``use`` says), one launch: FP32 into a
    16-bit type or back."""
    _contiguous("cast", src, dst)
    if src.size != dst.size:
        raise ValueError(f"cast: {src.size} elements into {dst.size}")
    if src_element == FLOAT32 and dst_element != FLOAT32:
        name = f"nn_cast_f32_to_{_suffix(dst_element)}"
    elif dst_element == FLOAT32 and src_element != FLOAT32:
        name = f"nn_cast_{_suffix(src_element)}_to_f32"
    else:
        raise ValueError(f"cast: from {src_element.name} to {dst_element.name}; one side must be float32, the "
                         f"other 16-bit")
    n = int(src.size)
    _kernel(name)(_grid(n), (THREADS,), (src, dst, np.int64(n), _state(state), np.int32(use.value)))
    return dst


def gradients_to_fp32(g32: Any, g16: Any, element: ElementType, runs: Any, nruns: int, state: Any | None) -> None:
    """g32 = g16 / scale inside the runs (int64 [lo, hi) pairs on the device), g32 kept elsewhere;
    with a scaler's state, a non-finite value anywhere in g32 flags the step."""
    _contiguous("gradients_to_fp32", g32, g16, runs)
    if g32.size != g16.size or runs.dtype != np.int64:
        raise ValueError("gradients_to_fp32: g16 mirrors g32, runs are int64 pairs")
    n = int(g32.size)
    _kernel(f"nn_gradients_to_f32_{_suffix(element)}")(_grid(n), (THREADS,),
                                                       (g32, g16, np.int64(n), runs, np.int32(nruns), _state(state)))


def loss_scale_update(state: Any, growth: float, backoff: float, growth_interval: int) -> None:
    """The loss scale's update after the step's optimizer (one thread)."""
    _kernel("nn_loss_scale_update")((1,), (32,), (_state(state), np.float32(growth), np.float32(backoff),
                                                  np.float32(growth_interval)))


def activation(element: ElementType, name: str, z: Any, out: Any) -> Any:
    """out = act(z) on 16-bit tensors, one launch; out may be z."""
    _contiguous("activation", z, out)
    n = int(z.size)
    _kernel(f"nn_activation_{_suffix(element)}")(_grid(n), (THREADS,), (z, out, np.int64(n), _code(name)))
    return out


def activation_grad(element: ElementType, name: str, y: Any, dy: Any, out: Any) -> Any:
    """out = dL/dz from y = act(z) and dL/dy on 16-bit tensors; out may be dy (not y)."""
    _contiguous("activation_grad", y, dy, out)
    n = int(y.size)
    _kernel(f"nn_activation_grad_{_suffix(element)}")(_grid(n), (THREADS,), (y, dy, out, np.int64(n), _code(name)))
    return out


def bias_activation_to(element: ElementType, z: Any, bias: Any | None, y: Any, name: str) -> Any:
    """y = act(z + bias) rounded once to ``element``, from the FP32 GEMM result z (a 16-bit Dense
    layer's forward epilogue), one launch."""
    _contiguous("bias_activation_to", z, bias, y)
    if z.dtype != np.float32 or z.shape != y.shape:
        raise ValueError(f"bias_activation_to: z is the FP32 GEMM result of y's shape, got {z.dtype} {z.shape}")
    n, features = int(z.size), int(z.shape[-1])
    _kernel(f"nn_bias_activation_to_{_suffix(element)}")(_grid(n), (THREADS,), (
        z, np.uint64(0) if bias is None else bias, y, np.int64(n), np.int32(features), _code(name)))
    return y


def activation_grad_colsum(element: ElementType, name: str, y: Any, dy: Any, dz_out: Any | None, db_out: Any) -> Any:
    """dz = dL/dz from y = act(z) and dy (into dz_out; with no activation dz is dy) and db_out = its
    column sums, on 16-bit tensors, one launch. Returns dz."""
    if name != "none" and dz_out is None:
        raise ValueError("activation_grad_colsum: an activation needs a dz buffer")
    dz = dy if name == "none" else dz_out
    _contiguous("activation_grad_colsum", y, dy, dz, db_out)
    rows, cols = (int(s) for s in dy.shape)
    _kernel(f"nn_activation_grad_colsum_{_suffix(element)}")(_grid(cols), (THREADS,), (
        y, dy, dz, db_out, np.int32(rows), np.int32(cols), _code(name)))
    return dz
