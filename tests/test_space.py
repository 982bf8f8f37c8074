"""Search spaces: configs are validated before anything is rendered; nothing outside the space passes."""
from __future__ import annotations

import random

import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import FailureClass, InfeasibleConfigError, InvalidConfigError
from autocnn.kernels import OPERATIONS, operation_for
from autocnn.kernels.formulations import OpFormulation
from autocnn.kernels.space import Config, Constraint, Param, SearchSpace
from autocnn.kernels.suite import seed_problems

SM90 = DeviceLimits.for_arch("sm_90")
SM80 = DeviceLimits.for_arch("sm_80")


def toy_space() -> SearchSpace:
    return SearchSpace("toy", [
        Param("mode", ("a", "b")),
        Param("X", (1, 2, 4), active_if=(("mode", ("a",)),)),
        Param("Y", (1, 2, 4)),
    ], [Constraint(("X", "Y"), lambda x, y: None if x * y <= 4 else "X*Y > 4")])


def test_toy_space_enumerates_exactly_the_feasible_configs():
    space = toy_space()
    got = {c.key() for c in space.enumerate()}
    want = set()
    for y in (1, 2, 4):
        want.add(Config("toy", (("mode", "b"), ("Y", y))).key())
        for x in (1, 2, 4):
            if x * y <= 4:
                want.add(Config("toy", (("mode", "a"), ("X", x), ("Y", y))).key())
    assert got == want and space.size() == len(want) == 9


def test_inactive_parameter_is_rejected_and_active_one_required():
    space = toy_space()
    with pytest.raises(InvalidConfigError, match="applies only when"):
        space.validate({"mode": "b", "X": 1, "Y": 1})
    with pytest.raises(InvalidConfigError, match="required"):
        space.validate({"mode": "a", "Y": 1})


@pytest.mark.parametrize("bad", [
    {"mode": "a", "X": 3, "Y": 1},                       # not a choice
    {"mode": "a", "X": 2.0, "Y": 1},                     # right value, wrong type
    {"mode": "a", "X": "2", "Y": 1},                     # text instead of a number
    {"mode": "a", "X": True, "Y": 1},                    # bool is not the int 1
    {"mode": "a}; __global__ void evil() {", "X": 1, "Y": 1},   # text meant for the CUDA source
    {"mode": "a", "X": 1, "Y": 1, "Z": 1},               # unknown parameter
])
def test_values_outside_the_space_are_rejected(bad):
    with pytest.raises(InvalidConfigError) as err:
        toy_space().validate(bad)
    assert err.value.failure_class is FailureClass.INVALID_CONFIG


def test_constraint_violation_is_infeasible_with_reason():
    with pytest.raises(InfeasibleConfigError, match="X\\*Y > 4") as err:
        toy_space().validate({"mode": "a", "X": 4, "Y": 2})
    assert err.value.failure_class is FailureClass.INFEASIBLE


def test_sampling_returns_distinct_feasible_configs():
    space = toy_space()
    got = space.sample(random.Random(), 9)
    assert len({c.key() for c in got}) == 9
    assert all(space.is_feasible(c) for c in got)
    assert space.sample(random.Random(), 5, exclude=got) == []


def repair_space() -> SearchSpace:
    """Three rules: A*B <= 8; C <= B; D > 1 unless mode is "b"."""
    return SearchSpace("toy", [
        Param("mode", ("a", "b")),
        Param("A", (1, 2, 4, 8)),
        Param("B", (1, 2, 4)),
        Param("C", (1, 2, 4)),
        Param("D", (1, 2, 3)),
    ], [Constraint(("A", "B"), lambda a, b: None if a * b <= 8 else f"A*B={a * b} > 8"),
        Constraint(("B", "C"), lambda b, c: None if c <= b else f"C={c} > B={b}"),
        Constraint(("mode", "D"), lambda m, d: None if m == "b" or d > 1 else f"D={d} with mode {m}")])


