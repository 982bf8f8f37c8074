"""The wgmma formulation (formulations/wgmma/): Hopper's warpgroup tensor cores for conv_fwd,
conv_bwd_data and conv_wgrad (stride 1), tf32 and fp32 (3xTF32).

CPU: where it is offered (sm_90, tf32, C a multiple of 4) and why not elsewhere; every config builds
for sm_90a without spills and not for the portable sm_90 (so the plan's target matters); the
lookup's resource check compiles it for its target. GPU (``-m gpu``, a Hopper GPU): every config
verified against float64 on seed shapes and on shapes that divide nothing evenly, through NVRTC
(the training library's path) and through nvcc cubins (the tuner's), and a NaN in the input
reaches exactly the outputs the reference has it in."""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from autocnn.device import DeviceInfo, DeviceLimits
from autocnn.errors import CompileError, InfeasibleConfigError, InvalidConfigError
from autocnn.kernels import OPERATIONS
from autocnn.kernels.compiler import NvccCompiler, nvcc_path
from autocnn.kernels.formulations.cores.wgmma_gemm import FORMULATION_WGMMA
from autocnn.kernels.problem import ConvBwdDataProblem, ConvFwdProblem, ConvWgradProblem
from autocnn.kernels.suite import seed_problems
from tests.formulation_checks import BUILDS, assert_every_config_verifies, build_sample, target_build_failures

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
FWD = OPERATIONS["conv_fwd"]
BWD = OPERATIONS["conv_bwd_data"]
WGRAD = OPERATIONS["conv_wgrad"]
HOPPER = DeviceLimits.for_arch("sm_90")
H200 = DeviceInfo("NVIDIA H200", "9.0", 132, 13020, 13000, max_smem_per_block=227 * 1024)
# C a multiple of 4 (the NHWC float4 runs) and nothing else even: odd K, P, Q and batch, stride 2 by
# 1, asymmetric padding, a reduction (C*R*S = 180) that is not a whole number of 32-float stages.
ODD = (("odd_wg_a", ConvFwdProblem(N=3, C=12, H=13, W=11, K=19, R=3, S=5, stride=(2, 1), padding=(1, 2, 0, 1),
                                   precision="tf32")),
       ("odd_wg_b", ConvFwdProblem(N=1, C=4, H=9, W=17, K=70, R=1, S=1, precision="tf32", bias=True,
                                   activation="relu")))


# conv_bwd_data: K (dY's channels) a multiple of 4 and nothing else even: 13 input channels (a block
# of 16 columns with 3 past the edge), stride 2 by 1 with asymmetric padding (two phases of
# different sizes), stride 3 with a 2x2 filter (phases no tap reaches: their gradient is 0), batch 1.
ODD_BWD = (("odd_wgb_a", ConvBwdDataProblem(N=3, C=13, H=13, W=11, K=20, R=3, S=5, stride=(2, 1),
                                            padding=(1, 2, 0, 1), precision="tf32")),
           ("odd_wgb_b", ConvBwdDataProblem(N=1, C=9, H=17, W=14, K=8, R=2, S=2, stride=(3, 3), precision="tf32")),
           ("odd_wgb_c", ConvBwdDataProblem(N=2, C=70, H=9, W=7, K=36, R=1, S=1, precision="tf32")))
BWD_SEED_SHAPES = ("modern_14", "scherer10_l2", "convnet18_c3", "sweep_3x3")


# conv_wgrad (stride 1): nothing even: 5 channels, 7 filters, a 3x5 filter with asymmetric padding
# (the grid's rows 16 wide), batch 3, bias; a 1x1 filter without bias, batch 1, 70 filters.
ODD_WGRAD = (("odd_wgw_a", ConvWgradProblem(N=3, C=5, H=13, W=11, K=7, R=3, S=5, padding=(1, 2, 0, 1),
                                            precision="tf32")),
             ("odd_wgw_b", ConvWgradProblem(N=1, C=9, H=17, W=14, K=70, R=1, S=1, bias=False, precision="tf32")))
WGRAD_SEED_SHAPES = ("modern_14", "convnet18_c2", "kriz09")


def _wgrad_problems():
    seed = dict(seed_problems("conv_wgrad"))
    return [(n, dataclasses.replace(seed[n], precision="tf32")) for n in WGRAD_SEED_SHAPES] + list(ODD_WGRAD)


def _strided_wgrad_problems():
    """The strided shapes (STRIDED_WGRAD, defined with the NumPy model below), tf32 and one in fp32."""
    resnet = ConvWgradProblem(N=4, C=64, H=56, W=56, K=128, R=3, S=3, stride=(2, 2), padding=(1, 1, 1, 1), bias=False,
                              precision="tf32")   # ResNet-18's first strided 3x3, 4 images
    return [*STRIDED_WGRAD, ("resnet_s2", resnet),
            (f"{STRIDED_WGRAD[0][0]} fp32", dataclasses.replace(STRIDED_WGRAD[0][1], precision="fp32"))]


def _space(problem, limits=HOPPER, op=FWD):
    return op.space(problem, limits).restrict({"formulation": FORMULATION_WGMMA})


SEED_SHAPES = ("modern_14", "sweep_3x3", "scherer10_l2")   # modern_14 first: 256 filters take every WBN


def _problems():
    seed = dict(seed_problems("conv_fwd"))
    return [(n, dataclasses.replace(seed[n], precision="tf32")) for n in SEED_SHAPES] + list(ODD)


def _fp32(problems):
    """fp32 (3xTF32) versions of the first seed shape and of the odd shapes."""
    return [(f"{n} fp32", dataclasses.replace(p, precision="fp32")) for n, p in problems if n.startswith(("modern", "odd"))]


def _bwd_problems():
    seed = dict(seed_problems("conv_bwd_data"))
    return [(n, dataclasses.replace(seed[n], precision="tf32")) for n in BWD_SEED_SHAPES] + list(ODD_BWD)


ALL_WIDTHS = (64, 128, 256, 32, 16)


def _every_config(problem, op=FWD, widths=(64, 128, 256), splits=None, inflight=0, image_tiles=(0, 1), x_unrolled=0,
                  dy_in_place=0, stage_launches=2, sk_blocks=0, stage_planes=0, cross=0, x_in_place=0):
    """Every feasible config of the widths given (and of those SPLITK values, by default 1 for conv_fwd
    and conv_bwd_data; for wgrad with its IMAGE_TILES choices, X unrolled or not), with each tile's
    wgmmas waited for (inflight 0: stages 2-4) or one group in flight (1: stages 3, 4, 6)."""
    space = _space(problem, op=op)
    out = []
    depths = (3, 4, 6) if inflight else (2, 3, 4)
    wgrad = op is WGRAD
    for wgs, wbn, stages, splitk, tiles in itertools.product((1, 2, 4), widths, depths, splits or (1,),
                                                             image_tiles if wgrad else (None,)):
        config = {"formulation": FORMULATION_WGMMA, "WGS": wgs, "WBN": wbn, "WSTAGES": stages, "INFLIGHT": inflight,
                  "SPLITK": splitk}
        if not wgrad:
            config["STAGE_LAUNCHES"] = stage_launches
            config["SK_BLOCKS"] = sk_blocks
            config["STAGE_PLANES"] = stage_planes
            if problem.precision == "fp32":
                config["A_REGS"] = 0   # A's small parts staged (A_REGS=1: _a_regs_configs)
                config["CROSS"] = cross
        if wgrad:
            config["IMAGE_TILES"] = tiles
            config["X_UNROLLED"] = x_unrolled
            config["DY_IN_PLACE"] = dy_in_place
            if x_in_place or any(p.name == "X_IN_PLACE" for p in space.params):   # pointwise layers only
                config["X_IN_PLACE"] = x_in_place
        try:
            out.append(space.validate(config))
        except InfeasibleConfigError:
            pass
    return out


def _every_wgrad_config(problem, splits, inflight=0, image_tiles=(0, 1), x_unrolled=0):
    return _every_config(problem, WGRAD, ALL_WIDTHS, splits, inflight, image_tiles, x_unrolled)


def _both_loops(problem, op=FWD, widths=ALL_WIDTHS, splits=None, image_tiles=(0, 1), x_unrolled=0, dy_in_place=0,
                x_in_place=0):
    """Every config of the widths given with either main loop (wait per tile, and one group in flight)."""
    return _every_config(problem, op, widths, splits, image_tiles=image_tiles, x_unrolled=x_unrolled,
                         dy_in_place=dy_in_place, x_in_place=x_in_place) + \
        _every_config(problem, op, widths, splits, 1, image_tiles, x_unrolled, dy_in_place, x_in_place=x_in_place)


def _default(problem):
    return FWD.default_config(problem, HOPPER, formulation=FORMULATION_WGMMA)


