"""The seed shape suite: the layer shapes of the five source documents plus two modern ones.

Tests compile every family on these, the benchmark times them, and the shipped tuning database
holds records for them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autocnn.kernels.problem import PROBLEM_TYPES

CONV_OPS = ("conv_fwd", "conv_bwd_data", "conv_wgrad")
POOL_OPS = ("avgpool_fwd", "avgpool_bwd")


@dataclass(frozen=True)
class SeedShape:
    name: str
    kind: str            # "conv" or "pool"
    geometry: tuple[tuple[str, Any], ...]
    source: str

    def problem(self, op: str) -> Any:
        ops = CONV_OPS if self.kind == "conv" else POOL_OPS
        if op not in ops:
            raise ValueError(f"{self.name} is a {self.kind} shape; {op} is not one of {', '.join(ops)}")
        return PROBLEM_TYPES[op](**dict(self.geometry))


def _conv(name: str, source: str, N: int, C: int, H: int, W: int, K: int, R: int, S: int,
          stride: int, pad: tuple[int, int, int, int]) -> SeedShape:
    geo = (("N", N), ("C", C), ("H", H), ("W", W), ("K", K), ("R", R), ("S", S),
           ("stride", (stride, stride)), ("padding", pad))
    return SeedShape(name, "conv", geo, source)


def _pool(name: str, source: str, N: int, C: int, H: int, W: int, window: int, stride: int,
          pad: tuple[int, int, int, int], count_pad: bool) -> SeedShape:
    geo = (("N", N), ("C", C), ("H", H), ("W", W), ("window", (window, window)),
           ("stride", (stride, stride)), ("padding", pad), ("count_pad", count_pad))
    return SeedShape(name, "pool", geo, source)


SEED_SHAPES: tuple[SeedShape, ...] = (
    _conv("kriz09", "Krizhevsky 2009", 128, 3, 32, 32, 64, 8, 8, 1, (4, 4, 3, 3)),
    _conv("scherer10_l1", "Scherer et al. 2010", 60, 4, 256, 256, 16, 8, 8, 2, (3, 3, 3, 3)),
    _conv("scherer10_l2", "Scherer et al. 2010", 60, 16, 128, 128, 64, 8, 8, 2, (3, 3, 3, 3)),
    _conv("scherer10_l3", "Scherer et al. 2010", 60, 64, 64, 64, 64, 8, 8, 2, (3, 3, 3, 3)),
    _conv("convnet18_c1", "cuda-convnet layers-18pct", 128, 3, 32, 32, 32, 5, 5, 1, (2, 2, 2, 2)),
    _conv("convnet18_c2", "cuda-convnet layers-18pct", 128, 32, 16, 16, 32, 5, 5, 1, (2, 2, 2, 2)),
    _conv("convnet18_c3", "cuda-convnet layers-18pct", 128, 32, 8, 8, 64, 5, 5, 1, (2, 2, 2, 2)),
    _conv("sweep_3x3", "filter sweep", 128, 64, 32, 32, 64, 3, 3, 1, (1, 1, 1, 1)),
    _conv("sweep_7x7", "filter sweep", 128, 64, 32, 32, 64, 7, 7, 1, (3, 3, 3, 3)),
    _conv("sweep_11x11", "filter sweep", 128, 64, 32, 32, 64, 11, 11, 1, (5, 5, 5, 5)),
    _conv("chellapilla06_c1", "Chellapilla et al. 2006", 128, 1, 29, 29, 5, 5, 5, 2, (0, 0, 0, 0)),
    _conv("chellapilla06_c2", "Chellapilla et al. 2006", 128, 5, 13, 13, 50, 5, 5, 2, (0, 0, 0, 0)),
    _conv("modern_56", "modern 3x3", 64, 64, 56, 56, 64, 3, 3, 1, (1, 1, 1, 1)),
    _conv("modern_14", "modern 3x3", 64, 256, 14, 14, 256, 3, 3, 1, (1, 1, 1, 1)),
    _pool("kriz09_pool", "Krizhevsky 2009", 128, 64, 32, 32, 4, 4, (0, 0, 0, 0), True),
    _pool("convnet18_pool", "cuda-convnet layers-18pct", 128, 32, 32, 32, 3, 2, (1, 1, 1, 1), False),
    _pool("modern_pool", "modern 2x2", 64, 256, 56, 56, 2, 2, (0, 0, 0, 0), True),
)


# Layers that the project's targets name and the seed suite lacks (today's pointwise 1x1 layers, stride 1 and
# the strided projection): benchmarked by name (`autocnn bench --shapes pointwise_s1,pointwise_s2`),
# never counted in the seed suite's geometric means.
TARGET_SHAPES: tuple[SeedShape, ...] = (
    _conv("pointwise_s1", "today's pointwise layers", 64, 256, 28, 28, 512, 1, 1, 1, (0, 0, 0, 0)),
    _conv("pointwise_s2", "today's pointwise layers", 64, 256, 28, 28, 512, 1, 1, 2, (0, 0, 0, 0)),
)



def _grouped(name: str, source: str, C: int, H: int, R: int, stride: int, groups: int) -> SeedShape:
    """A grouped (or depthwise: groups == C) layer of a named suite: C -> C channels, batch 64,
    square, padded to keep the size at stride 1."""
    pad = R // 2
    geo = (("N", 64), ("C", C), ("H", H), ("W", H), ("K", C), ("R", R), ("S", R), ("stride", (stride, stride)),
           ("padding", (pad, pad, pad, pad)), ("groups", groups))
    return SeedShape(name, "conv", geo, source)


# ResNeXt-50 32x4d's grouped 3x3 convolutions (torchvision's resnext50_32x4d: 32 groups, a stage's width
# 128/256/512/1024 at 56/28/14/7; the first block of stages 2-4 has the stride 2 at its 3x3, reading the
# previous stage's map), batch 64.
GROUPED_SHAPES: tuple[SeedShape, ...] = tuple(
    _grouped(name, "ResNeXt-50 32x4d", c, h, 3, stride, 32) for name, c, h, stride in (
        ("resnext_128_56", 128, 56, 1),
        ("resnext_256_56_s2", 256, 56, 2),
        ("resnext_256_28", 256, 28, 1),
        ("resnext_512_28_s2", 512, 28, 2),
        ("resnext_512_14", 512, 14, 1),
        ("resnext_1024_14_s2", 1024, 14, 2),
        ("resnext_1024_7", 1024, 7, 1),
    ))

# Depthwise layers, batch 64: MobileNetV2's 3x3 ones at stride 1 and 2 (torchvision's mobilenet_v2: the
# expanded channels of a block at its input's size), ConvNeXt-T's 7x7 ones at 56/28/14/7 and
# RepLKNet-31B's 31x31 and 13x13 ones at 56/28/14.
DEPTHWISE_SHAPES: tuple[SeedShape, ...] = tuple(
    _grouped(name, source, c, h, r, stride, c) for name, source, c, h, r, stride in (
        ("mobilenet_32_112", "MobileNetV2", 32, 112, 3, 1),
        ("mobilenet_96_112_s2", "MobileNetV2", 96, 112, 3, 2),
        ("mobilenet_144_56", "MobileNetV2", 144, 56, 3, 1),
        ("mobilenet_144_56_s2", "MobileNetV2", 144, 56, 3, 2),
        ("mobilenet_192_28", "MobileNetV2", 192, 28, 3, 1),
        ("mobilenet_192_28_s2", "MobileNetV2", 192, 28, 3, 2),
        ("mobilenet_384_14", "MobileNetV2", 384, 14, 3, 1),
        ("mobilenet_576_14_s2", "MobileNetV2", 576, 14, 3, 2),
        ("convnext_96_56", "ConvNeXt-T", 96, 56, 7, 1),
        ("convnext_192_28", "ConvNeXt-T", 192, 28, 7, 1),
        ("convnext_384_14", "ConvNeXt-T", 384, 14, 7, 1),
        ("convnext_768_7", "ConvNeXt-T", 768, 7, 7, 1),
        ("replknet31_128_56", "RepLKNet-31B", 128, 56, 31, 1),
        ("replknet31_256_28", "RepLKNet-31B", 256, 28, 31, 1),
        ("replknet31_512_14", "RepLKNet-31B", 512, 14, 31, 1),
        ("replknet13_128_56", "RepLKNet-31B", 128, 56, 13, 1),
        ("replknet13_256_28", "RepLKNet-31B", 256, 28, 13, 1),
        ("replknet13_512_14", "RepLKNet-31B", 512, 14, 13, 1),
    ))

# torchvision's ResNet-50 (v1.5: the stride at the 3x3 of a stage's first block) on 224x224 images, its
# distinct convolutions at batch 64: the 7x7 stem, each stage's 1x1 reduce and expand and 3x3, the
# strided 3x3 and 1x1 downsampling of stages 2-4 (a 1x1 whose shape another layer already has, as
# stage 1's downsampling has the expand's, is listed once).
def _resnet50(name: str, C: int, K: int, H: int, R: int, stride: int) -> SeedShape:
    pad = R // 2
    return _conv(name, "ResNet-50", 64, C, H, H, K, R, R, stride, (pad, pad, pad, pad))


RESNET50_SHAPES: tuple[SeedShape, ...] = (
    _resnet50("resnet50_stem", 3, 64, 224, 7, 2),
    _resnet50("resnet50_1x1_64_64_56", 64, 64, 56, 1, 1),
    _resnet50("resnet50_3x3_64_56", 64, 64, 56, 3, 1),
    _resnet50("resnet50_1x1_64_256_56", 64, 256, 56, 1, 1),
    _resnet50("resnet50_1x1_256_64_56", 256, 64, 56, 1, 1),
    _resnet50("resnet50_1x1_256_128_56", 256, 128, 56, 1, 1),
    _resnet50("resnet50_3x3_128_56_s2", 128, 128, 56, 3, 2),
    _resnet50("resnet50_1x1_128_512_28", 128, 512, 28, 1, 1),
    _resnet50("resnet50_down_256_512_56_s2", 256, 512, 56, 1, 2),
    _resnet50("resnet50_1x1_512_128_28", 512, 128, 28, 1, 1),
    _resnet50("resnet50_3x3_128_28", 128, 128, 28, 3, 1),
    _resnet50("resnet50_1x1_512_256_28", 512, 256, 28, 1, 1),
    _resnet50("resnet50_3x3_256_28_s2", 256, 256, 28, 3, 2),
    _resnet50("resnet50_1x1_256_1024_14", 256, 1024, 14, 1, 1),
    _resnet50("resnet50_down_512_1024_28_s2", 512, 1024, 28, 1, 2),
    _resnet50("resnet50_1x1_1024_256_14", 1024, 256, 14, 1, 1),
    _resnet50("resnet50_3x3_256_14", 256, 256, 14, 3, 1),
    _resnet50("resnet50_1x1_1024_512_14", 1024, 512, 14, 1, 1),
    _resnet50("resnet50_3x3_512_14_s2", 512, 512, 14, 3, 2),
    _resnet50("resnet50_1x1_512_2048_7", 512, 2048, 7, 1, 1),
    _resnet50("resnet50_down_1024_2048_14_s2", 1024, 2048, 14, 1, 2),
    _resnet50("resnet50_1x1_2048_512_7", 2048, 512, 7, 1, 1),
    _resnet50("resnet50_3x3_512_7", 512, 512, 7, 3, 1),
)

# Shapes that divide nothing evenly: odd sizes, K not a multiple of 8, batch 1 and 3, non-square
# images and filters, asymmetric padding, stride 3, strides larger than the filter, 1x1 filters.
ODD_SHAPES: tuple[SeedShape, ...] = (
    SeedShape("odd_a", "conv", (("N", 3), ("C", 5), ("H", 13), ("W", 11), ("K", 7), ("R", 3), ("S", 5),
                                ("stride", (1, 1)), ("padding", (1, 2, 1, 2))), "odd"),
    SeedShape("odd_b", "conv", (("N", 1), ("C", 3), ("H", 17), ("W", 23), ("K", 13), ("R", 5), ("S", 5),
                                ("stride", (3, 3)), ("padding", (2, 1, 0, 2))), "odd"),
    SeedShape("odd_c", "conv", (("N", 3), ("C", 7), ("H", 9), ("W", 31), ("K", 10), ("R", 4), ("S", 3),
                                ("stride", (2, 1)), ("padding", (3, 0, 1, 2))), "odd"),
    SeedShape("odd_d", "conv", (("N", 2), ("C", 1), ("H", 15), ("W", 15), ("K", 9), ("R", 7), ("S", 7),
                                ("stride", (2, 2)), ("padding", (3, 3, 2, 2))), "odd"),
    SeedShape("odd_e", "conv", (("N", 5), ("C", 17), ("H", 6), ("W", 10), ("K", 3), ("R", 2), ("S", 2),
                                ("stride", (3, 3)), ("padding", (0, 0, 0, 0))), "odd"),
    SeedShape("odd_f", "conv", (("N", 1), ("C", 9), ("H", 33), ("W", 7), ("K", 15), ("R", 1), ("S", 1),
                                ("stride", (1, 1)), ("padding", (0, 0, 0, 0))), "odd"),
    _pool("odd_pool_a", "odd", 3, 5, 13, 11, 3, 2, (1, 1, 1, 1), False),
    SeedShape("odd_pool_b", "pool", (("N", 1), ("C", 7), ("H", 9), ("W", 17), ("window", (2, 3)),
                                     ("stride", (3, 3)), ("padding", (0, 0, 0, 0)), ("count_pad", True)), "odd"),
    _pool("odd_pool_c", "odd", 3, 3, 31, 29, 4, 4, (1, 2, 1, 1), False),
    _pool("odd_pool_d", "odd", 2, 10, 7, 7, 7, 1, (0, 0, 0, 0), True),
    _pool("odd_pool_e", "odd", 5, 4, 16, 20, 2, 1, (0, 0, 0, 0), True),
    SeedShape("odd_pool_f", "pool", (("N", 1), ("C", 1), ("H", 5), ("W", 4), ("window", (5, 4)),
                                     ("stride", (1, 1)), ("padding", (4, 3, 0, 0)), ("count_pad", False)), "odd"),
)


def _registered_suite(op: str, which: str) -> list[tuple[str, Any]]:
    """An operation registered after the first five keeps its suite beside its problem type: its
    module's seed_problems / odd_problems (e.g. kernels.conv_pool's: the zoo's conv+pool pairs)."""
    import sys

    from autocnn.kernels.problem import problem_type

    from autocnn.errors import InvalidProblemError
    from autocnn.kernels.problem import ConvProblem

    cls = problem_type(op)
    module = sys.modules[cls.__module__]
    fn = getattr(module, which, None)
    if fn is not None:
        return fn(op)
    if not issubclass(cls, ConvProblem):
        raise ValueError(f"{op} has no {which.replace('_', ' ')} ({module.__name__} defines none)")
    # A convolution problem type with the same geometry (e.g. conv_bwd_fused): the convolution
    # shapes it accepts (a stride-1-only type leaves out the strided ones).
    out = []
    for shape in (SEED_SHAPES if which == "seed_problems" else ODD_SHAPES):
        if shape.kind == "conv":
            try:
                out.append((shape.name, cls(**dict(shape.geometry))))
            except InvalidProblemError:
                continue
    return out


