"""The bf16 and fp16 bounds (autocnn.precision), shown on a NumPy emulation of what a 16-bit
tensor-core kernel computes: 16-bit operands, products exact in FP32, FP32 sums in steps of one
mma's k16, each output rounded to 16 bits once; the reference in float64 from the 16-bit inputs."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from autocnn.precision import (BF16, BF16_UNIT_ROUNDOFF, FP16, FP16_UNIT_ROUNDOFF, FP32, PRECISIONS, TF32,
                               precision_named)
from tests.test_precision import rel_error, to_bf16


def to_fp16(x: np.ndarray) -> np.ndarray:
    """cvt.rn.f16.f32: round to 10 explicit mantissa bits, ties to even, inf beyond the largest
    finite half (kept as float32)."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


ROUND = {"bf16": to_bf16, "fp16": to_fp16}
UNIT = {"bf16": BF16_UNIT_ROUNDOFF, "fp16": FP16_UNIT_ROUNDOFF}
SIXTEEN = (BF16, FP16)


def emulated_kernel(a: np.ndarray, b: np.ndarray, rounding, split: int = 1) -> np.ndarray:
    """a @ b as a 16-bit kernel forms it from 16-bit a and b: exact products, FP32 partial sums of 16
    terms added into an FP32 accumulator; ``split`` > 1: the reduction cut into that many parts, each
    part's sum rounded to 16 bits (a split-K kernel staging its partial results as 16-bit outputs)
    before the parts are added in FP32 and the sum is rounded again."""
    parts = np.array_split(np.arange(a.shape[1]), split)
    total = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    for idx in parts:
        acc = np.zeros_like(total)
        for k0 in range(0, len(idx), 16):
            k = idx[k0:k0 + 16]
            acc += (a[:, k].astype(np.float64) @ b[k].astype(np.float64)).astype(np.float32)
        total += rounding(acc) if split > 1 else acc
    return rounding(total)


