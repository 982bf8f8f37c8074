"""autocnn.torch's preparing of a model on the CPU: quick tuning is the default, under one budget per
model, with a progress line and a report of the time to the first step; "off" tunes nothing; what
is tuned is found by the next prepare, in another process, which tunes nothing; bad settings are
refused before any GPU work. The GPU is tests/torch_fake_gpu.py's: the real lookup, quick tuning,
planning and database, recorded H200 measurements (replay files) and a scripted table.
"""
from __future__ import annotations

import re
import warnings

import pytest

torch = pytest.importorskip("torch", reason="autocnn.torch needs PyTorch (pip install 'autocnn[torch]')")

import autocnn.torch as at  # noqa: E402
from autocnn.dispatch.quick import AUTOTUNE_ENV, MODEL_BUDGET_ENV, MODEL_QUICK_BUDGET_S  # noqa: E402
from autocnn.store import RecordKey  # noqa: E402
from autocnn.torch import first_use, launch  # noqa: E402
from autocnn.torch.first_use import FirstUse, PrepareSettings, prepare_on  # noqa: E402
from tests import torch_fake_gpu as fake  # noqa: E402

PROBLEMS = 7   # conv_fwd, conv_wgrad, avgpool_fwd, avgpool_bwd, then conv_fwd, conv_bwd_data, conv_wgrad


@pytest.fixture(autouse=True)
def _settings_from_arguments_only(monkeypatch):
    monkeypatch.delenv(AUTOTUNE_ENV, raising=False)
    monkeypatch.delenv(MODEL_BUDGET_ENV, raising=False)


def example() -> tuple[torch.Tensor, ...]:
    return (torch.empty(fake.INPUT_SHAPE),)


def prepared(tmp_path, source=None, **settings):
    source = source or fake.RecordedSource()
    kernels = fake.fake_kernels(tmp_path / "db", source)
    report = prepare_on(kernels, fake.model(), example(), PrepareSettings.resolve(**settings))
    return report, source, kernels


def test_quick_is_the_default_and_every_unseen_problem_is_tuned_and_stored(tmp_path):
    report, source, kernels = prepared(tmp_path, verbose=False)
    assert report.settings == PrepareSettings("quick", MODEL_QUICK_BUDGET_S, False)
    assert len(report.problems) == PROBLEMS and len(report.tuned) == PROBLEMS and not report.over_budget
    assert source.opened == 1 and source.measured
    assert {p.op for p, _ in source.measured} == {"conv_fwd", "conv_bwd_data", "conv_wgrad", "avgpool_fwd",
                                                  "avgpool_bwd"}
    stored = kernels.kernels.db.records()
    assert len(stored) == PROBLEMS and all(r.quick for r in stored)
    assert all(d.source == "quick-tuned" for d in report.dispatch)
    # Recorded measurements decide where a file holds the problem: the wgrad's recorded fastest candidate.
    wgrad = next(p for p in report.problems if p.problem == fake.RECORDED[0].problem)
    measured = {key for p, key in source.measured if p == wgrad.problem}
    assert wgrad.time_us == min(r.time_us for r in fake.RECORDED[0].results.values()
                                if r.ok and r.config.key() in measured)
    assert report.tune_s == pytest.approx(source.now) and report.seconds >= report.tune_s


