"""The separable layer's two update routes (autocnn.separable.execution): the factored one
(sep_conv_wgrad, then the tangent projection from gu and gv) and the dense one (the 2D conv_wgrad
into G, then the projection kernel from G, which forms gu and gv itself). On the CPU: the layer's
problems carry both weight gradients, and both projection kernels, compiled as C++ by the CUDA
emulator (tests/cuda_emulator.py), match the float64 NumPy formulas. The GPU tests are in
test_separable_layer.py."""
from __future__ import annotations

import ctypes
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from autocnn.kernels.compiler import nvcc_path
from autocnn.kernels.problem import ConvFwdProblem
from autocnn.kernels.steps import Launch
from autocnn.separable import projection_cuda
from autocnn.separable.execution import separable_problems
from autocnn.separable.projection import factor_gradients, tangent_projection
from autocnn.separable.svd import SvdSettings, power_svd

TIGHT = SvdSettings(tolerance=1e-24, max_iterations=100_000)


@pytest.mark.parametrize("needs_input_grad", [True, False])
def test_separable_problems_carry_the_dense_routes_2d_weight_gradient(needs_input_grad):
    fwd = ConvFwdProblem(N=3, C=5, H=9, W=7, K=6, R=3, S=5, padding=(1, 2), bias=True, activation="relu")
    problems = separable_problems(fwd, 2, needs_input_grad)
    ops = [p.op for p in problems]
    assert ops == ["sep_conv_fwd"] + (["sep_conv_bwd_data"] if needs_input_grad else []) + \
        ["sep_conv_wgrad", "conv_wgrad"]
    assert problems[-1] == fwd.with_op("conv_wgrad", bias=True)
    assert problems[-2].rank == 2 and problems[-2].bias


@pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc (the CUDA toolkit) to compile the template")
@pytest.mark.parametrize("R,S,rank", [(3, 3, 1), (11, 11, 11), (5, 7, 3)])
def test_projection_from_g_compiles_without_spills(R, S, rank):
    from autocnn.separable.templates import nvcc_reports

    report = nvcc_reports(projection_cuda.render_source(R, S, rank, from_g=True), "sm_80")[projection_cuda.KERNEL_FROM_G]
    assert not report.spills


def _emulate(source: str, kernel: str, filters: int, threads: int, arrays: list[np.ndarray], tmp_path) -> None:
    """Run ``kernel`` of ``source`` with one block per filter under the CPU emulator, in place."""
    from tests.cuda_emulator import build

    names = tuple(f"a{i}" for i in range(len(arrays)))
    plan = SimpleNamespace(source=source, steps=[Launch(kernel, (filters, 1, 1), (threads, 1, 1), 0, names)],
                           config=kernel)
    lib = build(plan, tmp_path)
    ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    lib.emu_launch_0(ptrs, (ctypes.c_int * 1)(0))


@pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++")
@pytest.mark.parametrize("R,S,rank", [(3, 3, 1), (5, 4, 2), (7, 7, 3)])
def test_both_projection_kernels_match_the_float64_formulas(R, S, rank, tmp_path):
    rng = np.random.default_rng()
    K, C = 3, 4
    w = rng.standard_normal((K, C, R, S))
    g = rng.standard_normal((K, C, R, S))
    result = power_svd(w, rank, TIGHT)
    u, v = result.u.reshape(K, C, rank, R), result.v.reshape(K, C, rank, S)
    gu, gv = factor_gradients(g, u, v)
    expected = tangent_projection(gu, gv, u, v)
    f32 = {name: np.ascontiguousarray(a, dtype=np.float32) for name, a in dict(u=u, v=v, g=g, gu=gu, gv=gv).items()}
    threads = projection_cuda.threads_for(R, S)

    dw = np.full((K, C, R, S), np.nan, dtype=np.float32)
    _emulate(projection_cuda.render_source(R, S, rank), projection_cuda.KERNEL, K * C, threads,
             [f32["u"], f32["v"], f32["gu"], f32["gv"], dw], tmp_path)
    assert np.isfinite(dw).all()
    assert np.linalg.norm(dw - expected) <= 1e-5 * np.linalg.norm(expected)

    dense = np.full((K, C, R, S), np.nan, dtype=np.float32)
    gu_out = np.full(gu.shape, np.nan, dtype=np.float32)
    gv_out = np.full(gv.shape, np.nan, dtype=np.float32)
    _emulate(projection_cuda.render_source(R, S, rank, from_g=True), projection_cuda.KERNEL_FROM_G, K * C, threads,
             [f32["u"], f32["v"], f32["g"], gu_out, gv_out, dense], tmp_path)
    for got, want in ((gu_out, gu), (gv_out, gv), (dense, expected)):
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)
