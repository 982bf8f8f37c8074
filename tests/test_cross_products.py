"""CROSS on the mma.sync formulations (fp32): 3xTF32's two cross products big x small + small x big
as one m16n8k16 BF16 mma per k-step (_mma_sync.cuh.j2's mma_cross) instead of two m16n8k8 TF32
ones, in the tc formulation (CROSS), winograd's generated products (MMA_CROSS) and fft's tensor-core
multiply-accumulate (MAC_CROSS). The parameters, their rules and the code they select here; the CPU
emulator runs the kernels in tests/test_mma_emulated.py; the GPU test below is the word on the
hardware (every element against float64 at the FP32 bound). wgmma's own CROSS is in test_wgmma.py."""
from __future__ import annotations

import dataclasses
import random

import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError, InvalidConfigError
from autocnn.kernels import OPERATIONS
from autocnn.kernels.suite import odd_problems, seed_problems
from tests.formulation_checks import assert_every_config_verifies
from tests.test_fft import small_problems as fft_problems
from tests.test_winograd import wgmma_problems as winograd_problems

OPS = ("conv_fwd", "conv_bwd_data", "conv_wgrad")
LIMITS = DeviceLimits.for_arch("sm_90")


def _tc_configs(op, problem):
    """The tc defaults with paired fragment reads and CROSS=1, and two sampled CROSS configs."""
    space = OPERATIONS[op].space(problem, LIMITS)
    out = []
    for cand in OPERATIONS[op].formulation("tc").default_candidates(problem):
        try:
            out.append(space.validate({**cand, "FRAG": "pair", "CROSS": 1}))
        except (InvalidConfigError, InfeasibleConfigError):   # a candidate's tile the small shape does not offer
            pass
    rng = random.Random(len(out))
    return out + space.restrict({"formulation": "tc", "CROSS": 1}).sample(rng, 2, exclude=out)


def _sampled(op, problem, fixed, count, seed=0):
    return OPERATIONS[op].space(problem, LIMITS).restrict(fixed).sample(random.Random(seed), count)


@pytest.mark.parametrize("op", OPS)
def test_cross_is_offered_for_fp32_and_selects_the_bf16_mma(op):
    problem = odd_problems(op)[0][1]
    tf32 = dataclasses.replace(problem, precision="tf32")
    space = OPERATIONS[op].space(problem, LIMITS)
    default = OPERATIONS[op].default_config(problem, LIMITS, formulation="tc")
    assert default["CROSS"] == 0   # the first choice: the code of configs written before the parameter
    paired = {**default.as_dict(), "FRAG": "pair"}
    three = OPERATIONS[op].plan(problem, space.validate({**paired, "CROSS": 0})).source
    cross = OPERATIONS[op].plan(problem, space.validate({**paired, "CROSS": 1})).source
    assert "m16n8k16.row.col.f32.bf16.bf16" in cross and "bf16" not in three
    assert "products_cross(part" in cross and "products(acc, part" not in cross
    with pytest.raises(InfeasibleConfigError, match="FRAG=scalar"):
        space.validate({**default.as_dict(), "FRAG": "scalar", "CROSS": 1})
    with pytest.raises(InvalidConfigError, match="CROSS"):
        tf32_default = OPERATIONS[op].default_config(tf32, LIMITS, formulation="tc")
        OPERATIONS[op].space(tf32, LIMITS).validate({**tf32_default.as_dict(), "CROSS": 1})
    # winograd's products and fft's multiply-accumulate take it under their own names
    wq = dataclasses.replace(winograd_problems(op)[0][1], precision="fp32")
    products = _sampled(op, wq, {"formulation": "winograd", "PRODUCTS": "mma", "MMA_CROSS": 1}, 1)[0]
    assert "mma_cross(" in OPERATIONS[op].plan(wq, products).source
    f = dict(fft_problems(op))["f_7x5"]
    mac = _sampled(op, f, {"formulation": "fft", "MAC": "mma", "MAC_CROSS": 1}, 1)[0]
    assert "product_cross(pre" in OPERATIONS[op].plan(f, mac).source
    assert "MAC_CROSS" not in _sampled(op, f, {"formulation": "fft", "MAC": "block"}, 1)[0].as_dict()


def _gpu_problems(op):
    seed = dict(seed_problems(op))
    return {"tc": [("modern_14 (4 images)", dataclasses.replace(seed["modern_14"], N=4)), *odd_problems(op)],
            "winograd": [("sweep_3x3 (4 images)", dataclasses.replace(seed["sweep_3x3"], N=4)),
                         *((n, dataclasses.replace(p, precision="fp32")) for n, p in winograd_problems(op))],
            "fft": [("sweep_7x7 (4 images)", dataclasses.replace(seed["sweep_7x7"], N=4)),
                    ("scherer10_l2 (4 images)", dataclasses.replace(seed["scherer10_l2"], N=4)),
                    *fft_problems(op)]}


@pytest.mark.parametrize("op", OPS)
def test_the_gpu_test_has_cross_configs_for_every_shape(op):
    problems = _gpu_problems(op)
    for name, problem in problems["tc"]:
        configs = _tc_configs(op, problem)
        assert configs and all(c["CROSS"] == 1 for c in configs), name
    for name, problem in problems["winograd"]:
        assert _sampled(op, problem, {"formulation": "winograd", "PRODUCTS": "mma", "MMA_CROSS": 1}, 3), name
    for name, problem in problems["fft"]:
        assert _sampled(op, problem, {"formulation": "fft", "MAC": "mma", "MAC_CROSS": 1}, 3), name


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_cross_products_meet_the_fp32_bound_on_the_gpu(op):
    """tc (its defaults with paired reads and two samples), winograd's products (three samples, both
    tiles) and fft's multiply-accumulate (three samples, stride phases included) with CROSS on a
    seed layer of 4 images and the odd shapes, every element against float64 at the FP32 bound."""
    problems = _gpu_problems(op)
    operation = OPERATIONS[op]
    assert_every_config_verifies(operation, "tc", problems["tc"], lambda p: _tc_configs(op, p), "sm_90", LIMITS)
    assert_every_config_verifies(operation, "winograd", problems["winograd"],
                                 lambda p: _sampled(op, p, {"formulation": "winograd", "PRODUCTS": "mma",
                                                            "MMA_CROSS": 1}, 3), "sm_90", LIMITS)
    assert_every_config_verifies(operation, "fft", problems["fft"],
                                 lambda p: _sampled(op, p, {"formulation": "fft", "MAC": "mma", "MAC_CROSS": 1}, 3),
                                 "sm_90", LIMITS)
