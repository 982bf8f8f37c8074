"""The tuning database: storage, validation of what is read back, and the lookup chain (CPU only)."""
from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
from pathlib import Path

import pytest

from autocnn.store import (NEAREST_SHAPE_MAX_DISTANCE, RECORD_FORMAT, DatabaseError, InvalidRecordWarning,
                        RecordError, RecordKey, StaleRecordError, StaleRecordWarning, TuningDatabase,
                        TuningRecord, now_utc, redact_storage_url, shape_distance)
from autocnn.device import DeviceInfo
from autocnn.errors import InfeasibleConfigError, InvalidConfigError
from autocnn.kernels import ConvFwdProblem, get_operation
from autocnn.kernels.suite import seed_shape

H200 = DeviceInfo("NVIDIA H200", "9.0", 132, 13020, 13000)
H200_OLD_DRIVER = DeviceInfo("NVIDIA H200", "9.0", 132, 13020, 12080)
H100 = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0", 132, 13000, 13000)
A100 = DeviceInfo("NVIDIA A100-SXM4-80GB", "8.0", 108, 13000, 13000)

KRIZ = seed_shape("kriz09").problem("conv_fwd")          # direct default config
MODERN = seed_shape("modern_56").problem("conv_fwd")     # implicit-GEMM default config


def default_config(problem, device=H200) -> dict:
    return get_operation(problem.op).default_config(problem, device.limits()).as_dict()


def make_record(device: DeviceInfo, problem, config: dict | None = None, time_us: float = 10.0,
                **changes) -> TuningRecord:
    config = config or default_config(problem, device)
    record = TuningRecord(
        key=RecordKey.for_(device, problem, get_operation(problem.op).config_fingerprint(config)), config=config,
        time_us=time_us, spread=0.02, default_time_us=2 * time_us, cudnn_time_us=None, trials=40,
        tuned_at=now_utc(), autocnn_version="0.1.0", sampler="tpe", study="s", storage=None,
        runner_up=None)
    return dataclasses.replace(record, **changes) if changes else record


def raw_file(path: Path, raws: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": RECORD_FORMAT, "records": raws}))


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    user = tmp_path / "user"
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(user))
    return user, shipped


@pytest.fixture
def db(dirs) -> TuningDatabase:
    user, shipped = dirs
    database = TuningDatabase(shipped_dir=shipped)
    assert database.user_dir == user    # AUTOCNN_TUNING_DB decides where user records go
    return database


# -- records ------------------------------------------------------------------------------------

def test_record_round_trip_and_key_identity():
    record = make_record(H200, KRIZ, runner_up={"config": {**default_config(KRIZ), "PAD": 2}, "time_us": 11.0})
    again = TuningRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert again == record
    assert again.key == record.key and hash(again.key) == hash(record.key)
    assert record.key != RecordKey.for_(H200_OLD_DRIVER, KRIZ)
    assert record.key.fingerprint == get_operation("conv_fwd").fingerprint(record.config["formulation"])
    assert record.speedup == pytest.approx(2.0)


@pytest.mark.parametrize("change, field", [
    (lambda d: d.pop("time_us"), "time_us"),
    (lambda d: d.update(trials="many"), "trials"),
    (lambda d: d.update(trials=True), "trials"),
    (lambda d: d.update(time_us=-3.0), "time_us"),
    (lambda d: d.update(time_us=float("inf")), "time_us"),
    (lambda d: d.update(tuned_at="yesterday"), "tuned_at"),
    (lambda d: d.update(config=["KB", 16]), "config"),
    (lambda d: d.update(config={"KB": [16]}), "config.KB"),
    (lambda d: d.update(surprise=1), "surprise"),
    (lambda d: d["key"].update(sm_count="132"), "key.sm_count"),
    (lambda d: d["key"].pop("driver"), "key.driver"),
    (lambda d: d.update(runner_up={"config": {}}), "runner_up"),
])
def test_from_dict_names_the_bad_field(change, field):
    data = make_record(H200, KRIZ).to_dict()
    change(data)
    with pytest.raises(RecordError) as info:
        TuningRecord.from_dict(data)
    assert info.value.field == field


