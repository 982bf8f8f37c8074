"""scripts/tune_rows.py's arguments: with --budget and no --trials the budget, not a trial count, ends each study."""
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "tune_rows.py"


def load():
    spec = importlib.util.spec_from_file_location("tune_rows_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trials_default_depends_on_budget():
    tune_rows = load()
    assert tune_rows.parse_args(["--rows", "modern_56"])[0].trials == tune_rows.DEFAULT_TRIALS
    assert tune_rows.parse_args(["--rows", "modern_56", "--budget", "60"])[0].trials == tune_rows.UNCAPPED_TRIALS
    assert tune_rows.parse_args(["--rows", "modern_56", "--budget", "60", "--trials", "7"])[0].trials == 7


@pytest.mark.parametrize("argv, message", [
    (["--rows", "modern_56", "--trials", "0"], "--trials must be at least 1"),
    (["--rows", "modern_56", "--budget", "0"], "--budget must be positive"),
    (["--rows", "no_such_row"], "is not a seed row or target layer"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    tune_rows = load()
    with pytest.raises(SystemExit):
        tune_rows.parse_args(argv)
    assert message in capsys.readouterr().err


def test_target_layers_are_rows_beside_the_seed_suite():
    """pointwise_s1/s2 (issue 13's 1x1 layers, benched with `autocnn bench --shapes`) can be tuned by name,
    in every convolution op, as 1x1 problems of the target shape."""
    from autocnn.kernels.suite import named_problems

    tune_rows = load()
    args, ops, precisions, rows = tune_rows.parse_args(["--rows", "pointwise_s2,modern_56", "--vary", "formulation"])
    assert rows == ["pointwise_s2", "modern_56"]
    for op in ops:
        problem = dict(named_problems(op))["pointwise_s2"]
        assert (problem.R, problem.S, problem.stride, problem.C, problem.K) == (1, 1, (2, 2), 256, 512)
