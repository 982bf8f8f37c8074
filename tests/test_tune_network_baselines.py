"""`autocnn tune --network` end to end on the CPU, with the cuDNN column on: a scripted measuring
source stands in for the GPU and a scripted baseline provider for PyTorch. Every zoo network's
run ends with status 0 and a summary row per tuned kernel; operations PyTorch has no single
operator for get the sequence of operators they replace, or an empty cell with the reason."""
from __future__ import annotations

import hashlib
import json

import pytest

from autocnn import cli
from autocnn.device import DeviceInfo
from autocnn.nn.zoo import NETWORKS
from autocnn.benchmark import baselines
from autocnn.benchmark.baselines import BASELINE_NOTES, BaselineTime, no_baseline_reason
from autocnn.search.devices import GpuSources
from autocnn.measurement.sources import TrialResult

H100 = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0", 132, 13000, 13000, max_smem_per_block=227 * 1024)


class ScriptedGpu:
    """Answers every config with a time drawn from its key (so the search has a winner)."""

    device = H100

    def measure(self, op, problem, configs):
        for config in configs:
            digest = hashlib.sha256(f"{op}{problem.shape_string()}{config.key()}".encode()).digest()
            us = 20.0 + digest[0] / 4
            yield TrialResult(config, True, us, timing={"median_us": us, "spread": 0.01})

    def close(self):
        pass


class ScriptedPyTorch:
    """Stands in for cuDNN through PyTorch: a time wherever autocnn's own rule says PyTorch has a
    version of the operation, the rule's reason where it has none, and one operator error."""

    available = True

    def __init__(self, failing_op: str | None = None):
        self.failing_op = failing_op
        self.asked: list[str] = []

    def time(self, op, problem):
        self.asked.append(op)
        reason = no_baseline_reason(op, problem)
        if reason is not None:
            return BaselineTime(None, reason)
        if op == self.failing_op:
            return BaselineTime(None, "PyTorch failed: OutOfMemoryError: CUDA out of memory")
        return BaselineTime(50.0)


