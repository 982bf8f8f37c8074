"""Formulations that cannot compute channel groups or dilation refuse such a problem by a
rules.Refusal that says why, so a space holds only those that serve it, a lookup never runs one
of the others, and a run held to one of them is refused before a GPU opens."""
from __future__ import annotations

import dataclasses

import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError
from autocnn.kernels import get_operation
from autocnn.kernels.problem import ConvBwdDataProblem, ConvFwdProblem, ConvWgradProblem

LIMITS = DeviceLimits.for_arch("sm_90")
CONV_OPS = {"conv_fwd": ConvFwdProblem, "conv_bwd_data": ConvBwdDataProblem, "conv_wgrad": ConvWgradProblem}
# The formulations that serve each grouping (by the values of "formulation" that select them):
# igemm's GEMM per group, taps dilated (conv_wgrad's igemm answers to atomic and two_pass), and tc's
# (dilated; grouped with a k-step of channels a group, which these 3 channels are not).
IGEMM = {"conv_fwd": {"igemm"}, "conv_bwd_data": {"igemm"}, "conv_wgrad": {"atomic", "two_pass"}}
SERVING: dict[str, dict[str, set[str]]] = {"grouped": IGEMM, "dilated": {op: {*IGEMM[op], "tc"} for op in IGEMM}}


def _problems(op):
    cls = CONV_OPS[op]
    dense = cls(N=2, C=12, H=11, W=10, K=12, R=3, S=3, padding=1)
    return {"grouped": dataclasses.replace(dense, groups=4), "dilated": dataclasses.replace(dense, dilation=2, padding=2)}


@pytest.mark.parametrize("op", CONV_OPS)
@pytest.mark.parametrize("kind", ["grouped", "dilated"])
def test_every_formulation_but_those_serving_refuses_with_its_reason(op, kind):
    operation = get_operation(op)
    problem = _problems(op)[kind]
    refusals = operation.refusals(problem, LIMITS)
    assert set(refusals) == set(operation.formulation_names) - SERVING[kind][op]
    for name, why in refusals.items():
        formulation = operation.formulation(name).formulation
        if formulation == "depthwise":   # it serves groups == C alone (tests/test_depthwise.py)
            assert why.startswith("depthwise computes depthwise convolutions only"), why
            continue
        if formulation == "tc":   # groups of fewer channels than an mma's k-step
            assert why.startswith("tc computes grouped convolutions of at least 8 channels a group"), why
            assert "gives 3; igemm serves it" in why
            continue
        assert why.startswith(f"{formulation} computes dense, undilated convolutions only"), why
        assert ("groups=4, dilation=1 given" if kind == "grouped" else "groups=1, dilation=2 given") in why
    space = operation.space(problem, LIMITS)
    dense = dataclasses.replace(problem, groups=1, dilation=(1, 1), padding=1)   # the same P x Q
    checked = 0
    for formulation in {operation.formulation(name).formulation for name in refusals} - {"depthwise", "tc"}:
        # A default config of the dense shape breaks the refusal on the grouped or dilated one.
        try:
            config = operation.default_config(dense, LIMITS, formulation)
        except InfeasibleConfigError:   # the formulation does not serve this dense shape either
            continue
        with pytest.raises(InfeasibleConfigError, match=f"{formulation} computes dense, undilated convolutions only"):
            space.validate(config)
        checked += 1
    assert checked >= 2


@pytest.mark.parametrize("op", CONV_OPS)
def test_a_dense_problem_meets_no_grouping_refusal(op):
    problem = dataclasses.replace(_problems(op)["grouped"], groups=1)
    refusals = get_operation(op).refusals(problem, LIMITS)
    assert "depthwise" in refusals   # the one formulation that serves only grouped problems
    assert not any("dense, undilated" in why for why in refusals.values())


def test_a_run_held_to_a_dense_formulation_is_refused_before_any_gpu_work():
    from autocnn.search.tuner import problems_offering

    grouped = _problems("conv_fwd")["grouped"]
    with pytest.raises(InfeasibleConfigError, match="direct computes dense, undilated convolutions only"):
        problems_offering({"formulation": "direct"}, [grouped])