def test_the_budget_stops_tuning_and_the_report_says_how_many_are_left(tmp_path, capsys):
    source = fake.RecordedSource(seconds_each=1.0)
    report, _, kernels = prepared(tmp_path, source, budget_s=4.0, verbose=True)
    tuned, left = report.tuned, report.over_budget
    assert 1 <= len(tuned) < PROBLEMS and len(tuned) + len(left) == PROBLEMS
    # Tuned first: the problems with the largest share of the step (the 5x5 layer's on 128x3x32x32).
    assert tuned[0].problem.op.startswith("conv") and tuned[0].problem.R == 5
    # Each quick tuning is held to what is left, so the budget is overrun by at most one result or two.
    assert 4.0 <= report.tune_s <= 4.0 + 2 * source.seconds_each
    assert all(d.source == "heuristic default (not tuned)" for d in (p.dispatch for p in left))
    assert all("tuning budget was spent" in p.dispatch.detail for p in left)
    assert len(kernels.kernels.db.records()) == len(tuned)
    out = capsys.readouterr().out
    assert f"{len(left)} left untuned: the 4 s tuning budget was spent" in out and out.count("\n") == 1
    # What the budget left is tuned by the next prepare; what was tuned is not measured again.
    again, second, _ = prepared(tmp_path, verbose=False)
    assert {p.problem for p in again.tuned} == {p.problem for p in left}
    assert {p.problem for p in again.from_database} == {p.problem for p in tuned}


def test_the_progress_line_and_the_report_show_once_and_quiet_shows_nothing(tmp_path, capsys):
    report, _, _ = prepared(tmp_path / "a", verbose=True)
    captured = capsys.readouterr()
    for i in range(1, PROBLEMS + 1):
        assert re.search(rf"autocnn.torch prepare \[\d\d:\d\d\]: problem {i} of {PROBLEMS}, ", captured.err)
    assert re.search(r"the one before: quick-tuned \d+\.\d us \(tuned in \d+\.\d s\)", captured.err)
    assert f"{PROBLEMS} problems; the last: quick-tuned" in captured.err
    assert captured.out.count("autocnn.torch.prepare") == 1
    assert f"{PROBLEMS} kernels ready in" in captured.out and f"): {PROBLEMS} tuned now" in captured.out
    assert str(report) in captured.out
    prepared(tmp_path / "b", verbose=False)
    quiet = capsys.readouterr()
    assert quiet.out == "" and quiet.err == ""


def test_off_tunes_nothing_and_runs_the_lookups_answer(tmp_path, monkeypatch):
    monkeypatch.setenv(AUTOTUNE_ENV, "off")
    report, source, kernels = prepared(tmp_path, verbose=False)
    assert report.settings.autotune == "off"
    assert source.opened == 0 and source.measured == [] and kernels.kernels.db.records() == []
    assert len(report.untuned) == PROBLEMS and not report.tuned and not report.over_budget
    assert all(d.source == "heuristic default (not tuned)" for d in report.dispatch)
    assert f"{PROBLEMS} on the lookup's answer, untuned" in str(report)
    # The argument wins over the environment.
    again, source, _ = prepared(tmp_path / "quick", autotune="quick", verbose=False)
    assert len(again.tuned) == PROBLEMS and source.measured


def test_a_tuned_record_is_used_as_it_is(tmp_path):
    from tests.test_quick_tune import record

    source = fake.RecordedSource()
    kernels = fake.fake_kernels(tmp_path / "db", source)
    problem = fake.RECORDED[0].problem
    best = fake.RECORDED[0].best()
    kernels.kernels.db.put_many([record(problem, best.config, best.time_us, device=fake.DEVICE)])
    report = prepare_on(kernels, fake.model(), example(), PrepareSettings.resolve(verbose=False))
    found = next(p for p in report.problems if p.problem == problem)
    assert found.source == "exact" and not found.tuned_now and found.time_us == best.time_us
    assert found.dispatch.source == "tuned" and found in report.from_database
    assert len(report.tuned) == PROBLEMS - 1 and problem not in {p for p, _ in source.measured}
    # Prepared once per device: the same model again does nothing.
    again = prepare_on(kernels, fake.model(), example(), PrepareSettings.resolve(verbose=False))
    assert not again.prepared_now and "nothing to do" in str(again)


def test_a_second_prepare_in_a_new_process_finds_the_quick_records_and_tunes_nothing(tmp_path):
    first = fake.run_in_new_process({"db": str(tmp_path / "db")})
    assert first["tuned"] == PROBLEMS and first["measured"] > 0 and first["opened"] == 1
    second = fake.run_in_new_process({"db": str(tmp_path / "db")})
    assert second["tuned"] == 0 and second["from_database"] == PROBLEMS
    assert second["measured"] == 0 and second["opened"] == 0 and second["tune_s"] == 0


