"""The Precision type: one object per precision, names taken at the door, bounds set in one
place, and no precision decided by comparing names inside autocnn."""
from __future__ import annotations

import ast
import dataclasses
import pickle
from pathlib import Path

import pytest

from autocnn.errors import InvalidProblemError
from autocnn.kernels.problem import ConvFwdProblem, problem_from_dict
from autocnn.precision import (BASE_TERMS, BF16, FLOAT32_PRECISIONS, FP16, FP32, FP32_BASE_BOUND, PRECISION_NAMES,
                               PRECISIONS, TF32, TF32_BASE_BOUND, Precision, precision_named)
from autocnn.measurement.measure import error_bound

PACKAGE = Path(__file__).resolve().parent.parent / "autocnn"


def test_a_problem_takes_a_name_and_holds_the_precision():
    p = ConvFwdProblem(N=2, C=3, H=9, W=7, K=5, R=3, S=3, precision="tf32")
    assert p.precision is TF32
    assert dataclasses.replace(p, precision="fp32").precision is FP32
    assert p.to_dict()["precision"] == "tf32" and "precision" not in dataclasses.replace(p, precision=FP32).to_dict()
    assert problem_from_dict(p.to_dict()) == p
    assert p.shape_string().endswith(",precision=tf32")
    assert pickle.loads(pickle.dumps(p)).precision is TF32   # the worker processes get the same object


def test_a_bad_name_is_refused_with_the_allowed_ones():
    with pytest.raises(InvalidProblemError, match=r"precision='bf17' is not allowed: one of fp32, tf32, bf16, fp16"):
        ConvFwdProblem(N=1, C=1, H=4, W=4, K=1, R=3, S=3, precision="bf17")
    with pytest.raises(InvalidProblemError, match="one of fp32, tf32, bf16, fp16"):
        precision_named(32)


def test_the_bounds_are_the_precisions_own():
    assert error_bound(BASE_TERMS, "fp32") == FP32.error_bound(BASE_TERMS) == FP32_BASE_BOUND
    assert error_bound(4 * BASE_TERMS, TF32) == pytest.approx(2 * TF32_BASE_BOUND)
    assert error_bound(10) == FP32_BASE_BOUND   # short reductions keep the base bound


def test_what_a_precision_answers():
    assert FP32.tf32x3 and not FP32.tf32 and TF32.tf32 and not TF32.tf32x3
    assert FP32.can_serve(TF32) and not TF32.can_serve(FP32)   # an fp32 config may run tf32, never back
    assert {p.x.c_type for p in FLOAT32_PRECISIONS} == {"float"} and FLOAT32_PRECISIONS == (FP32, TF32)
    assert {p.accumulator.size for p in PRECISIONS} == {4}   # every precision sums in FP32
    assert [p.sixteen_bit for p in PRECISIONS] == [False, False, True, True] and (BF16.x.c_type, FP16.x.c_type) == (
        "__nv_bfloat16", "__half")
    assert sorted([TF32, FP32]) == [FP32, TF32] and tuple(map(str, PRECISIONS)) == PRECISION_NAMES
    assert FP32 == "fp32" and TF32 != "fp32"   # a user's comparison reads as written


def _name_comparisons(tree: ast.AST) -> list[int]:
    """Lines where a comparison has a precision's name as an operand (alone or in a tuple)."""
    names = set(PRECISION_NAMES)

    def is_name(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(is_name(e) for e in node.elts)
        return False
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Compare) and any(is_name(n) for n in [node.left, *node.comparators])]


def test_no_precision_is_decided_by_comparing_its_name():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = _name_comparisons(ast.parse(path.read_text(), str(path)))
        if lines:
            found[str(path.relative_to(PACKAGE))] = lines
    assert not found, f"ask the Precision (autocnn/precision.py) instead of comparing names: {found}"
    templates = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.j2")
                 if any(f'precision == "{n}"' in p.read_text() or f"precision == '{n}'" in p.read_text()
                        for n in PRECISION_NAMES)]
    assert not templates


def test_the_guard_sees_a_comparison():
    assert _name_comparisons(ast.parse('x = p.precision == "tf32"\ny = q in ("fp32", "tf32")\n')) == [1, 2]


def test_precision_is_a_type():
    assert isinstance(FP32, Precision) and all(isinstance(p, Precision) for p in PRECISIONS)
