"""scripts/tune_rows.py's arguments: with --budget and no --trials the budget, not a trial count, ends each study."""
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "tune_rows.py"


def load():
    spec = importlib.util.spec_from_file_location("tune_rows_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
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
    """pointwise_s1/s2 (the pointwise targets, benched with `autocnn bench --shapes`) can be tuned by name,
    in every convolution op, as 1x1 problems of the target shape."""
    from autocnn.kernels.suite import named_problems

    tune_rows = load()
    args, ops, precisions, rows = tune_rows.parse_args(["--rows", "pointwise_s2,modern_56", "--vary", "formulation"])
    assert rows == ["pointwise_s2", "modern_56"]
    for op in ops:
        problem = dict(named_problems(op))["pointwise_s2"]
        assert (problem.R, problem.S, problem.stride, problem.C, problem.K) == (1, 1, (2, 2), 256, 512)


def test_budget_shares_reserve_the_overrun_so_that_every_problem_is_reached():
    """Twelve problems, 225 s, each study running past its share by what the fft rows' studies ran
    past theirs on an H200 (fft:radix, b664ba1: 6, 5, 0, 9, 0, 7, 10, 9, 3, 5 s): even shares of what is left
    leave the last problem none (that run, with the tuner's own time between studies too, left two);
    reserving the mean overrun so far reaches all twelve, every share at least MIN_SHARE_S, the run
    ending near the budget."""
    tune_rows = load()
    overruns = (6.0, 5.0, 0.0, 9.0, 0.0, 7.0, 10.0, 9.0, 3.0, 5.0, 6.0, 6.0)

    def run(share_of, ran=lambda seconds, share: None):
        elapsed, shares = 0.0, []
        for done in range(12):
            share = share_of(done, elapsed)
            if share is None:
                break
            elapsed += share + overruns[done]
            ran(share + overruns[done], share)
            shares.append(share)
        return shares, elapsed

    def even(done, elapsed):   # the rule before: what is left over the problems left, none at 5 s or less
        left = 225 - elapsed
        return None if left <= 5 else left / (12 - done)

    assert len(run(even)[0]) == 11
    budget = tune_rows.BudgetShares(225, 12)
    shares, elapsed = run(budget.share, budget.ran)
    assert len(shares) == 12 and min(shares) >= tune_rows.MIN_SHARE_S
    assert elapsed <= 225 + max(overruns)
    # A spent budget stops the run: under MIN_SHARE_S a problem is spent.
    assert tune_rows.BudgetShares(60, 4).share(2, 55.0) is None
    assert tune_rows.BudgetShares(60, 4).share(0, 0.0) == 15.0