def test_storage_password_is_never_kept():
    record = make_record(H200, KRIZ, storage="postgresql://tuner:hunter2@db.example/optuna")
    assert "hunter2" not in json.dumps(record.to_dict())
    assert record.storage == "postgresql://tuner:***@db.example/optuna"
    assert redact_storage_url("sqlite:////tmp/optuna.db") == "sqlite:////tmp/optuna.db"


# -- storage ------------------------------------------------------------------------------------

def test_put_records_and_exact_lookup(db):
    record = make_record(H200, KRIZ)
    db.put(record)
    path = db.user_dir / f"{H200.slug()}.json"
    assert path == db.path_for(H200) and path.exists()
    data = json.loads(path.read_text())
    assert data["format"] == RECORD_FORMAT and len(data["records"]) == 1
    assert db.records() == [record]
    result = db.lookup(H200, KRIZ)
    assert result.source == "exact"
    assert result.record == record
    assert result.config.as_dict() == record.config
    assert "this GPU" in result.detail


def test_put_same_key_replaces(db):
    db.put(make_record(H200, KRIZ, time_us=10.0))
    db.put(make_record(H200, KRIZ, time_us=8.0))
    db.put(make_record(H200, MODERN, time_us=30.0))
    times = sorted(r.time_us for r in db.records())
    assert times == [8.0, 30.0]
    assert db.lookup(H200, KRIZ).record.time_us == 8.0


def test_gpu_kinds_go_to_separate_files(db):
    db.put(make_record(H200, KRIZ))
    db.put(make_record(A100, KRIZ, config=default_config(KRIZ, A100)))
    files = sorted(p.name for p in db.user_dir.glob("*.json"))
    assert files == sorted([f"{H200.slug()}.json", f"{A100.slug()}.json"])
    for name in files:
        assert len(json.loads((db.user_dir / name).read_text())["records"]) == 1
    assert [r.key.gpu for r in db.records(device=A100)] == [A100.name]
    assert [r.key.gpu for r in db.records(arch="sm_90")] == [H200.name]


def test_put_refuses_a_record_loading_would_skip(db):
    stale = make_record(H200, KRIZ)
    stale = dataclasses.replace(stale, key=dataclasses.replace(stale.key, fingerprint="0" * 16))
    with pytest.raises(StaleRecordError):
        db.put(stale)
    with pytest.raises(RecordError, match="KB"):
        db.put(make_record(H200, KRIZ, config={**default_config(KRIZ), "KB": 12}))
    assert not db.path_for(H200).exists()


def _write_many(user_dir: str, shipped_dir: str, worker: int, count: int) -> None:
    database = TuningDatabase(Path(user_dir), Path(shipped_dir))
    for i in range(count):
        problem = ConvFwdProblem(N=worker * 100 + i + 1, C=16, H=16, W=16, K=16, R=3, S=3, padding=1)
        database.put(make_record(H200, problem, time_us=1.0 + i))


def test_concurrent_writers_lose_nothing(db):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(db.user_dir), str(db.shipped_dir), w, 10))
             for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    data = json.loads(db.path_for(H200).read_text())      # valid JSON
    assert len(data["records"]) == 40
    assert sorted(r.key.problem["N"] for r in db.records()) == sorted(
        w * 100 + i + 1 for w in range(4) for i in range(10))
    assert not list(db.user_dir.glob("*.tmp"))             # no temp file left behind