def test_wgmma_is_offered_on_hopper_for_tf32_with_whole_float4_runs():
    name, problem = _problems()[0]
    config = _default(problem).as_dict()
    assert len(_every_config(problem)) == 24   # WGS=4 holds at most 128 columns (64 accumulator registers)
    with pytest.raises(InfeasibleConfigError, match="sm_90"):
        _space(problem, DeviceLimits.for_arch("sm_80")).validate(config)
    # fp32 is 3xTF32: both staged copies hold each operand's small parts after its big parts.
    fp32 = dataclasses.replace(problem, precision="fp32")
    split_plan = FWD.plan(fp32, FWD.space(fp32, HOPPER).complete(config))
    assert dict(split_plan.workspaces) == {"xt": 2 * problem.N * problem.C * problem.H * problem.W,
                                           "wt": 2 * problem.K * problem.C * problem.R * problem.S}
    assert "3xTF32, the small cross terms first" in split_plan.source
    assert "3xTF32" not in FWD.plan(problem, FWD.space(problem, HOPPER).validate(config)).source
    # Each tile's partial sums sit beside the totals: 256 columns would need 256 registers for them.
    with pytest.raises(InfeasibleConfigError, match="partial sums"):
        FWD.space(fp32, HOPPER).complete({**config, "WBN": 256})
    # A group of wgmmas in flight holds a stage beyond the copies ahead; fp32 pipelines pairs of
    # tiles, each with its own partial sums that the tile's first wgmma overwrites.
    with pytest.raises(InfeasibleConfigError, match="WGS=4"):   # 512 threads, 128 registers each
        FWD.space(problem, HOPPER).validate({**config, "WGS": 4, "WBN": 256})
    with pytest.raises(InfeasibleConfigError, match="at least 3 stages"):
        FWD.space(problem, HOPPER).validate({**config, "WSTAGES": 2, "INFLIGHT": 1})
    pipelined = FWD.plan(fp32, FWD.space(fp32, HOPPER).complete({**config, "WBN": 128, "INFLIGHT": 1}))
    assert "part0[ACC], part1[ACC]" in pipelined.source and "mma_fresh(" in pipelined.source
    assert "wgmma.wait_group.sync.aligned 1" in FWD.plan(problem, FWD.space(problem, HOPPER).validate(
        {**config, "INFLIGHT": 1})).source
    with pytest.raises(InfeasibleConfigError, match="multiple of 4"):
        FWD.space(dataclasses.replace(problem, C=6), HOPPER).validate(config)
    plan = FWD.plan(problem, _default(problem))
    assert plan.target_suffix == "a" and plan.compile_arch("sm_90") == "sm_90a"
    assert [l.kernel for l in plan.launches] == ["conv_fwd_stage_x", "conv_fwd_stage_w", "conv_fwd"]
    assert dict(plan.workspaces) == {"xt": problem.N * problem.C * problem.H * problem.W,
                                     "wt": problem.K * problem.C * problem.R * problem.S}
    # The other formulations keep the portable target.
    other = FWD.plan(problem, FWD.default_config(problem, HOPPER, formulation="tc"))
    assert other.target_suffix == "" and other.compile_arch("sm_90") == "sm_90"


def test_wgmma_serves_conv_bwd_data_per_stride_phase_with_staged_operands():
    from autocnn.kernels.geometry import stride_phases

    name, problem = _bwd_problems()[0]   # modern_14: 256 input channels take every width
    assert len(_every_config(problem, BWD, ALL_WIDTHS)) == 33
    plan = BWD.plan(problem, BWD.default_config(problem, HOPPER, formulation=FORMULATION_WGMMA))
    assert plan.compile_arch("sm_90") == "sm_90a"
    assert [l.kernel for l in plan.launches] == ["conv_bwd_data_stage_dy", "conv_bwd_data_stage_w", "conv_bwd_data"]
    assert dict(plan.workspaces) == {"dyt": problem.N * problem.K * problem.P * problem.Q,
                                     "wt": problem.K * problem.C * problem.R * problem.S}
    for _, odd in ODD_BWD:   # one block row of phases per stride phase
        plan = BWD.plan(odd, BWD.default_config(odd, HOPPER, formulation=FORMULATION_WGMMA))
        assert plan.launches[-1].grid[2] == len(stride_phases(odd))
    # 16 input channels (scherer10_l2): the default block is as wide as the GEMM
    scherer = _bwd_problems()[1][1]
    assert BWD.default_config(scherer, HOPPER, formulation=FORMULATION_WGMMA).as_dict()["WBN"] == 16
    config = {"formulation": FORMULATION_WGMMA, "WGS": 1, "WBN": 64, "WSTAGES": 3, "INFLIGHT": 0, "SPLITK": 1,
              "STAGE_LAUNCHES": 2, "SK_BLOCKS": 0, "STAGE_PLANES": 0}
    with pytest.raises(InfeasibleConfigError, match="multiple of 4"):
        BWD.space(dataclasses.replace(problem, K=6), HOPPER).validate(config)
    fp32 = dataclasses.replace(problem, precision="fp32")
    assert dict(BWD.plan(fp32, BWD.space(fp32, HOPPER).complete(config)).workspaces) == {
        "dyt": 2 * problem.N * problem.K * problem.P * problem.Q, "wt": 2 * problem.K * problem.C * problem.R * problem.S}
    with pytest.raises(InfeasibleConfigError, match="sm_90"):
        _space(problem, DeviceLimits.for_arch("sm_80"), BWD).validate(config)
    with pytest.raises(InfeasibleConfigError, match="only 16 input channels"):
        BWD.space(scherer, HOPPER).validate({**config, "WBN": 128})
    with pytest.raises(InfeasibleConfigError, match="split evenly"):
        BWD.space(problem, HOPPER).validate({**config, "WGS": 2, "WBN": 16})


def _split_configs(problem, op):
    """Split reductions (2 and 4 blocks per output tile) in two widths, with either loop."""
    return _both_loops(problem, op, (64, 128), splits=(2, 4))


def test_a_split_reduction_adds_into_the_zeroed_output_of_layers_without_activation():
    from autocnn.kernels.geometry import stride_phases

    config = {"formulation": FORMULATION_WGMMA, "WGS": 2, "WBN": 128, "WSTAGES": 3, "INFLIGHT": 0, "STAGE_LAUNCHES": 2,
              "SK_BLOCKS": 0, "STAGE_PLANES": 0}
    narrow = {**config, "WGS": 1, "WBN": 16}   # 13 input channels
    for op, (name, problem), output, base in ((FWD, _problems()[0], "y", config), (BWD, ODD_BWD[0], "dx", narrow)):
        whole = op.plan(problem, op.space(problem, HOPPER).validate({**base, "SPLITK": 1}))
        split = op.plan(problem, op.space(problem, HOPPER).validate({**base, "SPLITK": 4}))
        assert output not in whole.zero_first and output in split.zero_first
        assert split.launches[-1].grid[2] == 4 * whole.launches[-1].grid[2]   # bwd_data: 4 per stride phase
        assert "atomicAdd" in split.source and "SplitEp" not in whole.source
    assert BWD.plan(ODD_BWD[0][1], BWD.space(ODD_BWD[0][1], HOPPER).validate(
        {**narrow, "SPLITK": 2})).launches[-1].grid[2] == 2 * len(stride_phases(ODD_BWD[0][1]))
    # the partial sums meet in the output: a fused activation cannot be applied to them
    relu = dataclasses.replace(_problems()[0][1], activation="relu")
    with pytest.raises(InfeasibleConfigError, match="activation"):
        FWD.space(relu, HOPPER).validate({**config, "SPLITK": 2})
    # no more splits than the reduction has tiles: a 1x1 over 12 channels has one
    tiny = ConvFwdProblem(N=2, C=12, H=5, W=5, K=8, R=1, S=1, precision="tf32")
    with pytest.raises(InfeasibleConfigError, match="only 1 tiles"):
        FWD.space(tiny, HOPPER).validate({**config, "WGS": 1, "WBN": 16, "SPLITK": 2})
    assert FWD.default_config(_problems()[0][1], HOPPER, formulation=FORMULATION_WGMMA)["SPLITK"] == 1


def _a_regs_configs(problem, op, widths=ALL_WIDTHS, splits=(1,)):
    """A_REGS=1 (fp32: A staged in FP32, its remainders split in registers) in the widths, depths 2-4
    and splits given, the staging in one launch and in two by turns; the wait-per-tile loop only (the
    constraints refuse a group in flight)."""
    space = _space(problem, op=op)
    out = []
    for (wgs, wbn, stages, splitk), launches in zip(itertools.product((1, 2, 4), widths, (2, 3, 4), splits),
                                                    itertools.cycle((1, 2))):
        try:
            out.append(space.validate({"formulation": FORMULATION_WGMMA, "WGS": wgs, "WBN": wbn, "WSTAGES": stages,
                                       "INFLIGHT": 0, "SPLITK": splitk, "A_REGS": 1, "STAGE_LAUNCHES": launches,
                                       "SK_BLOCKS": 0, "STAGE_PLANES": 0, "CROSS": 0}))
        except InfeasibleConfigError:
            pass
    return out


