"""A NumPy interpreter of kernel plans for CPU tests of formulations with library steps: each
LibraryGemm and LibraryComplexGemm runs on exactly the buffer views it names (as cuBLAS would), each
LibraryFft on the planes and half spectra it names (unnormalised, as cuFFT; frequency-major where it
says so), each generated kernel by a NumPy function a test supplies, all in float64 on flat buffers."""
from __future__ import annotations

from typing import Any

import numpy as np

from autocnn.kernels import reference
from autocnn.kernels.steps import LibraryComplexGemm, LibraryFft, LibraryGemm, MatrixView


def view(buf: np.ndarray, mv: MatrixView, rows: int, cols: int, batch: int) -> np.ndarray:
    """The (batch, rows, cols) matrices a MatrixView names in a flat buffer (writable)."""
    assert mv.extent(rows, cols, batch) <= buf.size, f"{mv} reaches past {buf.size} elements"
    item = buf.itemsize
    return np.lib.stride_tricks.as_strided(buf[mv.offset:], shape=(batch, rows, cols),
                                           strides=(mv.batch_stride * item, mv.ld * item, item))


def numpy_gemm(step: LibraryGemm | LibraryComplexGemm, buffers: dict[str, np.ndarray]) -> None:
    """As cuBLAS: each operand as stored ("n", "t" or "h"); a complex step's views count complex
    numbers of the float buffers."""
    shapes = step.stored_shapes()

    def operand(name):
        buf, mv = buffers[getattr(step, name).buffer], getattr(step, name)
        if step.FLOATS == 2:
            buf = buf[:buf.size // 2 * 2].view(np.result_type(buf.dtype, np.complex64))
        x = view(buf, mv, *shapes[name], step.batch)
        how = step.stored_op(name) if name != "c" else "n"
        return x if how == "n" else x.transpose(0, 2, 1) if how == "t" else np.conj(x.transpose(0, 2, 1))

    c = operand("c")
    product = operand("a") @ operand("b")
    c[...] = product + c if step.accumulate else product


def frequency_major(spectra: np.ndarray, planes: int, h: int, half: int) -> np.ndarray:
    """A [frequency][plane] run of complex numbers seen as (planes, h, half), writable."""
    seen = np.moveaxis(spectra.reshape(h, half, planes), -1, 0)
    assert np.shares_memory(seen, spectra)
    return seen


def numpy_fft(step: LibraryFft, buffers: dict[str, np.ndarray]) -> None:
    (src, src_end), (dst, dst_end) = step.extents()["src"], step.extents()["dst"]
    assert src_end <= buffers[src].size and dst_end <= buffers[dst].size, f"{step} reaches past a buffer"
    complex_type = np.result_type(buffers[src].dtype, np.complex64)
    h, w, n = step.height, step.width, step.batch
    source = buffers[src][step.src_offset:src_end]
    target = buffers[dst][step.dst_offset:dst_end]
    if step.kind == "r2c":
        spectra = np.fft.rfft2(source.reshape(n, h, w))
        if step.frequency_major:
            frequency_major(target.view(complex_type), n, h, w // 2 + 1)[...] = spectra
        else:
            target.view(complex_type)[...] = spectra.ravel()
    else:
        spectra = source.view(complex_type)
        spectra = (frequency_major(spectra, n, h, w // 2 + 1) if step.frequency_major
                   else spectra.reshape(n, h, w // 2 + 1))
        target[...] = (np.fft.irfft2(spectra, s=(h, w)) * (h * w)).ravel()
        source[...] = np.nan   # cuFFT's C2R may overwrite its input: a plan must not read it again


LIBRARY_STEPS = (LibraryGemm, LibraryComplexGemm, LibraryFft)


def run_library_step(step: LibraryGemm | LibraryComplexGemm | LibraryFft, buffers: dict[str, np.ndarray]) -> None:
    """A cuBLAS GEMM or cuFFT transform of a plan, in NumPy on the flat buffers it names."""
    if isinstance(step, (LibraryGemm, LibraryComplexGemm)):
        numpy_gemm(step, buffers)
    else:
        numpy_fft(step, buffers)


def run_plan(plan: Any, inputs: dict[str, np.ndarray], kernels: Any, dtype: Any = np.float64) -> dict[str, np.ndarray]:
    """Run a plan's steps in order on buffers of ``dtype`` (float32 to see a formulation's
    rounding): outputs and workspaces start as NaN (so an unwritten element shows); a generated
    kernel's launch calls ``kernels.<kernel name>(buffers, *scalars)``."""
    buffers = {name: a.astype(dtype).ravel() for name, a in inputs.items()}
    shapes = reference.output_shapes(plan.problem)
    for name, shape in shapes.items():
        buffers[name] = np.full(int(np.prod(shape)), np.nan, dtype=dtype)
    for name, n in plan.workspaces:
        buffers[name] = np.full(n, np.nan, dtype=dtype)
    for name in plan.zero_first:        # cleared before the first launch, as the runtime does
        buffers[name][...] = 0
    for step in plan.steps:
        if isinstance(step, LIBRARY_STEPS):
            run_library_step(step, buffers)
        else:
            getattr(kernels, step.kernel)(buffers, *step.scalars)
    return {name: buffers[name].reshape(shape) for name, shape in shapes.items()}


def relative_errors(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> dict[str, float]:
    """||got - expected|| / ||expected|| per output; NaN where an element was not written."""
    out = {}
    for name, ref in expected.items():
        if not np.all(np.isfinite(got[name])):
            out[name] = float("nan")
        else:
            out[name] = float(np.linalg.norm(got[name].astype(np.float64) - ref) / np.linalg.norm(ref))
    return out


def check_plans(operation: Any, problems: Any, configs_for: Any, kernels_for: Any, rng: np.random.Generator,
                tolerance: float = 1e-12) -> int:
    """Each problem's configs (``configs_for(problem)``) planned and run in float64 on fresh inputs
    against the float64 reference: an error above ``tolerance`` or an unwritten element fails.
    Returns how many plans ran."""
    checked = 0
    for name, problem in problems:
        inputs = {k: rng.standard_normal(s) for k, s in reference.input_shapes(problem).items()}
        expected = reference.run_problem(problem, inputs)
        for config in configs_for(problem):
            plan = operation.plan(problem, config)
            errors = relative_errors(run_plan(plan, inputs, kernels_for(problem, config)), expected)
            assert all(e < tolerance for e in errors.values()), f"{name} {config}: relative errors {errors}"
            checked += 1
    return checked
