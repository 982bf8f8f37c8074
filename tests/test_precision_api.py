"""Precision as users choose it: ``--precision`` on the command line (tune, db) and ``precision=`` in
the nn API. Everything here runs on the CPU: tuning is answered from recorded measurements or
stands in a fake tuner that records what it was asked to tune."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from autocnn.kernels import parse_shape
from autocnn.kernels.suite import seed_problems
from autocnn.store import TuningDatabase
from autocnn.tuning.sources import ReplayFile, ReplaySource
from autocnn.tuning.tuner import TuneOutcome, TuneSettings, Tuner

REPLAY = Path(__file__).parent / "data" / "replay"
WGRAD_FILE = REPLAY / "conv_wgrad__chellapilla06_c2.json.gz"
POOL_FILE = REPLAY / "avgpool_bwd__modern_pool.json.gz"
CONV_SHAPE = "N=8,C=3,H=16,W=16,K=8,R=3,S=3,stride=1,pad=1"


# -- autocnn tune --precision ---------------------------------------------------------------------

@pytest.fixture
def asked(monkeypatch, tmp_path):
    """The (op, problem) pairs `autocnn tune` hands the tuner (which tunes nothing here)."""
    calls: list[tuple[str, object]] = []

    def fake_tune(self, op, problem, trials=None, timeout_s=None):
        calls.append((op, problem))
        return TuneOutcome(op, problem, "study", None, None, stopped_because="fake")

    monkeypatch.setattr(Tuner, "tune", fake_tune)
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "db"))
    return calls


def _tune(*args: str) -> int:
    from autocnn.cli import main

    return main(["tune", *args, "--replay", str(POOL_FILE), "--json", "--storage", "sqlite:///:memory:"])


def test_tune_op_takes_the_precision_from_the_flag_or_the_shape(asked, capsys):
    _tune("--op", "conv_fwd", "--shape", CONV_SHAPE)
    _tune("--op", "conv_fwd", "--shape", CONV_SHAPE, "--precision", "tf32")
    _tune("--op", "conv_fwd", "--shape", CONV_SHAPE + ",precision=tf32")
    _tune("--op", "conv_fwd", "--shape", CONV_SHAPE + ",precision=tf32", "--precision", "tf32")
    assert [p.precision for _, p in asked] == ["fp32", "tf32", "tf32", "tf32"]
    rows = [json.loads(chunk)["results"][0] for chunk in _json_documents(capsys.readouterr().out)]
    assert [r["precision"] for r in rows] == ["fp32", "tf32", "tf32", "tf32"]
    assert rows[1]["shape"] == CONV_SHAPE + ",precision=tf32"


def test_tune_op_refuses_a_shape_and_a_flag_that_disagree(asked, capsys):
    assert _tune("--op", "conv_fwd", "--shape", CONV_SHAPE + ",precision=tf32", "--precision", "fp32") == 1
    err = capsys.readouterr().err
    assert "--shape says precision=tf32 but --precision says fp32" in err
    assert _tune("--op", "conv_fwd", "--shape", CONV_SHAPE + ",precision=fp32", "--precision", "tf32") == 1
    assert "--shape says precision=fp32 but --precision says tf32" in capsys.readouterr().err
    assert asked == []   # refused before anything was tuned


def test_tune_names_the_allowed_precisions(asked, capsys):
    with pytest.raises(SystemExit):
        _tune("--op", "conv_fwd", "--shape", CONV_SHAPE, "--precision", "bf16")
    err = capsys.readouterr().err
    assert "bf16" in err and "fp32" in err and "tf32" in err
    assert _tune("--op", "conv_fwd", "--shape", CONV_SHAPE + ",precision=fp16") == 1
    err = capsys.readouterr().err
    assert "fp16" in err and "fp32, tf32" in err


def test_tune_pooling_has_no_precision(asked):
    shape = "N=2,C=3,H=8,W=8,window=2"
    assert _tune("--op", "avgpool_fwd", "--shape", shape, "--precision", "tf32") == 1   # nothing tuned: fake
    assert asked[0][1] == parse_shape("avgpool_fwd", shape)


def test_tune_suite_applies_the_precision_to_every_convolution(asked):
    _tune("--suite", "seed", "--ops", "conv_fwd,avgpool_fwd", "--precision", "tf32")
    convs = [p for op, p in asked if op == "conv_fwd"]
    pools = [p for op, p in asked if op == "avgpool_fwd"]
    assert len(convs) == len(seed_problems("conv_fwd")) and {p.precision for p in convs} == {"tf32"}
    assert [(p.N, p.C, p.H, p.K) for p in convs] == [(p.N, p.C, p.H, p.K) for _, p in seed_problems("conv_fwd")]
    assert pools == [p for _, p in seed_problems("avgpool_fwd")]
    asked.clear()
    _tune("--suite", "seed", "--ops", "conv_wgrad")
    assert {p.precision for _, p in asked} == {"fp32"}


def _json_documents(text: str) -> list[str]:
    """The JSON documents printed one after another."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        obj, end = decoder.raw_decode(text, i)
        out.append(json.dumps(obj))
        i = end
    return out


