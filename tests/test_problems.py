"""Problem construction: every bad shape raises an error naming the field, the value and what is allowed."""
from __future__ import annotations

import pytest

from autocnn.errors import FailureClass, InvalidProblemError
from autocnn.kernels import (AvgPoolBwdProblem, AvgPoolFwdProblem, ConvBwdDataProblem, ConvFwdProblem,
                         ConvWgradProblem, parse_shape, problem_from_dict)
from autocnn.kernels.suite import SEED_SHAPES, seed_problems

GOOD = dict(N=2, C=3, H=7, W=9, K=5, R=3, S=2, stride=(2, 1), padding=(1, 0, 2, 1))


def test_output_size_follows_the_formula():
    p = ConvFwdProblem(**GOOD)
    assert p.P == (7 + 1 + 2 - 3) // 2 + 1 == 4
    assert p.Q == (9 + 0 + 1 - 2) // 1 + 1 == 9
    assert p.y_shape == (2, 5, 4, 9)


def test_kriz09_asymmetric_padding_gives_32x32():
    p = parse_shape("conv_fwd", "N=128,C=3,H=32,W=32,K=64,R=8,S=8,stride=1,pad=4,4,3,3")
    assert p.padding == (4, 4, 3, 3) and (p.P, p.Q) == (32, 32)


@pytest.mark.parametrize("field,value,allowed", [
    ("N", 0, ">= 1"), ("C", -1, ">= 1"), ("K", 2.0, "integer"), ("R", True, "integer"),
    ("H", "7", "integer"), ("stride", (0, 1), ">= 1"), ("stride", (1, 2, 3), "two"),
    ("padding", (3, 0, 0, 0), "smaller than the filter height"),
    ("padding", (0, 2, 0, 0), "smaller than the filter width"),
    ("padding", (-1, 0, 0, 0), ">= 0"), ("padding", (1, 1, 1), "four"),
    ("dtype", "float16", "float32"),
])
def test_invalid_conv_fields_name_field_value_and_rule(field, value, allowed):
    kwargs = dict(GOOD)
    kwargs[field] = value
    with pytest.raises(InvalidProblemError) as err:
        ConvFwdProblem(**kwargs)
    assert err.value.field == field
    assert err.value.failure_class is FailureClass.INVALID_PROBLEM
    assert field in str(err.value) and allowed in str(err.value)


def test_empty_output_is_rejected():
    with pytest.raises(InvalidProblemError, match="R"):
        ConvFwdProblem(N=1, C=1, H=2, W=8, K=1, R=5, S=1, padding=(1, 0, 1, 0))


def test_index_overflow_is_rejected():
    with pytest.raises(InvalidProblemError, match="32-bit"):
        ConvFwdProblem(N=4096, C=512, H=64, W=64, K=64, R=3, S=3, padding=1)


def test_epilogue_fields_are_validated():
    with pytest.raises(InvalidProblemError, match="activation"):
        ConvFwdProblem(**GOOD, activation="gelu")
    with pytest.raises(InvalidProblemError, match="bias"):
        ConvFwdProblem(**GOOD, bias=1)
    with pytest.raises(InvalidProblemError, match="bias"):
        ConvWgradProblem(**GOOD, bias="yes")


@pytest.mark.parametrize("kwargs,field", [
    (dict(window=(0, 2)), "window"), (dict(window=(3, 3), padding=(3, 0, 0, 0)), "padding"),
    (dict(window=(9, 2)), "window"), (dict(count_pad=0), "count_pad"), (dict(stride=(1, -1)), "stride"),
])
def test_invalid_pool_fields(kwargs, field):
    with pytest.raises(InvalidProblemError) as err:
        AvgPoolFwdProblem(N=2, C=3, H=8, W=6, **kwargs)
    assert err.value.field == field


def test_pool_stride_defaults_to_window_and_overlap_is_allowed():
    p = AvgPoolFwdProblem(N=1, C=1, H=32, W=32, window=3, stride=2, padding=1, count_pad=False)
    assert p.stride == (2, 2) and (p.P, p.Q) == (16, 16)
    assert AvgPoolBwdProblem(N=1, C=1, H=8, W=8, window=4).stride == (4, 4)


@pytest.mark.parametrize("op", ["conv_fwd", "conv_bwd_data", "conv_wgrad", "avgpool_fwd", "avgpool_bwd"])
def test_dict_and_shape_string_round_trip(op):
    for _, p in seed_problems(op):
        assert problem_from_dict(p.to_dict()) == p
        assert parse_shape(op, p.shape_string()) == p


def test_parse_shape_errors_are_actionable():
    with pytest.raises(InvalidProblemError, match="missing"):
        parse_shape("conv_fwd", "N=1,C=1,H=4,W=4,K=1,R=3")
    with pytest.raises(InvalidProblemError, match="fields are"):
        parse_shape("conv_fwd", "N=1,C=1,H=4,W=4,K=1,R=3,S=3,dilatation=2")
    with pytest.raises(InvalidProblemError, match="integers"):
        parse_shape("conv_fwd", "N=1,C=x,H=4,W=4,K=1,R=3,S=3")
    with pytest.raises(InvalidProblemError, match="op"):
        parse_shape("conv_fwdd", "N=1")
    with pytest.raises(InvalidProblemError, match="each field once"):
        parse_shape("conv_fwd", "N=1,N=2")


