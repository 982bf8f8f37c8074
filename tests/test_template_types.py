"""Kernel templates take element types from the problem's Precision (``t`` in their context), never
``float`` where a tensor's or the accumulator's type belongs (every template of the package: those
rendered without a problem, the training library's and the separable factorisation's, say in a note
why they are float32).

A template keeps ``float`` only where a ``{# float: why #}`` note says why (arithmetic that stays
FP32 whatever the storage: TF32 splits, FFT spectra, an instruction's registers): a note on a
template's first line covers the template, any other note the lines after it up to the next blank
line. Prose (C++ and Jinja comments) is not code and is not checked."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from autocnn.device import DeviceLimits
from autocnn.kernels import get_operation, problem_from_dict
from autocnn.kernels.codegen import template_index
from autocnn.precision import FP32, ElementType, KernelTypes

DIGESTS = Path(__file__).resolve().parent / "data" / "render_digests.json"
PACKAGE = Path(__file__).resolve().parent.parent / "autocnn"
NOTE = re.compile(r"^\s*\{#\s*float:.*#\}\s*$")
FLOAT = re.compile(r"\bfloat\b")


def _without_prose(text: str) -> str:
    """The text with Jinja comments other than notes blanked (keeping their lines) and C++ line
    comments cut."""
    def blank(m: re.Match) -> str:
        return m.group(0) if NOTE.match(m.group(0)) else "\n" * m.group(0).count("\n")
    text = re.sub(r"\{#.*?#\}", blank, text, flags=re.S)
    return "\n".join(line.split("//")[0] for line in text.split("\n"))


def floats_without_a_note(text: str) -> list[int]:
    """Line numbers of a template that spell float outside a note's cover."""
    lines, written = _without_prose(text).split("\n"), text.split("\n")
    if lines and NOTE.match(lines[0]):
        return []
    found, covered = [], False
    for number, (line, as_written) in enumerate(zip(lines, written), 1):
        if NOTE.match(line):
            covered = True
        elif not as_written.strip():
            covered = False
        elif FLOAT.search(line) and not covered:
            found.append(number)
    return found


def test_no_kernel_template_spells_float_where_an_element_type_belongs():
    templates = sorted(PACKAGE.rglob("*.j2"))
    assert set(template_index().values()) <= set(templates)   # every kernel template is guarded
    found = {str(p.relative_to(PACKAGE)): lines for p in templates if (lines := floats_without_a_note(p.read_text()))}
    assert not found, f"write {{{{ t.x }}}}, {{{{ t.acc }}}} ... or say why in a {{# float: #}} note: {found}"


def test_the_guard_sees_a_float_and_honours_notes():
    text = ("__device__ float f(const {{ t.x }}* p);\n"
            "// float in prose\n"
            "{# float: FP32 arithmetic #}\n"
            "__device__ float g(float v);\n"
            "\n"
            "__device__ float h();\n")
    assert floats_without_a_note(text) == [1, 6]
    assert floats_without_a_note("{# float: the whole template #}\nfloat a;\n\nfloat b;\n") == []


# A precision of other element types, local to this test (autocnn has none such): 16-bit operands and
# outputs, FP32 accumulation, the filters of another 16-bit type than the activations.
BF16 = ElementType("bfloat16", "__nv_bfloat16", 2)
FP16 = ElementType("float16", "__half", 2)
MIXED = dataclasses.replace(FP32, name="mixed16", x=BF16, w=FP16, y=BF16)
KERNEL = re.compile(r'extern "C" __global__[^\n]*\n(\w+)\(([^)]*)\)')
POINTER = re.compile(r"(?:const\s+)?([\w:]+)\s*\*\s*ACNN_RESTRICT\s+(\w+)")
ROLES = {"x": "x", "w": "w", "y": "y", "dx": "dx", "dy": "dy", "dw": "dw", "bias": "w", "db": "dw"}


def _first_case_per_formulation() -> dict[str, dict]:
    document = json.loads(DIGESTS.read_text())
    firsts: dict[str, dict] = {}
    for case in document["cases"]:
        if case["group"].endswith("/fp32"):
            firsts.setdefault(case["group"], {**case, "problem": document["problems"][case["problem"]]})
    return firsts


CASES = _first_case_per_formulation()


@pytest.mark.parametrize("group", sorted(CASES))
def test_kernel_pointers_follow_the_precisions_element_types(group):
    case = CASES[group]
    problem = dataclasses.replace(problem_from_dict(case["problem"]), precision=MIXED)
    operation = get_operation(group.split("/")[0])
    # Unchecked against the rules: a formulation that refuses 16-bit tensors still writes its pointers by
    # the element types (its configs come from the fp32 case, whose rules they meet).
    config = operation.space(problem, DeviceLimits.for_arch("sm_90")).validate(case["config"], check_feasible=False)
    source = operation.plan(problem, config).source
    types = KernelTypes.of(MIXED)
    typed = [(kernel, ty, name) for kernel, params in KERNEL.findall(source)
             for ty, name in POINTER.findall(params) if name in ROLES]
    wrong = [(kernel, name, ty) for kernel, ty, name in typed if ty != getattr(types, ROLES[name]).c_type]
    assert not wrong, f"{group}: kernel pointers not of their tensor's element type: {wrong}"
    if group.split("/")[0] in ("conv_fwd", "conv_bwd_data", "conv_wgrad", "conv_bwd_fused", "conv_pool_fwd"):
        assert typed, f"{group}: no kernel takes a tensor by its name"   # the check looked at something