def test_a_refused_choice_is_repaired_by_the_nearest_moves_of_the_parameters_its_rules_name():
    space = repair_space()
    base = space.validate({"mode": "a", "A": 2, "B": 4, "C": 2, "D": 2})
    # A=4 breaks A*B <= 8: B moves to its nearest value that works, 2; nothing else changes.
    with pytest.raises(InfeasibleConfigError):
        space.with_choice(base, "A", 4)
    assert space.nearest_with_choice(base, "A", 4).as_dict() == {"mode": "a", "A": 4, "B": 2, "C": 2, "D": 2}
    # A=8 needs B=1, which breaks C <= B in turn: C moves too (two changes), not more.
    assert space.nearest_with_choice(base, "A", 8).as_dict() == {"mode": "a", "A": 8, "B": 1, "C": 1, "D": 2}
    # At most max_changes moves: one is not enough for A=8.
    with pytest.raises(InfeasibleConfigError, match="A\\*B=32 > 8"):
        space.nearest_with_choice(base, "A", 8, max_changes=1)
    # A choice that needs no repair is with_choice's config.
    assert space.nearest_with_choice(base, "A", 1) == space.with_choice(base, "A", 1)
    # The chosen parameter never moves, though moving it back would repair too: B=1 moves C instead.
    assert space.nearest_with_choice(base, "B", 1).as_dict() == {"mode": "a", "A": 2, "B": 1, "C": 1, "D": 2}


def test_held_parameters_never_move_and_values_outside_the_space_are_refused():
    space = repair_space()
    base = space.validate({"mode": "a", "A": 1, "B": 1, "C": 1, "D": 3})
    # D=1 breaks the mode's rule: only the mode's move repairs it.
    assert space.nearest_with_choice(base, "D", 1)["mode"] == "b"
    with pytest.raises(InfeasibleConfigError, match="D=1 with mode a"):
        space.nearest_with_choice(base, "D", 1, held=("mode",))
    with pytest.raises(InvalidConfigError):
        space.nearest_with_choice(base, "D", 5)
    # A parameter the config leaves off is refused as validation refuses it.
    toy = toy_space()
    with pytest.raises(InvalidConfigError, match="applies only when"):
        toy.nearest_with_choice(toy.validate({"mode": "b", "Y": 1}), "X", 2)


@pytest.mark.parametrize("op", sorted(OPERATIONS))
@pytest.mark.parametrize("limits", [SM80, SM90], ids=["sm_80", "sm_90"])
def test_default_and_samples_are_valid_on_every_seed_shape(op, limits):
    rng = random.Random()
    for name, problem in seed_problems(op):
        operation = operation_for(problem)
        space = operation.space(problem, limits)
        default = operation.default_config(problem, limits)
        assert space.validate(default.as_dict()) == default, name
        for config in space.sample(rng, 8):
            assert space.validate(config.as_dict()) == config, (name, config)
            plan = operation.plan(problem, config)
            launch = plan.launches[0]
            assert 32 <= launch.threads <= limits.max_threads_per_block
            assert plan.max_shared_bytes <= limits.max_smem_per_block
            assert launch.grid[1] <= 65535 and launch.grid[2] <= 65535


def test_device_limits_shape_the_space():
    from autocnn.kernels import ConvFwdProblem

    p = ConvFwdProblem(N=8, C=64, H=64, W=64, K=64, R=11, S=11, padding=5)
    big = {"formulation": "direct", "KB": 64, "KPT": 8, "TP": 32, "TQ": 8, "PPT": 4, "QPT": 2,
           "CB": 16, "PAD": 0, "UNROLL_R": 1}
    space90 = operation_for(p).space(p, SM90)
    tiny = DeviceLimits("sm_90", max_smem_per_block=48 * 1024)
    with pytest.raises(InfeasibleConfigError, match="shared memory"):
        operation_for(p).space(p, tiny).validate(big)
    with pytest.raises(InfeasibleConfigError):
        space90.validate(big)   # 256 accumulators per thread are over the register budget too


def test_bwd_data_gather_space_and_defaults_follow_the_problem():
    from autocnn.kernels.problem import ConvBwdDataProblem

    small = ConvBwdDataProblem(N=128, C=5, H=13, W=13, K=50, R=5, S=5, stride=(2, 2))
    space = operation_for(small).space(small, SM90)
    assert 5 in space.param("CPB").choices                 # C itself, not only powers of two
    assert operation_for(small).default_config(small, SM90)["formulation"] == "gather"
    with pytest.raises(InfeasibleConfigError, match="KSPLIT=8 does not divide KSTAGE=4"):
        space.validate({"formulation": "gather", "POS": 32, "CPB": 5, "KSPLIT": 8, "KSTAGE": 4, "UNROLL_KS": 1})
    large_maps = ConvBwdDataProblem(N=60, C=4, H=256, W=256, K=16, R=8, S=8, stride=(2, 2), padding=(3, 3, 3, 3))
    assert operation_for(large_maps).default_config(large_maps, SM90)["formulation"] == "direct"
    tall = ConvBwdDataProblem(N=1, C=2, H=40, W=40, K=2, R=33, S=3)
    with pytest.raises(InfeasibleConfigError, match="at most 32 filter rows"):
        operation_for(tall).space(tall, SM90).validate(
            {"formulation": "gather", "POS": 32, "CPB": 2, "KSPLIT": 1, "KSTAGE": 4, "UNROLL_KS": 1})