# -- settings, checked before any GPU work ----------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    (dict(budget_s=-1), r"the model's tuning budget \(budget_s\) must be a positive number of seconds, not -1"),
    (dict(budget_s=0), "must be a positive number of seconds"),
    (dict(budget_s="60"), "must be a positive number of seconds, not '60'"),
    (dict(autotune="fast"), "autotune must be one of off, quick, full, not 'fast'"),
])
def test_bad_arguments_are_refused_before_the_device(kwargs, message, monkeypatch):
    def no_device(device):
        raise AssertionError("the device was touched")

    monkeypatch.setattr(first_use, "kernels_for", no_device)
    model = fake.model()
    with pytest.raises(ValueError, match=message):
        at.prepare(model, torch.empty(2, 3, 8, 8), **kwargs)
    with pytest.raises(ValueError, match=message):
        at.convert(model, verbose=False, **kwargs)
    assert not any(isinstance(m, at.Conv2d) for m in model.modules())   # nothing converted
    with pytest.raises(TypeError, match="verbose must be True or False"):
        at.prepare(model, torch.empty(2, 3, 8, 8), verbose="yes")


@pytest.mark.parametrize("env,value,message", [
    (MODEL_BUDGET_ENV, "-5", r"\$AUTOCNN_QUICK_BUDGET \(the model's tuning budget\) must be a positive number of "
                             r"seconds, not -5.0"),
    (MODEL_BUDGET_ENV, "soon", r"\$AUTOCNN_QUICK_BUDGET .* not 'soon'"),
    (AUTOTUNE_ENV, "always", r"\$AUTOCNN_AUTOTUNE must be one of off, quick, full, not 'always'"),
])
def test_bad_environment_is_refused_before_the_device(env, value, message, monkeypatch):
    monkeypatch.setenv(env, value)
    monkeypatch.setattr(launch, "_cupy", lambda: pytest.fail("the device was touched"))
    monkeypatch.setattr(launch, "_DEVICES", {})
    with pytest.raises(ValueError, match=message):
        at.prepare(fake.model(), torch.empty(2, 3, 8, 8))
    with pytest.raises(ValueError, match=message):
        at.convert(fake.model(), verbose=False)
    if env == AUTOTUNE_ENV:
        with pytest.raises(ValueError, match=message):
            launch.kernels_for(torch.device("cuda", 0))


def test_the_environment_sets_the_budget_and_a_cpu_input_is_named():
    assert PrepareSettings.resolve().budget_s == MODEL_QUICK_BUDGET_S
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MODEL_BUDGET_ENV, "30")
        assert PrepareSettings.resolve().budget_s == 30.0
        assert PrepareSettings.resolve(budget_s=5).budget_s == 5.0     # the argument wins
    with pytest.raises(ValueError, match="example input on the CUDA device .* not on cpu"):
        at.prepare(fake.model(), torch.empty(2, 3, 8, 8))


def test_a_device_s_kernels_quick_tune_by_default_unless_off(monkeypatch, tmp_path):
    """What autocnn.torch.launch builds for a CUDA device: the mode is $AUTOCNN_AUTOTUNE's, else quick."""
    import autocnn.device
    import autocnn.dispatch.kernels

    made = []

    class Kernels:
        def __init__(self, cp, index, device, database, autotune):
            made.append(autotune)

    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "db"))
    monkeypatch.setattr(autocnn.dispatch.kernels, "GpuKernels", Kernels)
    monkeypatch.setattr(autocnn.device, "current_device", lambda index: fake.DEVICE)
    monkeypatch.setattr(launch, "_cupy", lambda: fake.FAKE_CUPY)
    for env, expected in ((None, "quick"), ("off", "off"), ("FULL", "full")):
        monkeypatch.setattr(launch, "_DEVICES", {})
        if env is None:
            monkeypatch.delenv(AUTOTUNE_ENV, raising=False)
        else:
            monkeypatch.setenv(AUTOTUNE_ENV, env)
        launch.kernels_for(torch.device("cuda", 0))
        assert made[-1] == expected


