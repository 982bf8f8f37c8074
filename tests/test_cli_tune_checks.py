"""`autocnn tune` as a new user meets it: every mistake named before a device is touched, and one
line per finished problem when the output is not a terminal."""
from __future__ import annotations

from pathlib import Path

import pytest

from autocnn import cli
from autocnn.measurement.sources import ReplayFile

REPLAY = Path(__file__).parent / "data" / "replay"
POOL_FILE = REPLAY / "avgpool_fwd__kriz09_pool.json.gz"
SHAPE = "N=128,C=3,H=32,W=32,K=64,R=8,S=8,stride=1,pad=4,4,3,3"


@pytest.mark.parametrize("argv, message", [
    (["--op", "conv_fwd", "--shape", SHAPE, "--timeout", "-5"], "--timeout must be a positive number"),
    (["--network", "lenet5", "--timeout", "-1"], "--timeout must be a positive number"),
    (["--network", "lenet5", "--batch", "-5"], "--batch must be at least 1"),
    (["--network", "nosuchnet"], "nosuchnet"),
    (["--op", "conv_fwd", "--shape", SHAPE.replace("N=128", "N=0")], "N"),
    (["--op", "conv_fwd", "--shape", SHAPE.replace("stride=1", "stride=0")], "stride"),
    (["--op", "conv_fwdd", "--shape", SHAPE], "conv_fwdd"),
    (["--op", "conv_fwd", "--shape", SHAPE, "--storage", "notaurl"], "Accepted forms"),
    (["--op", "conv_fwd", "--shape", SHAPE, "--devices", "0,x"], "--devices"),
    (["--suite", "seed", "--ops", "conv_fwd", "--trials", "0"], "trials"),
    (["--op", "conv_fwd", "--shape", SHAPE, "--workspace-limit", "lots"], "--workspace-limit: 'lots' is not a size"),
    # TF32_ROUND is a parameter of tf32 problems only: an fp32 run has nothing to vary along it.
    (["--op", "conv_fwd", "--shape", SHAPE, "--vary", "TF32_ROUND"], "--vary: TF32_ROUND is not a parameter"),
    (["--op", "conv_fwd", "--shape", SHAPE, "--vary", "FRAG,NOSUCH"], "--vary: NOSUCH is not a parameter"),
    # A held value that no problem of the run offers (misspelt); one that some ops lack holds elsewhere.
    (["--network", "lenet5", "--fix", "formulation=wgmmma"], "no problem of this run offers formulation=wgmmma"),
    (["--op", "conv_wgrad", "--shape", SHAPE, "--fix", "formulation=halo"], "no problem of this run offers"),
    (["--op", "conv_fwd", "--shape", SHAPE, "--missing"], "--missing goes with --suite, --network or --torch-model"),
    (["--stale", "--missing"], "--missing goes with"),
])
def test_mistakes_are_named_before_any_device_is_touched(no_gpu_source, capsys, argv, message):
    assert cli.main(["tune", *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and "GPU" not in err.split(message)[0][-40:], err


def test_devices_and_device_are_one_choice(capsys):
    with pytest.raises(SystemExit):
        cli.main(["tune", "--op", "conv_fwd", "--shape", SHAPE, "--device", "1", "--devices", "all"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_one_line_per_finished_problem_when_the_output_is_not_a_terminal(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "db"))
    rf = ReplayFile.load(POOL_FILE)
    code = cli.main(["tune", "--op", rf.op, "--shape", rf.problem.shape_string(), "--trials", "6", "--replay",
                     str(POOL_FILE), "--storage", f"sqlite:///{tmp_path / 'study.db'}"])
    assert code == 0
    err = capsys.readouterr().err   # pytest's capture is not a terminal
    finished = [line for line in err.splitlines() if line.startswith(f"{rf.op} {rf.problem.shape_string()}: ")
                and "trials measured" in line]
    assert len(finished) == 1 and "\r" not in err, err


def test_cudnn_comparison_is_on_unless_refused():
    parse = cli.build_parser().parse_args
    base = ["tune", "--op", "conv_fwd", "--shape", SHAPE]
    assert parse(base).cudnn is None          # on when PyTorch with CUDA is importable
    assert parse([*base, "--cudnn"]).cudnn is True
    assert parse([*base, "--no-cudnn"]).cudnn is False


def test_vary_takes_the_parameters_of_the_problems_tuned():
    import dataclasses

    from autocnn.cli.tune import parse_vary
    from autocnn.kernels.suite import seed_problems

    problem = dict(seed_problems("conv_fwd"))["modern_14"]
    tf32 = dataclasses.replace(problem, precision="tf32")
    assert parse_vary("TF32_ROUND, FRAG", [tf32]) == ("TF32_ROUND", "FRAG")
    assert parse_vary("", [problem]) == ()


def test_missing_tunes_only_the_kernels_without_a_record_of_their_own(tmp_path, monkeypatch, capsys):
    """--missing on the seed pools (replayed H200 measurements, no shipped records): after one pool was
    tuned alone, a run tunes the other two and leaves its record as it was; a second run tunes
    nothing."""
    import autocnn.store.database as database
    from autocnn.store import TuningDatabase

    monkeypatch.setattr(database, "default_shipped_dir", lambda: tmp_path / "no-shipped")
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "db"))
    files = [str(p) for p in sorted(REPLAY.glob("avgpool_fwd__*.json.gz"))]
    common = ["--trials", "4", "--no-cudnn", "--replay", *files, "--storage", f"sqlite:///{tmp_path / 'study.db'}"]
    kriz = ReplayFile.load(POOL_FILE)
    assert cli.main(["tune", "--op", kriz.op, "--shape", kriz.problem.shape_string(), *common]) == 0
    db = TuningDatabase()
    before = db.tuned(kriz.device, kriz.problem).record
    capsys.readouterr()

    def run_missing() -> list[str]:
        assert cli.main(["tune", "--suite", "seed", "--ops", "avgpool_fwd", "--missing", *common]) == 0
        err = capsys.readouterr().err
        return [line for line in err.splitlines() if "--missing:" in line or "trials measured" in line]

    first = run_missing()
    assert first[0].startswith("autocnn: --missing: 1 of 3 kernels have records of their own"), first
    tuned = [line.split(":")[0] for line in first[1:]]
    assert len(tuned) == 2 and not any(kriz.problem.shape_string() in t for t in tuned), first
    assert TuningDatabase().tuned(kriz.device, kriz.problem).record == before
    second = run_missing()
    assert second == ["autocnn: --missing: 3 of 3 kernels have records of their own for NVIDIA H200 and are "
                      "left as they are; 0 to tune"], second
