"""The layout as a problem dimension (autocnn/layout.py): NHWC problems' keys, references, verification
data and command line; every formulation but those that serve NHWC refusing it with its reason; a
lookup never crossing layouts. The kernels themselves: tests/test_nhwc_emulated.py (CPU) and
tests/test_nhwc_gpu.py."""
from __future__ import annotations

import dataclasses
import math
import pickle

import numpy as np
import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError, InvalidProblemError
from autocnn.kernels import PROBLEM_TYPES, get_operation, parse_shape, problem_from_dict
from autocnn.kernels import reference
from autocnn.kernels.suite import nhwc_odd_problems, odd_problems
from autocnn.layout import DEFAULT_LAYOUT, NCHW, NHWC, layout_named
from autocnn.measurement.measure import random_inputs
from autocnn.store.lookup import shape_distance

LIMITS = DeviceLimits.for_arch("sm_90")
FIVE = ("conv_fwd", "conv_bwd_data", "conv_wgrad", "avgpool_fwd", "avgpool_bwd")
# The formulations that serve NHWC, by operation: dense problems, and depthwise ones.
SERVING = {
    "conv_fwd": {"dense": {"direct"}, "depthwise": {"depthwise"}},
    "conv_bwd_data": {"dense": {"direct"}, "depthwise": {"depthwise"}},
    "conv_wgrad": {"dense": set(), "depthwise": {"depthwise"}},
    "avgpool_fwd": {"dense": {"window_gather"}},
    "avgpool_bwd": {"dense": {"window_gather"}},
}


def _nhwc(op: str, name: str):
    return dict(nhwc_odd_problems(op))[name]


@pytest.mark.parametrize("op", FIVE)
def test_the_default_layout_leaves_keys_strings_and_geometry_as_they_were(op):
    problem = odd_problems(op)[0][1]
    assert problem.layout is NCHW is DEFAULT_LAYOUT
    assert "layout" not in problem.to_dict() and "layout" not in problem.shape_string()
    assert "layout" not in problem.geometry()
    nhwc = dataclasses.replace(problem, layout="nhwc")
    assert nhwc.layout is NHWC
    assert nhwc.to_dict()["layout"] == "nhwc" and nhwc.shape_string().endswith(",layout=nhwc")
    assert problem_from_dict(nhwc.to_dict()) == nhwc and parse_shape(op, nhwc.shape_string()) == nhwc
    assert nhwc != problem and nhwc.to_dict() != problem.to_dict()
    assert nhwc.with_op(op).layout is NHWC
    assert pickle.loads(pickle.dumps(nhwc)).layout is NHWC


def test_a_bad_layout_names_the_field_and_the_layouts_allowed():
    with pytest.raises(InvalidProblemError, match=r"layout='chwn' is not allowed: one of nchw, nhwc"):
        PROBLEM_TYPES["conv_fwd"](N=1, C=2, H=5, W=5, K=3, R=3, S=3, layout="chwn")
    with pytest.raises(InvalidProblemError, match="layout"):
        PROBLEM_TYPES["avgpool_fwd"](N=1, C=2, H=4, W=4, layout="NHWC")   # names are lower case, as stored
    assert layout_named(NHWC) is NHWC


@pytest.mark.parametrize("op", ["conv_pool_fwd", "conv_pool_dz", "conv_bwd_fused", "sep_conv_fwd"])
def test_operations_with_only_nchw_refuse_another_layout(op):
    import autocnn.kernels.registry  # noqa: F401  (registers every operation's problem type)

    problem = odd_problems(op)[0][1]
    with pytest.raises(InvalidProblemError, match=f"only nchw: {op} has no nhwc form"):
        dataclasses.replace(problem, layout="nhwc")


def test_layout_shapes_and_moves_are_inverse():
    a = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    assert NHWC.activation_shape((2, 3, 4, 5)) == (2, 4, 5, 3) and NHWC.filter_shape((2, 3, 4, 5)) == (2, 4, 5, 3)
    assert NHWC.from_nchw(a).shape == (2, 4, 5, 3) and NHWC.from_nchw(a)[1, 2, 3, 0] == a[1, 0, 2, 3]
    for filters in (False, True):
        assert np.array_equal(NHWC.to_nchw(NHWC.from_nchw(a, filters=filters), filters=filters), a)
        assert NHWC.from_nchw(a, filters=filters).flags.c_contiguous
    assert NCHW.activation_shape((2, 3, 4, 5)) == (2, 3, 4, 5)


