"""The named suites that `autocnn tune --suite` and `autocnn bench --suite` run: seed, grouped
(ResNeXt-50 32x4d's grouped 3x3 layers), depthwise (MobileNetV2's, ConvNeXt-T's and RepLKNet-31B's
depthwise layers) and resnet50 (ResNet-50's distinct convolutions), each at batch 64."""
from __future__ import annotations

import pytest

from autocnn.benchmark.kernels import BenchSettings, plan
from autocnn.cli import build_parser
from autocnn.cli.tune import _tune_problems
from autocnn.kernels.suite import CONV_OPS, SUITES, seed_problems, suite_problems
from autocnn.precision import DEFAULT_PRECISION


def test_the_grouped_suite_is_resnext50_32x4ds_grouped_3x3_layers():
    problems = dict(suite_problems("grouped", "conv_fwd"))
    assert len(problems) == 7
    for p in problems.values():
        assert (p.N, p.groups, p.R, p.S, p.K, p.padding) == (64, 32, 3, 3, p.C, (1, 1, 1, 1))
        assert p.C // p.groups in (4, 8, 16, 32)   # 4 channels a group per 128 of width (32x4d)
    # Stride 2 in the first block of stages 2-4, on the previous stage's map.
    strided = {(p.C, p.H, p.P) for p in problems.values() if p.stride == (2, 2)}
    assert strided == {(256, 56, 28), (512, 28, 14), (1024, 14, 7)}
    assert {(p.C, p.H) for p in problems.values() if p.stride == (1, 1)} == {(128, 56), (256, 28), (512, 14),
                                                                            (1024, 7)}


def test_the_depthwise_suite_holds_the_issues_layers():
    problems = dict(suite_problems("depthwise", "conv_wgrad"))
    assert all(p.depthwise and p.N == 64 and p.P == -(-p.H // p.stride[0]) for p in problems.values())
    by_filter = {}
    for p in problems.values():
        by_filter.setdefault(p.R, set()).add((p.H, p.stride[0]))
    assert by_filter[3] >= {(112, 1), (112, 2), (56, 1), (56, 2), (28, 1), (28, 2), (14, 1), (14, 2)}
    assert by_filter[7] == {(56, 1), (28, 1), (14, 1), (7, 1)}
    assert by_filter[31] == by_filter[13] == {(56, 1), (28, 1), (14, 1)}


def _resnet50_layers() -> set[tuple[int, int, int, int, int]]:
    """(C, K, H, R, stride) of every convolution of ResNet-50 v1.5 on 224x224 images, walked block by
    block: 3, 4, 6, 3 bottlenecks of widths 64-512 (expanded 4x), the stride at a stage's first 3x3
    (stages 2-4) and a strided 1x1 downsampling beside it."""
    layers = {(3, 64, 224, 7, 2)}
    c, h = 64, 56
    for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            layers |= {(c, width, h, 1, 1), (width, width, h, 3, stride)}
            if block == 0:
                layers.add((c, 4 * width, h, 1, stride))   # the downsampling of the identity path
            h //= stride
            layers.add((width, 4 * width, h, 1, 1))
            c = 4 * width
    return layers


def test_the_resnet50_suite_is_resnet50s_distinct_convolutions():
    problems = [p for _, p in suite_problems("resnet50", "conv_fwd")]
    assert {(p.C, p.K, p.H, p.R, p.stride[0]) for p in problems} == _resnet50_layers()
    assert len(problems) == len(_resnet50_layers())   # each once
    assert all(p.N == 64 and p.padding == (p.R // 2,) * 4 and p.P == -(-p.H // p.stride[0]) for p in problems)


def test_suites_have_convolutions_only_except_seed_and_an_unknown_one_is_refused():
    assert SUITES == ("seed", "grouped", "depthwise", "resnet50")
    assert suite_problems("seed", "conv_fwd") == seed_problems("conv_fwd")
    assert suite_problems("grouped", "avgpool_fwd") == []
    with pytest.raises(ValueError, match="unknown suite 'resnext'; choose from seed, grouped, depthwise, resnet50"):
        suite_problems("resnext", "conv_fwd")


@pytest.mark.parametrize("suite", ["grouped", "depthwise"])
def test_tune_and_bench_run_a_named_suite(suite):
    args = build_parser().parse_args(["tune", "--suite", suite, "--ops", ",".join(CONV_OPS)])
    problems = _tune_problems(args, DEFAULT_PRECISION, None, None)
    expected = [p for op in CONV_OPS for _, p in suite_problems(suite, op)]
    assert problems == expected and all(p.groups > 1 for p in problems)
    work = plan(BenchSettings(suite=suite, precision="fp32"))
    assert [(op, name) for op, name, _ in work.problems] == [(op, name) for op in CONV_OPS
                                                            for name, _ in suite_problems(suite, op)]
    # A shape of a suite may also be named alone.
    one = plan(BenchSettings(ops="conv_fwd", shapes=suite_problems(suite, "conv_fwd")[0][0], precision="fp32"))
    assert len(one.problems) == 1


def test_bench_refuses_an_unknown_suite_before_any_gpu_work():
    with pytest.raises(ValueError, match="--suite: unknown suite 'resnext'"):
        plan(BenchSettings(suite="resnext"))