# Depthwise, grouped and dilated shapes that divide nothing evenly (a channel multiplier, dilation
# with stride, a 31x31 filter on a 20x20 map, groups of several channels): the formulations of
# channel groups are tested on these, apart from ODD_SHAPES, which every dense formulation is.
GROUPED_ODD_SHAPES: tuple[SeedShape, ...] = tuple(
    SeedShape(name, "conv", tuple(geometry.items()), "odd grouped") for name, geometry in (
        ("odd_dw_3x3", dict(N=3, C=5, H=13, W=11, K=5, R=3, S=3, stride=(1, 1), padding=(1, 1, 1, 1), groups=5)),
        ("odd_dw_d2_s3", dict(N=2, C=7, H=17, W=19, K=7, R=3, S=3, stride=(3, 3), padding=(2, 1, 2, 2), groups=7,
                              dilation=(2, 2))),
        ("odd_dw_mult", dict(N=2, C=3, H=9, W=14, K=6, R=5, S=3, stride=(2, 1), padding=(2, 1, 1, 1), groups=3,
                             dilation=(1, 2))),
        ("odd_dw_31x31", dict(N=1, C=3, H=20, W=20, K=3, R=31, S=31, stride=(1, 1), padding=(15, 15, 15, 15),
                              groups=3)),
        # Grouped (channels per group > 1) and dilated: 15 channels in 3 groups of 5 and 9 filters,
        # dilation 2 with stride 3; 12 channels in 4 groups of 3 at stride 1; dilation alone (3 by 2)
        # with stride 2, groups = 1; 48 channels in 3 groups of 16.
        ("odd_g3_d2_s3", dict(N=3, C=15, H=23, W=19, K=9, R=3, S=3, stride=(3, 3), padding=(2, 1, 2, 2), groups=3,
                              dilation=(2, 2))),
        ("odd_g4_3x3", dict(N=2, C=12, H=11, W=13, K=20, R=3, S=3, stride=(1, 1), padding=(1, 1, 1, 1), groups=4)),
        ("odd_d3x2_s2", dict(N=2, C=6, H=17, W=15, K=10, R=3, S=2, stride=(2, 2), padding=(3, 1, 2, 1),
                             dilation=(3, 2))),
        # Groups of 16 channels (a 16-bit mma's k-step: the tensor cores' grouped GEMMs), 7 filters each.
        ("odd_g3_c16", dict(N=2, C=48, H=11, W=13, K=21, R=3, S=3, stride=(2, 1), padding=(1, 2, 1, 1), groups=3,
                            dilation=(1, 2))),
    ))


