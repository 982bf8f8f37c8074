"""Every command checks, before any search, compile or device work, what it needs at its end: each
failure one sentence naming the path or URL and what to do, a non-zero exit, no traceback.

Tests run as root, for whom no permission bit makes a directory unwritable: a read-only or full
file system is made by failing the probe write (``tempfile.mkstemp`` in autocnn.preflight) or the
database's own write (``files.atomic_write_json``) for paths under a directory.
"""
from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path

import pytest

from autocnn import cli
from autocnn.measurement.sources import ReplayFile

REPLAY = Path(__file__).parent / "data" / "replay"
POOL_FILE = REPLAY / "avgpool_fwd__kriz09_pool.json.gz"
POOL = ReplayFile.load(POOL_FILE)
POOL_ARGS = ["--op", POOL.op, "--shape", POOL.problem.shape_string()]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A new user's HOME: nothing in it, no autocnn variables."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("AUTOCNN_TUNING_DB", "AUTOCNN_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return home


def read_only(monkeypatch, directory: Path, error: int = errno.EROFS) -> None:
    """Make file creation under ``directory`` fail as a read-only (or full) file system does."""
    import autocnn.preflight as preflight

    real = tempfile.mkstemp
    root = str(directory)

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and (str(dir) == root or str(dir).startswith(root + os.sep)):
            raise OSError(error, os.strerror(error), str(dir))
        return real(*args, dir=dir, **kwargs)
    monkeypatch.setattr(preflight.tempfile, "mkstemp", mkstemp)


def one_sentence(err: str, *parts: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    hit = [line for line in lines if all(p in line for p in parts)]
    assert hit, err
    return hit[0]


def test_tune_into_a_read_only_database_is_refused_before_any_trial(home, monkeypatch, capsys, no_gpu_source):
    db = home / ".cache" / "autocnn" / "tuning_db"
    db.mkdir(parents=True)   # made by an earlier run, now on a read-only file system
    read_only(monkeypatch, db.parent)   # the cache directory and all under it
    code = cli.main(["tune", *POOL_ARGS, "--replay", str(POOL_FILE), "--trials", "108"])
    err = capsys.readouterr().err
    assert code == 1
    line = one_sentence(err, "autocnn cache directory", str(db.parent), "Read-only file system", "AUTOCNN_CACHE_DIR")
    assert line.startswith("autocnn: ")


def test_tune_with_an_unwritable_database_directory_names_it_and_the_variable(home, monkeypatch, capsys,
                                                                              no_gpu_source):
    db = home / "records"
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(db))
    read_only(monkeypatch, db)
    db.mkdir()
    assert cli.main(["tune", *POOL_ARGS, "--replay", str(POOL_FILE)]) == 1
    one_sentence(capsys.readouterr().err, "tuning database directory", str(db), "AUTOCNN_TUNING_DB")


def test_an_unwritable_home_is_one_sentence(home, monkeypatch, capsys, no_gpu_source):
    read_only(monkeypatch, home, errno.EACCES)
    assert cli.main(["tune", *POOL_ARGS, "--replay", str(POOL_FILE)]) == 1
    line = one_sentence(capsys.readouterr().err, str(home / ".cache" / "autocnn"), "Permission denied")
    assert f"(it would be made in {home})" in line


@pytest.mark.parametrize("command", [["db", "import", "IMPORT"], ["db", "remove", "--op", "conv_fwd", "--yes"]])
def test_db_writes_into_a_read_only_database_are_refused(home, monkeypatch, capsys, tmp_path, command):
    db = tmp_path / "db"
    db.mkdir()
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(db))
    source = tmp_path / "in.json"
    source.write_text(json.dumps({"format": 1, "records": []}))
    read_only(monkeypatch, db)
    assert cli.main([str(source) if a == "IMPORT" else a for a in command]) == 1
    one_sentence(capsys.readouterr().err, "tuning database directory", str(db), "not writable")


def test_an_unreachable_postgresql_port_is_one_sentence_before_the_source_opens(home, capsys, no_gpu_source):
    pytest.importorskip("psycopg")
    url = "postgresql://nobody@127.0.0.1:1/x"
    assert cli.main(["tune", *POOL_ARGS, "--replay", str(POOL_FILE), "--storage", url]) == 1
    err = capsys.readouterr().err
    line = one_sentence(err, "cannot reach the PostgreSQL server", "nobody@127.0.0.1:1/x", "start the server")
    assert len(err.strip().splitlines()) == 1 and "sqlalchemy" not in err.lower(), err
    assert line.startswith("autocnn: ")


