"""The workspace limit (--workspace-limit, $AUTOCNN_WORKSPACE_LIMIT): parsing, and that no config a
space admits under a limit plans more scratch memory than the limit, for every formulation."""
from __future__ import annotations

import dataclasses
import random

import pytest

from autocnn.device import (DEFAULT_WORKSPACE_BYTES, WORKSPACE_LIMIT_ENV, DeviceInfo, DeviceLimits,
                            parse_workspace_limit, workspace_limit)
from autocnn.kernels import OPERATIONS
from autocnn.kernels.suite import CONV_OPS, POOL_OPS, odd_problems, seed_problems

MiB = 1024 * 1024


@pytest.mark.parametrize("text, expected", [
    ("256MiB", 256 * MiB), ("1GiB", 1024 * MiB), ("64M", 64 * MiB), ("1.5 GiB", 1536 * MiB),
    ("2MB", 2_000_000), ("0", 0), ("4096", 4096), (123, 123), ("512 kib", 512 * 1024),
])
def test_sizes_parse(text, expected):
    assert parse_workspace_limit(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "12 parsecs", "-1", "-5MiB", "1e9", True])
def test_a_bad_size_names_the_option_and_the_accepted_forms(text):
    with pytest.raises(ValueError, match=r"--workspace-limit: .*(KiB, MiB, GiB|>= 0|not a size)"):
        parse_workspace_limit(text)


def test_the_environment_sets_the_process_limit(monkeypatch):
    monkeypatch.delenv(WORKSPACE_LIMIT_ENV, raising=False)
    assert workspace_limit() == DEFAULT_WORKSPACE_BYTES
    monkeypatch.setenv(WORKSPACE_LIMIT_ENV, "16MiB")
    assert workspace_limit() == 16 * MiB
    info = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0", 132, 13000, 13000)
    assert info.limits().workspace_bytes == 16 * MiB
    assert info.limits(workspace_bytes=0).workspace_bytes == 0
    monkeypatch.setenv(WORKSPACE_LIMIT_ENV, "much")
    with pytest.raises(ValueError, match=r"\$AUTOCNN_WORKSPACE_LIMIT: 'much' is not a size"):
        workspace_limit()


def _problems():
    for op in OPERATIONS:   # the five and every operation registered after them
        for name, problem in seed_problems(op) + odd_problems(op):
            yield op, name, problem


@pytest.mark.parametrize("limit", [0, 1 * MiB, 24 * MiB])
def test_no_admitted_config_plans_more_workspace_than_the_limit(limit):
    limits = dataclasses.replace(DeviceLimits.for_arch("sm_90"), workspace_bytes=limit)
    rng = random.Random(limit)
    checked = with_workspace = 0
    for op, name, problem in _problems():
        operation = OPERATIONS[op]
        space = operation.space(problem, limits)
        for config in space.sample(rng, 40):
            used = operation.workspace_bytes(problem, config)
            assert used <= limit, f"{op} {name} {config}: {used} bytes > limit {limit}"
            checked += 1
            with_workspace += used > 0
        # The default is feasible under any limit: some formulation needs no workspace.
        default = operation.default_config(problem, limits)
        assert operation.workspace_bytes(problem, default) <= limit
    assert checked > 500
    if limit:
        assert with_workspace > 0, "no sampled config used a workspace: the check saw nothing"


def test_a_smaller_limit_removes_exactly_the_configs_that_need_more():
    # conv_wgrad's two-pass split keeps partial sums in a workspace: its biggest splits go first.
    name, problem = next((n, p) for n, p in seed_problems("conv_wgrad") if n == "modern_56")
    operation = OPERATIONS["conv_wgrad"]
    base = DeviceLimits.for_arch("sm_90")
    roomy = operation.space(problem, base)
    tight = operation.space(problem, dataclasses.replace(base, workspace_bytes=2 * MiB))
    rng = random.Random(7)
    sample = roomy.sample(rng, 300)
    needs = [c for c in sample if operation.workspace_bytes(problem, c) > 2 * MiB]
    assert needs, "the sample holds no config with a workspace above 2 MiB"
    for config in sample:
        assert tight.is_feasible(config) == (operation.workspace_bytes(problem, config) <= 2 * MiB
                                             and roomy.is_feasible(config))


