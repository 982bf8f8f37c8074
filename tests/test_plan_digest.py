"""Record currency by plan digest (CPU only): KernelPlan.code_digest hashes the code a plan runs and
how it launches it, not the config nor the fingerprint, and a record whose fingerprint is old but
whose config (completed with the first choice of parameters added since) still plans to its digest
is current, re-keyed to the current fingerprint (autocnn.store.records.validate_record)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from autocnn.device import DeviceInfo
from autocnn.kernels import get_operation
from autocnn.kernels.plan import code_text
from autocnn.kernels.steps import Launch
from autocnn.kernels.suite import seed_shape
from autocnn.store import (RecordError, RecordKey, StaleRecordError, StaleRecordWarning, TuningDatabase,
                           TuningRecord, now_utc, validate_record)
from autocnn.store.files import as_loaded, read_raw

H200 = DeviceInfo("NVIDIA H200", "9.0", 132, 13020, 13000)
KRIZ = seed_shape("kriz09").problem("conv_fwd")       # the direct formulation's default
OP = get_operation("conv_fwd")
OLD = "0123456789abcdef"                              # a fingerprint no template has now


def default_config():
    return OP.default_config(KRIZ, H200.limits())


def make_record(config: dict, fingerprint: str | None = None, time_us: float = 10.0, **changes) -> TuningRecord:
    fingerprint = fingerprint or OP.config_fingerprint(config)
    record = TuningRecord(key=RecordKey.for_(H200, KRIZ, fingerprint), config=config, time_us=time_us, spread=0.01,
                          default_time_us=None, cudnn_time_us=None, trials=5, tuned_at=now_utc(),
                          autocnn_version="0.1.0", sampler="tpe")
    return dataclasses.replace(record, **changes) if changes else record


@pytest.fixture
def db(tmp_path, monkeypatch) -> TuningDatabase:
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "user"))
    (tmp_path / "shipped").mkdir()
    return TuningDatabase(user_dir=tmp_path / "user", shipped_dir=tmp_path / "shipped")


def write_user(db: TuningDatabase, records: list[TuningRecord]) -> None:
    path = db.path_for(H200)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": 1, "records": [r.to_dict() for r in records]}))


# -- the digest -------------------------------------------------------------------------------------

def test_the_digest_ignores_the_header_lines_naming_the_config_and_fingerprint():
    plan = OP.plan(KRIZ, default_config())
    lines = plan.source.splitlines()
    config_line = next(i for i, line in enumerate(lines) if line.startswith("// config: "))
    note_line = next(i for i, line in enumerate(lines) if line.startswith("// Do not edit: rendered from"))
    renamed = list(lines)
    renamed[config_line] = "// config: formulation=direct NEW_PARAM=0 " + lines[config_line][len("// config: "):]
    renamed[note_line] = lines[note_line].replace(plan.fingerprint, OLD)
    assert renamed != lines
    other = dataclasses.replace(plan, source="\n".join(renamed) + "\n", fingerprint=OLD)
    assert other.code_digest == plan.code_digest
    assert "// config: " not in code_text(plan.source) and len(code_text(plan.source)) < len(plan.source)
    assert len(plan.code_digest) == len(plan.fingerprint) == 16 and int(plan.code_digest, 16) >= 0
    assert OP.code_digest(KRIZ, default_config()) == plan.code_digest


def test_the_digest_changes_with_any_code_line_launch_or_workspace():
    plan = OP.plan(KRIZ, default_config())
    launch = plan.steps[0]
    assert isinstance(launch, Launch)
    changed = [
        dataclasses.replace(plan, source=plan.source.replace("#define ACNN_RESTRICT __restrict__", "#define ACNN_RESTRICT")),
        dataclasses.replace(plan, source=plan.source.replace("// autocnn generated kernel:", "// generated kernel:")),
        dataclasses.replace(plan, steps=(dataclasses.replace(launch, grid=(launch.grid[0] + 1, *launch.grid[1:])),)),
        dataclasses.replace(plan, steps=(dataclasses.replace(launch, block=(launch.block[0] * 2, 1, 1)),)),
        dataclasses.replace(plan, steps=(dataclasses.replace(launch, shared_bytes=launch.shared_bytes + 16),)),
        dataclasses.replace(plan, workspaces=(("scratch", 1024),)),
        dataclasses.replace(plan, zero_first=("y",)),
        dataclasses.replace(plan, outputs=("y", "extra")),
    ]
    digests = [p.code_digest for p in changed]
    assert all(p.source != plan.source or p.steps != plan.steps or p.workspaces != plan.workspaces
               or p.zero_first != plan.zero_first or p.outputs != plan.outputs for p in changed)
    assert plan.code_digest not in digests and len(set(digests)) == len(digests)
    # Another config of the formulation generates other code.
    assert OP.plan(KRIZ, OP.space(KRIZ, H200.limits()).validate({**default_config().as_dict(), "PAD": 2})
                   ).code_digest != plan.code_digest


# -- the record field -------------------------------------------------------------------------------

def test_plan_digest_round_trips_and_is_written_only_when_set():
    config = default_config().as_dict()
    without = make_record(config)
    assert "plan_digest" not in without.to_dict() and TuningRecord.from_dict(without.to_dict()) == without
    digest = OP.code_digest(KRIZ, default_config())
    with_digest = dataclasses.replace(without, plan_digest=digest)
    data = json.loads(json.dumps(with_digest.to_dict()))
    assert data["plan_digest"] == digest
    assert TuningRecord.from_dict(data) == with_digest
    for bad in ("", "  ", 5, ["x"]):
        with pytest.raises(RecordError) as info:
            TuningRecord.from_dict({**data, "plan_digest": bad})
        assert info.value.field == "plan_digest"


# -- currency ---------------------------------------------------------------------------------------

def test_an_old_fingerprint_with_the_same_code_is_current_and_re_keyed():
    config = default_config()
    digest = OP.code_digest(KRIZ, config)
    old = make_record(config.as_dict(), OLD, plan_digest=digest)
    valid = validate_record(old)
    assert valid.record.key.fingerprint == OP.config_fingerprint(config) != OLD
    assert valid.record.key == RecordKey.for_(H200, KRIZ)       # the key a lookup asks for
    assert valid.record.config == config.as_dict() and valid.config == config
    assert valid.record.plan_digest == digest and valid.record.time_us == old.time_us
    # Without a digest, or with another one, the record is stale as before.
    with pytest.raises(StaleRecordError, match="no plan digest"):
        validate_record(dataclasses.replace(old, plan_digest=None))
    with pytest.raises(StaleRecordError, match="code its config generates differs") as info:
        validate_record(dataclasses.replace(old, plan_digest="ffffffffffffffff"))
    assert info.value.field == "key.fingerprint"
    # A record current by its fingerprint is not planned, whatever digest it holds.
    current = make_record(config.as_dict(), plan_digest="ffffffffffffffff")
    assert validate_record(current).record == current


def test_a_config_lacking_a_parameter_added_since_completes_to_its_first_choice():
    """As if UNROLL_R had been added after tuning with the old code as its first choice: the
    completed config plans to the record's digest, so the record is current with the parameter set."""
    config = default_config()
    space = OP.space(KRIZ, H200.limits())
    assert config["UNROLL_R"] == space.param("UNROLL_R").choices[0]
    digest = OP.code_digest(KRIZ, config)
    lacking = {k: v for k, v in config.as_dict().items() if k != "UNROLL_R"}
    runner = {k: v for k, v in {**config.as_dict(), "KB": 32}.items() if k != "UNROLL_R"}
    old = make_record(lacking, OLD, plan_digest=digest, runner_up={"config": runner, "time_us": 11.0})
    valid = validate_record(old)
    assert valid.config == config and valid.record.config == config.as_dict()
    assert valid.record.runner_up["config"] == {**runner, "UNROLL_R": space.param("UNROLL_R").choices[0]}
    assert valid.record.key.fingerprint == OP.config_fingerprint(config)
    # With the current fingerprint an incomplete config is invalid, as before (nothing is completed).
    with pytest.raises(RecordError, match="UNROLL_R") as info:
        validate_record(make_record(lacking, plan_digest=digest))
    assert not isinstance(info.value, StaleRecordError)
    # A parameter whose value was not the first choice completes to other code: stale.
    assert config["PAD"] != space.param("PAD").choices[0]
    no_pad = {k: v for k, v in config.as_dict().items() if k != "PAD"}
    with pytest.raises(StaleRecordError, match="differs"):
        validate_record(make_record(no_pad, OLD, plan_digest=digest))


