"""The mixed-precision kernels (nn_sixteen_bit.cu.j2) run on the CPU's CUDA emulator
(tests/cuda_emulator.py: host definitions of the 16-bit types and their conversions, bit for bit
as the GPU's) against the numpy backend's emulation of the same steps, which the CPU training
tests use: a cast, the gradients' way back into FP32, the loss scale's update and the activation
gradient must agree bit for bit, since both round the same FP32 values once. Grids smaller than
the arrays, so that the grid-stride loops and the block-wide flag run as on a GPU."""
from __future__ import annotations

import ctypes
import re
import shutil

import numpy as np
import pytest

from autocnn.measurement import element_arrays
from autocnn.nn import NumpyBackend
from autocnn.nn.fused import ACTIVATION_CODES
from autocnn.nn.mixed_precision import FOUND, LossScaling, ScaleUse
from autocnn.precision import BFLOAT16, FLOAT16, FLOAT32

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++")

BLOCKS, THREADS = 3, 64
# __syncthreads_or on the emulator: a flag every thread of the block may set between two barriers.
EXTRA = r"""
static std::atomic<int> emu_or_flag{0};
inline int __syncthreads_or(int predicate) {
    __syncthreads();
    if (predicate) emu_or_flag = 1;
    __syncthreads();
    const int any = emu_or_flag;
    __syncthreads();
    if (threadIdx.x == 0) emu_or_flag = 0;   // before any thread can reach the next call's first barrier
    return any;
}
"""


def _trampolines() -> str:
    text = []
    for suffix, ctype in (("bf16", "__nv_bfloat16"), ("fp16", "__half")):
        text.append(
            f'extern "C" void emu_to_{suffix}(void* s, void* d, long long n, void* st, int use) {{ gridDim.x = {BLOCKS}; '
            f"emu_run({BLOCKS}u, {THREADS}u, [&] {{ nn_cast_f32_to_{suffix}((const float*)s, ({ctype}*)d, n, "
            f"(const float*)st, use); }}); }}\n"
            f'extern "C" void emu_from_{suffix}(void* s, void* d, long long n, void* st, int use) {{ gridDim.x = {BLOCKS}; '
            f"emu_run({BLOCKS}u, {THREADS}u, [&] {{ nn_cast_{suffix}_to_f32((const {ctype}*)s, (float*)d, n, "
            f"(const float*)st, use); }}); }}\n"
            f'extern "C" void emu_grads_{suffix}(void* g32, void* g16, long long n, void* runs, int nruns, void* st) '
            f"{{ gridDim.x = {BLOCKS}; emu_run({BLOCKS}u, {THREADS}u, [&] {{ nn_gradients_to_f32_{suffix}("
            f"(float*)g32, (const {ctype}*)g16, n, (const long long*)runs, nruns, (float*)st); }}); }}\n"
            f'extern "C" void emu_act_grad_{suffix}(void* y, void* dy, void* dz, long long n, int act) '
            f"{{ gridDim.x = {BLOCKS}; emu_run({BLOCKS}u, {THREADS}u, [&] {{ nn_activation_grad_{suffix}("
            f"(const {ctype}*)y, (const {ctype}*)dy, ({ctype}*)dz, n, act); }}); }}\n")
        text.append(
            f'extern "C" void emu_bias_act_{suffix}(void* z, void* b, void* y, long long n, int features, int act) '
            f"{{ gridDim.x = {BLOCKS}; emu_run({BLOCKS}u, {THREADS}u, [&] {{ nn_bias_activation_to_{suffix}("
            f"(const float*)z, (const {ctype}*)b, ({ctype}*)y, n, features, act); }}); }}\n"
            f'extern "C" void emu_colsum_{suffix}(void* y, void* dy, void* dz, void* db, int rows, int cols, int act) '
            f"{{ gridDim.x = 1; emu_run(1u, {THREADS}u, [&] {{ nn_activation_grad_colsum_{suffix}("
            f"(const {ctype}*)y, (const {ctype}*)dy, ({ctype}*)dz, ({ctype}*)db, rows, cols, act); }}); }}\n")
    text.append('extern "C" void emu_scale_update(void* st, float growth, float backoff, float interval) '
                "{ gridDim.x = 1; emu_run(1u, 32u, [&] { nn_loss_scale_update((float*)st, growth, backoff, interval); }); }\n")
    return "".join(text)


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    import re

    from autocnn.nn import fused_sixteen_bit
    from tests.cuda_emulator import HOST_MIN, PRELUDE, compile_library

    body = re.sub(r"#include <cuda_(?:bf16|fp16)\.h>\n", "", fused_sixteen_bit.render_source())
    return compile_library(PRELUDE + HOST_MIN + EXTRA + body + "\n" + _trampolines(), tmp_path_factory.mktemp("emu"),
                           "nn_sixteen_bit")


