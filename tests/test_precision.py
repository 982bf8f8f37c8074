"""Precision: the problem field, the bounds, and a NumPy emulation of TF32 rounding showing that
3xTF32 meets the FP32 bound while one TF32 product per term needs the TF32 bound."""
from __future__ import annotations

import math

import numpy as np
import pytest

from autocnn.errors import InvalidProblemError
from autocnn.kernels.problem import ConvFwdProblem, ConvWgradProblem, parse_shape, problem_from_dict
from autocnn.precision import FP32_BASE_BOUND as BASE_BOUND, TF32_BASE_BOUND
from autocnn.measurement.measure import error_bound


def to_tf32(x: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32: round a float32 to 10 explicit mantissa bits, ties away from zero."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return rounded.view(np.float32)


def split_tf32(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    big = to_tf32(x)
    small = to_tf32((x - big).astype(np.float32))
    return big, small


def to_bf16(x: np.ndarray) -> np.ndarray:
    """cvt.rn.bf16.f32: round a float32 to 7 explicit mantissa bits, ties to even (kept as float32)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return rounded.view(np.float32)


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def emulated_gemm(a: np.ndarray, b: np.ndarray, three: bool, cross: bool = False) -> np.ndarray:
    """Products of TF32 operands are exact in float32 (11 x 11 mantissa bits), as in the tensor
    cores, and so are those of BF16 ones (8 x 8); the sums here run in float32 with
    round-to-nearest, tile by tile of 8 terms. cross (wgmma's CROSS, with three): the two cross
    products as BF16 values times BF16 remainders, x_a * rest_b + rest_a * x_b."""
    if three and cross:
        ab = to_tf32(a)
        bb = to_tf32(b)
        terms = [(to_bf16(a), to_bf16((b - bb).astype(np.float32))), (to_bf16((a - ab).astype(np.float32)), to_bf16(b)),
                 (ab, bb)]
    elif three:
        ab, as_ = split_tf32(a)
        bb, bs = split_tf32(b)
        terms = [(as_, bb), (ab, bs), (ab, bb)]
    else:
        terms = [(to_tf32(a), to_tf32(b))]
    acc = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    for k0 in range(0, a.shape[1], 8):
        part = np.zeros_like(acc)
        for x, y in terms:
            part += (x[:, k0:k0 + 8].astype(np.float64) @ y[k0:k0 + 8].astype(np.float64)).astype(np.float32)
        acc += part
    return acc


def test_tf32_rounding_keeps_ten_mantissa_bits_and_rounds_to_nearest():
    x = np.array([1.0, 1.0 + 2**-10, 1.0 + 2**-11, 1.0 + 2**-12, -1.0 - 3 * 2**-12, 3.0e-39], dtype=np.float32)
    got = to_tf32(x)
    assert got[0] == 1.0 and got[1] == np.float32(1.0 + 2**-10)
    assert got[2] == np.float32(1.0 + 2**-10)          # a tie rounds away from zero
    assert got[3] == 1.0                               # below half an ulp rounds down
    assert got[4] == np.float32(-1.0 - 2**-10)
    assert np.all(to_tf32(got) == got)                 # idempotent
    r = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)
    assert np.max(np.abs(to_tf32(r) - r) / np.abs(r)) <= 2.0**-11


@pytest.mark.parametrize("k", [9, 576, 2304, 4608])
def test_three_tf32_meets_the_fp32_bound_and_one_tf32_only_its_own(k):
    rng = np.random.default_rng(k)
    a = rng.standard_normal((64, k)).astype(np.float32)
    b = rng.standard_normal((k, 48)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    three = rel_error(emulated_gemm(a, b, three=True), ref)
    one = rel_error(emulated_gemm(a, b, three=False), ref)
    assert three <= error_bound(k, "fp32") / 4      # with room to spare
    assert one <= error_bound(k, "tf32")
    assert one > error_bound(k, "fp32")             # why tf32 needs a bound of its own
    assert one > 50 * three


@pytest.mark.parametrize("k", [9, 576, 2304, 4608])
def test_cross_products_in_bf16_meet_the_fp32_bound(k):
    """wgmma's CROSS: big x big in TF32, the cross products as BF16 value x BF16 remainder. A
    remainder is at most 2**-11 of its value and each BF16 rounding moves a factor by at most 2**-8,
    so a product is within about 2**-17 of itself. On random data that is 2-7 times 3xTF32's error
    (6-8e-7 here) and a tenth of the FP32 bound; where nothing cancels (every term positive) it stays
    within the bound too."""
    rng = np.random.default_rng(k)
    a = rng.standard_normal((64, k)).astype(np.float32)
    b = rng.standard_normal((k, 48)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    cross = rel_error(emulated_gemm(a, b, three=True, cross=True), ref)
    three = rel_error(emulated_gemm(a, b, three=True), ref)
    assert cross <= error_bound(k, "fp32") / 4
    assert three < cross < 20 * three                # less exact than 3xTF32, far from TF32
    pos_a, pos_b = np.abs(a), np.abs(b)              # no cancellation: errors add up
    ref = pos_a.astype(np.float64) @ pos_b.astype(np.float64)
    assert rel_error(emulated_gemm(pos_a, pos_b, three=True, cross=True), ref) <= error_bound(k, "fp32") / 2


def test_bounds_grow_with_the_square_root_of_long_reductions():
    assert error_bound(100) == BASE_BOUND and error_bound(1024) == BASE_BOUND
    assert error_bound(4096) == pytest.approx(2 * BASE_BOUND)
    assert error_bound(100, "tf32") == TF32_BASE_BOUND == pytest.approx(4 * 2.0**-11)
    assert error_bound(16384, "tf32") == pytest.approx(4 * TF32_BASE_BOUND)
    with pytest.raises(ValueError, match="one of fp32, tf32, bf16, fp16"):
        error_bound(10, "fp8")


def test_precision_is_part_of_the_problem_and_fp32_is_the_default():
    p = ConvFwdProblem(N=2, C=3, H=8, W=8, K=4, R=3, S=3)
    assert p.precision == "fp32"
    # fp32 is left out of the stored form, so records made before precision existed keep their keys.
    assert "precision" not in p.to_dict() and "precision" not in p.shape_string()
    t = ConvFwdProblem(N=2, C=3, H=8, W=8, K=4, R=3, S=3, precision="tf32")
    assert t != p and t.to_dict()["precision"] == "tf32"
    assert problem_from_dict(t.to_dict()) == t and problem_from_dict(p.to_dict()) == p
    assert t.shape_string().endswith(",precision=tf32")
    assert parse_shape("conv_fwd", t.shape_string()) == t
    assert t.with_op("conv_wgrad") == ConvWgradProblem(N=2, C=3, H=8, W=8, K=4, R=3, S=3, precision="tf32")


def test_an_unknown_precision_is_refused_with_what_is_allowed():
    with pytest.raises(InvalidProblemError, match="precision.*fp32, tf32, bf16, fp16"):
        ConvFwdProblem(N=2, C=3, H=8, W=8, K=4, R=3, S=3, precision="fp8")
