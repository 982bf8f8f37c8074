"""autocnn.torch: autocnn's tuned kernels inside PyTorch models (install with the ``torch`` extra).

    import autocnn.torch as at

    model = resnet18().cuda()
    at.convert(model, precision="fp32")        # nn.Conv2d / nn.AvgPool2d -> autocnn's, in place
    ...                                        # train as before: eager, torch.compile, CUDA graphs
    at.tune(model, torch.randn(64, 3, 224, 224, device="cuda"), trials=400)   # optional, longer

* ``Conv2d`` and ``AvgPool2d``: torch.nn's layers (same arguments, parameters and state_dict keys)
  running autocnn's kernels for float32, bfloat16 and float16 CUDA tensors (bf16 / fp16 for the
  16-bit ones; ``Conv2d(..., precision="tf32")`` for float32), under torch.autocast in its dtype,
  with the channel groups and dilation autocnn's kernels compute (depthwise layers), contiguous or
  channels_last (NHWC problems, where the kernels serve the layer in NHWC: autocnn.torch.memory_formats).
* ``convert(model, precision)``: turns every supported layer of a model into those, in place, and
  reports what it replaced, at which precision, and what it left to PyTorch, and why. At the model's first step on a
  GPU its kernels are prepared: quick-tuned where no record exists (within one budget per model,
  ``budget_s=`` or $AUTOCNN_QUICK_BUDGET; $AUTOCNN_AUTOTUNE=off takes the lookup's answer),
  remembered in the tuning database, compiled; the time that took is reported once.
* ``prepare(model, example_input)``: the same ahead of a step or a CUDA-graph capture, returning
  a PrepareReport (seconds tuning and compiling, problems tuned, found, left untuned).
* ``tune(model, example_input, trials=...)``: tunes the kernels of the model's training step with
  the full tuner under one trial budget.
* ``torch.ops.autocnn.*`` (autocnn.torch.ops): the operators, with autograd and fake implementations.
* ``dispatch_report()``: which config each prepared problem runs, and where it came from.
"""
from __future__ import annotations

try:
    import torch as _torch  # noqa: F401  (absolute: PyTorch itself)
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("autocnn.torch needs PyTorch: pip install 'autocnn[torch]' (and CuPy for the GPU: "
                      "'autocnn[cuda12]' or 'autocnn[cuda13]')") from exc

from autocnn.torch import ops  # noqa: F401,E402  (registers torch.ops.autocnn.*)
from autocnn.torch.convert import ConversionReport, ModuleOutcome, convert  # noqa: F401,E402
from autocnn.torch.first_use import PrepareReport, PrepareSettings, prepare  # noqa: F401,E402
from autocnn.torch.launch import launch_counts  # noqa: F401,E402
from autocnn.torch.modules import AvgPool2d, Conv2d  # noqa: F401,E402
from autocnn.torch.tuning import (  # noqa: F401,E402
    ProblemUse, collect_problems, factory_problems, tune, tune_factory, tune_uses)


def dispatch_report() -> str:
    """The kernels prepared so far: device, op, shape, where its config came from, the config."""
    from autocnn.nn.text_table import format_table
    from autocnn.torch.launch import dispatch_rows

    rows = dispatch_rows()
    if not rows:
        return "autocnn.torch: no kernel prepared yet"
    return "autocnn.torch kernels:\n" + format_table([("device", "op", "shape", "kernel", "detail"), *rows])


__all__ = ["AvgPool2d", "Conv2d", "ConversionReport", "ModuleOutcome", "PrepareReport", "PrepareSettings",
           "ProblemUse", "collect_problems", "convert", "dispatch_report", "factory_problems", "launch_counts",
           "prepare", "tune", "tune_factory", "tune_uses"]
