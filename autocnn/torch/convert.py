"""autocnn.torch.convert: put autocnn's kernels under an existing PyTorch model, and say what it did.

Every torch.nn.Conv2d and torch.nn.AvgPool2d that autocnn's kernels can run becomes an
autocnn.torch.Conv2d / AvgPool2d in place: the same module object, so parameters, buffers,
hooks, state_dict keys and an optimizer built before all stay as they were. Float32, bfloat16
and float16 layers convert (a model run under torch.autocast computes its converted convolutions
in the autocast dtype), and so do grouped, depthwise and dilated convolutions where the kernels
compute them: each of the three convolution operations must have a formulation that serves the
layer (support.py asks them). What cannot run on autocnn (groups or dilation no kernel computes,
padding modes, float64 and other dtypes, ceil_mode, a subclass with its own forward, other
convolution and pooling kinds) stays with PyTorch's operator, with one message each in the report,
which also names the precision and layout each converted layer computes at.

channels_last models (``model.to(memory_format=torch.channels_last)``, then convert): a module
cannot know the memory format its input will have, so convert decides a convolution by its
weight's (channels_last: NHWC problems, a KRSC weight) and a pooling layer by the model's (every
4-D parameter channels_last), converting it where the kernels serve each of its operations in that
layout and leaving it, with their reason, where they do not (a dense NHWC weight gradient, so far).
A converted layer reads its refusals again at each call's layout (autocnn.torch.modules): a call in
a layout the kernels refuse runs PyTorch's operator with a warning. So convert after the memory
format is set; a model converted before runs its layers' channels_last calls as the kernels allow. A model
with a layer converted gets a forward pre-hook (autocnn.torch.first_use.FirstUse) that prepares
its kernels at its first step on a GPU: looked up, quick-tuned under one budget where no record
exists, compiled, and the cost reported once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.modules.conv import _ConvNd
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.modules.pooling import _AdaptiveAvgPoolNd, _AvgPoolNd

from autocnn.layout import Layout
from autocnn.precision import DEFAULT_PRECISION, FP32
from autocnn.nn.text_table import format_table
from autocnn.torch.first_use import PrepareSettings, install
from autocnn.torch.geometry import check_precision
from autocnn.torch.modules import AvgPool2d, Conv2d
from autocnn.torch.dtypes import SIXTEEN_BIT, dtype_name
from autocnn.torch.memory_formats import model_layout
from autocnn.torch.support import conv_layout, conv_reasons, layer_precision, pool_reasons

# Module kinds the report lists when they are left: the convolution and average-pooling families.
_FAMILIES = (_ConvNd, _AvgPoolNd, _AdaptiveAvgPoolNd)


@dataclass(frozen=True)
class ModuleOutcome:
    name: str          # the module's qualified name in the model ("" is the model itself)
    kind: str          # its class name before conversion
    replaced: bool
    detail: str        # replaced: what runs it now; left: why PyTorch keeps it
    precision: str = ""   # replaced: the precision it computes at outside autocast ("input's" for a pool)
    layout: Layout | None = None   # replaced: the layout it was converted for (its tensors' memory format)


@dataclass
class ConversionReport:
    """What ``convert`` replaced and what it left to PyTorch, one line each."""

    precision: str
    modules: list[ModuleOutcome] = field(default_factory=list)

    @property
    def replaced(self) -> list[ModuleOutcome]:
        return [m for m in self.modules if m.replaced]

    @property
    def left(self) -> list[ModuleOutcome]:
        return [m for m in self.modules if not m.replaced]

    def to_dict(self) -> dict[str, Any]:
        return {"precision": self.precision,
                "replaced": [{"name": m.name, "kind": m.kind, "precision": m.precision,
                              "layout": m.layout.name if m.layout is not None else None, "detail": m.detail}
                             for m in self.replaced],
                "left": [{"name": m.name, "kind": m.kind, "reason": m.detail} for m in self.left]}

    def __str__(self) -> str:
        head = (f"autocnn.torch.convert: {len(self.replaced)} module(s) on autocnn's kernels "
                f"(float32 convolutions at precision {self.precision}), {len(self.left)} left to PyTorch")
        if not self.modules:
            return head + " (the model has no convolution or average-pooling module)"
        rows = [("module", "kind", "runs on", "precision", "why / what")]
        for m in self.modules:
            rows.append((m.name or "(model)", m.kind, "autocnn" if m.replaced else "PyTorch", m.precision or "-",
                         m.detail))
        return head + ":\n" + format_table(rows)


def convert(model: nn.Module, precision: str = DEFAULT_PRECISION.name, *, verbose: bool = True,
            autotune: str | None = None, budget_s: float | None = None) -> ConversionReport:
    """Replace, in place, every supported nn.Conv2d and nn.AvgPool2d of ``model`` (the model itself
    included) by autocnn.torch's; returns the report and, with ``verbose``, prints it.

    ``precision`` ("fp32" or "tf32") is given to every converted convolution, for float32 tensors;
    layers already on autocnn get it too. bfloat16 and float16 layers (``model.to(torch.bfloat16)``)
    compute at bf16 and fp16, and under torch.autocast a convolution computes in the autocast
    dtype, as PyTorch's does. Converting before or after ``.cuda()`` or ``.to(dtype)`` is the same:
    the layers run autocnn's kernels whenever their input is a CUDA tensor of a dtype the kernels
    take, contiguous as NCHW or channels_last. The memory format is not: convert after
    ``.to(memory_format=torch.channels_last)``, so that what is decided is decided for the layout
    the layers will run in (the module's docstring says how).

    At the model's first step on a GPU (per input shape), its kernels are prepared as
    ``autocnn.torch.prepare`` does, with ``autotune`` ("quick" by default, else $AUTOCNN_AUTOTUNE;
    "full"; "off": the lookup's answer, untuned) and ``budget_s``, the seconds the whole model's
    tuning may take (default $AUTOCNN_QUICK_BUDGET, else 120); ``verbose`` also shows that
    prepare's progress line and report. What was tuned is kept in the tuning database, so a later
    process tunes nothing. Bad values are refused here, before anything is converted.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert takes a torch.nn.Module, not {type(model).__name__}")
    precision = check_precision("autocnn.torch.convert", precision)
    PrepareSettings.resolve(autotune, budget_s, verbose)
    report = ConversionReport(precision)
    pools = model_layout(model)
    for name, module in model.named_modules():
        outcome = _convert_one(name, module, precision, pools)
        if outcome is not None:
            report.modules.append(outcome)
    if report.replaced:
        install(model, autotune, budget_s, verbose)
    if verbose:
        print(report)
    return report


def _in_layout(layout: Layout) -> str:
    return f" in {layout.label} (channels_last)" if layout.channels_last else ""


def _conv_detail(module: Conv2d, precision: str, layout: Layout) -> tuple[str, str]:
    """What a converted convolution computes at, and the report's line on it."""
    ops = f"autocnn conv_fwd / conv_bwd_data / conv_wgrad{_in_layout(layout)}"
    own = layer_precision(module.weight, precision)
    if module.weight.dtype != torch.float32:
        return own, f"{ops}: {dtype_name(module.weight.dtype)} at {own}"
    refusals = module._autocnn_refusals
    served = [p.name for p in SIXTEEN_BIT.values() if refusals.at(p.name, layout) is None]
    text = f"{ops}: float32 at {own}"
    if served:
        text += f"; under torch.autocast at its dtype ({' or '.join(served)})"
    for p in SIXTEEN_BIT.values():
        if refusals.at(p.name, layout) is not None:
            text += f"; under torch.autocast to {p.name}: PyTorch's ({refusals.at(p.name, layout)})"
    return own, text


def _pool_detail(module: AvgPool2d, layout: Layout) -> tuple[str, str]:
    served = module._autocnn_refusals.served(layout)
    return "input's", (f"autocnn avgpool_fwd / avgpool_bwd{_in_layout(layout)} in its input's dtype "
                       f"({', '.join(served)})")


def _convert_one(name: str, module: nn.Module, precision: str, pools: Layout) -> ModuleOutcome | None:
    """The outcome of one module; ``pools``: the layout a pooling layer's input is taken to have."""
    kind = type(module).__name__
    if isinstance(module, Conv2d):
        module.precision = precision
        layout = conv_layout(module)
        runs_at, detail = _conv_detail(module, precision, layout)
        refusal = module._autocnn_refusals.at(runs_at, layout) if runs_at is not None else None
        if refusal is not None:   # an autocnn layer of a layout its kernels refuse: its calls go to PyTorch's
            detail = f"its calls run PyTorch's operator: {refusal}"
        return ModuleOutcome(name, kind, True, f"already autocnn.torch.Conv2d; {detail}", runs_at, layout)
    if isinstance(module, AvgPool2d):
        runs_at, detail = _pool_detail(module, pools)
        if not module._autocnn_refusals.served(pools):
            detail = f"its calls run PyTorch's operator: {module._autocnn_refusals.at(FP32.name, pools)}"
        return ModuleOutcome(name, kind, True, f"already autocnn.torch.AvgPool2d; {detail}", runs_at, pools)
    if type(module) is nn.Conv2d:
        reasons = conv_reasons(module, precision)
        if reasons:
            return ModuleOutcome(name, kind, False, "; ".join(reasons))
        Conv2d.adopt(module, precision)
        layout = conv_layout(module)
        return ModuleOutcome(name, kind, True, *reversed(_conv_detail(module, precision, layout)), layout)
    if type(module) is nn.AvgPool2d:
        reasons = pool_reasons(module, pools)
        if reasons:
            return ModuleOutcome(name, kind, False, "; ".join(reasons))
        AvgPool2d.adopt(module, pools)
        return ModuleOutcome(name, kind, True, *reversed(_pool_detail(module, pools)), pools)
    if isinstance(module, LazyModuleMixin):
        return ModuleOutcome(name, kind, False, "a lazy module whose shapes are not known yet (run one forward "
                                                "pass, then convert)")
    if isinstance(module, (nn.Conv2d, nn.AvgPool2d)):
        base = "Conv2d" if isinstance(module, nn.Conv2d) else "AvgPool2d"
        return ModuleOutcome(name, kind, False, f"a subclass of torch.nn.{base}, whose forward may differ from "
                                                f"torch.nn's (use autocnn.torch.{base} in it by hand where it does not)")
    if isinstance(module, _FAMILIES):
        return ModuleOutcome(name, kind, False, f"{kind} is not a kernel autocnn has (2-D convolution and "
                                                f"average pooling only)")
    return None
