"""Separable convolutions (kernels/sep_conv.py) on the CPU: problem validation, the float64
references against independent computations (the 2D references with the filter rebuilt from its
factors; the 2D weight gradient contracted with the factors), the spaces, default candidates and
plans (workspace, launch geometry modelled in NumPy), and nvcc builds of every formulation with the
ptxas report. tests/test_sep_conv_emulated.py runs the kernels themselves on the CPU;
tests/test_sep_conv_gpu.py on the GPU."""
from __future__ import annotations

import random

import numpy as np
import pytest

from autocnn.device import DEFAULT_WORKSPACE_BYTES, DeviceLimits
from autocnn.errors import InfeasibleConfigError, InvalidProblemError
from autocnn.kernels import get_operation, reference
from autocnn.kernels.compiler import nvcc_path
from autocnn.kernels.problem import ConvFwdProblem, parse_shape, problem_from_dict
from autocnn.measurement.measure import error_bound

import autocnn.kernels.sep_conv as sep
from autocnn.kernels.formulations.cores.sep_geometry import correlation, tile_threads
from autocnn.kernels.formulations.sep_twopass import z_elements_per_image
from tests.formulation_checks import build_failures

SM90 = DeviceLimits.for_arch("sm_90")
SM86 = DeviceLimits.for_arch("sm_86")
OPERATIONS = {op: get_operation(op) for op in sep.SEP_OPS}
OPS = tuple(OPERATIONS)
FWD_BWD = ("sep_conv_fwd", "sep_conv_bwd_data")


def factors(rng, p, dtype=np.float64):
    K, C, R, S = p.w_shape
    return rng.standard_normal((K, C, p.rank, R)).astype(dtype), rng.standard_normal((K, C, p.rank, S)).astype(dtype)


def w_eff(u, v):
    return np.einsum("kcjy,kcjx->kcyx", u, v)


# -- problems -------------------------------------------------------------------------------------

def test_problems_are_registered_and_round_trip():
    p = sep.SepConvFwdProblem(N=2, C=3, H=9, W=8, K=4, R=5, S=3, padding=(2, 1, 2, 1), bias=True,
                              activation="relu", rank=2)
    assert p.shape_string().endswith(",bias=1,act=relu,rank=2")
    assert problem_from_dict(p.to_dict()) == p
    assert parse_shape("sep_conv_fwd", p.shape_string()) == p
    assert sep.PROBLEM_TYPES["sep_conv_wgrad"] is sep.SepConvWgradProblem


def test_with_op_keeps_the_rank_between_separable_problems():
    fwd = sep.SepConvFwdProblem(N=2, C=3, H=9, W=8, K=4, R=5, S=3, padding=1, bias=True, rank=3)
    bwd = fwd.with_op("sep_conv_bwd_data")
    assert isinstance(bwd, sep.SepConvBwdDataProblem) and bwd.rank == 3 and bwd.x_shape == fwd.x_shape
    assert fwd.with_op("sep_conv_wgrad", bias=False, rank=1).rank == 1
    plain = fwd.with_op("conv_fwd")
    assert type(plain) is ConvFwdProblem
    assert ConvFwdProblem(N=1, C=1, H=5, W=5, K=1, R=3, S=3).with_op("sep_conv_fwd", rank=2).rank == 2


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bad,field,allowed", [
    ({"stride": 2}, "stride", "stride-1"),
    ({"rank": 0}, "rank", "from 1 to min(R, S) = 3"),
    ({"rank": 4}, "rank", "from 1 to min(R, S) = 3"),
    ({"rank": True}, "rank", "an integer"),
    ({"rank": 1.0}, "rank", "an integer"),
    ({"padding": 5}, "padding", "smaller than the filter height"),
])
def test_invalid_problems_are_refused_with_the_field_and_what_is_allowed(op, bad, field, allowed):
    geo = dict(N=2, C=3, H=9, W=8, K=4, R=3, S=5, padding=1, rank=1)
    with pytest.raises(InvalidProblemError) as err:
        sep.PROBLEM_TYPES[op](**{**geo, **bad})
    assert err.value.field == field and allowed in str(err.value) and err.value.op == op