@pytest.mark.parametrize("op", FIVE)
def test_nhwc_reference_is_the_nchw_reference_in_the_other_order(op):
    for _name, nhwc in nhwc_odd_problems(op):
        nchw = dataclasses.replace(nhwc, layout="nchw")
        inputs = random_inputs(nhwc, np, seed=3)
        assert {k: v.shape for k, v in inputs.items()} == reference.input_shapes(nhwc)
        filters = {"w", "dw"}

        def moved(arrays, to_nchw):
            go = NHWC.to_nchw if to_nchw else NHWC.from_nchw
            return {k: go(v, filters=k in filters) if v.ndim == 4 else v for k, v in arrays.items()}

        got = reference.run_problem(nhwc, {k: v.astype(np.float64) for k, v in inputs.items()})
        want = reference.run_problem(nchw, moved({k: v.astype(np.float64) for k, v in inputs.items()}, True))
        assert {k: v.shape for k, v in got.items()} == reference.output_shapes(nhwc)
        for k, v in moved(want, False).items():
            np.testing.assert_array_equal(got[k], v)


def test_nhwc_input_shapes_are_channels_last():
    problem = _nhwc("conv_fwd", "odd_nhwc")
    assert reference.input_shapes(problem) == {"x": (3, 13, 13, 5), "w": (7, 3, 3, 5)}
    assert reference.output_shapes(problem) == {"y": (3, 7, 6, 7)}   # P=7, Q=6, K=7
    assert reference.output_shapes(_nhwc("conv_wgrad", "odd_nhwc")) == {"dw": (7, 3, 3, 5), "db": (7,)}
    assert reference.input_shapes(_nhwc("avgpool_bwd", "odd_nhwc_pool")) == {"dy": (3, 6, 5, 5)}


@pytest.mark.parametrize("op", FIVE)
def test_every_formulation_but_those_serving_nhwc_refuses_it_with_its_reason(op):
    operation = get_operation(op)
    for name, problem in nhwc_odd_problems(op):
        kind = "depthwise" if getattr(problem, "depthwise", False) else "dense"
        refusals = operation.refusals(problem, LIMITS)
        serving = SERVING[op][kind]
        assert set(operation.formulation_names) - set(refusals) == serving, name
        for value, why in refusals.items():
            formulation = operation.formulation(value)
            if formulation.layout_refusal(problem) is None or formulation.grouping_refusal(problem) is not None:
                continue   # it serves NHWC but not this grouping, or refuses the grouping first
            assert why == (f"{formulation.formulation} computes {op} in the nchw (NCHW activations, KCRS filters) "
                           "layout only (nhwc given): its index maps read and write that memory order"), why
        for value in serving:
            config = operation.default_config(problem, LIMITS, formulation=value)
            assert config.get("formulation", value) == value
        if serving:
            assert operation.default_config(problem, LIMITS).get("formulation", next(iter(serving))) in serving


def test_a_config_of_a_refusing_formulation_is_infeasible_for_nhwc():
    operation = get_operation("conv_fwd")
    nchw = dataclasses.replace(_nhwc("conv_fwd", "odd_nhwc"), layout="nchw")
    config = operation.default_config(nchw, LIMITS, formulation="igemm")
    with pytest.raises(InfeasibleConfigError, match="igemm computes conv_fwd in the nchw"):
        operation.space(dataclasses.replace(nchw, layout="nhwc"), LIMITS).validate(config)


def test_nchw_spaces_are_what_they_were():
    # No layout rule is added for an NCHW problem: its space's constraints are those of before.
    operation = get_operation("conv_fwd")
    problem = odd_problems("conv_fwd")[0][1]
    reasons = [c.check for c in operation.space(problem, LIMITS).constraints]
    assert all("layout" not in (getattr(c, "reason", "") or "") for c in operation.space(problem, LIMITS).constraints)
    assert reasons   # the space has its usual rules


def test_problems_of_two_layouts_are_infinitely_far_apart():
    for op in FIVE:
        nhwc = nhwc_odd_problems(op)[0][1]
        assert shape_distance(nhwc, dataclasses.replace(nhwc, layout="nchw")) == math.inf
        assert shape_distance(nhwc, dataclasses.replace(nhwc, N=nhwc.N * 2)) == pytest.approx(1.0)


def _db(tmp_path):
    from autocnn.store import TuningDatabase

    return TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "none",
                          resource_check=lambda plan, device: [])


