"""autocnn bench's tables from recorded timings (CPU), its plan and command line checks, the cuDNN
precision switch, and (on a GPU) a short run end to end."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from autocnn.errors import FailureClass
from autocnn.kernels import operation_for
from autocnn.kernels.space import Config
from autocnn.kernels.suite import seed_problems, seed_shape
from autocnn.kernels.problem import precision_label
from autocnn.benchmark.table import (BenchRow, GpuRates, conv_table, gemm_tflops, geomean, pool_table,
                                        row_from_results, summary_lines, tables, tflops)
from autocnn.measurement.sources import TrialResult

RATES = GpuRates(copy_gbps=3000.0, sgemm_tflops=50.0, tf32_tflops=400.0)


def _conv(op: str, name: str, precision: str, best: float, cudnn: float | None, default: float | None = None,
          flops: int = 10**10) -> BenchRow:
    return BenchRow(op=op, shape=name, precision=precision, flops=flops, min_bytes=10**7, default_us=default,
                    best_us=best, cudnn_us=cudnn, measured=5)


def _cells(table: str, first: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(f"| {first} |"))
    return [c.strip() for c in line.strip("|").split("|")]


# -- rates --------------------------------------------------------------------------------------------

def test_a_convolution_does_two_flops_per_term_and_rates_follow():
    problem = seed_shape("modern_14").problem("conv_fwd")
    p = problem
    assert operation_for(problem).flops(problem) == 2 * p.N * p.K * p.C * p.R * p.S * p.P * p.Q
    for op in ("conv_bwd_data", "conv_wgrad"):
        q = seed_shape("modern_14").problem(op)
        assert operation_for(q).flops(q) == operation_for(problem).flops(problem)
    assert tflops(2e12, 1e6) == pytest.approx(2.0)          # 2e12 flops in one second
    assert tflops(1e9, 100.0) == pytest.approx(10.0)        # 1e9 flops in 100 us
    assert tflops(1e9, None) is None and tflops(1e9, 0.0) is None
    assert gemm_tflops(8192, 20_000.0) == pytest.approx(2 * 8192**3 / 0.02 / 1e12)
    with pytest.raises(ValueError, match="positive time"):
        gemm_tflops(8192, 0.0)


def test_rows_are_made_from_trial_results():
    _, problem = seed_problems("conv_fwd")[0]
    problem = dataclasses.replace(problem, precision="tf32")
    cfg = Config("conv_fwd", (("formulation", "direct"),))
    results = [TrialResult(cfg, False, failure=FailureClass.WRONG_RESULT, message="error 3e-3 over the bound"),
               TrialResult(cfg, True, time_us=40.0), TrialResult(cfg, True, time_us=25.0),
               TrialResult(cfg, False, failure=FailureClass.COMPILE_ERROR, message="ptxas"),
               TrialResult(cfg, False, failure=FailureClass.WRONG_RESULT, message="nan")]
    row = row_from_results("conv_fwd", "kriz09", problem, results, cudnn_us=50.0)
    assert (row.precision, row.default_us, row.best_us, row.measured) == ("tf32", None, 25.0, 2)
    assert row.default_failure.startswith("wrong_result: error 3e-3")
    assert row.failures == {"wrong_result": 2, "compile_error": 1}
    assert row.vs_cudnn == 2.0 and row.flops == 2 * problem.macs
    assert row.tflops == pytest.approx(2 * problem.macs / 25e-6 / 1e12)
    _, pool = seed_problems("avgpool_fwd")[0]
    row = row_from_results("avgpool_fwd", "kriz09_pool", pool, [TrialResult(cfg, True, time_us=10.0)], None)
    assert row.precision == "-" and row.default_us == 10.0 and row.vs_cudnn is None
    assert row.gbps == pytest.approx(operation_for(pool).min_bytes(pool) / 10e-6 / 1e9)
    assert BenchRow.from_dict(json.loads(json.dumps(row.to_dict()))) == row


# -- tables -------------------------------------------------------------------------------------------

def test_conv_table_puts_the_precisions_side_by_side_against_their_cudnn():
    rows = [_conv("conv_fwd", "modern_14", "fp32", best=100.0, cudnn=150.0, default=300.0),
            _conv("conv_fwd", "modern_14", "tf32", best=50.0, cudnn=40.0, default=60.0),
            _conv("conv_wgrad", "modern_14", "fp32", best=400.0, cudnn=200.0)]
    table = conv_table(rows, RATES)
    head = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    assert head[2:9] == ["fp32 default us", "fp32 best us", "cuDNN FP32 us", "fp32 vs cuDNN FP32", "fp32 TFLOP/s",
                         "fp32 of SGEMM", "fp32 of TF32 GEMM"]
    assert head[9:] == ["tf32 default us", "tf32 best us", "cuDNN TF32 us", "tf32 vs cuDNN TF32", "tf32 TFLOP/s",
                        "tf32 of SGEMM", "tf32 of TF32 GEMM"]
    fwd = _cells(table, "conv_fwd")
    # fp32: 1e10 flops in 100 us = 100 TFLOP/s = 200% of SGEMM (50), 25% of TF32 GEMM (400)
    assert fwd[1:9] == ["modern_14", "300.0", "100.0", "150.0", "1.50", "100.00", "200%", "25%"]
    # tf32: 1e10 flops in 50 us = 200 TFLOP/s, slower than cuDNN TF32 (40 us)
    assert fwd[9:] == ["60.0", "50.0", "40.0", "0.80", "200.00", "400%", "50%"]
    wgrad = _cells(table, "conv_wgrad")
    assert wgrad[2:9] == ["-", "400.0", "200.0", "0.50", "25.00", "50%", "6%"]
    assert wgrad[9:] == ["-"] * 7            # no tf32 row measured
    mean = _cells(table, "**geometric mean**")
    assert mean[1] == "2 problems"
    assert mean[5] == f"{math.sqrt(1.5 * 0.5):.2f}" and mean[6] == f"{math.sqrt(100.0 * 25.0):.2f}"
    assert mean[7] == f"{100 * 50.0 / 50.0:.0f}%"            # geomean rate 50 TFLOP/s = SGEMM
    assert mean[12:] == ["0.80", "200.00", "400%", "50%"]


def test_conv_table_of_one_precision_has_only_its_columns():
    rows = [_conv("conv_fwd", "kriz09", "tf32", best=10.0, cudnn=12.0)]
    table = conv_table(rows, RATES, ("tf32",))
    assert "fp32" not in table.splitlines()[0] and "cuDNN TF32 us" in table.splitlines()[0]
    assert _cells(table, "conv_fwd")[1:] == ["kriz09", "-", "10.0", "12.0", "1.20", "1000.00", "2000%", "250%"]


def test_unmeasured_rates_leave_shares_empty():
    rows = [_conv("conv_fwd", "kriz09", "fp32", best=10.0, cudnn=None)]
    table = conv_table(rows, GpuRates(), ("fp32",))
    assert _cells(table, "conv_fwd")[2:] == ["-", "10.0", "-", "-", "1000.00", "-", "-"]
    assert GpuRates().header() == ("# measured in this run: SGEMM not measured, TF32 GEMM not measured, "
                                   "copy not measured")
    assert RATES.header() == "# measured in this run: SGEMM 50.0 TFLOP/s, TF32 GEMM 400.0 TFLOP/s, copy 3000 GB/s"
    assert GpuRates.from_dict({"copy_gbps": 1.0, "sgemm_tflops": "x", "tf32_tflops": -2}) == GpuRates(1.0)
    assert GpuRates.from_dict(RATES.to_dict()) == RATES and GpuRates.from_dict(None) == GpuRates()


def test_summary_counts_slow_problems_per_precision():
    rows = [_conv("conv_fwd", "a", "fp32", best=10.0, cudnn=20.0), _conv("conv_fwd", "b", "fp32", best=10.0, cudnn=7.0),
            _conv("conv_fwd", "c", "fp32", best=10.0, cudnn=9.0), _conv("conv_fwd", "a", "tf32", best=10.0, cudnn=5.0)]
    fp32, tf32 = summary_lines(rows)
    assert fp32 == (f"# fp32: geometric mean {geomean([2.0, 0.7, 0.9]):.2f}x cuDNN FP32 over 3 problems; "
                    f"1 below 0.8x, 2 below 1x, slowest 0.70x")
    assert tf32 == "# tf32: geometric mean 0.50x cuDNN TF32 over 1 problems; 1 below 0.8x, 1 below 1x, slowest 0.50x"
    assert summary_lines([], ("fp32",)) == ["# fp32: no problem timed against cuDNN FP32"]


def test_sixteen_bit_rows_are_placed_against_their_own_tensor_core_gemm():
    rates = dataclasses.replace(RATES, bf16_tflops=800.0)
    rows = [_conv("conv_fwd", "modern_14", "bf16", best=50.0, cudnn=25.0),
            BenchRow("avgpool_fwd", "modern_pool", "bf16", flops=10**6, min_bytes=3 * 10**7, best_us=20.0)]
    text = tables(rows, rates, ("bf16",))
    head = [c.strip() for c in text.splitlines()[2].strip("|").split("|")]
    assert head[-2:] == ["bf16 of SGEMM", "bf16 of BF16 GEMM"] and "cuDNN BF16 us" in head
    # 1e10 flops in 50 us = 200 TFLOP/s: 25% of the BF16 GEMM's 800
    assert _cells(text, "conv_fwd")[-2:] == ["400%", "25%"]
    assert "| avgpool_fwd | modern_pool (bf16) |" in text            # pooling: its own table, its type named
    assert rates.header().endswith("TF32 GEMM 400.0 TFLOP/s, BF16 GEMM 800.0 TFLOP/s, copy 3000 GB/s")
    assert GpuRates.from_dict(rates.to_dict()) == rates
    assert conv_table(rows[:1], RATES, ("bf16",)).splitlines()[2].split("|")[-2].strip() == "-"   # not measured


def test_pooling_is_placed_against_the_copy_bandwidth():
    rows = [BenchRow("avgpool_fwd", "kriz09_pool", "-", flops=10**6, min_bytes=3 * 10**7, best_us=20.0, cudnn_us=30.0)]
    table = pool_table(rows, RATES)
    # 3e7 bytes in 20 us = 1500 GB/s = 50% of 3000 GB/s
    assert _cells(table, "avgpool_fwd")[1:] == ["kriz09_pool", "-", "20.0", "30.0", "1.50", "1500", "50%"]
    assert _cells(table, "**geometric mean**")[5:] == ["1.50", "1500", "50%"]
    text = tables(rows + [_conv("conv_fwd", "kriz09", "fp32", best=10.0, cudnn=12.0)], RATES)
    assert text.splitlines()[0] == RATES.header()
    assert "| avgpool_fwd | kriz09_pool |" in text and "| conv_fwd | kriz09 |" in text
    assert "# fp32: geometric mean 1.20x" in text and "# tf32: no problem timed" in text


# -- the plan and the command line ---------------------------------------------------------------------

def _plan(*argv: str):
    from autocnn.benchmark.kernels import plan
    from autocnn.cli.bench import bench_settings, build_parser

    return plan(bench_settings(build_parser().parse_args(list(argv))))


def test_bench_runs_both_precisions_unless_told_one():
    work = _plan("--ops", "conv_fwd,avgpool_fwd", "--shapes", "modern_14,modern_pool")
    assert work.precisions == ("fp32", "tf32")
    assert [(op, name, precision_label(p)) for op, name, p in work.problems] == [
        ("conv_fwd", "modern_14", "fp32"), ("conv_fwd", "modern_14", "tf32"), ("avgpool_fwd", "modern_pool", "-")]
    # A 16-bit run: the convolutions and the pooling on tensors of its type.
    work = _plan("--ops", "conv_fwd,avgpool_fwd", "--shapes", "modern_14,modern_pool", "--precision", "bf16")
    assert work.precisions == ("bf16",)
    assert [(op, precision_label(p)) for op, _, p in work.problems] == [("conv_fwd", "bf16"), ("avgpool_fwd", "bf16")]
    work = _plan("--ops", "conv_wgrad", "--precision", "tf32")
    assert {p.precision for _, _, p in work.problems} == {"tf32"}
    assert len(work.problems) == len(seed_problems("conv_wgrad"))
    assert _plan("--precision", "fp32").precisions == ("fp32",)
    # The pointwise target layers run only when named, never in the default seed-suite run.
    work = _plan("--ops", "conv_bwd_data", "--precision", "fp32", "--shapes", "pointwise_s1,pointwise_s2")
    assert [(name, p.R, p.stride, p.C, p.K, p.H, p.N) for _, name, p in work.problems] == [
        ("pointwise_s1", 1, (1, 1), 256, 512, 28, 64), ("pointwise_s2", 1, (2, 2), 256, 512, 28, 64)]
    assert not {name for _, name, _ in _plan("--precision", "fp32").problems} & {"pointwise_s1", "pointwise_s2"}


@pytest.mark.parametrize("argv, message", [
    (["--ops", "conv_fwdd"], "unknown operation(s) ['conv_fwdd']"),
    (["--shapes", "modern_15"], "unknown shape(s) ['modern_15']"),
    (["--ops", "avgpool_bwd", "--shapes", "pointwise_s1"], "no shape of avgpool_bwd is named pointwise_s1"),
    (["--ops", "avgpool_fwd", "--shapes", "modern_14"], "no shape of avgpool_fwd is named modern_14"),
    (["--samples", "-1"], "--samples must be at least 0"),
    (["--precision", "fp8"], "invalid choice: 'fp8'"),
    (["--cudnn-processes", "0"], "--cudnn-processes must be 1 to 16, not 0"),
])
def test_bench_refuses_bad_input_before_touching_a_gpu(argv, message, capsys):
    from autocnn.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


# -- cuDNN at the problem's precision --------------------------------------------------------------

def test_cudnn_is_compared_at_its_fastest_draw():
    from autocnn.benchmark.table import fastest_draws

    draws = [[10.0, None, 7.5, None], [12.0, 3.0, 7.0, None], [9.5, 4.0, None, None]]
    assert fastest_draws(draws) == [9.5, 3.0, 7.0, None]
    assert fastest_draws([[5.0, 6.0]]) == [5.0, 6.0] and fastest_draws([]) == []
    with pytest.raises(ValueError, match="different lengths"):
        fastest_draws([[1.0], [1.0, 2.0]])


def test_cudnn_is_timed_with_tf32_exactly_for_tf32_problems(monkeypatch):
    torch = pytest.importorskip("torch")
    import autocnn.benchmark.baselines as baselines
    import autocnn.measurement.measure as measure

    seen = []

    def fake_runner(op, problem):
        def run():
            seen.append((problem.precision, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
        return run

    def fake_time(run, **kwargs):
        run()
        return measure.Timing(median_us=12.5, p25_us=12.0, p75_us=13.0, min_us=11.0, reps=1)

    monkeypatch.setattr(baselines, "cudnn_runner", fake_runner)
    monkeypatch.setattr(measure, "time_callable", fake_time)
    torch.backends.cudnn.allow_tf32 = True
    _, problem = seed_problems("conv_fwd")[0]
    assert baselines.time_cudnn("conv_fwd", problem) == 12.5
    assert baselines.time_cudnn("conv_fwd", dataclasses.replace(problem, precision="tf32")) == 12.5
    assert seen == [("fp32", False, False), ("tf32", True, True)]
    assert torch.backends.cudnn.allow_tf32 is True      # the flags as they were
    with pytest.raises(ValueError, match="one of fp32, tf32, bf16, fp16"):
        with baselines.torch_precision("bf17"):
            pass


# -- on a GPU --------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_bench_end_to_end_on_one_shape(tmp_path, capsys):
    from autocnn.cli.bench import main

    out = tmp_path / "bench.json"
    assert main(["--ops", "conv_fwd,avgpool_fwd", "--shapes", "kriz09,kriz09_pool", "--samples", "3",
                 "--budget", "0.02", "--out", str(out), "--seed", "1", "--cudnn-processes", "2"]) == 0
    data = json.loads(out.read_text())
    rows = [BenchRow.from_dict(r) for r in data["rows"]]
    assert [(r.op, r.precision) for r in rows] == [("conv_fwd", "fp32"), ("conv_fwd", "tf32"), ("avgpool_fwd", "-")]
    assert all(r.best_us and r.best_us > 0 for r in rows)
    rates = GpuRates.from_dict(data["ceilings"])
    assert data["precisions"] == ["fp32", "tf32"] and [rec["precision"] for rec in data["records"]] == ["fp32", "tf32", "-"]
    text = capsys.readouterr().out
    assert rates.header() in text and "| conv_fwd | kriz09 |" in text and "**geometric mean**" in text
    if rates.sgemm_tflops is not None:        # PyTorch present: both GEMM rates and cuDNN at both precisions
        assert rates.tf32_tflops > rates.sgemm_tflops
        assert all(r.cudnn_us for r in rows[:2])
        # Two draws of cuDNN, the second from a fresh process; each row compares with the faster.
        for row, record in zip(rows, data["records"]):
            draws = record["cudnn_draws_us"]
            assert len(draws) == 2 and row.cudnn_us == min(t for t in draws if t is not None)
        assert "# cuDNN: the fastest of 2 processes' times" in text
