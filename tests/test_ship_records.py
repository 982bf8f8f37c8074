"""scripts/ship_records.py: tuned records merged into the shipped database, the faster of each key
kept, invalid ones rejected and never written, no lock files left behind."""
from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

from autocnn.store.files import _document_text, file_document, read_raw

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "tuning_db" / "nvidia-h100-80gb-hbm3_sm90.json"


def _script():
    spec = importlib.util.spec_from_file_location("ship_records", ROOT / "scripts" / "ship_records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(path: Path, raws: list) -> None:
    path.write_text(_document_text(file_document(raws)), encoding="utf-8")


def _identity(raw) -> str:
    return json.dumps(raw["key"], sort_keys=True)


def test_faster_records_replace_slower_ones_are_kept_out_invalid_ones_rejected(tmp_path, capsys):
    shipped_raws = read_raw(H100)
    a, b, c = (copy.deepcopy(r) for r in shipped_raws[:3])
    into = tmp_path / "tuning_db"
    into.mkdir()
    _write(into / H100.name, [a, b])

    faster, slower = copy.deepcopy(a), copy.deepcopy(b)
    faster["time_us"] = a["time_us"] * 0.9
    slower["time_us"] = b["time_us"] * 1.1
    broken = copy.deepcopy(c)
    broken["key"]["problem"]["C"] = -1                       # no such problem: rejected on validation
    export = tmp_path / "tuned.json"
    _write(export, [faster, slower, c, broken])

    status = _script().ship([export], into)
    out = capsys.readouterr().out
    assert status == 1, "a rejected record makes the run fail"
    assert "imported 2 of the 4 records" in out and "kept 1 existing" in out
    merged = {_identity(r): r for r in read_raw(into / H100.name)}
    assert len(merged) == 3
    assert merged[_identity(a)]["time_us"] == faster["time_us"]
    assert merged[_identity(b)]["time_us"] == b["time_us"]
    assert _identity(c) in merged and _identity(broken) not in merged
    assert not list(into.glob("*.lock"))


def test_missing_inputs_are_named_before_anything_is_written(tmp_path, capsys):
    ship = _script().ship
    assert ship([tmp_path / "nope.json"], tmp_path) == 1
    assert "no such file" in capsys.readouterr().err
    assert ship([H100], tmp_path / "absent") == 1
    assert "is not a directory" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