def _p(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def _null_or(a: np.ndarray | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(0) if a is None else _p(a)


ELEMENTS = {"bf16": BFLOAT16, "fp16": FLOAT16}


@pytest.mark.parametrize("suffix", sorted(ELEMENTS))
@pytest.mark.parametrize("use", list(ScaleUse))
def test_casts_round_as_the_numpy_emulation(emu, suffix, use):
    element, cpu = ELEMENTS[suffix], NumpyBackend()
    rng = np.random.default_rng()
    values = (rng.standard_normal(1001) * 3000).astype(np.float32)   # more elements than threads
    values[:5] = [70000.0, -65520.0, np.nan, 3e-8, -0.0]             # fp16's Inf, NaN, a subnormal
    state = np.array([32.0, 0, 0, 0], np.float32)
    stored = np.zeros(values.size, dtype=element_arrays.storage_dtype(element))
    getattr(emu, f"emu_to_{suffix}")(_p(values), _p(stored), ctypes.c_longlong(values.size), _p(state),
                                     ctypes.c_int(use.value))
    expected = cpu.cast(values, FLOAT32, np.zeros_like(values), element, state, use)
    np.testing.assert_array_equal(element_arrays.values(stored, element, np), expected)
    back = np.full(values.size, np.nan, np.float32)
    getattr(emu, f"emu_from_{suffix}")(_p(stored), _p(back), ctypes.c_longlong(values.size), _p(state),
                                       ctypes.c_int(use.value))
    np.testing.assert_array_equal(back, cpu.cast(expected, element, np.zeros_like(values), FLOAT32, state, use))


@pytest.mark.parametrize("suffix", sorted(ELEMENTS))
def test_gradients_into_fp32_as_the_numpy_emulation(emu, suffix):
    element, cpu = ELEMENTS[suffix], NumpyBackend()
    rng = np.random.default_rng()
    n, runs = 999, ((0, 250), (300, 301), (600, 999))
    g16 = element_arrays.rounded(rng.standard_normal(n).astype(np.float32) * 100, element, np)
    own = rng.standard_normal(n).astype(np.float32)
    flat_runs = np.array([v for run in runs for v in run], np.int64)
    for poisoned in (None, 123, 450):   # none; inside a run (a 16-bit gradient); outside (an FP32 layer's)
        g32, expected = own.copy(), own.copy()
        values = element_arrays.values(g16, element, np).copy()
        if poisoned is not None:
            (values if poisoned == 123 else expected)[poisoned] = np.inf
            if poisoned != 123:
                g32[poisoned] = np.inf
        stored = element_arrays.rounded(values, element, np)
        state, host_state = np.array([1024.0, 7, 0, 0], np.float32), np.array([1024.0, 7, 0, 0], np.float32)
        getattr(emu, f"emu_grads_{suffix}")(_p(g32), _p(stored), ctypes.c_longlong(n), _p(flat_runs),
                                            ctypes.c_int(len(runs)), _p(state))
        cpu.gradients_to_fp32(expected, values, element, runs, host_state)
        np.testing.assert_array_equal(g32, expected)
        np.testing.assert_array_equal(state, host_state)
        assert state[FOUND] == (poisoned is not None)
    g32 = own.copy()
    getattr(emu, f"emu_grads_{suffix}")(_p(g32), _p(g16), ctypes.c_longlong(n), _p(flat_runs),
                                        ctypes.c_int(len(runs)), _null_or(None))   # bf16's way: no scaler
    np.testing.assert_array_equal(g32[:250], element_arrays.values(g16, element, np)[:250])
    np.testing.assert_array_equal(g32[250:300], own[250:300])


def test_the_loss_scale_update_follows_the_numpy_state_machine(emu):
    cpu = NumpyBackend()
    settings = LossScaling(init_scale=2.0 ** 16, growth_interval=3)
    device, host = (np.array([settings.init_scale, 0, 0, 0], np.float32) for _ in range(2))
    for found in [0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0]:
        device[FOUND] = host[FOUND] = found
        emu.emu_scale_update(_p(device), ctypes.c_float(settings.growth_factor), ctypes.c_float(settings.backoff_factor),
                             ctypes.c_float(settings.growth_interval))
        cpu.loss_scale_update(host, settings)
        np.testing.assert_array_equal(device, host)
    np.testing.assert_array_equal(host, [2.0 ** 16, 1, 0, 0])


@pytest.mark.parametrize("suffix", sorted(ELEMENTS))
@pytest.mark.parametrize("act", ["relu", "tanh", "logistic"])
def test_activation_gradients_on_sixteen_bits_as_the_numpy_emulation(emu, suffix, act):
    from autocnn.nn.backend import activation_grad

    element, cpu = ELEMENTS[suffix], NumpyBackend()
    rng = np.random.default_rng()
    y = element_arrays.rounded(np.tanh(rng.standard_normal(777)).astype(np.float32), element, np)
    dy = element_arrays.rounded(rng.standard_normal(777).astype(np.float32), element, np)
    dz = np.zeros_like(y)
    emu.__getattr__(f"emu_act_grad_{suffix}")(_p(y), _p(dy), _p(dz), ctypes.c_longlong(y.size),
                                              ctypes.c_int(ACTIVATION_CODES[act]))
    yv, dyv = element_arrays.values(y, element, np), element_arrays.values(dy, element, np)
    expected = cpu.round_to(element, activation_grad(cpu, act, yv, dyv, np.zeros_like(yv)))
    np.testing.assert_array_equal(element_arrays.values(dz, element, np), expected)


@pytest.mark.parametrize("suffix", sorted(ELEMENTS))
@pytest.mark.parametrize("act", ["none", "relu", "tanh"])
def test_the_sixteen_bit_dense_epilogues_as_the_numpy_emulation(emu, suffix, act):
    """The forward epilogue (FP32 GEMM result + bias, activation, one rounding) and the backward one
    (dL/dz rounded, its column sums in FP32 rounded once), 37 rows by 70 columns (more columns than
    the block's threads). Bit for bit where both compute the same FP32 operations in one order;
    tanh (each side's own tanhf) and the column sums (NumPy sums pairwise, the kernel in row order)
    may round to the neighbouring 16-bit value: one step, 2u of the value at most."""
    element, cpu = ELEMENTS[suffix], NumpyBackend()
    rng = np.random.default_rng()
    rows, cols = 37, 70
    z = rng.standard_normal((rows, cols)).astype(np.float32)
    bias = element_arrays.rounded(rng.standard_normal(cols).astype(np.float32), element, np)
    y = np.zeros((rows, cols), dtype=bias.dtype)
    emu.__getattr__(f"emu_bias_act_{suffix}")(_p(z), _p(bias), _p(y), ctypes.c_longlong(z.size), ctypes.c_int(cols),
                                              ctypes.c_int(ACTIVATION_CODES[act]))
    expected = cpu.bias_activation_into(z, element_arrays.values(bias, element, np), np.zeros_like(z), act, element)
    got = element_arrays.values(y, element, np)
    one_step = 2 * (2.0 ** -8 if element == BFLOAT16 else 2.0 ** -11)
    if act == "tanh":
        assert (np.abs(got - expected) <= one_step * np.abs(expected)).all()
    else:
        np.testing.assert_array_equal(got, expected)
    dy = element_arrays.rounded(rng.standard_normal((rows, cols)).astype(np.float32), element, np)
    dz, db = np.zeros_like(y), np.zeros(cols, dtype=y.dtype)
    emu.__getattr__(f"emu_colsum_{suffix}")(_p(y), _p(dy), _p(dz), _p(db), ctypes.c_int(rows), ctypes.c_int(cols),
                                            ctypes.c_int(ACTIVATION_CODES[act]))
    dz_cpu, db_cpu = np.zeros((rows, cols), np.float32), np.zeros(cols, np.float32)
    dz_expected = cpu.activation_grad_bias(act, got, element_arrays.values(dy, element, np), dz_cpu, db_cpu, element)
    if act != "none":
        np.testing.assert_array_equal(element_arrays.values(dz, element, np), dz_expected)
    assert (np.abs(element_arrays.values(db, element, np) - db_cpu) <= one_step * np.abs(db_cpu)).all()


# -- the Python side of every launch, against the kernels' signatures ---------------------------------
# fused_sixteen_bit's functions launch through _kernel(name)(grid, block, args). Here _kernel hands
# out a launcher that checks each argument against the kernel's parameter in the rendered source (an
# array or a null pointer for a pointer, a NumPy scalar of the C type's size for a value: CuPy
# passes a scalar by its own size, so an int64 where the kernel takes an int would shift every
# argument after it) and then runs the kernel on the emulator, on the NumPy arrays given.

SCALAR_SIZES = {"int": 4, "long long": 8, "float": 4, "double": 8, "unsigned": 4}
CTYPES = {np.int32: ctypes.c_int32, np.int64: ctypes.c_int64, np.float32: ctypes.c_float, np.float64: ctypes.c_double,
          np.uint32: ctypes.c_uint32}
SIGNATURE = re.compile(r'__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\(([^)]*)\)')


def kernel_signatures(source: str) -> dict[str, list[str]]:
    """Each kernel's parameter types (without their names and __restrict__)."""
    found = {}
    for name, params in SIGNATURE.findall(source):
        types = []
        for param in params.split(","):
            words = param.replace("__restrict__", "").split()
            types.append(" ".join(words[:-1]).replace(" *", "*"))
        found[name] = types
    return found


def check_arguments(name: str, types: list[str], args: tuple) -> None:
    assert len(args) == len(types), f"{name}: {len(args)} arguments for {len(types)} parameters"
    for i, (ctype, arg) in enumerate(zip(types, args)):
        if ctype.endswith("*"):
            assert isinstance(arg, np.ndarray) or (isinstance(arg, np.uint64) and arg == 0), \
                f"{name} parameter {i} ({ctype}) given {type(arg).__name__}"
        else:
            assert isinstance(arg, np.generic) and arg.itemsize == SCALAR_SIZES[ctype.replace("const ", "")], \
                f"{name} parameter {i} ({ctype}) given {type(arg).__name__}"


class EmulatedLaunches:
    """Stands in for fused_sixteen_bit._kernel: checks, counts and runs each launch on the emulator."""

    def __init__(self, source: str, library) -> None:
        self.signatures = kernel_signatures(source)
        self.library = library
        self.launched: list[str] = []

    def __call__(self, name: str):
        types = self.signatures[name]

        def launch(grid, block, args):
            check_arguments(name, types, args)
            self.launched.append(name)
            slots = [ctypes.c_void_p(a.ctypes.data) if isinstance(a, np.ndarray) else
                     ctypes.c_void_p(0) if ctype.endswith("*") else CTYPES[a.dtype.type](a.item())
                     for ctype, a in zip(types, args)]
            argv = (ctypes.c_void_p * len(slots))(*[ctypes.addressof(s) for s in slots])
            getattr(self.library, f"emu_call_{name}")(ctypes.c_uint(grid[0]), ctypes.c_uint(block[0]), argv)
        return launch


def generic_trampolines(signatures: dict[str, list[str]]) -> str:
    text = []
    for name, types in signatures.items():
        args = ", ".join(f"*reinterpret_cast<{t}*>(a[{i}])" for i, t in enumerate(types))
        text.append(f'extern "C" void emu_call_{name}(unsigned grid, unsigned block, void** a) {{ gridDim.x = grid; '
                    f"emu_run(grid, block, [&] {{ {name}({args}); }}); }}\n")
    return "".join(text)


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    from autocnn.nn import fused_sixteen_bit
    from tests.cuda_emulator import HOST_MIN, PRELUDE, compile_library

    source = fused_sixteen_bit.render_source()
    body = re.sub(r"#include <cuda_(?:bf16|fp16)\.h>\n", "", source)
    library = compile_library(PRELUDE + HOST_MIN + EXTRA + body + "\n" + generic_trampolines(kernel_signatures(source)),
                              tmp_path_factory.mktemp("launches"), "nn_sixteen_bit launches")
    return EmulatedLaunches(source, library)


@pytest.fixture
def emulated(launches, monkeypatch):
    """fused_sixteen_bit as the cuda backend calls it, each launch checked and run on the emulator."""
    from autocnn.nn import fused_sixteen_bit

    monkeypatch.setattr(fused_sixteen_bit, "_kernel", launches)
    monkeypatch.setattr(fused_sixteen_bit, "THREADS", 32)   # several blocks of a grid on small arrays
    launches.launched.clear()
    return fused_sixteen_bit


@pytest.mark.parametrize("suffix", sorted(ELEMENTS))
def test_every_python_launch_fits_its_kernel_and_computes_as_the_numpy_backend(emulated, launches, suffix):
    """Each function of fused_sixteen_bit, called as the cuda backend calls it (on NumPy arrays of the
    storage dtypes), against the numpy backend's emulation of the same operation."""
    element, cpu = ELEMENTS[suffix], NumpyBackend()
    rng = np.random.default_rng()
    store = element_arrays.storage_dtype(element)
    value = lambda a: element_arrays.values(a, element, np)   # noqa: E731
    rows, cols = 9, 45
    x = (rng.standard_normal((rows, cols)) * 10).astype(np.float32)   # scaled by 128, still finite in fp16
    state = np.array([128.0, 3, 0, 0], np.float32)
    # casts, with the scale and without a scaler
    x16 = np.zeros(x.shape, store)
    emulated.cast(x, FLOAT32, x16, element, state, ScaleUse.SCALE_UP)
    np.testing.assert_array_equal(value(x16), cpu.cast(x, FLOAT32, np.zeros_like(x), element, state, ScaleUse.SCALE_UP))
    back = np.zeros(x.shape, np.float32)
    emulated.cast(x16, element, back, FLOAT32, None, ScaleUse.SCALE_DOWN)   # no scaler: nothing divided
    np.testing.assert_array_equal(back, value(x16))
    with pytest.raises(ValueError, match="one side must be float32"):
        emulated.cast(x16, element, np.zeros(x.shape, store), element, None, ScaleUse.KEEP)
    # gradients into FP32, flagged
    g32 = rng.standard_normal(x.size).astype(np.float32)
    expected = g32.copy()
    runs = ((5, 100), (200, 405))
    flat_runs = np.array([v for run in runs for v in run], np.int64)
    host_state = state.copy()
    emulated.gradients_to_fp32(g32, x16.ravel(), element, flat_runs, len(runs), state)
    cpu.gradients_to_fp32(expected, value(x16).ravel(), element, runs, host_state)
    np.testing.assert_array_equal(g32, expected)
    np.testing.assert_array_equal(state, host_state)
    # the scale's update
    settings = LossScaling(growth_interval=4)
    emulated.loss_scale_update(state, settings.growth_factor, settings.backoff_factor, settings.growth_interval)
    cpu.loss_scale_update(host_state, settings)
    np.testing.assert_array_equal(state, host_state)
    # activations and their gradients
    y16 = np.zeros(x.shape, store)
    emulated.activation(element, "tanh", x16, y16)
    y_cpu = cpu.round_to(element, np.tanh(value(x16)))
    assert (np.abs(value(y16) - y_cpu) <= 2 * 2.0 ** -8 * np.abs(y_cpu)).all()   # each side's tanhf: one step apart at most
    dz16 = np.zeros(x.shape, store)
    emulated.activation_grad(element, "relu", y16, x16, dz16)
    np.testing.assert_array_equal(value(dz16), np.where(value(y16) > 0, value(x16), 0))
    # the Dense layer's epilogues
    bias16 = element_arrays.rounded(rng.standard_normal(cols).astype(np.float32), element, np)
    out16 = np.zeros(x.shape, store)
    emulated.bias_activation_to(element, x, bias16, out16, "relu")
    np.testing.assert_array_equal(value(out16), cpu.bias_activation_into(x, value(bias16), np.zeros_like(x), "relu",
                                                                          element))
    emulated.bias_activation_to(element, x, None, out16, "none")
    np.testing.assert_array_equal(value(out16), cpu.round_to(element, x.copy()))
    db16, dz16 = np.zeros(cols, store), np.zeros(x.shape, store)
    got = emulated.activation_grad_colsum(element, "relu", out16, x16, dz16, db16)
    assert got is dz16
    dz_cpu, db_cpu = np.zeros_like(x), np.zeros(cols, np.float32)
    cpu.activation_grad_bias("relu", value(out16), value(x16), dz_cpu, db_cpu, element)
    np.testing.assert_array_equal(value(dz16), dz_cpu)
    step = 2 * (2.0 ** -8 if element == BFLOAT16 else 2.0 ** -11)
    assert (np.abs(value(db16) - db_cpu) <= step * np.abs(db_cpu)).all()
    # every kernel of this type, and the scale's update, was launched (and so checked) here
    assert sorted(set(launches.launched)) == sorted(n for n in launches.signatures if f"_{suffix}" in n
                                                    or n == "nn_loss_scale_update")


def test_the_optimizer_launches_fit_their_kernels_with_the_skip_flag(monkeypatch):
    """fused.adam, sgd and rprop pass the skip flag (or a null pointer) as their kernels' last
    parameter: checked against nn_step.cu.j2's signatures, without running them."""
    from autocnn.nn import fused

    signatures = kernel_signatures(fused.render_source())
    calls = []

    def kernel(name):
        def launch(grid, block, args):
            check_arguments(name, signatures[name], args)
            calls.append((name, args[-1]))
        return launch

    monkeypatch.setattr(fused, "_kernel", kernel)
    p, g, a, b = (np.zeros(10, np.float32) for _ in range(4))
    hyper, counter, flag = np.zeros(5), np.zeros(2, np.int64), np.zeros(1, np.float32)
    for skip in (None, flag):
        fused.adam(p, g, a, b, hyper, counter, True, skip=skip)
        fused.sgd(p, g, a, hyper, counter, False, skip=skip)
        fused.rprop(p, g, a, b, hyper, counter, False, skip=skip)
    assert [name for name, _ in calls] == ["nn_adam", "nn_sgd", "nn_rprop"] * 2
    assert all(isinstance(last, np.uint64) for _, last in calls[:3]) and all(last is flag for _, last in calls[3:])