def test_a_regs_stages_operand_a_once_and_only_for_fp32():
    config = {"formulation": FORMULATION_WGMMA, "WGS": 2, "WBN": 64, "WSTAGES": 2, "INFLIGHT": 0, "SPLITK": 1,
              "STAGE_LAUNCHES": 2, "SK_BLOCKS": 0, "STAGE_PLANES": 0}
    for op, (name, problem), (a_name, b_name) in ((FWD, _problems()[0], ("xt", "wt")), (BWD, _bwd_problems()[0],
                                                                                         ("dyt", "wt"))):
        fp32 = dataclasses.replace(problem, precision="fp32")
        space = op.space(fp32, HOPPER)
        staged = op.plan(fp32, space.validate({**config, "A_REGS": 0, "CROSS": 0}))
        in_regs = op.plan(fp32, space.validate({**config, "A_REGS": 1, "CROSS": 0}))
        # A's small parts are neither staged nor in shared memory; B's still are
        assert dict(in_regs.workspaces)[a_name] * 2 == dict(staged.workspaces)[a_name]
        assert dict(in_regs.workspaces)[b_name] == dict(staged.workspaces)[b_name]
        assert staged.launches[-1].shared_bytes - in_regs.launches[-1].shared_bytes == 4 * 2 * 128 * 32
        assert "load_small_a" in in_regs.source and "load_small_a" not in staged.source
        assert "A_SMALL" not in in_regs.source and "A_SMALL" in staged.source
        # the first choice is the code of configs written before the parameter; tf32 has no split to place
        assert space.complete(config)["A_REGS"] == 0
        assert op.default_config(fp32, HOPPER, formulation=FORMULATION_WGMMA)["A_REGS"] == 0
        assert "A_REGS" not in op.default_config(problem, HOPPER, formulation=FORMULATION_WGMMA).as_dict()
        with pytest.raises(InvalidConfigError, match="A_REGS"):
            op.space(problem, HOPPER).validate({**config, "A_REGS": 1})
        with pytest.raises(InfeasibleConfigError, match="INFLIGHT=0"):
            space.validate({**config, "A_REGS": 1, "CROSS": 0, "INFLIGHT": 1, "WSTAGES": 3})
        with pytest.raises(InfeasibleConfigError, match="128 registers"):
            space.validate({**config, "A_REGS": 1, "CROSS": 0, "WBN": 128})
        assert len(_a_regs_configs(fp32, op)) >= 18   # 16 to 64 columns, 2-4 stages, 1-4 warpgroups


def test_one_launch_stages_both_operands_with_the_blocks_of_two():
    config = {"formulation": FORMULATION_WGMMA, "WGS": 1, "WBN": 16, "WSTAGES": 3, "INFLIGHT": 0, "SPLITK": 1}
    for op, (name, problem), kernel in ((FWD, ODD[0], "conv_fwd_stage"), (BWD, ODD_BWD[0], "conv_bwd_data_stage")):
        for precision in ("tf32", "fp32"):
            p = dataclasses.replace(problem, precision=precision)
            space = op.space(p, HOPPER)
            two = op.plan(p, space.complete({**config, "STAGE_LAUNCHES": 2}))
            one = op.plan(p, space.complete({**config, "STAGE_LAUNCHES": 1}))
            assert two.config["STAGE_PLANES"] == one.config["STAGE_PLANES"] == 0
            assert [l.kernel for l in one.launches] == [kernel, op.name]
            assert len(two.launches) == 3 and kernel + "(" not in two.source
            # W's gather blocks first, then A's 32 x 32 tiles: as many blocks as the two launches had
            assert one.launches[0].grid == (sum(l.grid[0] * l.grid[1] * l.grid[2] for l in two.launches[:2]), 1, 1)
            assert f"W_BLOCKS = {two.launches[1].grid[0]}," in one.source
            assert one.workspaces == two.workspaces and one.launches[-1] == two.launches[-1]
    assert FWD.default_config(ODD[0][1], HOPPER, formulation=FORMULATION_WGMMA)["STAGE_LAUNCHES"] == 2


# Stream-K needs at least as many (output tile, reduction tile) pairs as blocks: larger odd shapes, one
# GEMM each (stride 1), asymmetric padding, 70 GEMM columns, a 180-term reduction (5.6 tiles), bias.
ODD_SK = {FWD: ("odd_sk_fwd", ConvFwdProblem(N=7, C=20, H=23, W=19, K=70, R=3, S=3, padding=(1, 2, 0, 1), bias=True,
                                             precision="tf32")),
          BWD: ("odd_sk_bwd", ConvBwdDataProblem(N=7, C=70, H=23, W=19, K=20, R=3, S=3, padding=(1, 2, 0, 1),
                                                 precision="tf32"))}


def _stream_k_configs(problem, op, widths=(64, 16), blocks=(132, 264)):
    """SK_BLOCKS (stream-K) configs: either loop, the widths given, 1-2 blocks an SM of a 132-SM GPU."""
    return [c for sk in blocks for c in (_every_config(problem, op, widths, sk_blocks=sk) +
                                         _every_config(problem, op, widths, inflight=1, sk_blocks=sk))]


def test_stream_k_shares_every_tile_out_over_a_fixed_grid_into_the_zeroed_output():
    config = {"formulation": FORMULATION_WGMMA, "WGS": 2, "WBN": 128, "WSTAGES": 3, "INFLIGHT": 0, "SPLITK": 1,
              "STAGE_LAUNCHES": 2, "STAGE_PLANES": 0}
    for op, (name, problem), output in ((FWD, _problems()[0], "y"), (BWD, _bwd_problems()[0], "dx")):
        space = op.space(problem, HOPPER)
        whole = op.plan(problem, space.validate({**config, "SK_BLOCKS": 0}))
        stream = op.plan(problem, space.validate({**config, "SK_BLOCKS": 264}))
        assert output not in whole.zero_first and output in stream.zero_first
        assert stream.launches[-1].grid == (264, 1, 1) and whole.launches[-1].grid[0] > 1
        assert "gridDim.x" in stream.source and "StreamEp" not in whole.source and "WORK" not in whole.source
        assert stream.launches[:-1] == whole.launches[:-1] and stream.workspaces == whole.workspaces
        # 0 first: the code of configs written before the parameter, and the defaults'
        assert space.complete(config)["SK_BLOCKS"] == 0
        assert op.default_config(problem, HOPPER, formulation=FORMULATION_WGMMA)["SK_BLOCKS"] == 0
        # only this GPU's multiples of its SMs, up to 3 an SM
        with pytest.raises(InfeasibleConfigError, match="132 SMs"):
            space.validate({**config, "SK_BLOCKS": 114})
        assert op.space(problem, dataclasses.replace(HOPPER, sm_count=114)).validate({**config, "SK_BLOCKS": 342})
        with pytest.raises(InfeasibleConfigError, match="SPLITK=1"):
            space.validate({**config, "SK_BLOCKS": 132, "SPLITK": 2})
    relu = dataclasses.replace(_problems()[0][1], activation="relu")
    with pytest.raises(InfeasibleConfigError, match="activation"):
        FWD.space(relu, HOPPER).validate({**config, "SK_BLOCKS": 132})
    # conv_bwd_data with a stride runs a GEMM a phase: stream-K schedules one
    strided = ODD_BWD[0][1]
    with pytest.raises(InfeasibleConfigError, match="stride phases"):
        BWD.space(strided, HOPPER).validate({**config, "WGS": 1, "WBN": 16, "SK_BLOCKS": 132})
    # no more blocks than (output tile, reduction tile) pairs: a 1x1 over 12 channels on 25 pixels has 1
    tiny = ConvFwdProblem(N=1, C=12, H=5, W=5, K=8, R=1, S=1, precision="tf32")
    with pytest.raises(InfeasibleConfigError, match="exceeds the 1"):
        FWD.space(tiny, HOPPER).validate({**config, "WGS": 1, "WBN": 16, "SK_BLOCKS": 132})


def test_the_stream_k_runs_cover_every_pair_once():
    """The kernels' share-out (WORK * b / G up to WORK * (b + 1) / G, cut at tile ends), in Python: every
    (tile, reduction tile) pair belongs to one run of one block, and each tile's first is in a run that
    starts there (the one adding the bias)."""
    for tiles_m, tiles_n, ktiles, blocks in ((98, 1, 72, 132), (7, 3, 5, 264), (1, 1, 1, 1), (13, 2, 18, 396)):
        work = tiles_m * tiles_n * ktiles
        seen = []
        for b in range(blocks):
            w, end = work * b // blocks, work * (b + 1) // blocks
            while w < end:
                tile, first = divmod(w, ktiles)
                mine = min(ktiles - first, end - w)
                seen += [(tile, first + i) for i in range(mine)]
                w += mine
        assert sorted(seen) == [(t, k) for t in range(tiles_m * tiles_n) for k in range(ktiles)]


@needs_nvcc
@pytest.mark.parametrize("builds", BUILDS)
def test_every_stream_k_config_builds_for_sm90a_without_spills(tmp_path, builds):
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    problems = {op: (odd, *_fp32([odd]), (_problems() if op is FWD else _bwd_problems())[0])
                for op, odd in ODD_SK.items()}
    jobs = [(name, config, op.plan(problem, config)) for op, shapes in problems.items() for name, problem in shapes
            for config in _stream_k_configs(problem, op, (64, 128), (132,))]
    failures = target_build_failures(compiler, build_sample(jobs, builds))
    assert len(jobs) > 60 and not failures, "\n".join(failures[:8])


def _plane_configs(problem, op, widths=(64, 16)):
    """STAGE_PLANES=1 (the staging in one launch, through shared memory by whole planes) with either
    main loop, whole and split reductions, the widths given; in fp32 also with A_REGS (A staged
    unsplit) where it applies."""
    out = _every_config(problem, op, widths, (1, 2), stage_launches=1, stage_planes=1) + \
        _every_config(problem, op, widths, (1,), inflight=1, stage_launches=1, stage_planes=1)
    if problem.precision == "fp32":
        space = _space(problem, op=op)
        out += [space.validate({**c.as_dict(), "A_REGS": 1}) for c in out if c["INFLIGHT"] == 0 and c["WBN"] <= 64]
    return out