def test_shapes_and_reduction_lengths():
    p = sep.SepConvWgradProblem(N=3, C=5, H=7, W=6, K=4, R=3, S=2, padding=(1, 0, 1, 1), rank=2)
    assert reference.input_shapes(p) == {"x": (3, 5, 7, 6), "dy": (3, 4, p.P, p.Q), "u": (4, 5, 2, 3), "v": (4, 5, 2, 2)}
    assert reference.output_shapes(p) == {"gu": (4, 5, 2, 3), "gv": (4, 5, 2, 2), "db": (4,)}
    npq = 3 * p.P * p.Q
    assert [reference.reduction_length(p, n) for n in ("gu", "gv", "db")] == [npq * 2, npq * 3, npq]
    f = p.with_op("sep_conv_fwd")
    assert reference.input_shapes(f) == {"x": (3, 5, 7, 6), "u": (4, 5, 2, 3), "v": (4, 5, 2, 2)}
    assert reference.reduction_length(f, "y") == 5 * 2 * 3 * 2
    assert reference.reduction_length(p.with_op("sep_conv_bwd_data"), "dx") == 4 * 2 * 3 * 2


# -- references against independent computations ---------------------------------------------------

REF_SHAPES = (
    dict(N=2, C=3, H=9, W=8, K=4, R=5, S=3, padding=(2, 1, 0, 2), rank=2),
    dict(N=1, C=2, H=6, W=11, K=3, R=3, S=3, padding=1, rank=1),
    dict(N=3, C=4, H=5, W=5, K=2, R=4, S=5, padding=(3, 0, 1, 4), rank=4),
    dict(N=2, C=1, H=7, W=4, K=5, R=7, S=2, rank=2),
)


@pytest.mark.parametrize("geo", REF_SHAPES)
def test_forward_reference_is_the_2d_convolution_of_the_rebuilt_filter(geo, rng):
    p = sep.SepConvFwdProblem(**geo, bias=True, activation="tanh")
    x = rng.standard_normal(p.x_shape)
    u, v = factors(rng, p)
    b = rng.standard_normal(p.K)
    got = reference.run_problem(p, {"x": x, "u": u, "v": v, "bias": b})["y"]
    want = reference.conv_fwd(x, w_eff(u, v), stride=1, padding=p.padding, bias=b, activation="tanh")
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("geo", REF_SHAPES)
def test_backward_data_reference_is_the_2d_adjoint_of_the_rebuilt_filter(geo, rng):
    p = sep.SepConvBwdDataProblem(**geo)
    dy = rng.standard_normal(p.y_shape)
    u, v = factors(rng, p)
    got = reference.run_problem(p, {"dy": dy, "u": u, "v": v})["dx"]
    want = reference.conv_bwd_data(dy, w_eff(u, v), input_hw=(p.H, p.W), stride=1, padding=p.padding)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("geo", REF_SHAPES)