class _Probe(OpFormulation):
    """A formulation for tests: shares the parameter BM with the implicit GEMM, with other choices."""

    formulation = "probe"
    op = "conv_fwd"
    summary = "a formulation for tests"
    templates = ("direct_conv_fwd.cu.j2", "_direct.cuh.j2")

    def params(self, problem):
        return [Param("BM", (32, 48), "rows of a probe tile"), Param("SPARE", (1, 2), "nothing")]

    def constraints(self, problem, limits):
        return [Constraint(("BM",), lambda bm: None if bm == 48 else "the probe wants BM=48")]

    def default_candidates(self, problem):
        return [{"formulation": "probe", "BM": 48, "SPARE": 1}]


def test_a_registered_formulation_joins_the_space_and_changes_no_default():
    from autocnn.kernels.conv_fwd import ConvFwd
    from autocnn.kernels.formulations import REGISTRY, Formulation

    base = OPERATIONS["conv_fwd"]
    op = ConvFwd((*REGISTRY, Formulation("probe", (_Probe(),))))
    names = ("direct", "igemm", "tc", "unrolled", "winograd", "fft", "circular", "wgmma", "halo", "winograd_fused",
             "depthwise")
    assert base.formulation_names == names
    assert op.formulation_names == (*names, "probe")
    assert op.fingerprint("direct") == base.fingerprint("direct") and op.fingerprint("igemm") == base.fingerprint("igemm")
    for name, problem in seed_problems("conv_fwd"):
        assert op.default_config(problem, SM90) == base.default_config(problem, SM90), name
    problem = seed_problems("conv_fwd")[0][1]
    space = op.space(problem, SM90)
    assert space.param("BM").choices == (*base.space(problem, SM90).param("BM").choices, 48)
    assert space.param("BM").active_if == (("formulation", ("igemm", "tc", "probe")),)
    # Each formulation keeps its own choices and constraints.
    space.validate({"formulation": "probe", "BM": 48, "SPARE": 1})
    with pytest.raises(InfeasibleConfigError, match="BM=128 is not one of probe's choices"):
        space.validate({"formulation": "probe", "BM": 128, "SPARE": 1})
    gemm = base.candidates(problem, "igemm")[-1]
    assert space.validate(gemm).as_dict() == gemm
    with pytest.raises(InfeasibleConfigError, match="BM=48 is not one of igemm's choices"):
        space.validate({**gemm, "BM": 48})
    assert space.restrict({"formulation": "probe"}).size() == 2


class _ConditionalProbe(_Probe):
    """Shares BM with the implicit GEMM but uses it only when SPARE is 2: one parameter cannot say both."""

    def params(self, problem):
        return [Param("SPARE", (1, 2), "nothing"), Param("BM", (32, 48), "rows of a probe tile", (("SPARE", (2,)),))]


def test_a_shared_parameter_with_other_conditions_is_refused():
    from autocnn.kernels.conv_fwd import ConvFwd
    from autocnn.kernels.formulations import REGISTRY, Formulation

    op = ConvFwd((*REGISTRY, Formulation("probe", (_ConditionalProbe(),))))
    problem = seed_problems("conv_fwd")[0][1]
    with pytest.raises(ValueError, match="parameter BM of probe is active under .*give one of them its own name"):
        op.space(problem, SM90)


def test_complete_fills_parameters_added_since_with_their_first_choice():
    """What a config written before a parameter existed means: the first choice of each active
    parameter it lacks (the code it had before), then the usual validation."""
    space = SearchSpace("conv_fwd", [Param("A", (1, 2)), Param("B", ("x", "y"), "", (("A", (2,)),)), Param("C", (3, 4))],
                        [Constraint(("A", "C"), lambda a, c: "A=2 needs C=4" if a == 2 and c != 4 else None)])
    assert space.complete({"A": 1}).as_dict() == {"A": 1, "C": 3}
    assert space.complete({"A": 2, "C": 4}).as_dict() == {"A": 2, "B": "x", "C": 4}
    assert space.complete(space.validate({"A": 1, "C": 4})).as_dict() == {"A": 1, "C": 4}
    with pytest.raises(InfeasibleConfigError, match="A=2 needs C=4"):
        space.complete({"A": 2})
    with pytest.raises(InvalidConfigError, match="nothing here"):
        space.complete({"A": 1, "B": "y"})
    with pytest.raises(InvalidConfigError, match="one of"):
        space.complete({"A": 5})
