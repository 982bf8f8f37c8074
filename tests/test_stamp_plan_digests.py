"""scripts/stamp_plan_digests.py --drop-replaced: after a template edit changed a tuned config's code and
the shape was tuned again, the stale record beside its replacement goes; a stale record with no
replacement, and every current one, stays."""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import stamp_plan_digests  # noqa: E402
from autocnn.store.files import default_shipped_dir, read_raw  # noqa: E402


def _stale(raw: dict) -> dict:
    """The record as if tuned with other templates whose code differed (fingerprint and digest)."""
    old = copy.deepcopy(raw)
    old["key"]["fingerprint"] = "0123456789abcdef"
    old["plan_digest"] = "fedcba9876543210"
    old["time_us"] = raw["time_us"] * 1.5
    return old


def test_drop_replaced_removes_only_stale_records_that_were_tuned_again():
    raws = read_raw(sorted(default_shipped_dir().glob("*.json"))[0])
    replaced, alone = raws[0], raws[1]
    assert json.dumps(replaced["key"]["problem"], sort_keys=True) != json.dumps(alone["key"]["problem"], sort_keys=True)
    entries = [_stale(replaced), replaced, _stale(alone)]   # the second shape's current record left out

    kept, notes = stamp_plan_digests.drop_replaced(entries)

    assert kept == [replaced, entries[2]]
    assert len(notes) == 1 and "record 0" in notes[0] and "tuned again" in notes[0]
    assert stamp_plan_digests.drop_replaced(kept)[0] == kept   # nothing more to drop


def test_check_reports_a_stale_record_that_drop_replaced_would_remove(tmp_path, capsys):
    from autocnn.store.files import _document_text, file_document

    raws = read_raw(sorted(default_shipped_dir().glob("*.json"))[0])
    path = tmp_path / "gpu.json"
    path.write_text(_document_text(file_document([_stale(raws[0]), raws[0]])), encoding="utf-8")
    before = path.read_text(encoding="utf-8")

    assert stamp_plan_digests.main(["--check", "--drop-replaced", str(tmp_path)]) == 1
    assert path.read_text(encoding="utf-8") == before   # --check writes nothing
    assert stamp_plan_digests.main(["--drop-replaced", str(tmp_path)]) == 0
    assert read_raw(path) == [raws[0]]
    assert "dropped: stale, and tuned again since" in capsys.readouterr().out