def test_factor_gradients_are_the_2d_gradient_contracted_with_the_factors(geo, rng):
    p = sep.SepConvWgradProblem(**geo)
    x, dy = rng.standard_normal(p.x_shape), rng.standard_normal(p.y_shape)
    u, v = factors(rng, p)
    got = reference.run_problem(p, {"x": x, "dy": dy, "u": u, "v": v})
    G, db = reference.conv_wgrad(x, dy, kernel_hw=(p.R, p.S), stride=1, padding=p.padding)
    np.testing.assert_allclose(got["gu"], np.einsum("kcyx,kcjx->kcjy", G, v), rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(got["gv"], np.einsum("kcjy,kcyx->kcjx", u, G), rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(got["db"], db, rtol=1e-12)


def test_factor_gradients_are_the_loss_gradients_by_finite_differences(rng):
    """gu and gv are d(sum(y * dy))/du and /dv for y the separable forward (a central difference of a
    quadratic function is exact up to rounding)."""
    p = sep.SepConvWgradProblem(N=2, C=2, H=5, W=6, K=3, R=3, S=4, padding=(1, 2, 0, 1), rank=2, bias=False)
    fwd = p.with_op("sep_conv_fwd")
    x, dy = rng.standard_normal(p.x_shape), rng.standard_normal(p.y_shape)
    u, v = factors(rng, p)
    got = reference.run_problem(p, {"x": x, "dy": dy, "u": u, "v": v})

    def loss(uu, vv):
        return float((reference.run_problem(fwd, {"x": x, "u": uu, "v": vv})["y"] * dy).sum())

    h = 1e-3
    for name, arr in (("gu", u), ("gv", v)):
        for idx in [tuple(rng.integers(0, n) for n in arr.shape) for _ in range(6)]:
            e = np.zeros_like(arr)
            e[idx] = h
            args = (u + e, v) if name == "gu" else (u, v + e)
            back = (u - e, v) if name == "gu" else (u, v - e)
            assert abs((loss(*args) - loss(*back)) / (2 * h) - got[name][idx]) <= 1e-7 * max(1, abs(got[name][idx]))


def test_references_bound_their_memory_by_chunks(monkeypatch, rng):
    """With a tiny chunk the reference computes image by image and filter by filter: same result."""
    p = sep.SepConvFwdProblem(**REF_SHAPES[0])
    inputs = {"x": rng.standard_normal(p.x_shape), **dict(zip("uv", factors(rng, p)))}
    whole = reference.run_problem(p, inputs)["y"]
    monkeypatch.setattr(sep, "_REFERENCE_CHUNK", 1)
    np.testing.assert_allclose(reference.run_problem(p, inputs)["y"], whole, rtol=1e-13, atol=1e-13)
    w = p.with_op("sep_conv_wgrad")
    wi = {"x": inputs["x"], "dy": rng.standard_normal(w.y_shape), "u": inputs["u"], "v": inputs["v"]}
    chunked = reference.run_problem(w, wi)
    monkeypatch.undo()
    full = reference.run_problem(w, wi)
    for name in ("gu", "gv", "db"):
        np.testing.assert_allclose(chunked[name], full[name], rtol=1e-12, atol=1e-12)


def test_fp32_and_tf32_problems_share_the_kernels_and_differ_in_bound():
    p = sep.SepConvFwdProblem(N=2, C=8, H=9, W=9, K=8, R=3, S=3, padding=1, rank=1)
    t = sep.SepConvFwdProblem(**{**p.geometry(), "precision": "tf32"}, rank=1)
    op = OPERATIONS["sep_conv_fwd"]
    assert op.space(p, SM90).describe() == op.space(t, SM90).describe()
    assert error_bound(reference.reduction_length(t, "y"), t.precision) > error_bound(reference.reduction_length(p, "y"))


# -- spaces, defaults, plans ---------------------------------------------------------------------------

def shapes(op):
    return sep.seed_problems(op, N=8) + sep.odd_problems(op)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("limits", [SM86, SM90], ids=["sm_86", "sm_90"])
def test_default_and_samples_are_valid_on_every_seed_and_odd_shape(op, limits):
    rng = random.Random()
    operation = OPERATIONS[op]
    for name, problem in shapes(op):
        space = operation.space(problem, limits)
        defaults = list(operation.default_configs(problem, limits))
        assert defaults, name
        for config in [*defaults, *space.sample(rng, 6)]:
            assert space.validate(config.as_dict()) == config, (name, config)
            plan = operation.plan(problem, config)
            for launch in plan.launches:
                assert 32 <= launch.threads <= limits.max_threads_per_block and launch.threads % 32 == 0
                assert launch.shared_bytes <= limits.max_smem_per_block
                assert launch.grid[1] == launch.grid[2] == 1
            assert plan.workspace_bytes <= limits.workspace_bytes


@pytest.mark.parametrize("op", OPS)
def test_last_default_candidate_fits_extreme_problems(op):
    """The fallback the lookup ends on fits 1x1 maps, one map, large filters at full rank, wide images."""
    cls = sep.PROBLEM_TYPES[op]
    extremes = [cls(N=1, C=1, H=1, W=1, K=1, R=1, S=1, rank=1),
                cls(N=1, C=1, H=1, W=1, K=1, R=2, S=2, padding=1, rank=2),
                cls(N=2, C=3, H=40, W=40, K=2, R=21, S=21, padding=10, rank=21),
                cls(N=1, C=2, H=3, W=700, K=300, R=3, S=31, padding=(1, 15, 1, 15), rank=3)]
    for problem in extremes:
        last = OPERATIONS[op].default_candidates(problem)[-1]
        for limits in (SM86, SM90):
            OPERATIONS[op].space(problem, limits).validate(last)


@pytest.mark.parametrize("op", FWD_BWD)
def test_defaults_follow_the_seed_register_for_small_filters_shared_memory_for_large(op):
    small, large = dict(sep.seed_problems(op, N=8))["sep64_3x3_r1"], dict(sep.seed_problems(op, N=8))["sep64_11x11_r2"]
    assert OPERATIONS[op].default_config(small, SM90)["formulation"] == "sep_register"
    assert OPERATIONS[op].default_config(large, SM90)["formulation"] == "sep_onepass"
    assert {OPERATIONS[op].space(small, SM90).param("formulation").choices} == {("sep_register", "sep_onepass", "sep_twopass")}


def test_register_windows_beyond_the_registers_are_infeasible():
    p = dict(sep.seed_problems("sep_conv_fwd", N=8))["sep64_11x11_r1"]
    space = OPERATIONS["sep_conv_fwd"].space(p, SM90)
    config = {"formulation": "sep_register", "KB": 16, "KPT": 4, "TP": 8, "TQ": 16, "PPT": 4, "QPT": 4, "CB": 4,
              "UNROLL_C": 1, "UNROLL_J": 1}
    with pytest.raises(InfeasibleConfigError, match="registers per thread for the register window"):
        space.validate(config)
    space.validate({**config, "KB": 4, "PPT": 1, "QPT": 1})
    with pytest.raises(InfeasibleConfigError, match="more than the 128 a block of 512 threads leaves each"):
        space.validate({**config, "PPT": 1, "QPT": 1})


@pytest.mark.parametrize("op", FWD_BWD)
def test_twopass_workspace_is_bounded_by_blocks_of_images(op):
    big = sep.PROBLEM_TYPES[op](N=128, C=64, H=32, W=32, K=64, R=11, S=11, padding=5, rank=2)
    g = correlation(big)
    per_image = 4 * z_elements_per_image(g)
    operation = OPERATIONS[op]
    default = operation.default_config(big, SM90, formulation="sep_twopass")
    plan = operation.plan(big, default)
    assert plan.workspace_bytes == default["NB"] * per_image <= DEFAULT_WORKSPACE_BYTES
    assert [s.kernel for s in plan.steps] == ["sep_vpass", "sep_hpass"] * (128 // default["NB"])
    assert [s.scalars for s in plan.steps[::2]] == [(n0,) for n0 in range(0, 128, default["NB"])]
    too_many = 2 * DEFAULT_WORKSPACE_BYTES // per_image
    nb = next(n for n in (1, 2, 4, 8, 16, 32, 64, 128) if n >= too_many)
    with pytest.raises(InfeasibleConfigError, match="bytes of workspace exceed the limit"):
        operation.space(big, SM90).validate({**default.as_dict(), "NB": nb})
    huge = sep.PROBLEM_TYPES[op](N=2, C=512, H=64, W=64, K=512, R=9, S=9, padding=4, rank=3)
    assert operation.candidates(huge, "sep_twopass") == []      # one image's intermediate is too large
    assert operation.default_config(huge, SM90)["formulation"] != "sep_twopass"


def test_wgrad_plans_name_their_combine_and_bias_steps():
    p = sep.SepConvWgradProblem(N=8, C=16, H=12, W=12, K=16, R=5, S=5, padding=2, rank=2)
    op = OPERATIONS["sep_conv_wgrad"]
    space = op.space(p, SM90)
    base = {"KB": 4, "CB": 4, "TP": 4, "TQ": 16, "RSPLIT": 2, "PAD": 1, "UNROLL_ROWS": 1}
    atomic = op.plan(p, space.validate({**base, "SPLIT": 8, "COMBINE": "atomic"}))
    assert [s.kernel for s in atomic.steps] == ["sep_wgrad", "conv_bias_grad"]
    assert atomic.zero_first == ("gu", "gv") and atomic.workspace_bytes == 0
    ordered = op.plan(p, space.validate({**base, "SPLIT": 8, "COMBINE": "ordered"}))
    assert [s.kernel for s in ordered.steps] == ["sep_wgrad", "sep_wgrad_reduce", "conv_bias_grad"]
    assert ordered.zero_first == () and ordered.workspace_bytes == 4 * 8 * 16 * 16 * 2 * 10
    single = op.plan(p.with_op("sep_conv_wgrad", bias=False), space.validate({**base, "SPLIT": 1, "COMBINE": "atomic"}))
    assert [s.kernel for s in single.steps] == ["sep_wgrad"] and single.zero_first == ()
    with pytest.raises(InfeasibleConfigError, match="ordered needs SPLIT >= 2"):
        space.validate({**base, "SPLIT": 1, "COMBINE": "ordered"})
    # gv lanes and gu lanes are whole warps each: 4*4*2*2 = 64 lanes a half
    assert atomic.launches[0].threads == 128


@pytest.mark.parametrize("op", FWD_BWD)
def test_launch_geometry_covers_every_output_once(op):
    """A NumPy model of the block and thread decomposition the templates use (block index = image,
    output-map block, tile; thread = map group, row group, column group): every output element is
    owned by exactly one thread of exactly one block, and no thread owns one outside the output."""
    rng = random.Random()
    for _, problem in sep.odd_problems(op)[:4]:
        g = correlation(problem)
        operation = OPERATIONS[op]
        for config in operation.space(problem, SM90).sample(rng, 4):
            plan = operation.plan(problem, config)
            count = np.zeros((g.N, g.CO, g.OH, g.OW), dtype=np.int64)
            kb, tp, tq = config["KB"], config["TP"], config["TQ"]
            kpt, ppt, qpt = config["KPT"], config["PPT"], config["QPT"]
            txq, txp = tq // qpt, tp // ppt
            tiles_q, tiles = -(-g.OW // tq), -(-g.OH // tp) * -(-g.OW // tq)
            kblocks = -(-g.CO // kb)
            per_launch = [s for s in plan.launches if s.kernel in ("sep_conv", "sep_hpass")]
            for launch in per_launch:
                n0 = launch.scalars[0] if launch.scalars else 0
                assert launch.threads == tile_threads(config)
                for b in range(launch.grid[0]):
                    tile, rest = b % tiles, b // tiles
                    co0, n = (rest % kblocks) * kb, n0 + rest // kblocks
                    for t in range(launch.threads):
                        tqi, tpi, tki = t % txq, (t // txq) % txp, t // (txq * txp)
                        oh0 = (tile // tiles_q) * tp + tpi * ppt
                        ow0 = (tile % tiles_q) * tq + tqi * qpt
                        for a in range(kpt):
                            co = co0 + tki * kpt + a
                            for i in range(ppt):
                                for q in range(qpt):
                                    if co < g.CO and oh0 + i < g.OH and ow0 + q < g.OW:
                                        count[n, co, oh0 + i, ow0 + q] += 1
            assert (count == 1).all(), f"{problem.shape_string()} {config}"


def test_flops_count_the_separable_work():
    p = dict(sep.seed_problems("sep_conv_fwd"))["sep64_5x5_r2"]
    assert OPERATIONS["sep_conv_fwd"].flops(p) == 2 * 128 * 64 * 64 * 2 * 32 * 32 * 10
    assert OPERATIONS["sep_conv_wgrad"].flops(p.with_op("sep_conv_wgrad")) == 2 * OPERATIONS["sep_conv_fwd"].flops(p)


# -- nvcc ------------------------------------------------------------------------------------------------

def build_problems(op):
    seeds = dict(sep.seed_problems(op, N=8))
    return [(n, seeds[n]) for n in ("sep64_3x3_r1", "sep64_11x11_r2")] + sep.odd_problems(op)[:1]


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("op,name", [("sep_conv_fwd", "sep_register"), ("sep_conv_fwd", "sep_onepass"),
                                     ("sep_conv_fwd", "sep_twopass"), ("sep_conv_bwd_data", "sep_register"),
                                     ("sep_conv_bwd_data", "sep_onepass"), ("sep_conv_bwd_data", "sep_twopass"),
                                     ("sep_conv_wgrad", None)])
def test_templates_build_with_ptxas_reports(op, name, tmp_path):
    """nvcc -cubin for sm_90 of each formulation's default and a sampled config on a small and a
    large seed filter and an odd shape: every kernel the plan launches is in the report, and the
    default does not spill."""
    operations = {op: OPERATIONS[op]}
    if name is None:
        failures = _build_single(OPERATIONS[op], build_problems(op), tmp_path)
    else:
        problems = [(n, p) for n, p in build_problems(op) if OPERATIONS[op].candidates(p, name)]
        failures = build_failures(operations, name, {op: problems}, "sm_90", tmp_path, samples=1)
    assert not failures, "\n".join(failures[:10])


def _build_single(operation, problems, cache):
    """build_failures for an operation of one formulation (its configs name none)."""
    from autocnn.kernels.compiler import NvccCompiler

    compiler = NvccCompiler("sm_90", cache_dir=cache)
    rng = random.Random()
    failures = []
    for label, problem in problems:
        default = operation.default_config(problem, SM90)
        for i, config in enumerate([default, *operation.space(problem, SM90).sample(rng, 1, exclude=[default])]):
            plan = operation.plan(problem, config)
            module = compiler.compile(plan.source, config=config)
            missing = set(plan.kernel_names) - set(module.reports)
            spills = [str(r) for r in module.reports.values() if r.spills] if i == 0 else []
            if missing or spills:
                failures.append(f"{label} {config}: missing {missing}, spills {spills}")
    return failures


def test_the_gpu_tests_cases_are_well_formed():
    """What tests/test_sep_conv_gpu.py runs exists here already: each formulation has configs on each
    of its cases (the two-pass one where its workspace allows), and its fixed configs are valid."""
    from tests import test_sep_conv_gpu as gpu_tests

    rng = random.Random()
    for op, name in gpu_tests.FORMULATIONS:
        for label, problem in sep.seed_problems(op, N=gpu_tests.SEED_BATCH) + sep.odd_problems(op):
            assert OPERATIONS[op].candidates(problem, name), (op, name, label)
            assert len(gpu_tests.configs(op, name, problem, SM90, rng, 1)) >= 2, (op, name, label)
    problem = dict(sep.seed_problems("sep_conv_wgrad", N=gpu_tests.SEED_BATCH))["sep64_5x5_r2"]
    space = OPERATIONS["sep_conv_wgrad"].space(problem, SM90)
    for split, combine in ((1, "atomic"), (16, "atomic"), (2, "ordered"), (64, "ordered")):
        space.validate({**gpu_tests.WGRAD_BASE, "SPLIT": split, "COMBINE": combine})


@pytest.mark.parametrize("op", OPS)
def test_every_formulation_compiles_with_nvrtc(op):
    """The training library loads kernels through NVRTC, which lacks nvcc's host headers: the default
    of each formulation on a seed and an odd shape compiles there without warnings."""
    from tests.test_sep_conv_gpu import FORMULATIONS
    from tests.test_nvrtc_compile import NVRTC, nvrtc_compile

    if NVRTC is None:
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc)")
    operation = OPERATIONS[op]
    for name in (n for o, n in FORMULATIONS if o == op):
        for _, problem in [sep.seed_problems(op, N=8)[2], sep.odd_problems(op)[0]]:
            plan = operation.plan(problem, operation.default_config(problem, SM90, formulation=name))
            rc, log = nvrtc_compile(plan.source)
            assert rc == 0 and "warning" not in log.lower(), f"{name} {problem.shape_string()}:\n{log}"
