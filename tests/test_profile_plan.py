"""scripts/profile_plan.py: bad input is refused before any device work; on a GPU, every step of a
plan (generated kernels and cuFFT transforms) is timed alone, after the plan verified."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import profile_plan  # noqa: E402

SHAPE = "N=3,C=4,H=9,W=12,K=5,R=7,S=5,stride=1,pad=3"
# The GPU test's plan: an fft config with a directly transformed dY and cuFFT filters.
CONFIG = {"formulation": "fft", "FFT_SIZE": "smooth", "IMGS": 2, "FFT_THREADS": 64, "IT": 2, "JT": 2,
          "MAC": "block", "FB": 4, "BL": 4, "MAC_ORDER": "tiles", "XFORM_A": "dft", "DFT_FLAT_A": 0, "XFORM_B": "cufft",
          "XFORM_O": "cufft", "WS_SHARE": 0, "FFT_VEC": 1, "FFT_TILE": 0, "RADIX_THREADS": 0}


@pytest.mark.parametrize("argv, message", [
    (["--op", "conv_fwd", "--shape", "N=2,C=3"], "missing H, W, K, R, S"),
    (["--op", "conv_fwdd", "--shape", SHAPE], "conv_fwdd"),
    (["--op", "conv_fwd", "--shape", SHAPE, "--config", "{formulation: fft}"], "Expecting property name"),
])
def test_bad_input_is_refused_before_any_device_work(argv, message, capsys, device_untouched):
    with pytest.raises(SystemExit) as exc:
        profile_plan.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_the_gpu_tests_config_is_a_whole_config_of_the_space_here():
    """The GPU test's config checked on every CI run: a parameter added to the formulation since would
    otherwise fail it only on a GPU host (XFORM_O did, unseen, until one ran it)."""
    from autocnn.device import DeviceLimits
    from autocnn.kernels import get_operation
    from autocnn.kernels.problem import parse_shape

    problem = parse_shape("conv_bwd_data", SHAPE)
    op = get_operation("conv_bwd_data")
    config = op.space(problem, DeviceLimits.for_arch("sm_90")).validate(CONFIG)
    assert config.as_dict() == CONFIG


@pytest.mark.gpu
def test_every_step_of_a_verified_plan_is_timed(tmp_path, capsys):
    pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels import get_operation
    from autocnn.kernels.problem import parse_shape
    from autocnn.kernels.steps import LibraryFft

    config = CONFIG
    out = tmp_path / "profile.json"
    assert profile_plan.main(["--op", "conv_bwd_data", "--shape", SHAPE, "--config", json.dumps(config),
                              "--budget", "0.05", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    problem = parse_shape("conv_bwd_data", SHAPE)
    op = get_operation("conv_bwd_data")
    steps = op.plan(problem, op.space(problem, current_device().limits()).validate(config)).steps
    # The filters placed and R2C, then per block of 2 of the 3 images: dY's direct transform, the
    # multiply-accumulate, C2R and the crop.
    assert row["verified"] and len(row["steps"]) == len(steps) == 10
    assert [s["step"].split()[0] for s in row["steps"]] == [
        "cuFFT" if isinstance(s, LibraryFft) else s.kernel for s in steps]
    assert all(s["us"] > 0 for s in row["steps"]) and row["plan_us"] > 0
    assert "sum of steps" in capsys.readouterr().out