def test_corrupted_user_file_is_moved_aside(db):
    db.put(make_record(H200, KRIZ))
    path = db.path_for(H200)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])                 # a truncated write
    fresh = TuningDatabase(shipped_dir=db.shipped_dir)
    with pytest.warns(InvalidRecordWarning, match="not valid JSON"):
        result = fresh.lookup(H200, KRIZ)
    assert result.source == "default"
    assert any("not valid JSON" in p for p in fresh.check())
    with pytest.warns(InvalidRecordWarning, match="moved aside"):
        fresh.put(make_record(H200, MODERN))
    asides = list(db.user_dir.glob(f"{path.name}.corrupt-*"))
    assert len(asides) == 1 and asides[0].read_text() == text[: len(text) // 2]
    assert [r.key.problem["H"] for r in fresh.records()] == [MODERN.H]
    assert any("moved aside" in p for p in fresh.check())


def test_file_of_another_format_is_skipped_and_never_overwritten(db):
    path = db.path_for(H200)
    path.parent.mkdir(parents=True)
    content = json.dumps({"format": RECORD_FORMAT + 1, "records": [make_record(H200, KRIZ).to_dict()]})
    path.write_text(content)
    with pytest.warns(InvalidRecordWarning, match="format 2 is not supported"):
        assert db.records() == []
    with pytest.raises(DatabaseError, match="not overwriting"):
        db.put(make_record(H200, KRIZ))
    assert path.read_text() == content


# -- validation on load -------------------------------------------------------------------------

def _cfg(**changes):
    return lambda d: d["config"].update(changes)


BAD_RECORDS = [
    ("missing field", lambda d: d.pop("spread"), "spread: missing", InvalidRecordWarning),
    ("wrong type", lambda d: d.update(time_us="fast"), "time_us", InvalidRecordWarning),
    ("non-finite time", lambda d: d.update(time_us=float("nan")), "not a finite positive time",
     InvalidRecordWarning),
    ("zero default time", lambda d: d.update(default_time_us=0), "default_time_us", InvalidRecordWarning),
    ("stale fingerprint", lambda d: d["key"].update(fingerprint="0123456789abcdef"), "stale",
     StaleRecordWarning),
    ("unknown op", lambda d: (d["key"].update(op="conv3d_fwd"), d["key"]["problem"].update(op="conv3d_fwd")),
     "unknown operation", InvalidRecordWarning),
    ("unknown format", lambda d: d["key"].update(format=RECORD_FORMAT + 1), "format 2 is not supported",
     InvalidRecordWarning),
    ("problem does not parse", lambda d: d["key"]["problem"].update(N=0), "does not parse",
     InvalidRecordWarning),
    ("value not in the space", _cfg(KB=12), "KB=12", InvalidRecordWarning),
    ("CUDA text", _cfg(KB='16; asm("trap;");'), "trap", InvalidRecordWarning),
    ("extra parameter", _cfg(EVIL=1), "EVIL", InvalidRecordWarning),
    ("float for an int", _cfg(KB=16.0), "KB=16.0", InvalidRecordWarning),
    ("infeasible for its arch", _cfg(KB=64, KPT=1, TP=32, PPT=1, TQ=32, QPT=1), "infeasible",
     InvalidRecordWarning),
    ("malicious runner-up", lambda d: d.update(runner_up={"config": {**d["config"], "PAD": "1]; evil();//"},
                                                            "time_us": 12.0}),
     "runner_up.config", InvalidRecordWarning),
]


@pytest.mark.parametrize("change, reason, category", [c[1:] for c in BAD_RECORDS], ids=[c[0] for c in BAD_RECORDS])
def test_bad_record_is_skipped_with_a_warning(db, change, reason, category):
    good = make_record(H200, KRIZ).to_dict()
    assert good["config"]["formulation"] == "direct"     # the changes above name direct parameters
    bad = json.loads(json.dumps(good))
    change(bad)
    raw_file(db.path_for(H200), [bad])
    with pytest.warns(category) as caught:
        result = db.lookup(H200, KRIZ)
    messages = [str(w.message) for w in caught if issubclass(w.category, InvalidRecordWarning)]
    assert len(messages) == 1
    assert reason in messages[0] and str(db.path_for(H200)) in messages[0] and "record 0" in messages[0]
    assert result.source == "default" and result.record is None      # lookup fell through
    assert db.records() == []
    assert any(reason in p for p in db.check())


def test_one_bad_record_does_not_hide_the_good_ones(db):
    good = make_record(H200, KRIZ).to_dict()
    bad = make_record(H200, MODERN).to_dict()
    bad["config"]["BM"] = "128; evil()"
    stale = json.loads(json.dumps(good))
    stale["key"]["fingerprint"] = "0" * 16
    raw_file(db.path_for(H200), [bad, good, stale])
    with pytest.warns(InvalidRecordWarning) as caught:
        assert db.lookup(H200, KRIZ).source == "exact"
    # Only autocnn's warnings count: the full suite can let another (a ResourceWarning from a
    # garbage-collected file of an earlier test) land inside this block, as CI once saw.
    ours = [str(w.message) for w in caught if issubclass(w.category, InvalidRecordWarning)]
    assert sorted(m.split(": record ")[1][0] for m in ours) == ["0", "2"]
    assert [r.key.problem["H"] for r in db.records()] == [KRIZ.H]
    # A writer replaces the entry with its key (the bad one) and keeps entries of other keys it
    # cannot use: a stale record is harmless, and a newer autocnn may read what this one cannot.
    mine = make_record(H200, MODERN)
    db.put(mine)
    stored = json.loads(db.path_for(H200).read_text())["records"]
    assert stored == [good, stale, mine.to_dict()]


# -- lookup chain -------------------------------------------------------------------------------

def test_lookup_chain_exact_then_same_arch_then_default(db):
    assert db.lookup(H200, KRIZ).source == "default"
    db.put(make_record(A100, KRIZ, config=default_config(KRIZ, A100), time_us=1.0))   # other arch
    assert db.lookup(H200, KRIZ).source == "default"

    slow = make_record(H200_OLD_DRIVER, KRIZ, time_us=9.0)
    fast_cfg = {**default_config(KRIZ), "PAD": 2}
    fast = make_record(H100, KRIZ, config=fast_cfg, time_us=7.0)
    db.put(slow)
    db.put(fast)
    result = db.lookup(H200, KRIZ)
    assert result.source == "same_arch"
    assert result.record == fast and result.config.as_dict() == fast_cfg     # the fastest one

    exact = make_record(H200, KRIZ, time_us=12.0)
    db.put(exact)
    result = db.lookup(H200, KRIZ)
    assert result.source == "exact" and result.record == exact               # even though slower

    # Another operation with the same geometry never matches conv_fwd records.
    other_op = KRIZ.with_op("conv_bwd_data")
    result = db.lookup(H200, other_op)
    assert result.source == "default" and result.record is None
    assert result.config == get_operation("conv_bwd_data").default_config(other_op, H200.limits())


def test_one_record_per_shape_and_gpu_whichever_formulation_won(db):
    """A key holds the fingerprint of its config's formulation; a winner of another formulation
    replaces the record of the same shape and GPU, and lookup finds it as the exact one."""
    direct = make_record(H200, KRIZ)
    gemm_config = get_operation("conv_fwd").candidates(KRIZ, "igemm")[-1]
    gemm = make_record(H200, KRIZ, config=gemm_config, time_us=5.0)
    assert direct.config["formulation"] == "direct" and gemm.key.fingerprint != direct.key.fingerprint
    assert gemm.key == direct.key
    db.put(direct)
    db.put(gemm)
    assert [r.config for r in db.records()] == [gemm_config]
    result = db.lookup(H200, KRIZ)
    assert result.source == "exact" and result.record == gemm and result.config.as_dict() == gemm_config


def test_nearest_shape_skips_a_neighbour_whose_config_is_invalid_here(db):
    target = ConvFwdProblem(N=64, C=16, H=32, W=32, K=8, R=3, S=3, padding=1)
    space = get_operation("conv_fwd").space(target, H200.limits())
    near = dataclasses.replace(target, K=16)       # distance 1
    far = dataclasses.replace(target, N=256)       # distance 2
    direct = {"formulation": "direct", "KPT": 4, "TP": 8, "TQ": 32, "PPT": 2, "QPT": 4, "CB": 4,
              "PAD": 1, "UNROLL_R": 1}
    near_cfg = {**direct, "KB": 16}    # fine for K=16, too many channels per block for K=8
    far_cfg = {**direct, "KB": 8}
    with pytest.raises((InvalidConfigError, InfeasibleConfigError)):
        space.validate(near_cfg)
    assert shape_distance(target, near) < shape_distance(target, far) <= NEAREST_SHAPE_MAX_DISTANCE

    db.put(make_record(H200, near, config=near_cfg))
    assert db.lookup(H200, target).source == "default"      # the only neighbour does not fit
    db.put(make_record(H200, far, config=far_cfg))
    db.put(make_record(A100, target, config=default_config(target, A100)))   # sm_80: not a neighbour
    result = db.lookup(H200, target)
    assert result.source == "nearest_shape"
    assert result.record.key.problem["N"] == 256 and result.config.as_dict() == far_cfg
    assert "N=256" in result.detail
    assert db.neighbour_configs(H200, target, space, limit=3) == [space.validate(far_cfg)]


def test_shape_distance():
    assert shape_distance(KRIZ, KRIZ) == 0
    wider = dataclasses.replace(KRIZ, W=64)
    strided = dataclasses.replace(KRIZ, stride=(2, 2))
    assert shape_distance(KRIZ, wider) == shape_distance(wider, KRIZ) == pytest.approx(1.0)
    assert shape_distance(KRIZ, strided) == pytest.approx(4.0)      # strides weigh double, both axes
    assert shape_distance(KRIZ, dataclasses.replace(KRIZ, padding=(3, 3, 3, 3))) == pytest.approx(0.5)
    assert shape_distance(KRIZ, KRIZ.with_op("conv_wgrad")) == math.inf
    pool = seed_shape("kriz09_pool").problem("avgpool_fwd")
    assert shape_distance(pool, dataclasses.replace(pool, window=(2, 2), stride=(2, 2))) == pytest.approx(6.0)


def test_a_tf32_record_never_serves_an_fp32_request(db):
    tf32 = dataclasses.replace(KRIZ, precision="tf32")
    assert shape_distance(KRIZ, tf32) == math.inf
    db.put(make_record(H200, tf32))
    assert db.lookup(H200, tf32).source == "exact"
    assert db.lookup(H200, KRIZ).source == "default"       # not borrowed as a nearest shape either


def test_an_fp32_record_serves_a_tf32_request_as_a_slightly_farther_shape(db):
    from autocnn.store.lookup import PRECISION_DISTANCE

    tf32 = dataclasses.replace(KRIZ, precision="tf32")
    assert shape_distance(tf32, KRIZ) == PRECISION_DISTANCE
    db.put(make_record(H200, KRIZ))
    found = db.lookup(H200, tf32)
    assert found.source == "nearest_shape" and found.record.key.problem == KRIZ.to_dict()
    assert found.config.key() == db.lookup(H200, KRIZ).config.key()
    # A tf32 record of a shape as near (one size doubled) is preferred when it is faster; nearer wins.
    wider = dataclasses.replace(tf32, C=2 * tf32.C)
    assert shape_distance(tf32, wider) == pytest.approx(PRECISION_DISTANCE)
    tc = {"formulation": "tc", "BM": 32, "BN": 32, "BK": 8, "WM": 2, "WN": 2, "STAGES": 2, "CP_ASYNC": 0,
          "PAD_A": 8, "PAD_B": 4, "UNROLL_K": 0, "TABLE_A": 1, "VEC": 1, "NHWC": 0, "FRAG": "pair", "CROSS": 1}
    # A tensor-core fp32 config lacks the tf32-only rounding parameter: it is borrowed with its first
    # choice; the fp32-only way of splitting (CROSS) has no meaning in tf32 and is dropped.
    db.put(make_record(H200, dataclasses.replace(KRIZ, N=KRIZ.N // 2), config=tc, time_us=1.0))
    half = dataclasses.replace(tf32, N=KRIZ.N // 2)
    got = db.lookup(H200, half)
    assert got.source == "nearest_shape" and got.config["TF32_ROUND"] == "nearest" and got.config["FRAG"] == "pair"
    assert "CROSS" not in got.config.as_dict()


def test_far_shapes_are_not_borrowed(db):
    far = seed_shape("scherer10_l1").problem("conv_fwd")
    assert shape_distance(KRIZ, far) > NEAREST_SHAPE_MAX_DISTANCE
    db.put(make_record(H200, far))
    assert db.lookup(H200, KRIZ).source == "default"


# -- shipped records ------------------------------------------------------------------------------

def test_shipped_records_are_read_and_user_records_override_them(db):
    shipped = make_record(H200, KRIZ, time_us=20.0)
    raw_file(db.shipped_dir / f"{H200.slug()}.json", [shipped.to_dict()])
    before = {p.name: p.read_bytes() for p in db.shipped_dir.iterdir()}

    result = db.lookup(H200, KRIZ)
    assert result.source == "exact" and result.record == shipped and "shipped" in result.detail
    assert db.summary_rows()[0].origin == "shipped"

    mine = make_record(H200, KRIZ, config={**default_config(KRIZ), "PAD": 0}, time_us=15.0)
    db.put(mine)
    assert db.records() == [mine]
    assert db.lookup(H200, KRIZ).record == mine
    assert db.remove(mine.key) == 1
    assert db.lookup(H200, KRIZ).record == shipped       # shipped records cannot be removed
    assert db.remove(lambda r: True) == 0
    assert {p.name: p.read_bytes() for p in db.shipped_dir.iterdir()} == before   # never written


def test_default_shipped_dir_is_the_package_tuning_db():
    database = TuningDatabase(user_dir=Path("/nonexistent"))
    assert database.shipped_dir.name == "tuning_db"
    assert (database.shipped_dir / "__init__.py").exists()


# -- exchange and listing -----------------------------------------------------------------------

def test_export_import_round_trip(db, tmp_path):
    a = make_record(H200, KRIZ)
    b = make_record(H200, MODERN, time_us=30.0)
    c = make_record(A100, KRIZ, config=default_config(KRIZ, A100))
    for r in (a, b, c):
        db.put(r)
    out = tmp_path / "export.json"
    assert db.export(out, lambda r: r.key.gpu == H200.name) == 2
    other = TuningDatabase(user_dir=tmp_path / "other", shipped_dir=db.shipped_dir)
    report = other.import_file(out)
    assert set(report.accepted) == {a.key, b.key} and report.rejected == ()
    assert sorted(other.records(), key=lambda r: r.time_us) == [a, b]


def test_import_keep_faster_never_makes_a_record_slower(db, tmp_path):
    fast = make_record(H200, KRIZ, time_us=8.0, cudnn_time_us=12.0)
    slow_other = make_record(H200, MODERN, time_us=20.0)
    db.put_many([fast, slow_other])
    incoming = tmp_path / "incoming.json"
    slower = make_record(H200, KRIZ, time_us=9.0)          # slower than what is stored: kept out
    faster = make_record(H200, MODERN, time_us=15.0)       # faster, and without a cuDNN time
    new = make_record(A100, KRIZ, config=default_config(KRIZ, A100), time_us=50.0)
    raw_file(incoming, [slower.to_dict(), faster.to_dict(), new.to_dict()])
    report = db.import_file(incoming, keep_faster=True)
    assert len(report.accepted) == 3 and report.kept_existing == (slower.key,)
    stored = {r.key.identity(): r for r in db.records()}
    assert stored[fast.key.identity()].time_us == 8.0 and stored[fast.key.identity()].cudnn_time_us == 12.0
    assert stored[faster.key.identity()].time_us == 15.0
    assert stored[new.key.identity()].time_us == 50.0
    # Without the flag, the imported record replaces the stored one, slower or not.
    report = db.import_file(incoming)
    assert report.kept_existing == ()
    assert {r.key.identity(): r for r in db.records()}[slower.key.identity()].time_us == 9.0


def test_import_reports_rejections_and_stores_only_accepted(db, tmp_path):
    good = make_record(H200, KRIZ).to_dict()
    stale = json.loads(json.dumps(good))
    stale["key"]["fingerprint"] = "f" * 16
    evil = make_record(H200, MODERN).to_dict()
    evil["config"]["BM"] = "128\n#include </etc/passwd>"
    path = tmp_path / "incoming.json"
    raw_file(path, [good, stale, evil, "not a record"])
    report = db.import_file(path)
    assert len(report.accepted) == 1
    assert [r.index for r in report.rejected] == [1, 2, 3]
    assert "stale" in report.rejected[0].reason
    assert "BM" in report.rejected[1].reason and "conv_fwd" in report.rejected[1].what
    assert "not a mapping" in report.rejected[2].reason
    assert [r.key.problem["H"] for r in db.records()] == [KRIZ.H]
    assert report.failed
    lines = report.sentences(path)
    assert lines[0] == f"imported 1 of the 4 records in {path}"
    assert lines[1].startswith("record 1 (conv_fwd ") and "was not imported: key.fingerprint: stale" in lines[1]
    assert all("ImportRejection" not in line for line in lines)
    # A file whose every record is rejected fails, and says so.
    raw_file(path, [stale, evil])
    report = db.import_file(path)
    assert report.failed and report.sentences(path)[-1] == f"no record of {path} was imported"
    raw_file(path, [good])
    assert not db.import_file(path).failed
    path.write_text("{")
    with pytest.raises(DatabaseError, match="not valid JSON"):
        db.import_file(path)


def test_remove_by_predicate(db):
    db.put(make_record(H200, KRIZ))
    db.put(make_record(H200, MODERN, time_us=30.0))
    assert db.remove(lambda r: r.time_us > 20) == 1
    assert [r.time_us for r in db.records()] == [10.0]
    assert db.remove(lambda r: False) == 0


def test_summary_rows(db):
    db.put(make_record(H200, KRIZ, time_us=10.0))
    (row,) = db.summary_rows()
    assert (row.gpu, row.arch, row.op, row.origin) == (H200.name, "sm_90", "conv_fwd", "user")
    assert row.shape == KRIZ.shape_string()
    assert row.config.startswith("formulation=direct")
    assert row.time_us == 10.0 and row.default_time_us == 20.0 and row.speedup == pytest.approx(2.0)


def test_db_module_does_not_import_cupy():
    import subprocess
    import sys

    code = "import sys, autocnn.store; print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- stale records ------------------------------------------------------------------------------

def test_stale_records_name_the_shapes_to_tune_again_and_their_old_configs(db):
    """A record tuned with older templates is never run, but it says which shape to tune again
    (until a current record of the GPU kind exists) and offers its config as a first guess."""
    other = seed_shape("kriz09").problem("conv_bwd_data")
    old = make_record(H200, KRIZ, config={**default_config(KRIZ), "PAD": 0}, time_us=20.0)
    old = dataclasses.replace(old, key=dataclasses.replace(old.key, fingerprint="0123456789abcdef"))
    old_other = make_record(H100, other)
    old_other = dataclasses.replace(old_other, key=dataclasses.replace(old_other.key, fingerprint="fedcba9876543210"))
    raw_file(db.shipped_dir / f"{H200.slug()}.json", [old.to_dict()])
    raw_file(db.shipped_dir / f"{H100.slug()}.json", [old_other.to_dict()])

    with pytest.warns(StaleRecordWarning):
        assert db.lookup(H200, KRIZ).source == "default"           # stale: never run
    assert sorted(r.key.identity() for r, _ in db.stale_records()) == sorted([old.key.identity(), old_other.key.identity()])
    assert db.stale_problems(H200) == [KRIZ]                        # this GPU kind only
    assert db.stale_problems(H200_OLD_DRIVER) == [KRIZ]             # a driver update changes no kind
    assert db.stale_problems(H200, ops=["conv_bwd_data"]) == []
    assert db.stale_problems(H100) == [other]
    space = get_operation("conv_fwd").space(KRIZ, H200.limits())
    assert [c.as_dict() for c in db.stale_configs(H200, KRIZ, space)] == [old.config]
    assert db.stale_configs(A100, KRIZ, space) == []                # another architecture

    db.put(make_record(H200, KRIZ, time_us=18.0))                  # tuned again with current templates
    assert db.stale_problems(H200) == []
    assert [c.as_dict() for c in db.stale_configs(H200, KRIZ, space)] == [old.config]


def test_remove_stale_user_records_only(db):
    stale = make_record(H200, KRIZ)
    stale = dataclasses.replace(stale, key=dataclasses.replace(stale.key, fingerprint="0123456789abcdef"))
    current = make_record(H200, MODERN)
    raw_file(db.user_dir / f"{H200.slug()}.json", [stale.to_dict(), current.to_dict()])
    assert db.remove(lambda r: any(r.key == s.key for s, _ in db.stale_records())) == 1
    assert db.stale_records() == [] and db.records() == [current]


def test_db_list_says_which_records_were_tuned_quickly(db, monkeypatch, capsys):
    import autocnn.store.database
    from autocnn.cli import main

    monkeypatch.setattr(autocnn.store.database, "default_shipped_dir", lambda: db.shipped_dir)
    db.put(make_record(H200, KRIZ, quick=True))
    db.put(make_record(H200, MODERN))
    assert main(["db", "list"]) == 0
    lines = {line.split()[-1] for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines == {"quick", "full"}
    assert [r.quick for r in db.summary_rows() if r.shape == KRIZ.shape_string()] == [True]
