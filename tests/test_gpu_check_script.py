"""scripts/gpu_check.sh's bookkeeping, on the CPU with a small test file of its own: runs side by
side (-j) reported in the order they were started, one run per function or per case, a failed
test's run failing the whole check, and arguments it cannot take refused before anything runs."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"

SAMPLE = textwrap.dedent('''
    import time

    import pytest


    def test_slow():
        time.sleep(2)   # ends after the runs started after it


    def test_fast():
        pass


    @pytest.mark.parametrize("x", [1, 2])
    def test_cases(x):
        assert x == 1
''')


def _check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    sample = tmp_path / "test_sample.py"
    sample.write_text(SAMPLE)
    out = tmp_path / "out"
    # The script runs "python3 -m pytest": this interpreter's, with its pytest.
    env = {**os.environ, "OUT": str(out), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(SCRIPT), "-m", "not gpu", *args, str(sample)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    summary = out / "gpu_tests_summary.txt"
    return done, summary.read_text().splitlines() if summary.exists() else []


def test_runs_side_by_side_are_reported_in_the_order_they_started(tmp_path):
    done, summary = _check(tmp_path, "-j", "3", "--by-function")
    assert [line.split()[0] for line in summary] == ["test_sample-test_slow", "test_sample-test_fast",
                                                     "test_sample-test_cases"]
    assert "1 passed" in summary[0] and "1 passed" in summary[1]
    assert "1 failed, 1 passed" in summary[2]
    assert done.returncode == 1, done.stdout + done.stderr   # the failed case fails the check
    assert (tmp_path / "out" / "test_sample-test_cases.log").exists()


def test_one_run_per_case(tmp_path):
    done, summary = _check(tmp_path, "-j", "2", "--by-case")
    labels = [line.split()[0] for line in summary]
    assert labels == ["test_sample-test_slow", "test_sample-test_fast", "test_sample-test_cases_1_",
                      "test_sample-test_cases_2_"]
    assert "1 passed" in summary[2] and "1 failed" in summary[3]
    assert done.returncode == 1


@pytest.mark.parametrize("args, says", [(["-j", "0"], "-j takes a number of runs of 1 or more"),
                                        (["-T", "soon"], "-T takes whole seconds"),
                                        (["--fast"], "unknown option --fast")])
def test_arguments_it_cannot_take_are_refused_before_anything_runs(tmp_path, args, says):
    done, summary = _check(tmp_path, *args)
    assert done.returncode == 2 and says in done.stderr and summary == []


FAMILIES = textwrap.dedent('''
    import pytest


    @pytest.mark.parametrize("case", ["conv_fwd-a", "conv_fwd-b", "conv_wgrad-a"])
    def test_family_verifies(case):
        pass
''')


@pytest.mark.parametrize("other", [False, True])
def test_one_run_per_operation_and_one_for_the_rest_where_there_is_a_rest(tmp_path, other):
    # --by-op splits a file named test_gpu_kernels.py: each operation's family cases, then the other
    # tests, a run only where there are some (an empty one would run pytest on "").
    kernels = tmp_path / "test_gpu_kernels.py"
    kernels.write_text(FAMILIES + ("\n\ndef test_rest():\n    pass\n" if other else ""))
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(SCRIPT), "-m", "not gpu", "--by-op", str(kernels)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    summary = (out / "gpu_tests_summary.txt").read_text().splitlines()
    runs = {line.split()[0]: line for line in summary}
    want = ["test_gpu_kernels-conv_fwd", "test_gpu_kernels-conv_wgrad"] + (["test_gpu_kernels-other"] if other else [])
    assert list(runs) == want, summary
    assert "2 passed" in runs["test_gpu_kernels-conv_fwd"] and "1 passed" in runs["test_gpu_kernels-conv_wgrad"]
    assert done.returncode == 0, done.stdout + done.stderr