def _put(db, device, problem, config):
    from autocnn.store import RecordKey, TuningRecord, now_utc

    op = get_operation(problem.op)
    config = config.as_dict()
    db.put(TuningRecord(RecordKey.for_(device, problem, op.config_fingerprint(config)), config, 10.0, 0.0, None,
                        None, 5, now_utc(), "0", "tpe"))


@pytest.mark.parametrize("op", ["avgpool_fwd", "conv_fwd"])
def test_a_lookup_never_returns_a_config_recorded_for_the_other_layout(op, tmp_path):
    from tests.test_sound_lookup import H200

    operation = get_operation(op)
    nhwc = nhwc_odd_problems(op)[0][1]
    nchw = dataclasses.replace(nhwc, layout="nchw")
    db = _db(tmp_path)
    # The exact shape recorded in NCHW, and an NHWC neighbour (twice the batch) recorded with a
    # config that is not NHWC's default.
    nchw_config = operation.default_config(nchw, H200.limits())
    _put(db, H200, nchw, nchw_config)
    neighbour = dataclasses.replace(nhwc, N=nhwc.N * 2)
    space = operation.space(neighbour, H200.limits())
    default = operation.default_config(neighbour, H200.limits())
    other = next(c for c in space.sample(__import__("random").Random(5), 20, exclude=[default])
                 if c.get("formulation") == default.get("formulation"))
    _put(db, H200, neighbour, other)

    found = db.lookup(H200, nhwc)
    assert found.source == "nearest_shape" and found.config.as_dict() == other.as_dict()
    assert found.record.key.problem["layout"] == "nhwc"
    # The NCHW problem finds its own record, never the NHWC neighbour's.
    back = db.lookup(H200, nchw)
    assert back.source == "exact" and back.config.as_dict() == nchw_config.as_dict()
    assert db.lookup(H200, dataclasses.replace(nchw, N=nchw.N * 2)).record.key.problem.get("layout") is None


def test_the_command_line_takes_the_layout_in_the_flag_or_the_shape():
    from autocnn.cli.problems import at_layout, shape_problem

    shape = "N=3,C=5,H=13,W=13,K=7,R=3,S=3,stride=2,pad=1,0,2,1"
    assert shape_problem("conv_fwd", shape, None, "nhwc").layout is NHWC
    assert shape_problem("conv_fwd", shape + ",layout=nhwc", "bf16", None).layout is NHWC
    assert shape_problem("conv_fwd", shape + ",layout=nhwc", None, "nhwc").layout is NHWC
    with pytest.raises(ValueError, match="--shape says layout=nhwc but --layout says nchw"):
        shape_problem("conv_fwd", shape + ",layout=nhwc", None, "nchw")
    with pytest.raises(InvalidProblemError, match="one of nchw, nhwc"):
        shape_problem("conv_fwd", shape, None, "chwn")
    fused = odd_problems("conv_pool_fwd")[0][1]
    with pytest.raises(ValueError, match="conv_pool_fwd has only the nchw layout"):
        at_layout(fused, "nhwc")


def test_tune_and_bench_take_layout_where_problems_are_built():
    import argparse

    from autocnn.benchmark.kernels import BenchSettings, plan
    from autocnn.cli import build_parser
    from autocnn.cli.tune import tune_command

    parser = build_parser()
    args = parser.parse_args(["tune", "--op", "avgpool_fwd", "--shape", "N=3,C=5,H=13,W=11,window=3,stride=2",
                              "--layout", "nhwc", "--no-progress"])
    command = tune_command(args)
    assert [p.layout for p in command.problems] == [NHWC]
    args = parser.parse_args(["tune", "--suite", "seed", "--ops", "avgpool_fwd,conv_wgrad", "--layout", "nhwc"])
    problems = tune_command(args).problems
    # Dense NHWC weight gradients have no formulation yet: the suite keeps the pools only.
    assert problems and all(p.layout is NHWC and p.op == "avgpool_fwd" for p in problems)
    with pytest.raises(ValueError, match="--layout goes with --op"):
        tune_command(parser.parse_args(["tune", "--network", "lenet5", "--layout", "nhwc"]))
    work = plan(BenchSettings(ops="avgpool_fwd,conv_fwd", precision="fp32", layout="nhwc"))
    assert work.problems and all(p.layout is NHWC for _, _, p in work.problems)
    with pytest.raises(ValueError, match="conv_pool_fwd has only the nchw layout"):
        plan(BenchSettings(ops="conv_pool_fwd", precision="fp32", layout="nhwc"))
    assert isinstance(args, argparse.Namespace)
