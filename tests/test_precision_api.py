"""Precision as users choose it: ``--precision`` on the command line (tune, db) and ``precision=`` in
the nn API. Everything here runs on the CPU: tuning is answered from recorded measurements or
stands in a fake tuner that records what it was asked to tune."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from autocnn.kernels import parse_shape
from autocnn.kernels.problem import precision_label
from autocnn.precision import FP32
from autocnn.kernels.suite import seed_problems
from autocnn.store import TuningDatabase
from autocnn.measurement.sources import ReplayFile, ReplaySource
from autocnn.search.tuner import TuneOutcome, TuneSettings, Tuner

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
    # The replay file only names a device here: the fake tuner measures nothing from it.
    import autocnn.cli.checks

    monkeypatch.setattr(autocnn.cli.checks, "replay_notes", lambda paths, problems, fixed: [])
    return calls


@pytest.fixture
def tune(asked, tmp_path):
    """`autocnn tune ARGS` answered from a replay file (a device to name) and the fake tuner."""
    from autocnn.cli import main

    def run(*args: str) -> int:
        return main(["tune", *args, "--replay", str(POOL_FILE), "--json",
                     "--storage", f"sqlite:///{tmp_path / 'optuna.db'}"])
    return run


def test_tune_op_takes_the_precision_from_the_flag_or_the_shape(asked, capsys, tune):
    tune("--op", "conv_fwd", "--shape", CONV_SHAPE)
    tune("--op", "conv_fwd", "--shape", CONV_SHAPE, "--precision", "tf32")
    tune("--op", "conv_fwd", "--shape", CONV_SHAPE + ",precision=tf32")
    tune("--op", "conv_fwd", "--shape", CONV_SHAPE + ",precision=tf32", "--precision", "tf32")
    assert [p.precision for _, p in asked] == ["fp32", "tf32", "tf32", "tf32"]
    rows = [json.loads(chunk)["results"][0] for chunk in _json_documents(capsys.readouterr().out)]
    assert [r["precision"] for r in rows] == ["fp32", "tf32", "tf32", "tf32"]
    assert rows[1]["shape"] == CONV_SHAPE + ",precision=tf32"


def test_tune_op_refuses_a_shape_and_a_flag_that_disagree(asked, capsys, tune):
    assert tune("--op", "conv_fwd", "--shape", CONV_SHAPE + ",precision=tf32", "--precision", "fp32") == 1
    err = capsys.readouterr().err
    assert "--shape says precision=tf32 but --precision says fp32" in err
    assert tune("--op", "conv_fwd", "--shape", CONV_SHAPE + ",precision=fp32", "--precision", "tf32") == 1
    assert "--shape says precision=fp32 but --precision says tf32" in capsys.readouterr().err
    assert asked == []   # refused before anything was tuned


def test_tune_names_the_allowed_precisions(asked, capsys, tune):
    with pytest.raises(SystemExit):
        tune("--op", "conv_fwd", "--shape", CONV_SHAPE, "--precision", "bf17")
    err = capsys.readouterr().err
    assert "bf17" in err and all(name in err for name in ("fp32", "tf32", "bf16", "fp16"))
    assert tune("--op", "conv_fwd", "--shape", CONV_SHAPE + ",precision=fp8") == 1
    err = capsys.readouterr().err
    assert "fp8" in err and "fp32, tf32, bf16, fp16" in err


def test_tune_takes_the_sixteen_bit_precisions_for_convolutions_and_pooling(asked, tune):
    tune("--op", "conv_fwd", "--shape", CONV_SHAPE, "--precision", "bf16")
    tune("--op", "conv_wgrad", "--shape", CONV_SHAPE + ",precision=fp16")
    tune("--op", "avgpool_fwd", "--shape", "N=2,C=3,H=8,W=8,window=2", "--precision", "fp16")
    tune("--op", "avgpool_bwd", "--shape", "N=2,C=3,H=8,W=8,window=2,precision=bf16")
    assert [str(p.precision) for _, p in asked] == ["bf16", "fp16", "fp16", "bf16"]


def test_a_held_formulation_that_refuses_sixteen_bit_tensors_fails_with_its_reason(asked, capsys, tune):
    assert tune("--op", "conv_fwd", "--shape", CONV_SHAPE, "--precision", "bf16", "--fix", "formulation=wgmma") == 1
    err = capsys.readouterr().err
    assert "wgmma cannot compute bf16 (16-bit tensors)" in err and "TF32" in err
    assert not asked                                   # refused before any source is opened or tuned
    tune("--op", "conv_fwd", "--shape", CONV_SHAPE, "--precision", "bf16", "--fix", "formulation=direct")
    assert [p.precision for _, p in asked] == ["bf16"]


def test_tune_pooling_has_no_precision(asked, tune):
    shape = "N=2,C=3,H=8,W=8,window=2"
    assert tune("--op", "avgpool_fwd", "--shape", shape, "--precision", "tf32") == 1   # nothing tuned: fake
    assert asked[0][1] == parse_shape("avgpool_fwd", shape)


def test_tune_suite_applies_the_precision_to_every_convolution(asked, tune):
    tune("--suite", "seed", "--ops", "conv_fwd,avgpool_fwd", "--precision", "tf32")
    convs = [p for op, p in asked if op == "conv_fwd"]
    pools = [p for op, p in asked if op == "avgpool_fwd"]
    assert len(convs) == len(seed_problems("conv_fwd")) and {p.precision for p in convs} == {"tf32"}
    assert [(p.N, p.C, p.H, p.K) for p in convs] == [(p.N, p.C, p.H, p.K) for _, p in seed_problems("conv_fwd")]
    assert pools == [p for _, p in seed_problems("avgpool_fwd")]
    asked.clear()
    tune("--suite", "seed", "--ops", "conv_wgrad")
    assert {p.precision for _, p in asked} == {"fp32"}


def test_tune_network_tunes_the_model_at_the_precision(asked, tune):
    tune("--network", "lenet5", "--batch", "16", "--precision", "tf32", "--trials", "50")
    # conv_pool_dz (supersampling and an activation gradient) is pooling-shaped: it has no precision.
    convs = [p for op, p in asked if op.startswith("conv") and op != "conv_pool_dz"]
    assert convs and {p.precision for p in convs} == {"tf32"}
    assert any(op.startswith("avgpool") for op, _ in asked)
    # The fused alternatives are tuned too (conv + averaging pairs, the one-pass backward).
    assert {"conv_pool_fwd", "conv_pool_dz", "conv_bwd_fused"} <= {op for op, _ in asked}
    asked.clear()
    tune("--network", "lenet5", "--batch", "16", "--trials", "50")
    assert {p.precision for op, p in asked if op.startswith("conv") and op != "conv_pool_dz"} == {"fp32"}


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
    assert main(["db", "list", "--precision", "tf32", "--op", "avgpool_bwd"]) == 1   # nothing found, as db show
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


# -- precision= in the nn API ---------------------------------------------------------------------

def _net(precision: str | None = None, first: str | None = None, **kwargs):
    from autocnn.nn import AvgPool2d, Conv2d, Dense, Flatten, Sequential

    layers = [Conv2d(1, 4, 3, padding=1, activation="relu", precision=first), AvgPool2d(2),
              Conv2d(4, 4, 3, padding=1), Flatten(), Dense(4 * 4 * 4, 3)]
    extra = {} if precision is None else {"precision": precision}
    return Sequential(layers, (1, 8, 8), seed=0, **extra, **kwargs)


def _conv_precisions(problems) -> list[tuple[str, str]]:
    return [(p.op, p.precision) for p in problems if p.op.startswith("conv")]


def test_model_precision_reaches_every_convolution_problem():
    fp32 = _net()
    assert fp32.precision == "fp32"
    assert {pr for _, pr in _conv_precisions(fp32.problems(8))} == {"fp32"}
    tf32 = _net("tf32")
    problems = tf32.problems(8)
    assert {pr for _, pr in _conv_precisions(problems)} == {"tf32"}
    pools = [p for p in problems if p.op.startswith("avgpool")]
    # pooling forms no products: it stays float32 (fp32) in a tf32 model
    assert pools and all(p.precision is FP32 for p in pools)
    # the same shapes, only the precision differs
    assert [dataclasses.replace(p, precision="fp32") if hasattr(p, "precision") else p for p in problems] \
        == fp32.problems(8)
    assert "precision='tf32'" in repr(tf32) and tf32.summary().endswith("precision tf32")


def test_a_layer_overrides_the_model_precision():
    model = _net("tf32", first="fp32")
    first, second = model.layers[0], model.layers[2]
    assert (first.precision, first.precision_override) == ("fp32", "fp32")
    assert (second.precision, second.precision_override) == ("tf32", None)
    assert {pr for op, pr in _conv_precisions(first.make_problems((1, 8, 8), 8))} == {"fp32"}
    assert {pr for op, pr in _conv_precisions(second.make_problems((4, 4, 4), 8))} == {"tf32"}
    assert "precision='fp32'" in repr(first) and "precision" not in repr(second)
    model.precision = "fp32"
    assert second.precision == "fp32" and first.precision == "fp32"
    model.precision = "tf32"
    assert first.precision == "fp32"      # its own setting outlives the model's changes


def test_changing_a_built_models_precision_rebuilds_it_with_its_weights():
    model = _net().build(8)
    weights = model.get_weights()
    builds = model._build_count
    assert {pr for _, pr in _conv_precisions(model.problems())} == {"fp32"}
    model.precision = "tf32"
    assert model.batch_size == 8 and model._build_count == builds + 1
    assert {pr for _, pr in _conv_precisions(model.problems())} == {"tf32"}
    assert {pr for _, pr in _conv_precisions(d.problem for d in model.dispatch)} == {"tf32"}
    after = model.get_weights()
    assert all((weights[k] == after[k]).all() for k in weights)


def test_dispatch_report_shows_each_kernels_precision():
    model = _net("tf32", first="fp32").build(8)
    lines = model.dispatch_report().splitlines()
    assert "model precision tf32" in lines[0]
    header = lines[1].split()
    assert header[:4] == ["layer", "op", "precision", "shape"]
    cells = [line.split()[:3] for line in lines[3:]]
    assert ["conv2d_1", "conv_fwd", "fp32"] in cells and ["conv2d_1", "conv_wgrad", "fp32"] in cells
    assert ["conv2d_2", "conv_fwd", "tf32"] in cells and ["conv2d_2", "conv_bwd_data", "tf32"] in cells
    assert ["avgpool2d_1", "avgpool_fwd", "-"] in cells
    assert ["dense_1", "dense+loss", "fp32"] in cells


def test_bad_precisions_name_what_is_allowed():
    from autocnn.nn import Conv2d

    with pytest.raises(ValueError, match=r"Sequential: precision must be one of fp32, tf32, bf16, fp16, got 'fp8'"):
        _net("fp8")
    with pytest.raises(ValueError, match=r"Conv2d: precision must be one of fp32, tf32, bf16, fp16 or None "
                                         r"\(the model's\), got 'int8'"):
        Conv2d(1, 2, 3, precision="int8")
    with pytest.raises(ValueError, match="got 32"):
        Conv2d(1, 2, 3, precision=32)
    model = _net().build(4)
    with pytest.raises(ValueError, match="fp32, tf32"):
        model.precision = "TF16"
    assert model.precision == "fp32" and model.batch_size == 4
    assert _net("TF32").precision == "tf32"    # names are not case-sensitive


def test_the_numpy_backend_computes_the_same_at_both_precisions(rng):
    x = rng.standard_normal((8, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, 8)
    out = {}
    from autocnn.nn import SGD

    for precision in ("fp32", "tf32"):
        model = _net(precision).build(8)
        history = model.fit(x, y, epochs=2, batch_size=8, optimizer=SGD(0.1), verbose=False, shuffle=False)
        out[precision] = (model.predict(x), history.loss)
    assert np.array_equal(out["fp32"][0], out["tf32"][0]) and out["fp32"][1] == out["tf32"][1]


# -- nn.train and autocnn train --------------------------------------------------------------------

@pytest.fixture
def fashion_root(tmp_path):
    from .test_nn_data import write_mnist_like

    write_mnist_like(tmp_path / "fashion", n_train=32, n_test=16, seed=3)
    return tmp_path / "fashion"


def test_train_reports_the_precision(fashion_root):
    from autocnn import nn

    report = nn.train("lenet5", data_root=fashion_root, epochs=1, batch_size=16, seed=0, verbose=False,
                      precision="tf32")
    assert report.precision == "tf32" and report.model.precision == "tf32"
    assert "precision tf32" in report.summary().splitlines()[0]
    assert "model precision tf32" in report.dispatch_report
    assert report.to_dict()["precision"] == "tf32"
    model = _net("tf32", first="fp32")
    assert nn.training.describe_precision(model) == "tf32 (conv2d_1 fp32)"
    with pytest.raises(ValueError, match="train: precision must be one of fp32, tf32"):
        nn.train("lenet5", data_root=fashion_root / "missing", precision="half")


def test_cli_train_takes_precision(fashion_root, capsys):
    from autocnn.cli import main

    assert main(["train", "--network", "lenet5", "--data-root", str(fashion_root), "--epochs", "1",
                 "--batch-size", "16", "--backend", "numpy", "--precision", "tf32", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "precision tf32" in out.splitlines()[0]
    conv_rows = [line.split() for line in out.splitlines() if line.startswith("conv2d_")]
    assert conv_rows and {row[2] for row in conv_rows} == {"tf32"}
    assert main(["train", "--network", "lenet5", "--data-root", str(fashion_root), "--epochs", "1",
                 "--batch-size", "16", "--backend", "numpy", "--json", "--seed", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["precision"] == "fp32"
    with pytest.raises(SystemExit):
        main(["train", "--network", "lenet5", "--precision", "fp8"])
    assert "invalid choice: 'fp8'" in capsys.readouterr().err


# -- on a GPU --------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_cuda_model_runs_its_layers_at_their_precisions(rng):
    """A tf32 model dispatches tf32 problems (the first layer kept in fp32 dispatches fp32 ones),
    and its logits stay within TF32 rounding of the numpy backend's; switched to fp32, within FP32's."""
    from autocnn.nn import AvgPool2d, Conv2d, Dense, Flatten, Sequential
    from autocnn.measurement.measure import error_bound

    def net(backend: str, precision: str) -> Sequential:
        layers = [Conv2d(3, 16, 3, padding=1, activation="relu", precision="fp32"), AvgPool2d(2),
                  Conv2d(16, 32, 3, padding=1, activation="relu"), AvgPool2d(2), Flatten(), Dense(32 * 4 * 4, 10)]
        return Sequential(layers, (3, 16, 16), backend=backend, seed=7, precision=precision).build(8)

    cpu, gpu = net("numpy", "tf32"), net("cuda", "tf32")
    dispatched = {(d.problem.op, getattr(d.problem, "precision", "-"), d.problem.C) for d in gpu.dispatch}
    assert ("conv_fwd", "fp32", 3) in dispatched and ("conv_fwd", "tf32", 16) in dispatched
    assert ("conv_bwd_data", "tf32", 16) in dispatched and ("conv_wgrad", "tf32", 16) in dispatched
    x = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)
    ref = cpu.predict(x)
    # One tf32 layer's rounding (its bound at its reduction length C*R*S), carried to the logits
    # through a ReLU, a pooling and an FP32 Dense layer that do not grow relative errors much.
    tf32_error = np.linalg.norm(gpu.predict(x) - ref) / np.linalg.norm(ref)
    assert tf32_error <= 4 * error_bound(16 * 9, "tf32")
    gpu.precision = "fp32"
    assert {getattr(d.problem, "precision", "fp32") for d in gpu.dispatch} == {"fp32"}
    assert np.linalg.norm(gpu.predict(x) - ref) / np.linalg.norm(ref) <= 1e-4


def test_tune_stale_takes_the_stale_records_of_its_precision(two_precisions, asked, tune, capsys):
    path = next(Path(TuningDatabase().user_dir).glob("*.json"))
    doc = json.loads(path.read_text())
    for record in doc["records"]:
        record["key"]["fingerprint"] = "0000000000000000"     # every record made stale:
        record["plan_digest"] = "0000000000000000"            # its config's code changed too
    path.write_text(json.dumps(doc))
    device = ReplayFile.load(WGRAD_FILE).device
    assert len(TuningDatabase().stale_problems(device, ["conv_wgrad", "avgpool_bwd"])) == 3
    tune("--stale", "--ops", "conv_wgrad,avgpool_bwd")
    assert sorted((op, precision_label(p)) for op, p in asked) == [("avgpool_bwd", "-"),
                                                                               ("conv_wgrad", "fp32")]
    assert "1 more stale shapes are tf32: tune them with --precision tf32" in capsys.readouterr().err
    asked.clear()
    tune("--stale", "--ops", "conv_wgrad", "--precision", "tf32")
    assert [(op, p) for op, p in asked] == [("conv_wgrad", dataclasses.replace(two_precisions, precision="tf32"))]


def test_a_json_network_sets_a_layers_precision():
    from autocnn.nn.zoo import network_from_dict

    layers = [{"type": "conv2d", "out_channels": 2, "kernel_size": 3, "precision": "tf32"},
              {"type": "conv2d", "out_channels": 2, "kernel_size": 3},
              {"type": "flatten"}, {"type": "dense", "out_features": 3}]
    model = network_from_dict({"input_shape": [1, 8, 8], "layers": layers})
    precisions = {(p.op, p.C): p.precision for p in model.problems(2) if hasattr(p, "precision")}
    assert precisions[("conv_fwd", 1)] == "tf32" and precisions[("conv_fwd", 2)] == "fp32"
    layers[0]["precision"] = "fp8"
    with pytest.raises(ValueError, match=r"layers\[0\] \(conv2d\).*precision must be one of fp32, tf32, bf16, fp16"):
        network_from_dict({"input_shape": [1, 8, 8], "layers": layers})