@pytest.fixture
def scripted_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AUTOCNN_TUNING_DB", str(tmp_path / "db"))
    monkeypatch.setenv("AUTOCNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cli.tune, "open_sources", lambda choice: GpuSources([ScriptedGpu()], {}))
    pytorch = ScriptedPyTorch()
    monkeypatch.setattr(baselines, "open_baselines", lambda budget_s=0.2: pytorch)
    return pytorch


@pytest.mark.slow
@pytest.mark.parametrize("network", NETWORKS)
def test_tune_network_ends_with_a_whole_summary_and_a_cudnn_column(network, scripted_run, capsys):
    status = cli.main(["tune", "--network", network, "--batch", "16", "--trials", "12", "--storage", "memory",
                       "--no-progress", "--json"])
    out = json.loads(capsys.readouterr().out)
    rows = out["results"]
    assert status == 0
    assert rows and all(r["tuned_us"] is not None and r["stored"] for r in rows)
    assert sorted(scripted_run.asked) == sorted(r["op"] for r in rows)   # the column asked of every kernel
    for r in rows:
        assert (r["cudnn_us"] is None) == (r["op"] in out["cudnn_notes"] and r["op"] not in BASELINE_NOTES)
    for op, note in out["cudnn_notes"].items():
        assert note == BASELINE_NOTES.get(op) or note.startswith("none (")


def test_kriz09_tunes_its_fused_kernels_with_their_operator_sequences(scripted_run, capsys):
    """The README's first command: kriz09's fused conv_pool kernels are compared with the PyTorch
    operators they replace, each footnoted, and the table is printed whole."""
    status = cli.main(["tune", "--network", "kriz09", "--batch", "128", "--trials", "14", "--no-progress"])
    table = capsys.readouterr().out
    assert status == 0
    ops = {line.split()[0] for line in table.splitlines()[1:] if not line.startswith("*")}
    assert {"conv_fwd", "conv_wgrad", "conv_pool_fwd", "conv_pool_dz", "avgpool_fwd", "avgpool_bwd"} <= ops
    assert f"cuDNN column, conv_pool_fwd: {BASELINE_NOTES['conv_pool_fwd']}" in table
    assert f"cuDNN column, conv_pool_dz: {BASELINE_NOTES['conv_pool_dz']}" in table
    pooled = next(line for line in table.splitlines() if line.startswith("conv_pool_fwd"))
    assert "50.0" in pooled   # a time, not an empty cell


def test_a_failing_baseline_leaves_its_cell_empty_and_the_run_whole(scripted_run, monkeypatch, capsys):
    failing = ScriptedPyTorch(failing_op="conv_wgrad")
    monkeypatch.setattr(baselines, "open_baselines", lambda budget_s=0.2: failing)
    status = cli.main(["tune", "--network", "lenet5", "--batch", "8", "--trials", "12", "--storage", "memory",
                       "--no-progress", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert status == 0
    wgrad = [r for r in out["results"] if r["op"] == "conv_wgrad"]
    assert wgrad and all(r["cudnn_us"] is None and r["stored"] for r in wgrad)
    assert out["cudnn_notes"]["conv_wgrad"] == "none (PyTorch failed: OutOfMemoryError: CUDA out of memory)"


def test_no_pytorch_and_cudnn_asked_for_gives_empty_cells_with_the_reason(scripted_run, monkeypatch, capsys):
    monkeypatch.setattr(baselines, "open_baselines", lambda budget_s=0.2: baselines.NoBaselines("no PyTorch here"))
    status = cli.main(["tune", "--network", "lenet5", "--batch", "8", "--trials", "12", "--storage", "memory",
                       "--no-progress", "--cudnn"])
    table = capsys.readouterr().out
    assert status == 0
    assert "cuDNN column, conv_fwd: none (no PyTorch here)" in table


def test_the_baseline_rule_answers_every_operation_without_pytorch():
    from autocnn.kernels.problem import PROBLEM_TYPES
    from autocnn.kernels.suite import named_problems

    seen = set()
    for op in PROBLEM_TYPES:
        for _, problem in named_problems(op)[:2]:
            reason = no_baseline_reason(op, problem)
            assert reason is None or reason.strip()
            seen.add(op)
    assert {"conv_pool_fwd", "conv_pool_dz", "conv_bwd_fused"} <= seen
    assert no_baseline_reason("conv_bogus", None) == "PyTorch has no operator for conv_bogus"


def test_time_baseline_turns_an_operator_error_into_a_reason(monkeypatch):
    from autocnn.kernels.problem import ConvFwdProblem

    def broken(op, problem, **kwargs):
        raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED\nmore lines")
    monkeypatch.setattr(baselines, "time_cudnn", broken)
    timed = baselines.time_baseline("conv_fwd", ConvFwdProblem(N=1, C=3, H=8, W=8, K=4, R=3, S=3))
    assert timed == BaselineTime(None, "PyTorch failed: RuntimeError: cuDNN error: CUDNN_STATUS_NOT_SUPPORTED")


@pytest.mark.gpu
def test_pytorch_times_every_operation_it_has_a_version_of():
    """On the GPU: every operation's seed-suite shapes get a time from PyTorch, or the rule's
    reason where PyTorch has no version; none is a failure (the fused ones are the sequences)."""
    from autocnn.device import current_device
    from autocnn.kernels.problem import PROBLEM_TYPES
    from autocnn.kernels.suite import named_problems
    from autocnn.measurement.measure import L2Flusher

    flusher = L2Flusher(current_device().l2_bytes)
    for op in PROBLEM_TYPES:
        for name, problem in named_problems(op)[:2]:
            timed = baselines.time_baseline(op, problem, flusher=flusher, budget_s=0.05)
            reason = no_baseline_reason(op, problem)
            assert timed.reason == reason, (op, name, timed)
            assert (timed.us is not None and timed.us > 0) == (reason is None), (op, name, timed)