# -- records and lookups under a limit ----------------------------------------------------------

def _two_pass_record(tmp_path, monkeypatch):
    """A user record of modern_56's weight gradient whose config keeps split sums in a workspace."""
    from autocnn.store import RecordKey, TuningDatabase, TuningRecord, now_utc

    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "user"))
    (tmp_path / "shipped").mkdir()
    db = TuningDatabase(shipped_dir=tmp_path / "shipped")
    info = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0", 132, 13000, 13000)
    name, problem = next((n, p) for n, p in seed_problems("conv_wgrad") if n == "modern_56")
    operation = OPERATIONS["conv_wgrad"]
    space = operation.space(problem, info.limits(workspace_bytes=DEFAULT_WORKSPACE_BYTES))
    config = max(space.sample(random.Random(3), 300), key=lambda c: operation.workspace_bytes(problem, c))
    used = operation.workspace_bytes(problem, config)
    assert used > 2 * MiB
    record = TuningRecord(
        key=RecordKey.for_(info, problem, operation.config_fingerprint(config)), config=config.as_dict(),
        time_us=5.0, spread=0.01, default_time_us=9.0, cudnn_time_us=None, trials=30, tuned_at=now_utc(),
        autocnn_version="0.1.0", sampler="tpe", workspace_bytes=used)
    db.put_many([record])
    return db, info, problem, config, used


def test_a_record_says_its_workspace_and_a_lookup_holds_it_to_the_limit_in_force(tmp_path, monkeypatch):
    from autocnn.store import TuningRecord

    monkeypatch.delenv(WORKSPACE_LIMIT_ENV, raising=False)
    db, info, problem, config, used = _two_pass_record(tmp_path, monkeypatch)
    again = TuningRecord.from_dict(db.lookup(info, problem).record.to_dict())
    assert again.workspace_bytes == used
    assert db.lookup(info, problem).config == config and db.lookup(info, problem).source == "exact"
    # Under a limit it does not fit, the record is passed over (it stays stored), and what the
    # lookup hands out instead fits.
    monkeypatch.setenv(WORKSPACE_LIMIT_ENV, str(used - 1))
    fallback = db.lookup(info, problem)
    assert fallback.config != config
    assert OPERATIONS["conv_wgrad"].workspace_bytes(problem, fallback.config) <= used - 1
    # Reading the database applies no limit: a record tuned under a larger one is not skipped.
    monkeypatch.setenv(WORKSPACE_LIMIT_ENV, "0")
    assert len(db.records()) == 1


def test_workspace_bytes_must_be_a_count():
    from autocnn.store import RecordError, RecordKey, TuningRecord, now_utc

    info = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0", 132, 13000, 13000)
    name, problem = seed_problems("conv_fwd")[0]
    config = OPERATIONS["conv_fwd"].default_config(problem, info.limits())
    with pytest.raises(RecordError, match="workspace_bytes"):
        TuningRecord(key=RecordKey.for_(info, problem, OPERATIONS["conv_fwd"].config_fingerprint(config)),
                     config=config.as_dict(), time_us=5.0, spread=0.0, default_time_us=None, cudnn_time_us=None,
                     trials=1, tuned_at=now_utc(), autocnn_version="0.1.0", sampler="tpe", workspace_bytes=-4)


def test_db_show_gives_every_record_its_workspace(tmp_path, monkeypatch, capsys):
    import json

    from autocnn import cli

    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "empty"))
    assert cli.main(["db", "show", "--op", "conv_wgrad"]) == 0    # the shipped records
    shown = json.loads(capsys.readouterr().out)
    assert shown and all(isinstance(r["workspace_bytes"], int) and r["workspace_bytes"] >= 0 for r in shown)
    assert any(r["workspace_bytes"] > 0 for r in shown)   # some shipped wgrad records split in two passes