# Channels-last (NHWC) shapes that divide nothing evenly, for the formulations that serve that layout
# (window_gather, depthwise, direct): channel counts that no vector width divides (C=5, K=7) beside
# ones that 8 divides (whole vector runs), stride 2, asymmetric padding, odd batches; depthwise with
# dilation and with a channel multiplier.
NHWC_ODD_SHAPES: tuple[SeedShape, ...] = tuple(
    SeedShape(name, kind, (*geometry.items(), ("layout", "nhwc")), "odd nhwc") for name, kind, geometry in (
        ("odd_nhwc", "conv", dict(N=3, C=5, H=13, W=13, K=7, R=3, S=3, stride=(2, 2), padding=(1, 0, 2, 1))),
        ("odd_nhwc_runs", "conv", dict(N=2, C=16, H=9, W=11, K=24, R=3, S=3, stride=(1, 1), padding=(1, 1, 1, 1))),
        ("odd_nhwc_dw_d2", "conv", dict(N=3, C=6, H=13, W=13, K=6, R=7, S=7, stride=(1, 1), padding=(6, 5, 6, 6),
                                    groups=6, dilation=(2, 2))),
        ("odd_nhwc_dw_mult", "conv", dict(N=2, C=8, H=9, W=10, K=16, R=3, S=3, stride=(2, 2), padding=(1, 1, 0, 1),
                                      groups=8)),
        ("odd_nhwc_pool", "pool", dict(N=3, C=5, H=13, W=11, window=(3, 3), stride=(2, 2), padding=(1, 0, 0, 1),
                                       count_pad=False)),
        ("odd_nhwc_pool_runs", "pool", dict(N=2, C=24, H=9, W=9, window=(2, 2), stride=(2, 2), padding=(0, 0, 0, 0))),
    ))