def operands(k: int, name: str, positive: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([k, len(name)])
    a = rng.standard_normal((48, k)).astype(np.float32)
    b = rng.standard_normal((k, 40)).astype(np.float32)
    if positive:
        a, b = np.abs(a), np.abs(b)
    return ROUND[name](a), ROUND[name](b)


def test_sixteen_bit_roundings_keep_their_significands_and_fp16_overflows_to_inf():
    r = np.random.default_rng(1).standard_normal(100_000).astype(np.float32) * 100
    for name, rounding in ROUND.items():
        got = rounding(r)
        assert np.max(np.abs(got - r) / np.abs(r)) <= UNIT[name]   # round to nearest: half an ulp
        assert np.all(rounding(got) == got)
    assert to_bf16(np.float32(1 + 2**-8)) == 1.0            # a tie rounds to even
    assert to_bf16(np.float32(1 + 3 * 2**-8)) == np.float32(1 + 2**-6)
    assert to_fp16(np.float32(1 + 2**-11)) == 1.0
    big = to_fp16(np.array([65504, 65519, 65520, 1e6, -1e6], dtype=np.float32))
    assert list(big[:2]) == [65504, 65504] and np.isposinf(big[2:4]).all() and np.isneginf(big[4])
    assert np.isnan(to_fp16(np.float32(np.nan))) and np.isnan(to_bf16(np.float32(np.nan)))


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_products_of_sixteen_bit_values_are_exact_in_fp32(name):
    a, b = operands(4096, name)
    products = a[0] * b[:, 0]                                        # float32 products
    assert np.array_equal(products.astype(np.float64), a[0].astype(np.float64) * b[:, 0].astype(np.float64))


@pytest.mark.parametrize("k", [9, 576, 4608, 36864])
@pytest.mark.parametrize("precision", SIXTEEN, ids=str)
def test_a_sixteen_bit_kernel_meets_its_bound_and_not_the_fp32_one(precision, k):
    a, b = operands(k, precision.name)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    got = emulated_kernel(a, b, ROUND[precision.name])
    err = rel_error(got, ref)
    assert err <= precision.error_bound(k) / 2                       # with room to spare
    assert err > FP32.error_bound(k)                                 # why it has a bound of its own
    assert err > UNIT[precision.name] / 4                            # the outputs' rounding is the error
    # every element within its own rounding plus FP32 sums: |got - ref| <= u |ref| + n 2^-24 sum |terms|
    terms = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    assert np.all(np.abs(got - ref) <= UNIT[precision.name] * np.abs(ref) * (1 + 2**-20) + k * 2.0**-24 * terms)


@pytest.mark.parametrize("precision", SIXTEEN, ids=str)
def test_the_bound_allows_one_staged_sixteen_bit_intermediate(precision):
    for k in (576, 4608):
        for positive in (False, True):
            a, b = operands(k, precision.name, positive)
            ref = a.astype(np.float64) @ b.astype(np.float64)
            assert rel_error(emulated_kernel(a, b, ROUND[precision.name], split=4), ref) <= precision.error_bound(k)


@pytest.mark.parametrize("precision", SIXTEEN, ids=str)
def test_faults_a_kernel_can_make_fail_the_bound(precision):
    k = 4608
    a, b = operands(k, precision.name)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    rounding = ROUND[precision.name]
    one_term_short = emulated_kernel(a[:, 1:], b[1:], rounding)     # an index off by one in K
    assert rel_error(one_term_short, ref) > precision.error_bound(k)
    one_wrong_row = emulated_kernel(a, b, rounding)
    one_wrong_row[7] = emulated_kernel(a[6:7], b, rounding)[0]      # a row of the tile read twice
    assert rel_error(one_wrong_row, ref) > precision.error_bound(k)
    # against a reference from the float32 values before their rounding to 16 bits, the inputs'
    # rounding would add as much again as the outputs': verification computes the reference from
    # the 16-bit inputs, so that the bound measures the kernel and not the rounding of its inputs
    rng = np.random.default_rng(3)
    a32 = rng.standard_normal((48, k)).astype(np.float32)
    b32 = rng.standard_normal((k, 40)).astype(np.float32)
    a16, b16 = rounding(a32), rounding(b32)
    got = emulated_kernel(a16, b16, rounding)
    of_inputs = rel_error(got, a16.astype(np.float64) @ b16.astype(np.float64))
    of_values = rel_error(got, a32.astype(np.float64) @ b32.astype(np.float64))
    assert of_values > 1.4 * of_inputs


def test_sixteen_bit_bounds_do_not_grow_like_the_fp32_sums():
    for precision in SIXTEEN:
        u = UNIT[precision.name]
        assert precision.error_bound(9) == pytest.approx(2 * u + FP32.error_bound(9))
        assert precision.error_bound(1 << 20) == pytest.approx(2 * u + FP32.error_bound(1 << 20))
        assert precision.error_bound(1 << 20) < 2 * precision.error_bound(1024)
    assert FP16.error_bound(1024) < TF32.error_bound(1024) < BF16.error_bound(1024)


def test_sixteen_bit_precisions_are_one_object_each_offered_and_apart_from_the_float32_ones():
    for precision in SIXTEEN:
        assert pickle.loads(pickle.dumps(precision)) is precision
        assert precision.x.size == precision.w.size == precision.y.size == 2 and precision.accumulator.size == 4
        assert precision in PRECISIONS and precision_named(precision.name) is precision and precision.sixteen_bit
        # a config never crosses element types: neither way with the float32 precisions, nor between the two
        assert not precision.can_serve(FP32) and not FP32.can_serve(precision) and not TF32.can_serve(precision)
        assert not BF16.can_serve(FP16) and not FP16.can_serve(BF16) and precision.can_serve(precision)
    with pytest.raises(ValueError, match="one of fp32, tf32, bf16, fp16"):
        precision_named("bf32")
    assert sorted([FP16, TF32, BF16, FP32]) == [FP32, TF32, BF16, FP16]