# -- at first use: convert's hook ------------------------------------------------------------------------

def test_convert_prepares_the_model_at_its_first_step_once_per_input_shape(tmp_path, monkeypatch, capsys):
    source = fake.RecordedSource()
    kernels = fake.fake_kernels(tmp_path / "db", source)
    calls = []

    def on_gpu(args, kwargs):
        calls.append(tuple(a.shape for a in args))
        return None if kwargs or args[0].device.type == "meta" else torch.device("cuda", 0)

    monkeypatch.setattr(first_use, "_cuda_step", on_gpu)
    monkeypatch.setattr(first_use, "kernels_for", lambda device: kernels)
    model = fake.model()
    at.convert(model, verbose=False, budget_s=50)
    hooks = [h for h in model._forward_pre_hooks.values() if isinstance(h, FirstUse)]
    assert len(hooks) == 1 and hooks[0].budget_s == 50
    at.convert(model, verbose=True, budget_s=60)    # converted again: the same hook, the new settings
    assert [h for h in model._forward_pre_hooks.values() if isinstance(h, FirstUse)] == hooks
    assert hooks[0].budget_s == 60 and hooks[0].verbose
    capsys.readouterr()

    x = torch.randn(4, 3, 32, 32)                   # on the CPU: the hook is told it is on a GPU
    model(x).sum().backward()
    first = capsys.readouterr()
    assert "]: problem 1 of" in first.err and "kernels ready in" in first.out
    measured = len(source.measured)
    assert measured and len(kernels.kernels.db.records()) == len(kernels.kernels.dispatch) == PROBLEMS
    assert all(p.N == 4 for p in kernels.kernels.dispatch)
    model(x)                                        # the same shape in training: nothing more
    with torch.no_grad():
        model.eval()
        model(x)                                    # inference: its problems are prepared already
    assert len(source.measured) == measured and len(kernels.kernels.dispatch) == PROBLEMS
    model.train()
    model(x[:2])                                    # a new batch size: a new prepare
    assert {p.N for p in kernels.kernels.dispatch} == {2, 4} and len(source.measured) > measured
    assert all(shape[0][0] in (2, 4) for shape in calls)


def test_a_forward_that_needs_values_is_left_to_the_layers_with_a_warning(tmp_path, monkeypatch):
    class ReadsValues(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return self.conv(x) * x.sum().item()

    kernels = fake.fake_kernels(tmp_path / "db", fake.RecordedSource())
    monkeypatch.setattr(first_use, "_cuda_step", lambda args, kwargs: torch.device("cuda", 0))
    monkeypatch.setattr(first_use, "kernels_for", lambda device: kernels)
    model = ReadsValues()
    at.convert(model, verbose=False)
    with pytest.warns(RuntimeWarning, match="did not run on the meta device.*when its layer first runs"):
        model(torch.randn(1, 3, 8, 8))
    assert not kernels.kernels.dispatch
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # said once per input shape
        model(torch.randn(1, 3, 8, 8))


def test_problems_met_one_at_a_time_share_one_budget_and_say_when_they_tune(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(MODEL_BUDGET_ENV, "3")
    source = fake.RecordedSource(seconds_each=1.0)
    kernels = fake.fake_kernels(tmp_path / "db", source)
    uses = at.collect_problems(fake.model(), example())
    for use in uses:
        launch._say_tuned(kernels.prepare([use.problem]))
    tuned = [p for p in kernels.kernels.dispatch.values() if p.source == "quick-tuned"]
    assert kernels.met_budget is not None and kernels.met_budget.spent
    assert 1 <= len(tuned) < len(uses)
    err = capsys.readouterr().err
    assert err.count("met for the first time, tuned in") == len(tuned)
    assert RecordKey.for_(fake.DEVICE, uses[0].problem) in {r.key for r in kernels.kernels.db.records()}