def nhwc_odd_problems(op: str) -> list[tuple[str, Any]]:
    """NHWC_ODD_SHAPES as problems of one of the five operations (none for the others)."""
    if op not in CONV_OPS + POOL_OPS:
        return []
    kind = "conv" if op in CONV_OPS else "pool"
    return [(s.name, s.problem(op)) for s in NHWC_ODD_SHAPES if s.kind == kind]


def grouped_odd_problems(op: str) -> list[tuple[str, Any]]:
    """GROUPED_ODD_SHAPES as problems of a convolution op (none for the others)."""
    return [(s.name, s.problem(op)) for s in GROUPED_ODD_SHAPES] if op in CONV_OPS else []


def odd_problems(op: str) -> list[tuple[str, Any]]:
    if op not in CONV_OPS + POOL_OPS:
        return _registered_suite(op, "odd_problems")
    kind = "conv" if op in CONV_OPS else "pool"
    return [(s.name, s.problem(op)) for s in ODD_SHAPES if s.kind == kind]


def seed_shapes(kind: str | None = None) -> list[SeedShape]:
    return [s for s in SEED_SHAPES if kind is None or s.kind == kind]


def seed_problems(op: str) -> list[tuple[str, Any]]:
    if op not in CONV_OPS + POOL_OPS:
        return _registered_suite(op, "seed_problems")
    kind = "conv" if op in CONV_OPS else "pool"
    return [(s.name, s.problem(op)) for s in seed_shapes(kind)]