# -- autocnn db with records of both precisions ---------------------------------------------------

@pytest.fixture
def two_precisions(tmp_path, monkeypatch):
    """A user database with one conv_wgrad record in fp32, the same shape in tf32, and a pooling record."""
    import autocnn.store.database

    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "db"))
    (tmp_path / "shipped").mkdir()
    monkeypatch.setattr(autocnn.store.database, "default_shipped_dir", lambda: tmp_path / "shipped")
    db = TuningDatabase()
    for path in (WGRAD_FILE, POOL_FILE):
        rf = ReplayFile.load(path)
        tuner = Tuner(ReplaySource([rf]), db, TuneSettings(storage=f"sqlite:///{tmp_path / 'o.db'}",
                                                           fixed=rf.space_filter, trials=4), progress=False)
        record = tuner.tune(rf.op, rf.problem).record
        if rf.op == "conv_wgrad":
            fp32 = record
    tf32_key = dataclasses.replace(fp32.key, problem={**fp32.key.problem, "precision": "tf32"})
    db.put(dataclasses.replace(fp32, key=tf32_key, time_us=fp32.time_us / 2))
    return ReplayFile.load(WGRAD_FILE).problem


def test_db_list_has_a_precision_column_and_filter(two_precisions, capsys):
    from autocnn.cli import main

    assert main(["db", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["gpu", "op", "precision", "shape"]
    shape = two_precisions.shape_string()
    wgrad = [line for line in lines if "conv_wgrad" in line]
    assert len(wgrad) == 2
    assert any(" fp32 " in line and f"{shape} " in line for line in wgrad)
    assert any(" tf32 " in line and f"{shape},precision=tf32" in line for line in wgrad)
    assert any("avgpool_bwd" in line and " - " in line for line in lines)

    assert main(["db", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["precision"] for r in rows) == ["-", "fp32", "tf32"]

    assert main(["db", "list", "--precision", "tf32", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["op"], r["precision"]) for r in rows] == [("conv_wgrad", "tf32")]
    assert main(["db", "list", "--precision", "tf32", "--op", "avgpool_bwd"]) == 0
    assert "no tuned record matches the filters" in capsys.readouterr().out


def test_db_show_states_the_precision_and_matches_shapes_at_it(two_precisions, capsys):
    from autocnn.cli import main

    shape = two_precisions.shape_string()
    assert main(["db", "show", "--op", "conv_wgrad"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert sorted(r["precision"] for r in shown) == ["fp32", "tf32"]
    fp32 = next(r for r in shown if r["precision"] == "fp32")
    assert "precision" not in fp32["key"]["problem"]      # fp32 records keep their keys

    assert main(["db", "show", "--op", "conv_wgrad", "--shape", shape]) == 0
    assert [r["precision"] for r in json.loads(capsys.readouterr().out)] == ["fp32"]
    for args in (["--shape", shape, "--precision", "tf32"], ["--shape", shape + ",precision=tf32"],
                 ["--precision", "tf32"]):
        assert main(["db", "show", "--op", "conv_wgrad", *args]) == 0
        assert [r["precision"] for r in json.loads(capsys.readouterr().out)] == ["tf32"]
    assert main(["db", "show", "--shape", shape + ",precision=tf32", "--precision", "fp32"]) == 1
    assert "--shape says precision=tf32 but --precision says fp32" in capsys.readouterr().err


def test_db_remove_by_precision_keeps_the_other(two_precisions, capsys):
    from autocnn.cli import main

    assert main(["db", "remove", "--op", "conv_wgrad", "--precision", "tf32", "--yes"]) == 0
    assert "removed 1" in capsys.readouterr().out
    left = [r for r in TuningDatabase().records() if r.key.op == "conv_wgrad"]
    assert len(left) == 1 and "precision" not in left[0].key.problem