def test_a_database_that_does_not_exist_is_named(home, capsys, no_gpu_source, postgres_url):
    import urllib.parse

    url = urllib.parse.urlunsplit(urllib.parse.urlsplit(postgres_url)._replace(path="/no_such_database"))
    assert cli.main(["tune", *POOL_ARGS, "--replay", str(POOL_FILE), "--storage", url]) == 1
    one_sentence(capsys.readouterr().err, "no_such_database", "does not exist", "createdb")


def test_a_sqlite_storage_in_a_read_only_directory_is_refused(home, monkeypatch, capsys, tmp_path, no_gpu_source):
    where = tmp_path / "studies"
    where.mkdir()
    read_only(monkeypatch, where)
    assert cli.main(["tune", *POOL_ARGS, "--replay", str(POOL_FILE), "--storage", f"sqlite:///{where}/s.db"]) == 1
    one_sentence(capsys.readouterr().err, "Optuna storage's directory", str(where))


def test_seed_and_replay_files_are_checked_at_the_door(home, capsys, tmp_path, no_gpu_source):
    assert cli.main(["tune", *POOL_ARGS, "--replay", str(POOL_FILE), "--seed", "-5"]) == 1
    one_sentence(capsys.readouterr().err, "--seed must be a whole number from 0")
    other = REPLAY / "avgpool_bwd__modern_pool.json.gz"   # another op and shape
    assert cli.main(["tune", *POOL_ARGS, "--replay", str(other), "--trials", "100"]) == 1
    err = capsys.readouterr().err
    one_sentence(err, "no file given holds", POOL.problem.shape_string(), str(other))
    assert "100 trials" not in err
    corrupt = tmp_path / "corrupt.json.gz"
    corrupt.write_bytes(b"\x1f\x8b not really gzip")
    assert cli.main(["tune", *POOL_ARGS, "--replay", str(corrupt)]) == 1
    one_sentence(capsys.readouterr().err, f"replay file {corrupt} cannot be read")
    assert cli.main(["tune", *POOL_ARGS, "--replay", str(tmp_path / "missing.json")]) == 1
    one_sentence(capsys.readouterr().err, f"replay file {tmp_path / 'missing.json'} does not exist")


def test_a_fix_that_contradicts_the_replay_file_is_refused(home, capsys, no_gpu_source):
    wgrad = REPLAY / "conv_wgrad__convnet18_c1.json.gz"
    rf = ReplayFile.load(wgrad)
    code = cli.main(["tune", "--op", rf.op, "--shape", rf.problem.shape_string(), "--replay", str(wgrad),
                     "--fix", "BK=8"])
    assert code == 1
    one_sentence(capsys.readouterr().err, str(wgrad), "was recorded with", "BK=16", "--fix holds BK=8")


def test_db_filters_and_exit_status(home, capsys):
    assert cli.main(["db", "show", "--op", "conv_bogus"]) == 1
    one_sentence(capsys.readouterr().err, "--op 'conv_bogus' is not an operation")
    assert cli.main(["db", "list", "--op", "conv_bogus"]) == 1
    one_sentence(capsys.readouterr().err, "--op 'conv_bogus' is not an operation")
    # The same nothing found exits alike in both.
    assert cli.main(["db", "list", "--gpu", "no such gpu"]) == 1
    assert cli.main(["db", "show", "--gpu", "no such gpu"]) == 1


