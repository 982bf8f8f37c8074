"""autocnn.torch: autocnn's tuned kernels inside PyTorch models (install with the ``torch`` extra).

    import autocnn.torch as at

    model = resnet18().cuda()
    at.convert(model, precision="fp32")        # nn.Conv2d / nn.AvgPool2d -> autocnn's, in place
    at.tune(model, torch.randn(64, 3, 224, 224, device="cuda"), trials=400)   # optional
    ...                                        # train as before: eager, torch.compile, CUDA graphs

* ``Conv2d`` and ``AvgPool2d``: torch.nn's layers (same arguments, parameters and state_dict keys)
  running autocnn's kernels for contiguous float32 CUDA tensors; ``Conv2d(..., precision="tf32")``.
* ``convert(model, precision)``: turns every supported layer of a model into those, in place, and
  reports what it replaced and what it left to PyTorch, and why.
* ``tune(model, example_input, trials=...)``: tunes the kernels of the model's training step under
  one budget; ``prepare`` compiles them ahead of a step or a CUDA-graph capture.
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
from autocnn.torch.launch import launch_counts  # noqa: F401,E402
from autocnn.torch.modules import AvgPool2d, Conv2d  # noqa: F401,E402
from autocnn.torch.tuning import (  # noqa: F401,E402
    ProblemUse, collect_problems, factory_problems, prepare, tune, tune_factory, tune_uses)


def dispatch_report() -> str:
    """The kernels prepared so far: device, op, shape, where its config came from, the config."""
    from autocnn.nn.text_table import format_table
    from autocnn.torch.launch import dispatch_rows

    rows = dispatch_rows()
    if not rows:
        return "autocnn.torch: no kernel prepared yet"
    return "autocnn.torch kernels:\n" + format_table([("device", "op", "shape", "kernel", "detail"), *rows])


__all__ = ["AvgPool2d", "Conv2d", "ConversionReport", "ModuleOutcome", "ProblemUse", "collect_problems",
           "convert", "dispatch_report", "factory_problems", "launch_counts", "prepare", "tune", "tune_factory",
           "tune_uses"]
