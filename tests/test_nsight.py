"""autocnn.measurement.nsight and profile_plan.py --ncu: ncu's text report read back as the figures that
say what bounds a kernel (checked against a report ncu wrote on an H200), and a missing ncu refused
before any device work."""
from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from autocnn.errors import AutocnnError
from autocnn.measurement.nsight import NcuMissingError, find_ncu, ncu_command, parse_sections, summarize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import profile_plan  # noqa: E402

# ncu's report of modern_56's fp32 backward-data GEMM (the H200 record's wgmma config), as
# MEASUREMENTS.md's entry of 2026-11-28 (commit 8dd95ee) reads it.
REPORT = (Path(__file__).parent / "data" / "ncu" / "h200_modern_56_bwd_fp32_wgmma.txt").read_text()


def test_the_sections_metric_rows_are_read_and_the_rest_left_out():
    sections = parse_sections(REPORT)
    assert set(sections) == {"GPU Speed Of Light Throughput", "Compute Workload Analysis", "Memory Workload Analysis",
                             "Scheduler Statistics", "Warp State Statistics", "Occupancy"}
    sol = sections["GPU Speed Of Light Throughput"]
    assert sol["Duration"] == ("us", 232.80) and sol["Elapsed Cycles"] == ("cycle", 305206.0)
    # "Memory Throughput" is a share in one section and a rate in another
    assert sol["Memory Throughput"] == ("%", 63.53)
    assert sections["Memory Workload Analysis"]["Memory Throughput"] == ("Gbyte/s", 613.85)
    # no unit; and "no data" is not a number
    assert sections["Memory Workload Analysis"]["Local Memory Spilling Requests"] == ("", 0.0)
    assert "Local Memory Spilling Request Overhead" not in sections["Memory Workload Analysis"]
    # the rules' advice is not a metric
    assert not any(name.startswith(("OPT", "INF", "WRN")) for rows in sections.values() for name in rows)


def test_the_summary_says_what_bounds_the_kernel():
    s = summarize(REPORT, "conv_bwd_data")
    assert (s.duration_us, s.sm_ghz, s.sm_pct, s.memory_pct) == (232.80, 1.29, 54.57, 63.53)
    assert (s.l1_pct, s.l2_pct, s.dram_pct) == (65.46, 53.70, 12.76)
    assert (s.busiest_pipe, s.busiest_pipe_pct) == ("Tensor", 54.6)
    assert (s.issue_busy_pct, s.eligible_warps, s.active_warps) == (49.77, 1.04, 3.88)
    assert (s.occupancy_pct, s.theoretical_occupancy_pct) == (24.17, 25.0)
    assert s.block_limits == {"registers": 2.0, "shared mem": 2.0, "warps": 8.0}
    lines = s.lines()
    assert len(lines) == 3 and "L1/shared 65.5%" in lines[0] and "busiest pipe Tensor 54.6%" in lines[1]
    assert "1.04 eligible of 3.88 active" in lines[1] and "registers 2, shared mem 2" in lines[2]


def test_a_report_without_a_profiled_launch_is_an_error_with_ncus_last_words():
    with pytest.raises(AutocnnError, match="(?s)profiled no launch of conv_fwd.*No kernels were profiled"):
        summarize("==PROF== Disconnected\n==WARNING== No kernels were profiled.\n", "conv_fwd")


def test_ncu_is_found_where_named_and_refused_with_where_it_was_looked_for(tmp_path):
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert find_ncu(str(fake)) == str(fake)
    with pytest.raises(NcuMissingError, match=r"not found \(looked in /nowhere/ncu\)"):
        find_ncu("/nowhere/ncu")
    command = ncu_command(str(fake), "conv_bwd_data", ["python3", "x.py"])
    assert command[:5] == [str(fake), "--kernel-name", "regex:^conv_bwd_data$", "--launch-count", "1"]
    assert command[-2:] == ["python3", "x.py"] and command.count("--section") == 6


def test_profile_plan_refuses_a_missing_ncu_before_any_device_work(capsys, device_untouched):
    argv = ["--op", "conv_fwd", "--shape", "N=2,C=4,H=9,W=9,K=8,R=3,S=3,pad=1", "--ncu", "conv_fwd",
            "--ncu-path", "/nowhere/ncu"]
    with pytest.raises(SystemExit) as exc:
        profile_plan.main(argv)
    assert exc.value.code == 2 and "Nsight Compute (ncu) was not found (looked in /nowhere/ncu)" in capsys.readouterr().err


SHAPE = "N=4,C=16,H=20,W=20,K=32,R=3,S=3,pad=1"
IGEMM = {"formulation": "igemm", "BM": 64, "BN": 32, "BK": 16, "TM": 4, "TN": 4, "PAD_A": 4, "PAD_B": 4, "UNROLL_K": 1}


def test_the_gpu_tests_config_plans_one_kernel_named_conv_fwd():
    """Checked on every CI run, so that a parameter added since fails here, not only on a GPU host."""
    from autocnn.device import DeviceLimits
    from autocnn.kernels import get_operation
    from autocnn.kernels.problem import parse_shape

    problem, op = parse_shape("conv_fwd", SHAPE), get_operation("conv_fwd")
    config = op.space(problem, DeviceLimits.for_arch("sm_90")).validate(IGEMM)
    assert op.plan(problem, config).kernel_names == ("conv_fwd",)


@pytest.mark.gpu
def test_profile_plan_summarizes_a_kernel_under_ncu(tmp_path, capsys):
    """On a GPU host with ncu: the plan's GEMM profiled and summarized beside its step times."""
    pytest.importorskip("cupy")
    try:
        find_ncu()
    except NcuMissingError as exc:
        pytest.skip(str(exc))
    import json

    out = tmp_path / "profile.json"
    assert profile_plan.main(["--op", "conv_fwd", "--shape", SHAPE, "--config", json.dumps(IGEMM), "--budget", "0.05",
                              "--ncu", "conv_fwd", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["ncu"]["kernel"] == "conv_fwd" and row["ncu"]["duration_us"] > 0
    assert 0 < row["ncu"]["sm_pct"] <= 100 and "ncu conv_fwd:" in capsys.readouterr().out