def test_an_unknown_operation_has_one_prefix(home, capsys, no_gpu_source):
    assert cli.main(["tune", "--op", "conv_fwdx", "--shape", "N=1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("autocnn: op='conv_fwdx'") and "autocnn: autocnn:" not in err, err


def test_db_import_of_a_directory_or_a_missing_file(home, capsys, tmp_path):
    assert cli.main(["db", "import", str(tmp_path)]) == 1
    one_sentence(capsys.readouterr().err, f"{tmp_path} is a directory", "db export")
    assert cli.main(["db", "import", str(tmp_path / "nope.json")]) == 1
    one_sentence(capsys.readouterr().err, "nope.json does not exist")


def test_db_import_says_it_waits_for_a_lock_held_elsewhere(home, capsys, tmp_path, monkeypatch):
    import filelock

    from autocnn.store import files

    db = tmp_path / "db"
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(db))
    monkeypatch.setattr(files, "LOCK_TIMEOUT_S", 0.2)
    record = json.loads((Path(__file__).parents[1] / "tuning_db" / "nvidia-h200_sm90.json").read_text())["records"][0]
    source = tmp_path / "in.json"
    source.write_text(json.dumps({"format": 1, "records": [record]}))
    from autocnn.store import TuningDatabase
    from autocnn.store.records import TuningRecord

    target = TuningDatabase().path_for(TuningRecord.from_dict(record).key)
    db.mkdir()
    # Held elsewhere: another lock object on the file (flock conflicts between open files, as
    # between processes), in a thread of its own.
    import threading

    taken, release = threading.Event(), threading.Event()

    def hold():
        with filelock.FileLock(str(target) + ".lock", thread_local=False, is_singleton=False):
            taken.set()
            release.wait(5)
    t = threading.Thread(target=hold)
    t.start()
    taken.wait(5)
    try:
        assert cli.main(["db", "import", str(source)]) == 1
    finally:
        release.set()
        t.join()
    err = capsys.readouterr().err
    one_sentence(err, "waiting for", str(target) + ".lock", "held by another autocnn process")
    one_sentence(err, "was held by another process", "delete it")


def test_store_warnings_carry_no_python_source_line(home, tmp_path):
    import subprocess
    import sys

    db = tmp_path / "db"
    db.mkdir()
    (db / "broken.json").write_text("not json")
    env = {**os.environ, "AUTOCNN_TUNING_DB": str(db), "PYTHONPATH": str(Path(__file__).parents[1])}
    run = subprocess.run([sys.executable, "-m", "autocnn.cli", "db", "list", "--op", "conv_fwd"], env=env,
                         capture_output=True, text=True, timeout=120)
    line = one_sentence(run.stderr, "broken.json", "whole file skipped")
    assert line.startswith("autocnn: warning: ") and "warnings.warn" not in run.stderr, run.stderr
    assert ".py:" not in run.stderr, run.stderr


# -- train ------------------------------------------------------------------------------------------

def test_train_without_the_cuda_backend_is_one_line(home, capsys, monkeypatch):
    from autocnn.nn import backend_choice
    from autocnn.nn.backend import BackendUnavailableError

    def unavailable(dtype):
        raise BackendUnavailableError("the cuda backend is not available (No module named 'cupy'); install CuPy")
    monkeypatch.setattr(backend_choice, "_cuda_backend", unavailable)
    assert cli.main(["train", "--network", "lenet5", "--backend", "cuda", "--epochs", "1"]) == 1
    err = capsys.readouterr().err
    one_sentence(err, "the cuda backend is not available")
    assert len(err.strip().splitlines()) == 1, err


def test_train_refuses_an_unwritable_save_path_before_training(home, capsys, monkeypatch, tmp_path):
    import autocnn.nn.training as training

    def no_training(*args, **kwargs):
        raise AssertionError("trained before --save was checked")
    monkeypatch.setattr(training, "train", no_training)
    assert cli.main(["train", "--network", "lenet5", "--backend", "numpy", "--save", "/nonexistent/dir/w.npz"]) == 1
    one_sentence(capsys.readouterr().err, "--save /nonexistent/dir/w.npz", "/nonexistent/dir does not exist")
    read_only(monkeypatch, tmp_path / "ro")
    (tmp_path / "ro").mkdir()
    assert cli.main(["train", "--network", "lenet5", "--backend", "numpy", "--save", str(tmp_path / "ro/w.npz")]) == 1
    one_sentence(capsys.readouterr().err, "--save", "not writable")
    assert cli.main(["train", "--network", "lenet5", "--backend", "numpy", "--seed", "-5"]) == 1
    one_sentence(capsys.readouterr().err, "--seed must be a whole number from 0")


def test_a_batch_larger_than_the_data_set_is_clipped_with_a_warning(home, tmp_path):
    from autocnn import nn

    from .test_nn_data import write_mnist_like

    write_mnist_like(tmp_path / "fashion", n_train=12, n_test=8, seed=1)
    with pytest.warns(UserWarning, match="batch size 100000 is larger than the 12 training images"):
        report = nn.train("lenet5", data_root=tmp_path / "fashion", epochs=1, batch_size=100_000, seed=0,
                          verbose=False)
    assert report.batch_size == 12


# -- report -----------------------------------------------------------------------------------------

def test_report_stops_on_a_missing_bench_and_names_a_new_out_directory(home, tmp_path, capsys):
    pytest.importorskip("plotly")
    from autocnn.cli.report import main as report_main

    out = tmp_path / "r.html"
    assert report_main(["--bench", str(tmp_path / "missing.json"), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    one_sentence(err, "missing.json does not exist", "no report written")
    assert not out.exists()
    deep = tmp_path / "new" / "dir" / "r.html"
    report_main(["--out", str(deep)])
    assert f"creating the directory {deep.parent}" in capsys.readouterr().err
