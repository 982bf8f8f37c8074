"""scripts/bench_quick_tune.py without a GPU: its argument checks (before any device work), its
tables and summaries (geometric means, counts below 0.8x, the worst row) from recorded numbers, the
joining of a split run's parts, and the unseen layers a seed gives whatever a run measures.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
from types import SimpleNamespace

import pytest

from autocnn.benchmark.random_shapes import CONV_OPS, draw_layer, layer_problem, unseen_layers
from tests.bench_module import SCRIPTS, load_script

bench = load_script("bench_quick_tune")


def row(index: int, op: str, precision: str, rule, model, quick, cudnn) -> dict:
    return {"shape_index": index, "op": op, "precision": precision, "shape": f"shape{index}",
            "rule_us": rule, "model_us": model, "quick_us": quick, "cudnn_us": cudnn}


ROWS = [row(0, "conv_fwd", "fp32", 100.0, 50.0, 25.0, 50.0),        # 0.5x, 1x, 2x
        row(0, "conv_wgrad", "fp32", 10.0, 10.0, 5.0, 40.0),        # 4x, 4x, 8x
        row(1, "conv_bwd_data", "fp32", 200.0, None, 20.0, 30.0),   # 0.15x (the worst), untimed, 1.5x
        row(1, "conv_fwd", "tf32", 30.0, 20.0, 10.0, 10.0)]         # 0.33x, 0.5x, 1x


def result(rows=ROWS, **changes) -> dict:
    return {"device": {"name": "NVIDIA H100 80GB HBM3"}, "seed": 7, "budget_s": 2.0, "rounds": 2,
            "cost_model": "cost model: none in use", "rows": rows, **changes}


# -- arguments ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--ops", "conv_fwd,pool"], "--ops: pool; choose among conv_fwd, conv_bwd_data, conv_wgrad"),
    (["--budget", "-1"], "the quick-tuning budget must be a positive number of seconds, not -1.0"),
    (["--rounds", "0"], "--rounds must be at least 1, not 0"),
    (["--shapes", "0"], "--shapes takes a count (48) or a range START:END of the seed's shapes (24:48), not '0'"),
    (["--shapes", "30:20", "--seed", "1"], "not '30:20'"),
    (["--shapes", "many"], "not 'many'"),
    (["--shapes", "24:48"], "--shapes 24:48 measures part of a seed's shapes: give that run's --seed"),
    (["--precision", "fp16"], "argument --precision: invalid choice: 'fp16'"),
])
def test_bad_arguments_are_refused_before_the_device(args, message, capsys, device_untouched):
    with pytest.raises(SystemExit) as exit_:
        bench.main(args)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_the_script_itself_refuses_before_the_device():
    run = subprocess.run([sys.executable, str(SCRIPTS / "bench_quick_tune.py"), "--ops", "conv_fwd,pool"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "--ops: pool; choose among conv_fwd" in run.stderr, run.stderr


def test_arguments_a_split_run_takes():
    full = bench.parse_args([])
    assert full.shapes == range(48) and full.ops == CONV_OPS and full.precisions == ("fp32", "tf32")
    assert full.problems == 48 * 3 * 2 and full.seed is None and full.rounds == 2
    # The whole target table is more than one 10-minute command at the measured pace; its halves are not.
    assert full.problems * bench.SECONDS_PER_PROBLEM > bench.SPLIT_ADVICE_S
    half = bench.parse_args(["--precision", "tf32", "--seed", "7"])
    assert half.precisions == ("tf32",) and half.problems * bench.SECONDS_PER_PROBLEM < bench.SPLIT_ADVICE_S
    part = bench.parse_args(["--shapes", "24:48", "--seed", "7", "--ops", "conv_wgrad, conv_fwd,conv_fwd"])
    assert part.shapes == range(24, 48) and part.ops == ("conv_wgrad", "conv_fwd") and part.problems == 24 * 2 * 2


# -- tables ---------------------------------------------------------------------------------------------

def test_speedups_summaries_and_the_worst_row():
    assert bench.speedup(ROWS[0], "rule") == 0.5 and bench.speedup(ROWS[0], "quick") == 2.0
    assert bench.speedup(ROWS[2], "model") is None
    assert bench.speedup(row(0, "conv_fwd", "fp32", 1.0, 1.0, 1.0, None), "rule") is None
    fp32 = bench.summaries(ROWS)["fp32"]
    assert fp32["rule"]["geomean"] == pytest.approx((0.5 * 4 * 0.15) ** (1 / 3))
    assert fp32["model"]["geomean"] == pytest.approx(2.0) and fp32["model"]["timed"] == 2
    assert fp32["quick"]["geomean"] == pytest.approx((2 * 8 * 1.5) ** (1 / 3))
    assert fp32["rule"]["below"] == 2 and fp32["model"]["below"] == 0 and fp32["quick"]["below"] == 0
    assert fp32["rule"]["worst"] == {"x": pytest.approx(0.15), "shape_index": 1, "op": "conv_bwd_data",
                                     "shape": "shape1"}
    assert fp32["rule"]["problems"] == 3
    tf32 = bench.summaries(ROWS)["tf32"]
    assert tf32["quick"]["geomean"] == pytest.approx(1.0) and tf32["rule"]["below"] == 1
    assert set(bench.summaries(ROWS[:1])) == {"fp32"}


def test_the_tables_show_every_row_in_us_and_x_cudnn_with_the_summaries():
    text = bench.report(result())
    assert text.startswith("# NVIDIA H100 80GB HBM3, shape seed 7, quick budget 2 s a problem, 2 re-timing rounds")
    assert "fp32 against cuDNN FP32 (TF32 off): 3 problems of 2 shapes" in text
    assert "tf32 against cuDNN TF32: 1 problems of 1 shapes" in text
    fp32 = text.split("tf32 against")[0]
    for title in ("untuned rule", "untuned cost model", "quick-tuned"):
        assert title in fp32
    lines = fp32.splitlines()
    first = next(line for line in lines if line.startswith("0  ") and "conv_fwd" in line).split()
    assert first[3:10] == ["100.0", "0.50x", "50.0", "1.00x", "25.0", "2.00x", "50.0"]
    bwd = next(line for line in lines if "conv_bwd_data" in line and line.startswith("1")).split()
    assert bwd[5:7] == ["-", "-"]                       # no model time: no ratio
    mean = next(line for line in lines if line.startswith("geometric mean"))
    assert f"{(0.5 * 4 * 0.15) ** (1 / 3):.2f}x cuDNN over 3" in mean and "2.00x cuDNN over 2" in mean
    assert "2 of 3" in next(line for line in lines if line.startswith("below 0.8x"))
    assert "0.15x: #1 conv_bwd_data" in next(line for line in lines if line.startswith("worst"))
    # Rows follow the shapes, then the ops in their order.
    order = [line.split()[1] for line in lines if line[:1].isdigit()]
    assert order == ["conv_fwd", "conv_wgrad", "conv_bwd_data"]


# -- joining a split run ----------------------------------------------------------------------------------

def test_merge_joins_parts_of_one_run_and_refuses_others(tmp_path, capsys, device_untouched):
    a, b = tmp_path / "fp32.json", tmp_path / "tf32.json"
    a.write_text(json.dumps(result(ROWS[:3])))
    b.write_text(json.dumps(result(ROWS[3:])))
    out = tmp_path / "all.json"
    assert bench.main(["--merge", str(a), str(b), "--out", str(out)]) == 0
    joined = json.loads(out.read_text())
    assert len(joined["rows"]) == 4 and joined["precisions"] == ["fp32", "tf32"] and joined["shapes"] == [0, 2]
    assert joined["summary"]["tf32"]["quick"]["geomean"] == pytest.approx(1.0)
    assert joined["parts"] == [str(a), str(b)]
    printed = capsys.readouterr().out
    assert "fp32 against cuDNN FP32" in printed and "tf32 against cuDNN TF32" in printed
    assert "4 problems from 2 parts" in printed

    other = tmp_path / "other.json"
    other.write_text(json.dumps(result(ROWS[3:], seed=8)))
    with pytest.raises(ValueError, match=r"other.json has seed 8, .*fp32.json 7: only parts of one run join"):
        bench.merge([a, other])
    with pytest.raises(ValueError, match=r"fp32.json and .*fp32.json both hold shape 0 conv_fwd fp32"):
        bench.merge([a, a])
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps(result(ROWS[3:], device={"name": "NVIDIA H200"})))
    with pytest.raises(ValueError, match="gpu.json was measured on 'NVIDIA H200'"):
        bench.merge([a, gpu])
    assert bench.main(["--merge", str(tmp_path / "missing.json")]) == 2
    assert "missing.json cannot be read" in capsys.readouterr().err


# -- the shapes -----------------------------------------------------------------------------------------------

def test_layers_serve_every_convolution_and_a_seed_gives_the_same_unseen_ones():
    layer = draw_layer(random.Random(5))
    assert layer == draw_layer(random.Random(5))
    problems = [layer_problem(layer, op, "tf32") for op in CONV_OPS]
    assert [p.op for p in problems] == list(CONV_OPS) and {p.precision.name for p in problems} == {"tf32"}
    assert len({(p.N, p.C, p.H, p.W, p.K, p.R, p.S, p.stride, p.padding) for p in problems}) == 1

    class Covers:
        """A database with a record of every tf32 weight gradient of an even batch."""

        def __init__(self):
            self.asked = []

        def tuned(self, device, problem):
            self.asked.append((problem.op, problem.precision.name))
            covered = problem.op == "conv_wgrad" and problem.precision.name == "tf32" and problem.N % 2 == 0
            return SimpleNamespace(source="exact") if covered else None

    db = Covers()
    got = list(unseen_layers(db, None, 5, random.Random(3), ("fp32", "tf32")))
    assert len(got) == 5 and all(layer["N"] % 2 == 1 for layer in got)
    assert set(db.asked) == {(op, p) for op in CONV_OPS for p in ("fp32", "tf32")}
    assert got == list(unseen_layers(Covers(), None, 5, random.Random(3), ("fp32", "tf32")))


def test_one_problem_measured_on_recorded_answers_leaves_the_database_as_it_was(tmp_path, monkeypatch):
    """measure_problem's flow on the CPU: the fake GPU's source (tests/torch_fake_gpu.py) and cuDNN's
    time given; the lookups, quick tuning and re-timing are the real ones, and nothing is stored."""
    import autocnn.benchmark.baselines as baselines
    from tests import torch_fake_gpu as fake

    monkeypatch.setattr(baselines, "time_baseline", lambda op, problem, **kw: baselines.BaselineTime(80.0))
    source = fake.RecordedSource()
    db = fake.database(tmp_path / "db")
    args = bench.parse_args(["--rounds", "3", "--budget", "60"])
    problem = fake.RECORDED[0].problem                       # recorded: conv_wgrad of convnet18's first layer
    got = bench.measure_problem(4, problem, db, source, None, args)
    assert got["shape_index"] == 4 and got["op"] == "conv_wgrad" and got["precision"] == "fp32"
    assert got["cudnn_us"] == 80.0 and got["quick_us"] is not None
    recorded = fake.RECORDED[0].results
    assert got["quick_us"] == recorded[config_key(got["quick"]["config"])].time_us
    assert got["model"]["same_as_rule"]                      # the tests run without a cost model
    assert got["quick"]["measured"] == got["quick"]["candidates"] and got["quick"]["chosen"]
    assert db.records() == []                                # quick tuning's record kept in memory only
    assert json.loads(json.dumps(got)) == got


def config_key(config: dict) -> str:
    from autocnn.kernels.space import Config

    return Config("conv_wgrad", tuple(config.items())).key()