def test_problem_from_dict_rejects_foreign_data():
    with pytest.raises(InvalidProblemError):
        problem_from_dict({"N": 1})
    with pytest.raises(InvalidProblemError, match="fields are"):
        problem_from_dict({**ConvBwdDataProblem(**GOOD).to_dict(), "evil": "x"})


def test_seed_suite_is_complete():
    names = {s.name for s in SEED_SHAPES}
    for required in ("kriz09", "scherer10_l1", "scherer10_l2", "scherer10_l3", "convnet18_c1",
                     "convnet18_c2", "convnet18_c3", "sweep_3x3", "sweep_7x7", "sweep_11x11",
                     "chellapilla06_c1", "chellapilla06_c2", "modern_56", "modern_14",
                     "kriz09_pool", "convnet18_pool", "modern_pool"):
        assert required in names
    assert {p.op for _, p in seed_problems("conv_wgrad")} == {"conv_wgrad"}


# -- operations beyond the first five register their problem types ----------------------------------

def test_register_problem_type_refuses_a_type_without_a_reference():
    from dataclasses import dataclass
    from typing import ClassVar

    from autocnn.kernels.problem import register_problem_type

    @dataclass(frozen=True)
    class NoReference:
        N: int
        op: ClassVar[str] = "test_no_reference"

    with pytest.raises(ValueError, match="lacks the ReferenceProblem methods"):
        register_problem_type(NoReference)


def test_register_problem_type_refuses_a_taken_op_name():
    from autocnn.kernels.problem import ConvFwdProblem, register_problem_type

    class Impostor(ConvFwdProblem):
        def input_shapes(self): return {}
        def output_shapes(self): return {}
        def reference(self, inputs): return {}
        def reduction_length(self, name): return 1

    with pytest.raises(ValueError, match="registered already"):
        register_problem_type(Impostor)


def test_a_registered_problem_type_is_known_to_the_reference_and_the_parser(request):
    from dataclasses import dataclass
    from typing import ClassVar

    import numpy as np

    from autocnn.kernels import problem as problem_module
    from autocnn.kernels import problem_registry, reference

    # The registry is one dict that every module reading it holds (problem_registry's, re-exported):
    # the test's type leaves it again, so that no later test meets an operation it registered.
    request.addfinalizer(lambda: problem_registry.PROBLEM_TYPES.pop("test_doubling", None))

    @dataclass(frozen=True)
    class Doubling:
        N: int
        op: ClassVar[str] = "test_doubling"

        def input_shapes(self): return {"x": (self.N,)}
        def output_shapes(self): return {"y": (self.N,)}
        def reference(self, inputs): return {"y": 2 * inputs["x"]}
        def reduction_length(self, name): return 1

    problem_module.register_problem_type(Doubling)
    p = problem_module.parse_shape("test_doubling", "N=3")
    assert p == Doubling(3)
    assert problem_module.problem_from_dict({"op": "test_doubling", "N": 3}) == p
    out = reference.run_problem(p, {"x": np.arange(3.0)})
    np.testing.assert_array_equal(out["y"], [0.0, 2.0, 4.0])
    assert reference.output_shapes(p) == {"y": (3,)}
    assert reference.reduction_length(p, "y") == 1


def test_fused_and_separable_problems_round_trip_through_their_shape_strings():
    """Every field kind of the later ops reads back: conv_pool_fwd's pool_window/pool_stride/
    pool_padding tuples and keep_activation flag (``autocnn db list`` parses record shapes)."""
    from autocnn.kernels.conv_bwd_fused import ConvBwdFusedProblem
    from autocnn.kernels.conv_pool_problems import ConvPoolDzProblem, ConvPoolFwdProblem
    from autocnn.kernels.problem import problem_type

    problems = [
        ConvPoolFwdProblem(N=3, C=5, H=11, W=9, K=7, R=3, S=2, padding=(1, 0, 1, 1), bias=True, activation="relu",
                           pool_window=(3, 2), pool_stride=(2, 1), pool_padding=(1, 0, 1, 0), count_pad=False,
                           keep_activation=True),
        ConvPoolFwdProblem(N=2, C=1, H=8, W=8, K=4, R=5, S=5, padding=2, pool_window=(2, 2)),
        ConvPoolDzProblem(N=2, C=4, H=9, W=7, window=(3, 3), stride=(2, 2), padding=(1, 1, 1, 1), count_pad=False,
                          activation="tanh"),
        ConvBwdFusedProblem(N=2, C=3, H=9, W=10, K=4, R=3, S=3, stride=2, padding=1, bias=True),
        problem_type("sep_conv_fwd")(N=2, C=3, H=9, W=10, K=4, R=3, S=5, padding=(1, 2, 1, 2), rank=2,
                                     activation="relu", bias=True),
    ]
    for p in problems:
        assert parse_shape(p.op, p.shape_string()) == p, p.shape_string()
        assert problem_from_dict(p.to_dict()) == p