def test_a_runner_up_lacking_a_parameter_added_since_is_completed():
    """A current winner whose runner-up (for information only) lacks a parameter added to its
    formulation since: the runner-up is completed with that parameter's first choice, not refused."""
    config = default_config()
    space = OP.space(KRIZ, H200.limits())
    runner = {k: v for k, v in {**config.as_dict(), "KB": 32}.items() if k != "UNROLL_R"}
    record = make_record(config.as_dict(), runner_up={"config": runner, "time_us": 11.0})
    valid = validate_record(record)
    assert valid.record.key == record.key and valid.record.config == record.config
    assert valid.record.runner_up == {"config": {**runner, "UNROLL_R": space.param("UNROLL_R").choices[0]},
                                      "time_us": 11.0}
    with pytest.raises(RecordError) as info:
        validate_record(make_record(config.as_dict(), runner_up={"config": {**runner, "KB": 12}, "time_us": 11.0}))
    assert info.value.field == "runner_up.config"


def test_the_database_uses_replaces_removes_and_rekeys_a_record_current_by_digest(db, monkeypatch, capsys):
    config = default_config()
    digest = OP.code_digest(KRIZ, config)
    old = make_record(config.as_dict(), OLD, time_us=5.0, plan_digest=digest)
    stale = dataclasses.replace(make_record(config.as_dict(), OLD, plan_digest="ffffffffffffffff"),
                                key=RecordKey.for_(H200, seed_shape("modern_56").problem("conv_fwd"), OLD))
    write_user(db, [old, stale])
    with pytest.warns(StaleRecordWarning, match="code its config generates differs"):
        found = db.lookup(H200, KRIZ)
    assert found.source == "exact" and found.record.time_us == 5.0 and found.config == config
    assert [r.key.identity() for r, _ in db.stale_records()] == [stale.key.identity()]
    notes = db.current_by_digest()
    assert len(notes) == 1 and "record 0" in notes[0] and "plan digest only" in notes[0] and OLD in notes[0]
    assert as_loaded(old).key == RecordKey.for_(H200, KRIZ) and as_loaded(stale) == stale

    # A slower record of the same key does not replace it; a faster one does, in its place.
    assert db.put_many([make_record(config.as_dict(), time_us=8.0)], keep_faster=True) == []
    assert db.put_many([make_record(config.as_dict(), time_us=4.0)], keep_faster=True) != []
    raws = read_raw(db.path_for(H200))
    assert len(raws) == 2 and [r["time_us"] for r in raws if r["key"]["problem"] == KRIZ.to_dict()] == [4.0]

    write_user(db, [old, stale])
    assert db.remove(RecordKey.for_(H200, KRIZ)) == 1 and len(read_raw(db.path_for(H200))) == 1

    # `autocnn db check` names it and still finds the database consistent apart from the stale record;
    # --rekey writes it with the current fingerprint and its completed config.
    import autocnn.store.database
    from autocnn.cli import main

    monkeypatch.setattr(autocnn.store.database, "default_shipped_dir", lambda: db.shipped_dir)
    write_user(db, [old])
    assert main(["db", "check"]) == 0
    out = capsys.readouterr().out
    assert "current by its plan digest only" in out and "the tuning database is consistent" in out
    assert main(["db", "check", "--rekey"]) == 0
    assert "re-keyed 1 user records" in capsys.readouterr().out
    [raw] = read_raw(db.path_for(H200))
    assert raw["key"]["fingerprint"] == OP.config_fingerprint(config) and raw["plan_digest"] == digest
    assert db.current_by_digest() == [] and db.records() == [validate_record(old).record]
