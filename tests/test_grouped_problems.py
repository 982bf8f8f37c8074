"""Grouped and dilated convolution problems: validation, the command line's shape syntax, labels,
record keys (a field at its default leaves them as they were) and the lookup's distance."""
from __future__ import annotations

import dataclasses
import math

import pytest

from autocnn.errors import InvalidProblemError
from autocnn.kernels.conv_bwd_fused import ConvBwdFusedProblem
from autocnn.kernels.conv_pool_problems import ConvPoolFwdProblem
from autocnn.kernels.problem import (ConvBwdDataProblem, ConvFwdProblem, ConvWgradProblem, parse_shape,
                                     problem_from_dict)
from autocnn.store.lookup import grouping_class, shape_distance

BASE = dict(N=2, C=12, H=9, W=9, K=12, R=3, S=3, padding=1)


@pytest.mark.parametrize("cls", [ConvFwdProblem, ConvBwdDataProblem, ConvWgradProblem])
def test_defaults_leave_keys_and_labels_as_they_were(cls):
    problem = cls(**BASE)
    assert "groups" not in problem.to_dict() and "dilation" not in problem.to_dict()
    assert "groups" not in problem.shape_string() and "dilation" not in problem.shape_string()
    assert "groups" not in problem.geometry() and "dilation" not in problem.geometry()
    assert problem.w_shape == (12, 12, 3, 3)


@pytest.mark.parametrize("cls", [ConvFwdProblem, ConvBwdDataProblem, ConvWgradProblem])
def test_grouped_dilated_problem_round_trips(cls):
    problem = cls(**BASE, groups=4, dilation=(2, 1))
    assert problem.to_dict()["groups"] == 4 and problem.to_dict()["dilation"] == [2, 1]
    assert ",groups=4,dilation=2,1" in problem.shape_string()
    assert problem_from_dict(problem.to_dict()) == problem
    assert parse_shape(cls.op, problem.shape_string()) == problem
    assert problem.w_shape == (12, 3, 3, 3)
    assert (problem.P, problem.Q) == (7, 9)   # the dilated filter spans 5 rows and 3 columns
    assert problem.macs == 2 * 12 * 7 * 9 * 3 * 9
    assert problem.with_op("conv_wgrad").groups == 4


def test_cli_shape_takes_groups_and_one_dilation_for_both_axes():
    problem = parse_shape("conv_fwd", "N=1,C=64,H=14,W=14,K=64,R=3,S=3,pad=2,groups=32,dilation=2")
    assert problem.groups == 32 and problem.dilation == (2, 2) and problem.P == 14


@pytest.mark.parametrize("kwargs, field, allowed", [
    (dict(groups=5), "groups", "a divisor of C=12"),
    (dict(groups=0), "groups", "an integer >= 1"),
    (dict(groups=True), "groups", "an integer >= 1"),
    (dict(dilation=0), "dilation", "an integer >= 1"),
    (dict(dilation=(1, 2, 3)), "dilation", "one integer or two"),
    (dict(C=8, K=12, groups=8), "groups", "a divisor of K=12"),
    (dict(dilation=6), "R", "(dilated by 6, the filter spans 13)"),
    (dict(padding=3, dilation=(1, 2)), "padding", "top and bottom padding smaller than the filter height R=3"),
])
def test_bad_groups_and_dilation_name_field_value_and_rule(kwargs, field, allowed):
    with pytest.raises(InvalidProblemError) as info:
        ConvFwdProblem(**{**BASE, **kwargs})
    assert info.value.field == field
    assert allowed in info.value.allowed


def test_dilation_widens_what_padding_may_be():
    # Padding 3 is refused at dilation 1 for a 3-tap filter; dilated by 2 it spans 5, so 3 fits.
    problem = ConvFwdProblem(**{**BASE, "padding": 3, "dilation": 2})
    assert problem.P == 9 + 6 - 5 + 1


@pytest.mark.parametrize("cls, extra", [(ConvPoolFwdProblem, {}), (ConvBwdFusedProblem, {})])
def test_fused_problems_refuse_groups_and_dilation(cls, extra):
    for kwargs, field in ((dict(groups=2), "groups"), (dict(dilation=2), "dilation")):
        with pytest.raises(InvalidProblemError) as info:
            cls(**BASE, **kwargs, **extra)
        assert info.value.field == field and "has no grouped or dilated form" in info.value.allowed
    assert "groups" not in cls(**BASE, **extra).to_dict()


def test_lookup_borrows_only_within_a_grouping_class():
    dense = ConvFwdProblem(**BASE)
    depthwise = ConvFwdProblem(**BASE, groups=12)
    grouped = ConvFwdProblem(**BASE, groups=4)
    assert [grouping_class(p) for p in (dense, depthwise, grouped)] == ["dense", "depthwise", "grouped"]
    assert shape_distance(dense, depthwise) == math.inf
    assert shape_distance(grouped, depthwise) == math.inf
    assert shape_distance(dense, grouped) == math.inf
    wider = dataclasses.replace(depthwise, C=24, K=24, groups=24)
    assert shape_distance(depthwise, wider) == pytest.approx(2.0)   # C and K, not groups again
    assert shape_distance(grouped, dataclasses.replace(grouped, groups=2)) == pytest.approx(1.0)
    assert shape_distance(depthwise, dataclasses.replace(depthwise, dilation=2)) == pytest.approx(4.0)
    multiplier = ConvFwdProblem(**{**BASE, "K": 24}, groups=12)
    assert grouping_class(multiplier) == "depthwise"


@pytest.mark.parametrize("cls", [ConvFwdProblem, ConvBwdDataProblem, ConvWgradProblem])
def test_the_least_bytes_of_a_grouped_problem_count_its_filters_at_c_over_groups_channels(cls):
    """The physical floor a stored time is held to (store/evidence.py) counts the filters as they
    are: K x C/groups x R x S, not K x C x R x S."""
    from autocnn.kernels import get_operation

    dense = cls(N=2, C=64, H=8, W=8, K=64, R=3, S=3, padding=1)
    grouped = dataclasses.replace(dense, groups=32)
    operation = get_operation(dense.op)
    assert operation.min_bytes(dense) - operation.min_bytes(grouped) == 4 * 64 * (64 - 2) * 9
