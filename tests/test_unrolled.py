"""The unrolled formulation (im2col kernel + cuBLAS SGEMM steps): on the CPU, its plans run by a
NumPy interpreter (each library GEMM step on exactly the buffer views it names, each generated
kernel by a NumPy im2col / fold / epilogue) against the float64 reference, its workspace against
the limit, its templates through nvcc; on the GPU (-m gpu), every element against float64."""
from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError
from autocnn.kernels import reference
from autocnn.kernels.compiler import nvcc_path
from autocnn.kernels.formulations.cores.workspaces import WORKSPACE_LIMIT_BYTES
from autocnn.kernels.formulations.unrolled import (NAME, PER_IMAGE_T, SIDE_BY_SIDE, UNROLLED, block_images, layout,
                                                   unrolling)
from autocnn.kernels.problem import PROBLEM_TYPES
from autocnn.kernels.steps import LibraryGemm, MatrixView
from autocnn.kernels.suite import CONV_OPS, odd_problems, seed_problems
from tests.formulation_checks import BUILD_ARCHES, assert_verifies_on_gpu, build_failures, operations_with
from tests.plan_numpy import check_plans

LIMITS = DeviceLimits.for_arch("sm_90")
OPERATIONS = operations_with(UNROLLED)


def pointwise(op: str, N=64, C=256, H=28, W=28, K=512, stride=1):
    """The pointwise target layer (256->512 channels, 28x28, batch 64), or a small one like it."""
    return PROBLEM_TYPES[op](N=N, C=C, H=H, W=W, K=K, R=1, S=1, stride=stride)


def small_problems(op: str) -> list[tuple[str, object]]:
    """Shapes that divide nothing evenly, pointwise ones included, small enough for NumPy."""
    out = list(odd_problems(op))
    out += [("pw_s1", pointwise(op, N=3, C=9, H=7, W=5, K=6)), ("pw_s2", pointwise(op, N=5, C=6, H=9, W=8, K=7, stride=2)),
            ("pw_s2x3", pointwise(op, N=1, C=4, H=10, W=11, K=3, stride=(2, 3)))]
    if op == "conv_fwd":
        out += [("odd_a_relu_bias", dataclasses.replace(dict(out)["odd_a"], bias=True, activation="relu")),
                ("pw_s1_tanh", dataclasses.replace(dict(out)["pw_s1"], bias=True, activation="tanh"))]
    if op == "conv_wgrad":
        out += [("odd_c_nobias", dataclasses.replace(dict(out)["odd_c"], bias=False)),
                ("pw_s1_nobias", dataclasses.replace(dict(out)["pw_s1"], bias=False))]
    return out


def space(op, problem):
    return OPERATIONS[op].space(problem, LIMITS).restrict({"formulation": NAME})


def configs(op, problem, rng, samples=6):
    """The formulation's default candidates that fit, and sampled configs."""
    sp = space(op, problem)
    out = []
    for cand in OPERATIONS[op].candidates(problem, NAME):
        try:
            out.append(sp.validate(cand))
        except InfeasibleConfigError:
            pass
    return out + sp.sample(rng, samples, exclude=out)


# -- the generated kernels, in NumPy ------------------------------------------------------------