def test_the_staging_by_planes_moves_a_plane_or_a_weight_slice_a_block():
    from autocnn.kernels.formulations.cores.staging import PLANE_SMEM_LIMIT, plane_stage_smem

    config = {"formulation": FORMULATION_WGMMA, "WGS": 1, "WBN": 16, "WSTAGES": 3, "INFLIGHT": 0, "SPLITK": 1,
              "SK_BLOCKS": 0, "STAGE_LAUNCHES": 1}
    for op, (name, problem), kernel in ((FWD, ODD[0], "conv_fwd_stage"), (BWD, ODD_BWD[0], "conv_bwd_data_stage")):
        for precision in ("tf32", "fp32"):
            p = dataclasses.replace(problem, precision=precision)
            space = op.space(p, HOPPER)
            tiles = op.plan(p, space.complete({**config, "STAGE_PLANES": 0}))
            planes = op.plan(p, space.complete({**config, "STAGE_PLANES": 1}))
            stage = planes.launches[0]
            assert [l.kernel for l in planes.launches] == [kernel, op.name] and "extern __shared__ float4 stage_smem4" in \
                planes.source and "stage_smem4" not in tiles.source
            # a block per filter (conv_fwd) or input channel (conv_bwd_data), then one per image and 32 channels
            if op is FWD:
                assert stage.grid == (p.K + p.N * -(-p.C // 32), 1, 1)
                assert stage.shared_bytes == plane_stage_smem(p.H * p.W, p.C * (p.R * p.S | 1))
            else:
                assert stage.grid == (p.C + p.N * -(-p.K // 32), 1, 1)
                assert stage.shared_bytes == plane_stage_smem(p.P * p.Q, p.R * p.S * (p.K | 1))
            assert planes.workspaces == tiles.workspaces and planes.launches[-1] == tiles.launches[-1]
            assert ("store_split4" in planes.source) == (precision == "fp32")
            with pytest.raises(InfeasibleConfigError, match="STAGE_LAUNCHES=1"):
                space.complete({**config, "STAGE_LAUNCHES": 2, "STAGE_PLANES": 1})
    # rows padded to 1 mod 32 floats: 14 x 14 planes take 225 a row, 32 channels of them 28,800 bytes
    assert plane_stage_smem(196, 256 * 9) == 4 * 32 * 225
    assert plane_stage_smem(4, 121 * (64 | 1)) == 4 * 121 * 65   # W's slice the larger: 121 taps x 65
    # a 64 x 64 plane of 32 channels does not fit two blocks an SM
    big = dataclasses.replace(_problems()[0][1], H=64, W=64)
    assert plane_stage_smem(64 * 64, big.C * 9) > PLANE_SMEM_LIMIT
    with pytest.raises(InfeasibleConfigError, match="STAGE_PLANES=1 needs"):
        FWD.space(big, HOPPER).complete({**config, "WGS": 2, "WBN": 64, "STAGE_PLANES": 1})


@needs_nvcc
@pytest.mark.parametrize("builds", BUILDS)
def test_every_plane_staging_config_builds_for_sm90a_without_spills(tmp_path, builds):
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    jobs = [(name, config, op.plan(problem, config))
            for op, problems in ((FWD, (_problems()[0], *ODD)), (BWD, (_bwd_problems()[0], *ODD_BWD)))
            for name, problem in (*problems, *_fp32(problems)) for config in _plane_configs(problem, op, (64,))]
    failures = target_build_failures(compiler, build_sample(jobs, builds))
    assert len(jobs) > 60 and not failures, "\n".join(failures[:8])


@needs_nvcc
@pytest.mark.parametrize("builds", BUILDS)
def test_every_a_regs_config_builds_for_sm90a_without_spills(tmp_path, builds):
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    jobs = [(name, config, op.plan(problem, config))
            for op, problems in ((FWD, _fp32(_problems())), (BWD, _fp32(_bwd_problems())))
            for name, problem in problems for config in _a_regs_configs(problem, op, splits=(1, 2))]
    failures = target_build_failures(compiler, build_sample(jobs, builds))
    assert len(jobs) > 150 and not failures, "\n".join(failures[:8])


@pytest.mark.gpu
@pytest.mark.parametrize("op", [FWD, BWD], ids=["conv_fwd", "conv_bwd_data"])
def test_wgmma_staging_in_one_launch_verifies_against_float64(op):
    """STAGE_LAUNCHES 1 (one kernel stages both operands) on the odd shapes in tf32 and on the fp32 ones
    (each operand's small parts staged too; with A_REGS: test_wgmma_a_regs_meets_the_fp32_bound), 64
    and 16 columns, every depth of the wait-per-tile loop, whole and split reductions."""
    both = _problems() if op is FWD else _bwd_problems()
    problems = [(n, p) for n, p in both if n.startswith("odd")] + _fp32(both)
    _verify_every_config(op, problems, lambda p: _every_config(p, op, (64, 16), (1, 2), stage_launches=1))


@pytest.mark.gpu
@pytest.mark.parametrize("op", [FWD, BWD], ids=["conv_fwd", "conv_bwd_data"])
def test_wgmma_stream_k_verifies_against_float64(op):
    """SK_BLOCKS (stream-K: 132 or 264 blocks sharing every tile's reduction out, partial sums by
    atomics) on modern_14 and an odd shape in tf32, and in fp32 at the FP32 bound; 64 and 16 columns,
    either loop."""
    problems = [(_problems() if op is FWD else _bwd_problems())[0], ODD_SK[op]]
    _verify_every_config(op, problems + _fp32(problems), lambda p: _stream_k_configs(p, op))


@pytest.mark.gpu
@pytest.mark.parametrize("op", [FWD, BWD], ids=["conv_fwd", "conv_bwd_data"])
def test_wgmma_staging_by_planes_verifies_against_float64(op):
    """STAGE_PLANES=1 (the staging through shared memory by whole planes and weight slices) on
    modern_14 and every odd shape (planes whose size is not a multiple of 4, so 16-byte chunks span
    two channels; 13 input channels; stride phases) in tf32 and in fp32 at the FP32 bound; 64 and 16
    columns, either loop, whole and split reductions."""
    both = _problems() if op is FWD else _bwd_problems()
    problems = [(n, p) for n, p in both if n.startswith(("modern", "odd"))]
    _verify_every_config(op, problems + _fp32(problems), lambda p: _plane_configs(p, op))


@pytest.mark.gpu
@pytest.mark.parametrize("op", [FWD, BWD], ids=["conv_fwd", "conv_bwd_data"])
def test_wgmma_a_regs_meets_the_fp32_bound(op):
    """A_REGS (3xTF32 with A's TF32 parts truncated by the tensor cores and its remainders split in
    registers) against float64 under the FP32 bound: the fp32 seed shape and the odd shapes, every
    width and depth, whole and split reductions."""
    problems = _fp32(_problems() if op is FWD else _bwd_problems())
    _verify_every_config(op, problems, lambda p: _a_regs_configs(p, op, splits=(1, 2)))


# CROSS (fp32): the staged operands run in whole runs of 8 channels of one tap, so C (conv_fwd) or K
# (conv_bwd_data) a multiple of 8 and nothing else even: odd batch, P, Q and GEMM columns, stride 2 by 1
# with asymmetric padding (two stride phases of different sizes), bias and relu, 13 input channels,
# a 1x1 layer of 70 input channels, and shapes with enough (tile, reduction tile) pairs for stream-K.
ODD_CROSS = {FWD: (("odd_cross_fwd_a", ConvFwdProblem(N=3, C=24, H=13, W=11, K=19, R=3, S=5, stride=(2, 1),
                                                      padding=(1, 2, 0, 1), bias=True, activation="relu")),
                   ("odd_cross_fwd_sk", ConvFwdProblem(N=7, C=24, H=23, W=19, K=70, R=3, S=3, padding=(1, 2, 0, 1),
                                                       bias=True))),
                 BWD: (("odd_cross_bwd_a", ConvBwdDataProblem(N=3, C=13, H=13, W=11, K=24, R=3, S=5, stride=(2, 1),
                                                              padding=(1, 2, 0, 1))),
                       ("odd_cross_bwd_b", ConvBwdDataProblem(N=2, C=70, H=9, W=7, K=8, R=1, S=1)),
                       ("odd_cross_bwd_sk", ConvBwdDataProblem(N=7, C=70, H=23, W=19, K=24, R=3, S=3,
                                                               padding=(1, 2, 0, 1))))}


def _cross_problems(op):
    seed = dict(seed_problems(op.name))
    return [("modern_56 fp32", dataclasses.replace(seed["modern_56"], N=4, precision="fp32")), *ODD_CROSS[op]]


def _cross_configs(problem, op, widths=(64, 16)):
    """CROSS=1: either loop, whole and split reductions, the staging in two launches and in one (by
    tiles and by planes where a plane fits), stream-K on 132 blocks; the widths given."""
    out = _every_config(problem, op, widths, (1, 2), cross=1) + _every_config(problem, op, widths, inflight=1, cross=1)
    out += _every_config(problem, op, widths, (1,), stage_launches=1, stage_planes=1, cross=1)
    out += _every_config(problem, op, widths, inflight=1, stage_launches=1, cross=1)
    out += _every_config(problem, op, widths, sk_blocks=132, cross=1)
    return out


def test_cross_products_run_as_one_bf16_wgmma_over_runs_of_8():
    config = {"formulation": FORMULATION_WGMMA, "WGS": 2, "WBN": 64, "WSTAGES": 3, "INFLIGHT": 1, "SPLITK": 1,
              "STAGE_LAUNCHES": 1, "SK_BLOCKS": 0, "STAGE_PLANES": 0, "A_REGS": 0}
    for op in (FWD, BWD):
        name, problem = _cross_problems(op)[1]
        space = op.space(problem, HOPPER)
        three = op.plan(problem, space.validate({**config, "CROSS": 0}))
        cross = op.plan(problem, space.validate({**config, "CROSS": 1}))
        # the same workspaces and shared memory: the BF16 runs take the small parts' place
        assert cross.workspaces == three.workspaces
        assert [l.shared_bytes for l in cross.launches] == [l.shared_bytes for l in three.launches]
        assert "k16.f32.bf16.bf16" in cross.source and "bf16" not in three.source
        assert "cvt.rn.bf16.f32" in cross.source and cross.source.count(", false);") == 1   # W: remainders first
        # three TF32 wgmmas a k-step before (small x big among them), one TF32 and one BF16 now
        small_big = "descriptor(a + SMALL_SMEM + 32 * ks), descriptor(b + 32 * ks)"
        assert small_big in three.source and small_big not in cross.source
        assert "mma_cross(part0, descriptor(a + SMALL_SMEM + 32 * ks), descriptor(b + SMALL_SMEM + 32 * ks))" in \
            cross.source and "mma_cross_fresh(part1" in cross.source
        # the first choice is the code of configs written before the parameter; tf32 has no cross products
        assert space.complete({k: v for k, v in config.items()})["CROSS"] == 0
        assert op.default_config(problem, HOPPER, formulation=FORMULATION_WGMMA)["CROSS"] == 0
        tf32 = dataclasses.replace(problem, precision="tf32")
        tf32_config = {k: v for k, v in config.items() if k != "A_REGS"}
        with pytest.raises(InvalidConfigError, match="CROSS"):
            op.space(tf32, HOPPER).validate({**tf32_config, "CROSS": 1})
        assert "CROSS" not in op.space(tf32, HOPPER).validate(tf32_config).as_dict()
        with pytest.raises(InfeasibleConfigError, match="A_REGS=0"):
            space.validate({**config, "CROSS": 1, "A_REGS": 1, "INFLIGHT": 0})
        channels = "C" if op is FWD else "K"
        with pytest.raises(InfeasibleConfigError, match=f"{channels}.* must be a multiple of 8, not 12"):
            op.space(dataclasses.replace(problem, **{channels: 12}), HOPPER).validate({**config, "CROSS": 1})
        assert len(_cross_configs(problem, op)) >= 20


@needs_nvcc
@pytest.mark.parametrize("builds", BUILDS)
def test_every_cross_config_builds_for_sm90a_without_spills(tmp_path, builds):
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    jobs = [(name, config, op.plan(problem, config)) for op in (FWD, BWD) for name, problem in _cross_problems(op)
            for config in _cross_configs(problem, op, (64, 128))]
    failures = target_build_failures(compiler, build_sample(jobs, builds))
    assert len(jobs) > 100 and not failures, "\n".join(failures[:8])


@pytest.mark.gpu
@pytest.mark.parametrize("op", [FWD, BWD], ids=["conv_fwd", "conv_bwd_data"])
def test_wgmma_cross_products_meet_the_fp32_bound(op):
    """CROSS=1 (3xTF32's cross products as one BF16 wgmma) against float64 under the FP32 bound:
    modern_56's layer on 4 images and the odd shapes, 16 and 64 columns, either loop, whole and split
    reductions, the staging in one launch or two, by planes, stream-K."""
    _verify_every_config(op, _cross_problems(op), lambda p: _cross_configs(p, op))


def _padded_default(problem):
    """The first default config of the padded grid (X not unrolled)."""
    return next(c for c in WGRAD.default_configs(problem, HOPPER, FORMULATION_WGMMA) if not c["X_UNROLLED"])


def test_wgmma_serves_weight_gradients_on_a_padded_grid():
    from autocnn.kernels.formulations.cores.staging import PaddedGrid

    name, problem = _wgrad_problems()[0]   # modern_14: 64 x 256 x 14 x 14, 3x3, pad 1
    grid = PaddedGrid.of(problem)
    assert (grid.HP, grid.WP, grid.XCOPIES) == (16, 16, 3) and grid.GK == 64 * 16 * 16
    assert grid.LC >= grid.GK + 2 * 16 + 2 and grid.LC % 4 == 0
    # The defaults stage X unrolled where its copy is at most 128 MiB (modern_14 in tf32: 116 MB; in
    # fp32, with the small parts, twice that), the padded grid after it
    assert WGRAD.default_config(problem, HOPPER, formulation=FORMULATION_WGMMA)["X_UNROLLED"] == 1
    fp32_default = WGRAD.default_config(dataclasses.replace(problem, precision="fp32"), HOPPER,
                                        formulation=FORMULATION_WGMMA)
    assert (fp32_default["X_UNROLLED"], fp32_default["IMAGE_TILES"]) == (0, 1)
    config = _padded_default(problem)
    # Tiles of each image's 14 rows of 16 (7 of 32 floats) instead of the grid's 16 rows (8 tiles)
    assert grid.TPI == 7 and grid.tiles(problem, 1) == 64 * 7 and grid.tiles(problem, 0) == 64 * 8
    assert config["IMAGE_TILES"] == 1
    one_by_one = ODD_WGRAD[1][1]   # no rows to skip (R = 1): the whole grid, without per-image rounding
    assert _padded_default(one_by_one)["IMAGE_TILES"] == 0
    plan = WGRAD.plan(problem, config)
    assert plan.compile_arch("sm_90") == "sm_90a"
    assert [l.kernel for l in plan.launches] == ["conv_wgrad_stage_dy", "conv_wgrad_stage_x", "conv_wgrad"]
    assert plan.launches[-1].grid[2] == config["SPLITK"] > 1
    assert dict(plan.workspaces) == {"dyp": problem.K * grid.GK, "xs": 3 * problem.C * grid.LC}
    assert set(plan.zero_first) == {"dw", "db"}   # the splits' and the planes' atomics add into zeros
    # Any channel counts (no float4 runs of channels); 3xTF32 doubles the copies.
    odd = ODD_WGRAD[1][1]
    assert WGRAD.plan(odd, WGRAD.default_config(odd, HOPPER, formulation=FORMULATION_WGMMA)).zero_first in ((), ("dw",))
    # Strided: X staged on one grid per stride phase, by the one-pass staging only
    strided = dataclasses.replace(problem, stride=(2, 2))
    with pytest.raises(InfeasibleConfigError, match="IMAGE_TILES=1"):
        WGRAD.space(strided, HOPPER).validate({**config.as_dict(), "IMAGE_TILES": 0})
    sgrid = PaddedGrid.of(strided)   # 7 x 7 outputs, taps shifted by 0 or 1 row and column of 4 phases
    assert (sgrid.PHASES, sgrid.OH, sgrid.OW, sgrid.HP, sgrid.WP, sgrid.XCOPIES) == (4, 1, 1, 8, 8, 2)
    splan = WGRAD.plan(strided, _padded_default(strided))
    assert splan.launches[1].grid[2] == 4 and dict(splan.workspaces)["xs"] == 4 * 2 * problem.C * sgrid.LC
    fp32 = dataclasses.replace(problem, precision="fp32")
    assert dict(WGRAD.plan(fp32, WGRAD.space(fp32, HOPPER).validate(config.as_dict())).workspaces)["xs"] == \
        2 * 3 * problem.C * grid.LC
    with pytest.raises(InfeasibleConfigError, match="reduction tiles"):
        WGRAD.space(ODD_WGRAD[0][1], HOPPER).validate({**config.as_dict(), "WGS": 1, "SPLITK": 32})
    # X unrolled: dY's planes side by side and a row of X per filter tap, over N*P*Q rounded up to
    # whole tiles (modern_14: 12,544 positions, 392 tiles), for any stride; no grid to tile by images
    from autocnn.kernels.formulations.cores.staging import unrolled_length
    unrolled = {**config.as_dict(), "IMAGE_TILES": 0, "X_UNROLLED": 1}
    lj = unrolled_length(problem)
    assert lj == 64 * 14 * 14 and lj % 32 == 0 and unrolled_length(ODD_WGRAD[0][1]) == 32 * 12   # 3 x 12 x 10 = 360
    uplan = WGRAD.plan(problem, WGRAD.space(problem, HOPPER).validate(unrolled))
    assert dict(uplan.workspaces) == {"dyp": problem.K * lj, "xs": problem.C * 9 * lj}
    assert uplan.launches[1].grid == (-(-lj // (4 * 256)), problem.C * 9, 1)   # 13 blocks of 1,024 positions per row
    with pytest.raises(InfeasibleConfigError, match="IMAGE_TILES=0"):
        WGRAD.space(problem, HOPPER).validate({**unrolled, "IMAGE_TILES": 1})
    assert WGRAD.space(strided, HOPPER).validate(unrolled)["X_UNROLLED"] == 1
    # dY read in place: no dYp, the GEMM takes dY; only tf32 without bias, Q a multiple of 4, image tiles
    resnet1 = ConvWgradProblem(N=64, C=3, H=224, W=224, K=64, R=7, S=7, stride=(2, 2), padding=(3, 3, 3, 3),
                               bias=False, precision="tf32")   # staged, dY on the grid would need 219 MB
    in_place = WGRAD.default_config(resnet1, HOPPER, formulation=FORMULATION_WGMMA)
    assert in_place["DY_IN_PLACE"] == 1 and in_place["IMAGE_TILES"] == 1
    iplan = WGRAD.plan(resnet1, in_place)
    assert [l.kernel for l in iplan.launches] == ["conv_wgrad_stage_x", "conv_wgrad"]
    assert iplan.launches[-1].args[0] == "dy" and set(dict(iplan.workspaces)) == {"xs"}
    assert "conv_wgrad_stage_dy" not in iplan.source
    with pytest.raises(InfeasibleConfigError, match="workspace limit"):   # dYp and Xs: 383 MB
        WGRAD.space(resnet1, HOPPER).validate({**in_place.as_dict(), "DY_IN_PLACE": 0})
    for bad, why in ((dataclasses.replace(resnet1, precision="fp32"), "tf32"),
                     (dataclasses.replace(resnet1, W=222), "Q a multiple of 4 .*, not 111")):
        with pytest.raises(InfeasibleConfigError, match=why):
            WGRAD.space(bad, HOPPER).validate({**in_place.as_dict(), "WBN": 64, "WGS": 1})
    # With a bias, db is a kernel of its own (dY's staging summed it), into the zeroed db
    biased = dataclasses.replace(resnet1, bias=True)
    bplan = WGRAD.plan(biased, WGRAD.space(biased, HOPPER).validate(in_place.as_dict()))
    assert [(l.kernel, l.args) for l in bplan.launches[:2]] == [("conv_wgrad_db", ("dy", "db")),
                                                                ("conv_wgrad_stage_x", ("x", "xs"))]
    assert "db" in bplan.zero_first and "conv_wgrad_db" not in iplan.source
    with pytest.raises(InfeasibleConfigError, match="IMAGE_TILES=1"):
        WGRAD.space(resnet1, HOPPER).validate({**in_place.as_dict(), "IMAGE_TILES": 0, "X_UNROLLED": 1})
    with pytest.raises(InfeasibleConfigError, match="workspace limit"):   # 2.3 GB of X unrolled
        WGRAD.space(dict(seed_problems("conv_wgrad"))["scherer10_l2"], HOPPER).validate(
            {**unrolled, "WGS": 1, "WBN": 64})


def _padded_grid_wgrad(problem, x, dy, image_tiles=0):
    """The weight gradient as the wgmma kernel computes it (wgmma_conv_wgrad.cu.j2), in float64: dY on
    the padded grid, X's shifted copies on one grid per stride phase, and the GEMM whose B rows read
    copy d = shift % 4 of their tap's phase from shift - d, over the whole grid or (image_tiles) over
    the tiles of each image's P rows, a chunk of 4 past them zero. Also checks the alignment the
    kernel's 16-byte copies rely on."""
    from autocnn.kernels.formulations.cores.staging import PaddedGrid

    p, g = problem, PaddedGrid.of(problem)
    (sh, sw), pt, pl = p.stride, p.padding[0], p.padding[1]
    assert g.PHASES == sh * sw and ((sh, sw) != (1, 1) or (g.OH, g.OW) == (pt, pl))
    gk = g.GK
    dyp = np.zeros((p.K, p.N, g.HP, g.WP))
    dyp[:, :, :p.P, :p.Q] = dy.transpose(1, 0, 2, 3)
    copies = []   # per phase (a, b), a * sw + b: the XCOPIES shifted copies of its grid
    for a in range(sh):
        for b_ in range(sw):
            grid = np.zeros((p.C, p.N, g.HP, g.WP))
            for hp in range(g.HP):
                for wp in range(g.WP):
                    h, w = sh * (hp - g.OH) + a, sw * (wp - g.OW) + b_
                    if 0 <= h < p.H and 0 <= w < p.W:
                        grid[:, :, hp, wp] = x[:, :, h, w].T
            xs = np.zeros((p.C, g.LC + 4))
            xs[:, :gk] = grid.reshape(p.C, gk)
            copies.append([xs[:, d:d + g.LC] for d in range(g.XCOPIES)])
    b = np.zeros((p.C, p.R, p.S, gk))
    for r in range(p.R):
        for s_ in range(p.S):
            a, b_ = (r - pt) % sh, (s_ - pl) % sw
            shift = ((r - pt - a) // sh + g.OH) * g.WP + (s_ - pl - b_) // sw + g.OW
            d = shift % 4
            assert shift >= 0 and d < g.XCOPIES and (shift - d) % 4 == 0 and shift - d + gk <= g.LC
            b[:, r, s_] = copies[a * sw + b_][d][:, shift - d:shift - d + gk]
    a, b = dyp.reshape(p.K, gk), b.reshape(-1, gk)
    if image_tiles:   # grid positions v -> j of the kernel's grid_position, chunks past P rows masked
        v = np.arange(g.tiles(p, 1) * 32)
        local = (v // 32 % g.TPI) * 32 + v % 32
        j = (v // 32 // g.TPI) * g.HP * g.WP + local
        ok = local < p.P * g.WP
        assert (p.P * g.WP) % 4 == 0 and j[ok].max() < gk and len(set(j[ok])) == ok.sum()
        # every position where dY is not zero is visited once
        assert set(j[ok]) >= set(np.flatnonzero(np.abs(a).sum(axis=0)))
        # DY_IN_PLACE reads the same values from dY where it lies: the kernel's offset of v in image
        # t / TPI, row hp and column wp of the grid, valid inside P x Q (its AOp)
        hp, wp = local // g.WP, local % g.WP
        inside = (hp < p.P) & (wp < p.Q)
        off = (v // 32 // g.TPI) * p.K * p.P * p.Q + hp * p.Q + wp
        read = np.where(inside, dy.reshape(-1)[np.arange(p.K)[:, None] * p.P * p.Q + np.where(inside, off, 0)], 0.0)
        assert np.array_equal(read[:, ok], a[:, j[ok]])
        a, b = a[:, j[ok]], b[:, j[ok]]
    return (a @ b.T).reshape(p.K, p.C, p.R, p.S)


def _unrolled_wgrad(problem, x, dy, splitk=1):
    """The weight gradient as the wgmma kernel computes it with X_UNROLLED=1, in float64: dY's planes
    side by side and X unrolled (a row per filter tap), both over the unrolled length (zeros past
    N*P*Q), the reduction's whole tiles split over SPLITK blocks as the kernel splits them."""
    from autocnn.kernels.formulations.cores.staging import unrolled_length
    from autocnn.kernels.formulations.cores.wgmma_gemm import BK

    p, lj = problem, unrolled_length(problem)
    (sh, sw), pt, pl = p.stride, p.padding[0], p.padding[1]
    npq = p.N * p.P * p.Q
    assert lj % BK == 0 and npq <= lj < npq + BK
    j = np.arange(lj)
    n, pq = j // (p.P * p.Q), j % (p.P * p.Q)
    a = np.zeros((p.K, lj))
    a[:, :npq] = dy.transpose(1, 0, 2, 3).reshape(p.K, npq)
    b = np.zeros((p.C, p.R, p.S, lj))
    for r in range(p.R):
        for s_ in range(p.S):
            h, w = sh * (pq // p.Q) - pt + r, sw * (pq % p.Q) - pl + s_
            ok = (j < npq) & (h >= 0) & (h < p.H) & (w >= 0) & (w < p.W)
            b[:, r, s_, ok] = x[n[ok], :, h[ok], w[ok]].T
    b = b.reshape(-1, lj)
    tiles = lj // BK
    per = -(-tiles // splitk)
    out = np.zeros((p.K, b.shape[0]))
    for z in range(splitk):   # blockIdx.z's tiles: the kernel's first = z * PER, at most PER of them
        lo, hi = min(tiles, z * per) * BK, min(tiles, (z + 1) * per) * BK
        out += a[:, lo:hi] @ b[:, lo:hi].T
    return out.reshape(p.K, p.C, p.R, p.S)


# Strided weight gradients (wgmma stages X by stride phases): nothing even, stride 2 by 3 with
# asymmetric padding and a 3x4 filter; ResNet's 3x3 and 1x1 stride-2 layers in small; scherer10's
# 8x8 stride 2 with padding 3 (shifts of 0-4 columns: 4 copies).
STRIDED_WGRAD = (("odd_wgs_a", ConvWgradProblem(N=3, C=5, H=13, W=11, K=7, R=3, S=4, stride=(2, 3),
                                                padding=(1, 2, 0, 1), precision="tf32")),
                 ("odd_wgs_b", ConvWgradProblem(N=2, C=8, H=14, W=14, K=12, R=3, S=3, stride=(2, 2), padding=(1, 1, 1, 1),
                                                bias=False, precision="tf32")),
                 ("odd_wgs_c", ConvWgradProblem(N=2, C=8, H=14, W=14, K=20, R=1, S=1, stride=(2, 2), bias=False,
                                                precision="tf32")),
                 ("odd_wgs_d", ConvWgradProblem(N=1, C=4, H=20, W=18, K=9, R=8, S=8, stride=(2, 2), padding=(3, 3, 3, 3),
                                                precision="tf32")))


# dY read in place (tf32 without bias, Q a multiple of 4): ResNet-18's first layer in small (3
# channels, 7x7, stride 2, padding 3: 9 x 8 outputs), and a stride-1 3x3 with 12 output columns.
IN_PLACE_WGRAD = (("odd_wgi_a", ConvWgradProblem(N=3, C=3, H=17, W=15, K=12, R=7, S=7, stride=(2, 2),
                                                 padding=(3, 3, 3, 3), bias=False, precision="tf32")),
                  ("odd_wgi_b", ConvWgradProblem(N=2, C=5, H=9, W=12, K=7, R=3, S=3, padding=(1, 1, 1, 1),
                                                 bias=False, precision="tf32")),
                  # with a bias (db by its own kernel); pointwise layers with X in place too, the
                  # pointwise target's 256->512 at 28x28 and odd ones whose images end inside a tile
                  ("odd_wgi_c", ConvWgradProblem(N=3, C=5, H=9, W=12, K=7, R=3, S=3, padding=(1, 1, 1, 1),
                                                 precision="tf32")),
                  ("odd_wgi_pw", ConvWgradProblem(N=3, C=9, H=7, W=8, K=13, R=1, S=1, precision="tf32")),
                  ("odd_wgi_pw_nobias", ConvWgradProblem(N=1, C=6, H=5, W=12, K=10, R=1, S=1, bias=False,
                                                         precision="tf32")),
                  ("pointwise_s1", ConvWgradProblem(N=64, C=256, H=28, W=28, K=512, R=1, S=1, precision="tf32")))


def test_pointwise_layers_read_both_operands_where_they_lie():
    """X_IN_PLACE (a 1x1 stride-1 layer without padding, tf32, W a multiple of 4): no copies at all,
    the GEMM reads dY and X; offered only there, and only over each image's tiles."""
    pw = ConvWgradProblem(N=64, C=256, H=28, W=28, K=512, R=1, S=1, precision="tf32")
    space = WGRAD.space(pw, HOPPER)
    candidates = [space.validate(c) for c in WGRAD.candidates(pw, FORMULATION_WGMMA)]
    both = [c for c in candidates if c["X_IN_PLACE"]]
    assert both and all(c["DY_IN_PLACE"] and c["IMAGE_TILES"] and not c["X_UNROLLED"] for c in both)
    assert not candidates[0]["X_IN_PLACE"]   # the default is what it was
    plan = WGRAD.plan(pw, both[0])
    assert [(l.kernel, l.args) for l in plan.launches] == [("conv_wgrad_db", ("dy", "db")),
                                                           ("conv_wgrad", ("dy", "x", "dw"))]
    assert plan.workspaces == () and "conv_wgrad_stage_x" not in plan.source
    nobias = dataclasses.replace(pw, bias=False)
    assert [l.kernel for l in WGRAD.plan(nobias, WGRAD.space(nobias, HOPPER).validate(both[0].as_dict())).launches] \
        == ["conv_wgrad"]
    # X staged while dY is read in place, and the other way round: both are configs of their own
    x_only = space.validate({**both[0].as_dict(), "DY_IN_PLACE": 0})
    assert [l.kernel for l in WGRAD.plan(pw, x_only).launches] == ["conv_wgrad_stage_dy", "conv_wgrad"]
    with pytest.raises(InfeasibleConfigError, match="X_IN_PLACE=1 .* IMAGE_TILES=1"):
        space.validate({**both[0].as_dict(), "IMAGE_TILES": 0, "DY_IN_PLACE": 0})
    for other in (dataclasses.replace(pw, precision="fp32"), dataclasses.replace(pw, W=30),
                  dataclasses.replace(pw, R=3, S=3, padding=(1, 1, 1, 1)), dataclasses.replace(pw, stride=(2, 2))):
        assert "X_IN_PLACE" not in {p.name for p in WGRAD.space(other, HOPPER).params}, other


def _in_place_pointwise_wgrad(problem, x, dy):
    """The GEMM of X_IN_PLACE and DY_IN_PLACE as the kernel addresses both operands (AOp and BOp of
    wgmma_conv_wgrad.cu.j2), in float64: reduction position v of tile t covers image t // TPI at
    grid position local = (t % TPI) * 32 + v % 32, row local // W (zero past H), column local % W, read
    from dY's and X's own planes. Also checks that every 16-byte chunk the kernel copies is aligned
    and inside one row."""
    from autocnn.kernels.formulations.cores.staging import PaddedGrid

    p, g = problem, PaddedGrid.of(problem)
    assert g.WP == p.W and p.W % 4 == 0
    v = np.arange(p.N * g.TPI * 32)
    t, local = v // 32, (v // 32 % g.TPI) * 32 + v % 32
    hp, wp = local // p.W, local % p.W
    ok = hp < p.H
    n = t // g.TPI
    x_off = n * p.C * p.H * p.W + hp * p.W + wp        # BOp: + c * H * W
    dy_off = n * p.K * p.P * p.Q + hp * p.Q + wp        # AOp: + k * P * Q
    starts = v % 4 == 0
    assert (x_off[starts] % 4 == 0).all() and (wp[starts] + 3 < p.W).all()
    xf, dyf = x.reshape(-1), dy.reshape(-1)
    b = np.where(ok, xf[np.arange(p.C)[:, None] * p.H * p.W + np.where(ok, x_off, 0)], 0.0)
    a = np.where(ok, dyf[np.arange(p.K)[:, None] * p.P * p.Q + np.where(ok, dy_off, 0)], 0.0)
    assert len(set(zip(n[ok], hp[ok], wp[ok]))) == ok.sum() == p.N * p.H * p.W   # each position once
    return (a @ b.T).reshape(p.K, p.C, 1, 1)


@pytest.mark.parametrize("shape", [(3, 5, 7, 8, 6), (2, 9, 5, 12, 4), (1, 4, 3, 4, 3)])
def test_the_in_place_pointwise_gemm_is_the_weight_gradient(shape):
    n, c, h, w, k = shape
    p = ConvWgradProblem(N=n, C=c, H=h, W=w, K=k, R=1, S=1, precision="tf32")
    rng = np.random.default_rng(3)
    x, dy = rng.standard_normal((n, c, h, w)), rng.standard_normal((n, k, h, w))
    np.testing.assert_allclose(_in_place_pointwise_wgrad(p, x, dy)[:, :, 0, 0], np.einsum("nkhw,nchw->kc", dy, x),
                               rtol=1e-12, atol=1e-11)


@pytest.mark.parametrize("problem", [ODD_WGRAD[0][1], ODD_WGRAD[1][1],
                                     ConvWgradProblem(N=2, C=3, H=9, W=10, K=4, R=8, S=8, padding=(4, 3, 3, 4)),
                                     *(p for _, p in STRIDED_WGRAD), *(p for _, p in IN_PLACE_WGRAD)],
                         ids=["3x5_asymmetric", "1x1", "8x8_kriz09_padding", *(n for n, _ in STRIDED_WGRAD),
                              *(n for n, _ in IN_PLACE_WGRAD)])
def test_the_padded_grid_gemm_is_the_weight_gradient(problem):
    """The wgmma weight gradient's formulations (the padded grid, and X unrolled), in NumPy, against
    the direct float64 sum."""
    rng = np.random.default_rng(5)
    p = problem
    x = rng.standard_normal((p.N, p.C, p.H, p.W))
    dy = rng.standard_normal((p.N, p.K, p.P, p.Q))
    (sh, sw), pt, pl = p.stride, p.padding[0], p.padding[1]
    xp = np.zeros((p.N, p.C, pt + p.H + p.R + sh * p.P, pl + p.W + p.S + sw * p.Q))
    xp[:, :, pt:pt + p.H, pl:pl + p.W] = x
    direct = np.zeros((p.K, p.C, p.R, p.S))
    for r in range(p.R):
        for s_ in range(p.S):
            window = xp[:, :, r:r + sh * (p.P - 1) + 1:sh, s_:s_ + sw * (p.Q - 1) + 1:sw]
            direct[:, :, r, s_] = np.einsum("nkpq,ncpq->kc", dy, window)
    if p.stride == (1, 1):
        np.testing.assert_allclose(_padded_grid_wgrad(p, x, dy), direct, rtol=1e-12, atol=1e-11)
    np.testing.assert_allclose(_padded_grid_wgrad(p, x, dy, image_tiles=1), direct, rtol=1e-12, atol=1e-11)
    for splitk in (1, 3):
        np.testing.assert_allclose(_unrolled_wgrad(p, x, dy, splitk), direct, rtol=1e-12, atol=1e-11)


@needs_nvcc
@pytest.mark.parametrize("builds", BUILDS)
def test_every_wgrad_config_builds_for_sm90a_without_spills(tmp_path, builds):
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    problems = (_wgrad_problems()[0], ODD_WGRAD[0], *_fp32([_wgrad_problems()[0]]))
    jobs = [(name, config, WGRAD.plan(problem, config)) for name, problem in problems
            for config in _every_wgrad_config(problem, (1, 8))]
    strided = [p for p in _strided_wgrad_problems() if p[0] in ("odd_wgs_a", "odd_wgs_d", "resnet_s2")]
    jobs += [(name, config, WGRAD.plan(problem, config)) for name, problem in strided
             for config in _every_wgrad_config(problem, (1, 8), inflight=1, image_tiles=(1,))]
    assert sum(1 for _, _, plan in jobs if plan.problem.stride != (1, 1)) > 30
    jobs += [(name, config, WGRAD.plan(problem, config)) for name, problem in problems
             for config in _every_wgrad_config(problem, (8,), inflight=1)]
    assert {c["IMAGE_TILES"] for _, c, _ in jobs} == {0, 1}
    unrolled = [(name, config, WGRAD.plan(problem, config)) for name, problem in (*problems, *strided)
                for config in _unrolled_wgrad_configs(problem, (1, 8))]
    assert len(unrolled) > 100 and {c["X_UNROLLED"] for _, c, _ in unrolled} == {1}
    jobs += unrolled
    in_place = [(name, config, WGRAD.plan(problem, config)) for name, problem in (*IN_PLACE_WGRAD, *strided)
                for config in _in_place_wgrad_configs(problem)
                # pointwise layers: X in place, 8 splits (the rest of their code is the others')
                if config.get("X_IN_PLACE", 1) and (config["SPLITK"] == 8 or "X_IN_PLACE" not in config)]
    assert len(in_place) > 60 and all(c["DY_IN_PLACE"] or c["X_IN_PLACE"] for _, c, _ in in_place)
    assert sum(1 for _, c, _ in in_place if c.get("X_IN_PLACE")) > 20
    jobs += in_place

    failures = target_build_failures(compiler, build_sample(jobs, builds))
    assert len(jobs) > 150 and not failures, "\n".join(failures[:8])


@needs_nvcc
@pytest.mark.parametrize("builds", BUILDS)
def test_every_bwd_data_config_builds_for_sm90a_without_spills(tmp_path, builds):
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    widths = ALL_WIDTHS
    problems = (_bwd_problems()[0], *ODD_BWD, *_fp32([_bwd_problems()[0]]))
    jobs = [(name, config, BWD.plan(problem, config)) for name, problem in problems
            for config in _both_loops(problem, BWD, widths)]
    splits = [(name, config, BWD.plan(problem, config)) for name, problem in problems
              for config in _split_configs(problem, BWD)]

    failures = target_build_failures(compiler, build_sample(jobs + splits, builds))
    assert len(jobs) == sum(len(_both_loops(p, BWD, widths)) for _, p in problems) and not failures, \
        "\n".join(failures[:8])
    assert len(splits) > 40


@needs_nvcc
@pytest.mark.parametrize("builds", BUILDS)
def test_every_config_builds_for_sm90a_without_spills_and_not_for_sm90(tmp_path, builds):
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    problems = (_problems()[0], ODD[0], *_fp32([_problems()[0]]))
    jobs = [(name, config, FWD.plan(problem, config)) for name, problem in problems
            for config in _every_config(problem)]
    pipelined = [(name, config, FWD.plan(problem, config)) for name, problem in problems
                 for config in _every_config(problem, inflight=1)]
    splits = [(name, config, FWD.plan(problem, config)) for name, problem in problems
              for config in _split_configs(problem, FWD)]
    assert len(splits) > 30

    failures = target_build_failures(compiler, build_sample(jobs + pipelined + splits, builds))
    assert len(jobs) == sum(len(_every_config(p)) for _, p in problems) and len(pipelined) >= 30 and not failures, \
        "\n".join(failures[:8])
    # wgmma is not in the portable target: compiling for it must fail, or the suffix would not matter.
    with pytest.raises(CompileError, match="sm_90"):
        compiler.compile(jobs[0][2].source)


@needs_nvcc
def test_the_lookups_resource_check_compiles_for_the_plans_target():
    from autocnn.store.feasibility import ptxas_check

    name, problem = _problems()[0]
    assert ptxas_check(FWD.plan(problem, _default(problem)), H200) == []


def _verify_every_config(op, problems, configs):
    """Every config on each shape through NVRTC, and the default through an nvcc cubin."""
    assert_every_config_verifies(op, FORMULATION_WGMMA, problems, configs, "sm_90", HOPPER)


@pytest.mark.gpu
def test_wgmma_kernels_verify_against_float64():
    _verify_every_config(FWD, _problems(), lambda p: _both_loops(p, FWD) + _split_configs(p, FWD))


@pytest.mark.gpu
def test_wgmma_bwd_data_kernels_verify_against_float64():
    _verify_every_config(BWD, _bwd_problems(), lambda p: _both_loops(p, BWD) + _split_configs(p, BWD))


def _unrolled_wgrad_configs(problem, splits):
    """X unrolled, with either loop, in the widths that bound its copies (16 to 256 columns)."""
    return _both_loops(problem, WGRAD, (64, 128, 256, 16), splits, image_tiles=(0,), x_unrolled=1)


def _in_place_wgrad_configs(problem):
    """dY read in place (where it can be: tf32, Q a multiple of 4), each image's tiles, with either
    loop, 1 and 8 splits; on a pointwise layer X read in place too, with dY in place or staged."""
    from autocnn.kernels.formulations.wgmma import x_in_place_fits

    if problem.precision != "tf32" or problem.Q % 4:
        return []
    out = _both_loops(problem, WGRAD, (64, 128, 256, 16), (1, 8), image_tiles=(1,), dy_in_place=1)
    if x_in_place_fits(problem):
        out += _both_loops(problem, WGRAD, (64, 128, 256, 16), (1, 8), image_tiles=(1,), dy_in_place=1, x_in_place=1)
        out += _every_config(problem, WGRAD, (64, 128), (1, 8), image_tiles=(1,), x_in_place=1)
    return out


def _wgrad_configs_to_verify(problem):
    """Each image's tiles (the default where they pay) in every width and depth with either loop; the
    whole grid's in fewer (its code is the older, verified before the parameter): seed shapes with 1
    and 8 splits, the odd shapes with every split; fp32 (3xTF32) with 8 splits. X unrolled with 1
    and 8 splits (the odd shapes: 1, 2 and 8), on every shape; dY in place where it can be."""
    odd = problem.N * problem.H < 64
    unrolled = _unrolled_wgrad_configs(problem, (1, 2, 8) if odd else (1, 8)) + _in_place_wgrad_configs(problem)
    if problem.stride != (1, 1):   # strided: each image's tiles only
        return [*_both_loops(problem, WGRAD, splits=(1, 8), image_tiles=(1,)), *unrolled]
    if problem.precision == "fp32":
        return [*_both_loops(problem, WGRAD, splits=(8,), image_tiles=(1,)),
                *_every_wgrad_config(problem, (8,), image_tiles=(0,)), *_unrolled_wgrad_configs(problem, (8,))]
    splits = (1, 2, 4, 8, 16, 32) if odd else (1, 8)
    return [*_every_wgrad_config(problem, splits, image_tiles=(1,)),
            *_every_wgrad_config(problem, splits, inflight=1, image_tiles=(1,)),
            *_every_wgrad_config(problem, (1, 8) if odd else (8,), image_tiles=(0,)), *unrolled]


def _wgrad_problems_to_verify():
    return _wgrad_problems() + _fp32(_wgrad_problems()) + _strided_wgrad_problems() + list(IN_PLACE_WGRAD)


@pytest.mark.gpu
@pytest.mark.parametrize("index", range(len(_wgrad_problems_to_verify())),
                         ids=[n.replace(" ", "_") for n, _ in _wgrad_problems_to_verify()])
def test_wgmma_wgrad_kernels_verify_against_float64(index):
    """One problem per test (each compiles and checks up to 160 configs)."""
    _verify_every_config(WGRAD, [_wgrad_problems_to_verify()[index]], _wgrad_configs_to_verify)


@pytest.mark.gpu
def test_wgmma_3xtf32_kernels_meet_the_fp32_bound():
    """fp32 problems (3xTF32) are held to the FP32 bound, the one every fp32 kernel meets."""
    _verify_every_config(FWD, _fp32(_problems()), lambda p: _both_loops(p, FWD) + _split_configs(p, FWD))
    _verify_every_config(BWD, _fp32(_bwd_problems()), lambda p: _both_loops(p, BWD) + _split_configs(p, BWD))


def _nan_reaches_what_the_reference_says(op, problem, config, source, result, seed, at):
    """A canonical NaN planted at index ``at`` of input ``source`` is a NaN in exactly the elements of
    ``result`` where the float64 reference has one."""
    cp = pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import plan_buffers, reference_outputs

    if current_device(0).arch != "sm_90":
        pytest.skip("wgmma needs a Hopper GPU (sm_90)")
    loaded = KernelLoader().load(op.plan(problem, config))
    inputs, outputs, buffers = plan_buffers(loaded, problem, seed=seed)
    flat = inputs[source].reshape(-1)
    flat.view(cp.uint32)[at(flat.size)] = 0x7FFFFFFF   # the canonical NaN
    loaded(buffers)
    cp.cuda.get_current_stream().synchronize()
    expected = reference_outputs(problem, inputs)[result]
    want, got = cp.isnan(expected), cp.isnan(outputs[result])
    assert int(want.sum()) > 0, "the NaN reaches no output of the reference (the test is wrong)"
    assert bool((want == got).all()), f"{int(got.sum())} NaNs where the reference has {int(want.sum())}"


@pytest.mark.gpu
def test_a_nan_in_the_input_is_a_nan_in_every_output_it_reaches():
    name, problem = ODD[0]
    _nan_reaches_what_the_reference_says(FWD, problem, _default(problem), "x", "y", 7, lambda n: n // 3)


@pytest.mark.gpu
def test_a_nan_in_dy_is_a_nan_in_every_input_gradient_it_reaches():
    name, problem = ODD_BWD[0]
    config = BWD.default_config(problem, HOPPER, formulation=FORMULATION_WGMMA)
    _nan_reaches_what_the_reference_says(BWD, problem, config, "dy", "dx", 11, lambda n: n // 2)