def target_problems(op: str) -> list[tuple[str, Any]]:
    """TARGET_SHAPES as problems of a convolution op (none for the others)."""
    return [(s.name, s.problem(op)) for s in TARGET_SHAPES] if op in CONV_OPS else []


# The suites a command names (autocnn tune --suite, autocnn bench --suite): the seed suite, and the
# grouped, depthwise and ResNet-50 layers (convolutions only).
SUITES = ("seed", "grouped", "depthwise", "resnet50")
_SUITE_SHAPES = {"grouped": GROUPED_SHAPES, "depthwise": DEPTHWISE_SHAPES, "resnet50": RESNET50_SHAPES}


def suite_problems(suite: str, op: str) -> list[tuple[str, Any]]:
    """A named suite's problems of op (none where the suite has no such layer: pooling in grouped)."""
    if suite == "seed":
        return seed_problems(op)
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; choose from {', '.join(SUITES)}")
    if op not in CONV_OPS:
        return []
    return [(s.name, s.problem(op)) for s in _SUITE_SHAPES[suite]]


def named_problems(op: str) -> list[tuple[str, Any]]:
    """Every problem of op that a command may name: the seed suite's rows, the target layers', then
    the other suites'."""
    return [*seed_problems(op), *target_problems(op),
            *(p for suite in _SUITE_SHAPES for p in suite_problems(suite, op))]


def seed_shape(name: str) -> SeedShape:
    for s in SEED_SHAPES:
        if s.name == name:
            return s
    raise KeyError(f"no seed shape {name!r}; known: {', '.join(s.name for s in SEED_SHAPES)}")