def _unrolled_block(p, x: np.ndarray, n0: int, nb: int) -> np.ndarray:
    """im2col of images n0..n0+nb-1: (nb, C, R, S, P, Q)."""
    pt, pl, pb, pr = p.padding
    sh, sw = p.stride
    xp = np.pad(x[n0:n0 + nb], ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    out = np.empty((nb, p.C, p.R, p.S, p.P, p.Q))
    for r in range(p.R):
        for s in range(p.S):
            out[:, :, r, s] = xp[:, :, r:r + sh * (p.P - 1) + 1:sh, s:s + sw * (p.Q - 1) + 1:sw]
    return out


class Kernels:
    """What each generated kernel of the formulation computes, in NumPy, from its definition."""

    def __init__(self, problem, config):
        self.p, self.c = problem, config
        self.u = unrolling(problem)
        self.B = block_images(self.u, config["IMGS"])
        self.layout = layout(config.get("GEMM_MODE", "batched"), config.get("COL_T", 0))

    def _col(self, buf, nb):
        u = self.u
        if self.layout == SIDE_BY_SIDE:
            return buf[:u.CRS * self.B * u.PQ].reshape(u.CRS, self.B, u.PQ)[:, :nb].transpose(1, 0, 2)
        if self.layout == PER_IMAGE_T:
            return buf[:nb * u.CRS * u.PQ].reshape(nb, u.PQ, u.CRS).transpose(0, 2, 1)
        return buf[:nb * u.CRS * u.PQ].reshape(nb, u.CRS, u.PQ)

    def unrolled_im2col(self, b, n0, nb):
        self._col(b["col"], nb)[...] = _unrolled_block(self.p, b["x"].reshape(self.p.x_shape), n0, nb).reshape(
            nb, self.u.CRS, self.u.PQ)

    def unrolled_col2im(self, b, n0, nb):
        p = self.p
        pt, pl, pb, pr = p.padding
        sh, sw = p.stride
        cols = self._col(b["col"], nb).reshape(nb, p.C, p.R, p.S, p.P, p.Q)
        dxp = np.zeros((nb, p.C, p.H + pt + pb, p.W + pl + pr))
        for r in range(p.R):
            for s in range(p.S):
                dxp[:, :, r:r + sh * (p.P - 1) + 1:sh, s:s + sw * (p.Q - 1) + 1:sw] += cols[:, :, r, s]
        b["dx"].reshape(p.x_shape)[n0:n0 + nb] = dxp[:, :, pt:pt + p.H, pl:pl + p.W]

    def _epilogue(self, b, z):
        p = self.p
        if p.bias:
            z = z + b["bias"].reshape(1, -1, 1)
        return reference.activation(z, p.activation)

    def unrolled_store(self, b, n0, nb):
        u = self.u
        z = b["gemm_out"][:u.K * self.B * u.PQ].reshape(u.K, self.B, u.PQ)[:, :nb].transpose(1, 0, 2)
        b["y"].reshape(u.N, u.K, u.PQ)[n0:n0 + nb] = self._epilogue(b, z)

    def unrolled_bias_act(self, b):
        u = self.u
        y = b["y"].reshape(u.N, u.K, u.PQ)
        y[...] = self._epilogue(b, y.copy())

    def unrolled_gather_dy(self, b, n0, nb):
        u = self.u
        side = b["dy_side"][:u.K * self.B * u.PQ].reshape(u.K, self.B, u.PQ)
        side[:, :nb] = b["dy"].reshape(u.N, u.K, u.PQ)[n0:n0 + nb].transpose(1, 0, 2)

    def conv_bias_grad(self, b):
        b["db"][...] = b["dy"].reshape(self.u.N, self.u.K, self.u.PQ).sum(axis=(0, 2))


# -- CPU tests ------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", CONV_OPS)
def test_plans_compute_the_convolution_in_numpy(op, rng):
    """Every default candidate and sampled config, on shapes that divide nothing evenly, pointwise
    ones included: the plan's steps (GEMM views, blocks, accumulation, fold) give the float64
    reference's result to rounding."""
    pyrng = random.Random(int(rng.integers(2**31)))
    checked = check_plans(OPERATIONS[op], small_problems(op), lambda p: configs(op, p, pyrng), Kernels, rng)
    assert checked >= 5 * len(small_problems(op))


@pytest.mark.parametrize("op", CONV_OPS)
def test_workspace_is_computed_and_never_above_the_limit(op):
    rng = random.Random()
    for name, problem in seed_problems(op) + small_problems(op) + [("pointwise", pointwise(op))]:
        sp = space(op, problem)
        for config in configs(op, problem, rng, samples=8):
            plan = OPERATIONS[op].plan(problem, config)
            assert 0 <= plan.workspace_bytes <= WORKSPACE_LIMIT_BYTES, f"{name} {config}"
            u = unrolling(problem)
            b = block_images(u, config["IMGS"])
            if "col" in dict(plan.workspaces):
                assert dict(plan.workspaces)["col"] == b * u.CRS * u.PQ
        assert OPERATIONS[op].default_config(problem, LIMITS, formulation=NAME)
    # scherer10_l1 unrolls 16 MiB an image: a block of 32 exceeds the limit, with the reason.
    problem = dict(seed_problems(op))["scherer10_l1"]
    big = {"formulation": NAME, "IMGS": 32, "COL_T": 0, "THREADS": 256, "ITEMS": 1}
    if op != "conv_bwd_data":
        big["GEMM_MODE"] = "batched" if op == "conv_fwd" else "per_image"
    with pytest.raises(InfeasibleConfigError, match="bytes of workspace exceed the limit"):
        space(op, problem).validate(big)


def test_pointwise_stride_1_is_one_gemm_per_block_with_no_unroll():
    for op in CONV_OPS:
        problem = pointwise(op)
        for config in space(op, problem).feasible_configs():
            mode = config.get("GEMM_MODE", "batched")
            if mode == "wide":
                continue
            plan = OPERATIONS[op].plan(problem, config)
            assert plan.workspaces == () and "unrolled_im2col" not in plan.kernel_names, f"{op} {config}"
            assert all(g.a.buffer in ("w", "dy") and g.b.buffer in ("x", "w", "dy") for g in plan.library_gemms)
    fwd = pointwise("conv_fwd")
    config = space("conv_fwd", fwd).validate({"formulation": NAME, "GEMM_MODE": "batched", "IMGS": 64})
    plan = OPERATIONS["conv_fwd"].plan(fwd, config)
    (gemm,) = plan.steps
    assert (gemm.m, gemm.n, gemm.k, gemm.batch) == (512, 28 * 28, 256, 64)
    assert plan.kernel_names == () and plan.launches == ()
    # Strided: a gather (the im2col kernel with R = S = 1) and then the GEMM.
    strided = pointwise("conv_fwd", stride=2)
    config = space("conv_fwd", strided).validate({"formulation": NAME, "GEMM_MODE": "batched", "IMGS": 64,
                                                  "COL_T": 0, "THREADS": 256, "ITEMS": 2})
    plan = OPERATIONS["conv_fwd"].plan(strided, config)
    assert plan.kernel_names == ("unrolled_im2col",) and dict(plan.workspaces)["col"] == 64 * 256 * 14 * 14


def test_fp32_gemms_never_use_tf32_and_tf32_problems_may():
    problem = odd_problems("conv_fwd")[0][1]
    rng = random.Random()
    for config in space("conv_fwd", problem).sample(rng, 20):
        assert "TF32_GEMM" not in config
        assert not any(g.tf32 for g in OPERATIONS["conv_fwd"].plan(problem, config).library_gemms)
    tf32 = dataclasses.replace(problem, precision="tf32")
    default = OPERATIONS["conv_fwd"].default_config(tf32, LIMITS, formulation=NAME)
    assert default["TF32_GEMM"] == 0
    config = space("conv_fwd", tf32).validate({**default.as_dict(), "TF32_GEMM": 1})
    assert all(g.tf32 for g in OPERATIONS["conv_fwd"].plan(tf32, config).library_gemms)


def test_wgrad_blocks_accumulate_into_dw_after_the_first():
    problem = odd_problems("conv_wgrad")[0][1]     # N = 3
    for mode, imgs in (("wide", 2), ("per_image", 2)):
        config = space("conv_wgrad", problem).validate(
            {"formulation": NAME, "GEMM_MODE": mode, "IMGS": imgs, "COL_T": 0, "THREADS": 128, "ITEMS": 1})
        gemms = OPERATIONS["conv_wgrad"].plan(problem, config).library_gemms
        assert [g.accumulate for g in gemms] == [False] + [True] * (len(gemms) - 1)
        assert len(gemms) == (2 if mode == "wide" else 3)


def test_library_gemm_rejects_views_that_cannot_hold_its_matrices():
    w = MatrixView("w", 0, 8)
    with pytest.raises(ValueError, match="operand b: a 8x16 matrix cannot have ld=4"):
        LibraryGemm(m=4, n=16, k=8, a=w, b=MatrixView("x", 0, 4), c=MatrixView("y", 0, 16))
    with pytest.raises(ValueError, match="output matrices overlap"):
        LibraryGemm(m=4, n=16, k=8, a=w, b=MatrixView("x", 0, 16, 128), c=MatrixView("y", 0, 16, 32), batch=2)
    with pytest.raises(ValueError, match="k >= 1"):
        LibraryGemm(m=4, n=16, k=0, a=w, b=MatrixView("x", 0, 16), c=MatrixView("y", 0, 16))


def test_other_formulations_keep_their_fingerprints_and_defaults():
    """Registering the formulation changes no other formulation's code or any op's default."""
    for op in CONV_OPS:
        operation = OPERATIONS[op]
        for name, problem in seed_problems(op) + odd_problems(op):
            assert operation.default_config(problem, LIMITS)["formulation"] != NAME, f"{op} {name}"
        assert operation.fingerprint(NAME) not in {operation.fingerprint(f) for f in operation.formulation_names
                                                   if f != NAME}


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", BUILD_ARCHES)
def test_templates_build_without_spills(arch, tmp_path):
    problems = {op: small_problems(op)[:4] + seed_problems(op)[:2] + [("pointwise", pointwise(op, stride=2))]
                for op in CONV_OPS}
    failures = build_failures(OPERATIONS, NAME, problems, arch, tmp_path)
    assert not failures, "\n".join(failures[:10])


# -- GPU tests ------------------------------------------------------------------------------------

def gpu_problems(op: str) -> list[tuple[str, object]]:
    seeds = [(n, p) for n, p in seed_problems(op)
             if n in ("kriz09", "convnet18_c2", "chellapilla06_c2", "sweep_11x11", "modern_14")]
    return seeds + small_problems(op) + [("pointwise_s1", pointwise(op)), ("pointwise_s2", pointwise(op, stride=2))]


@pytest.mark.gpu
@pytest.mark.parametrize("op", CONV_OPS)
def test_unrolled_verifies_against_float64_on_the_gpu(op):
    """Default candidates and sampled configs of each shape (seed shapes, odd shapes, batch 1,
    asymmetric padding, pointwise layers) pass the FP32 bound, every element checked (cuBLAS in
    FP32: a TF32 product would fail it), with the workspace within the limit."""
    pytest.importorskip("cupy")
    assert_verifies_on_gpu(OPERATIONS[op], NAME, gpu_problems(op), 4, WORKSPACE_LIMIT_BYTES)


@pytest.mark.gpu
@pytest.mark.parametrize("op", CONV_OPS)
def test_unrolled_tf32_gemms_pass_the_tf32_bound(op):
    pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate

    limits = current_device(0).limits()
    loader = KernelLoader()
    for name, problem in gpu_problems(op)[:3]:
        problem = dataclasses.replace(problem, precision="tf32")
        default = OPERATIONS[op].default_config(problem, limits, formulation=NAME)
        config = OPERATIONS[op].space(problem, limits).validate({**default.as_dict(), "TF32_GEMM": 1})
        check = check_candidate(loader.load(OPERATIONS[op].plan(problem, config)), problem, time_it=False)
        assert check.verification.passed, f"{name}: {check.verification.message}"


@pytest.mark.gpu
def test_library_gemm_steps_replay_in_a_cuda_graph():
    """A plan with GEMM steps captured on a prepared stream and replayed gives the right result."""
    cp = pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import random_inputs, reference_outputs, verify_outputs

    limits = current_device(0).limits()
    problem = dict(small_problems("conv_wgrad"))["odd_a"]
    config = OPERATIONS["conv_wgrad"].space(problem, limits).validate(
        {"formulation": NAME, "GEMM_MODE": "wide", "IMGS": 2, "COL_T": 0, "THREADS": 128, "ITEMS": 2})
    loaded = KernelLoader().load(OPERATIONS["conv_wgrad"].plan(problem, config))
    inputs = random_inputs(problem, cp)
    outputs = {n: cp.full(s, cp.nan, dtype=cp.float32) for n, s in reference.output_shapes(problem).items()}
    buffers = {**inputs, **outputs, **loaded.workspaces()}
    stream = cp.cuda.Stream(non_blocking=True)
    loaded.prepare_stream(stream)
    with stream:
        stream.begin_capture()
        loaded(buffers, stream=stream)
        graph = stream.end_capture()
    graph.launch(stream=stream)
    stream.synchronize()
    check = verify_outputs(problem, inputs, outputs, reference_outputs(problem, inputs))
    assert check.passed, check.message
