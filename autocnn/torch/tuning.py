"""Tuning a PyTorch model's kernels: its problems found by hooks, one budget spent by time share.

``collect_problems`` runs the model once on the meta device (no memory, no GPU: only shapes),
with a hook on every layer autocnn can run, and lists the kernel problems of a training step in
both directions: the forward of every such layer, the backward-data where the layer's input needs
a gradient, the weight gradient where its parameters do. A shape met by several layers counts
once per layer. ``tune`` spends one trial budget over them in proportion to each problem's
expected share of the step (its count times autocnn's expected time for it), with the tuner of
autocnn.search, and makes the layers look their kernels up again afterwards. (``prepare``, which
quick-tunes and compiles them before a first step, is autocnn.torch.first_use.)
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.nn.modules.conv import _ConvNd

from autocnn.layout import DEFAULT_LAYOUT, NHWC, Layout, layout_named
from autocnn.precision import DEFAULT_PRECISION, FP32, Precision
from autocnn.errors import ProblemTooLargeError
from autocnn.torch.dtypes import ELEMENTS, SIXTEEN_BIT, autocast_dtype, precision_of_call
from autocnn.torch.geometry import check_precision, conv_padding, conv_problem, pair, pool_padding, pool_problem
from autocnn.torch.launch import forget
from autocnn.torch.memory_formats import (as_layout, call_layout, in_either_layout, memory_format, model_layout,
                                         tensor_layout)
from autocnn.torch.modules import AvgPool2d, Conv2d
from autocnn.torch.support import conv_reasons, conv_refusals, pool_reasons, pool_refusals


@dataclass(frozen=True)
class ProblemUse:
    """A kernel problem of the model's training step, how often a step runs it, and by which layers."""

    problem: Any
    count: int
    modules: tuple[str, ...]


def _layer_problems(module: nn.Module, x: torch.Tensor, precision: str | None, training: bool) -> list[Any]:
    """The problems one call of a layer runs on input ``x`` (none when the call falls back to
    PyTorch), in the dtype the layer computes in (the input's, or torch.autocast's for a convolution)
    and the layout its tensors are in (channels_last where the input or the weight is)."""
    if x.dim() not in (3, 4) or not in_either_layout(x):
        return []
    batch = x if x.dim() == 4 else x.unsqueeze(0)
    shape = tuple(batch.shape)
    if isinstance(module, nn.Conv2d):
        if not in_either_layout(module.weight):
            return []
        cast = autocast_dtype(x)
        dtype = cast if cast is not None and x.is_floating_point() and x.dtype != torch.float64 else x.dtype
        if dtype not in ELEMENTS:
            return []
        float32 = precision or getattr(module, "precision", DEFAULT_PRECISION.name)
        prec = precision_of_call(dtype, float32)
        layout = call_layout("autocnn.torch", {"x": batch, "weight": module.weight})
        if conv_refusals(module).at(prec, layout) is not None:
            return []   # the layer runs PyTorch's operator at this precision and layout (modules.py)
        stride = pair("stride", module.stride)
        dilation = pair("dilation", module.dilation)
        padding = conv_padding(module.padding, module.kernel_size, module.dilation)
        w_shape = tuple(module.weight.shape)
        has_bias = module.bias is not None
        geometry = (shape, w_shape, stride, padding, prec)
        grouping = (dilation, module.groups, layout)
        out = [conv_problem("conv_fwd", *geometry, has_bias, *grouping)]
        if training and x.requires_grad:
            out.append(conv_problem("conv_bwd_data", *geometry, False, *grouping))
        if training and (module.weight.requires_grad or (has_bias and module.bias.requires_grad)):
            out.append(conv_problem("conv_wgrad", *geometry, has_bias, *grouping))
        return out
    if x.dtype not in ELEMENTS:
        return []
    prec = precision_of_call(x.dtype, FP32.name)
    layout = call_layout("autocnn.torch", {"x": batch})
    if pool_refusals(module).at(prec, layout) is not None:
        return []
    window = pair("kernel_size", module.kernel_size)
    stride = pair("stride", module.stride if module.stride is not None else module.kernel_size)
    args = (shape, window, stride, pool_padding(module.padding), bool(module.count_include_pad), prec, layout)
    out = [pool_problem("avgpool_fwd", *args)]
    if training and x.requires_grad:
        out.append(pool_problem("avgpool_bwd", *args))
    return out


def _runs_on_autocnn(module: nn.Module, pools: Layout) -> bool:
    """Whether the module is autocnn's or convert would make it so (a pooling layer's input taken to be
    in ``pools``, the model's layout, as convert takes it)."""
    if isinstance(module, (Conv2d, AvgPool2d)):
        return True
    if type(module) is nn.Conv2d:
        return not conv_reasons(module, getattr(module, "precision", DEFAULT_PRECISION.name))
    if type(module) is nn.AvgPool2d:
        return not pool_reasons(module, pools)
    return False


class MetaTraceError(RuntimeError):
    """The model's forward did not run on meta tensors, so its problems cannot be found ahead."""


def as_args(example_input: Any) -> tuple[Any, ...]:
    if isinstance(example_input, torch.Tensor):
        return (example_input,)
    if isinstance(example_input, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in example_input):
        return tuple(example_input)
    raise TypeError(f"example_input must be a tensor (or a tuple of the model's input tensors), "
                    f"not {type(example_input).__name__}")


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t, device="meta").requires_grad_(t.requires_grad)


def _trace_precision(precision: Any) -> tuple[str | None, torch.dtype | None]:
    """A precision given to collect_problems as (the float32 layers' precision, the autocast dtype the
    trace runs under): fp32 / tf32 are the float32 layers' precision; bf16 / fp16 trace the model as
    under torch.autocast at their dtype; none given under torch.autocast("cuda") keeps its dtype. A
    name that is no precision is refused."""
    if precision is None:
        return None, torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
    name = precision.name if isinstance(precision, Precision) else precision
    sixteen = {p.name: dtype for dtype, p in SIXTEEN_BIT.items()}
    if name in sixteen:
        return None, sixteen[name]
    check_precision("autocnn.torch.tune", precision)
    return name, None


# The modules whose operators torch.autocast runs in its lower precision (its conv and linear rules):
# on meta tensors, which autocast passes by, a trace casts their inputs and parameters as a CUDA run
# does (autocnn.torch's Conv2d casts its own, in its forward).
_AUTOCAST_LOWER = (_ConvNd, nn.Linear)


@contextlib.contextmanager
def _cuda_autocast(dtype: torch.dtype | None):
    """CUDA's autocast state on at ``dtype`` for a meta trace (None: unchanged), restored after; set
    directly, since torch.autocast("cuda") is refused where PyTorch has no CUDA (a CPU host tracing
    for ``autocnn tune --torch-model``), and the layers read only the state."""
    if dtype is None:
        yield
        return
    enabled, before = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", before)


def _cast(t: Any, dtype: torch.dtype) -> Any:
    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64:
        return t.to(dtype)
    return t


def _autocast_inputs(dtype: torch.dtype) -> Callable[..., Any]:
    def cast(module: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(_cast(t, dtype) for t in inputs)
    return cast


def _cuda_conv_layout(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> Any:
    """A 2-D convolution's output in the memory format CUDA's gives it: channels_last where its input or
    its weight is (cuDNN's rule, which autocnn's operators follow). PyTorch's meta convolution makes
    every output contiguous, so that without this a trace would meet the layers after a convolution
    PyTorch runs (one convert left, say) in NCHW where a CUDA step has them in NHWC."""
    x, weight = inputs[0] if inputs else None, getattr(module, "weight", None)
    if not (isinstance(output, torch.Tensor) and output.dim() == 4 and isinstance(x, torch.Tensor) and x.dim() == 4
            and isinstance(weight, torch.Tensor) and weight.dim() == 4):
        return None
    layouts = (tensor_layout(x), tensor_layout(weight))
    if any(layout is not None and layout.channels_last for layout in layouts):
        return as_layout(output, NHWC)
    return None


def _autocast_parameters(model: nn.Module) -> set[str]:
    """The names of the parameters autocast casts: those of its lower-precision modules."""
    return {f"{name}.{p}" if name else p for name, m in model.named_modules() if isinstance(m, _AUTOCAST_LOWER)
            and not isinstance(m, Conv2d) for p, _ in m.named_parameters(recurse=False)}


def collect_problems(model: nn.Module, example_input: Any, *, precision: str | None = None,
                     training: bool = True) -> list[ProblemUse]:
    """Every kernel problem a step of ``model`` on ``example_input`` runs on autocnn's kernels,
    counted per call, at the precision each layer computes at: its tensors' dtype's. Layers count
    that are autocnn.torch's or that ``convert`` would replace. ``precision`` "fp32" or "tf32": the
    float32 convolutions at it (else at their own: torch.nn's at fp32); "bf16" or "fp16": the model
    as it runs under torch.autocast at that dtype (convolutions in it, pooling in its input's dtype);
    none given, under torch.autocast("cuda"): the autocast dtype. A bfloat16 or float16 model
    (``model.to(torch.bfloat16)``) traces in its dtype either way. The trace casts the inputs and
    parameters of autocast's lower-precision modules (convolutions, linear layers); the rest run in
    their inputs' dtypes there (autocast's float32 ops, such as layer_norm, too: a pooling layer after one is
    met at its real dtype when it first runs). Each problem is in the layout of its call's tensors:
    channels_last ones (``model.to(memory_format=torch.channels_last)`` and such an input) make NHWC
    problems where the kernels serve the layer so (autocnn.torch.memory_formats). With ``training``
    false, forward problems only."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"collect_problems takes a torch.nn.Module, not {type(model).__name__}")
    precision, autocast = _trace_precision(precision)
    args = tuple(_meta(t) for t in as_args(example_input))
    found: dict[Any, list[str]] = {}

    def hook(name: str) -> Callable[..., None]:
        def record(module: nn.Module, inputs: tuple[Any, ...]) -> None:
            if inputs and isinstance(inputs[0], torch.Tensor):
                try:
                    problems = _layer_problems(module, inputs[0], precision, training)
                except ProblemTooLargeError:
                    return   # beyond the kernels' indexing: the layer runs PyTorch's operator (modules.py)
                for p in problems:
                    found.setdefault(p, []).append(name)
        return record

    pools = model_layout(model)
    handles = [m.register_forward_pre_hook(hook(name)) for name, m in model.named_modules()
               if _runs_on_autocnn(m, pools)]
    handles += [m.register_forward_hook(_cuda_conv_layout) for m in model.modules() if isinstance(m, nn.Conv2d)]
    state = {**{n: _meta(p) for n, p in model.named_parameters()},
             **{n: _meta(b) for n, b in model.named_buffers()}}
    if autocast is not None:
        handles += [m.register_forward_pre_hook(_autocast_inputs(autocast)) for m in model.modules()
                    if isinstance(m, _AUTOCAST_LOWER) and not isinstance(m, Conv2d)]
        state.update({n: _cast(state[n], autocast) for n in _autocast_parameters(model)})
    try:
        with torch.set_grad_enabled(training), _cuda_autocast(autocast):
            torch.func.functional_call(model, state, args)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's forward on meta tensors
        raise MetaTraceError(f"autocnn.torch: the model's forward did not run on the meta device ({exc}); "
                           f"collect_problems traces shapes there, so the forward must not read tensor "
                           f"values (e.g. .item()) or create tensors on a fixed device") from exc
    finally:
        for h in handles:
            h.remove()
    return [ProblemUse(p, len(names), tuple(names)) for p, names in found.items()]


def split_trials(uses: Sequence[ProblemUse], total: int, minimum: int = 8) -> list[int]:
    """Trials per problem: ``minimum`` each, the rest in proportion to count x expected time."""
    from autocnn.search.network import expected_seconds

    weights = [u.count * expected_seconds(u.problem.op, u.problem) for u in uses]
    spare = max(0, total - minimum * len(uses))
    whole = sum(weights) or 1.0
    return [minimum + int(round(spare * w / whole)) for w in weights]


def tune_uses(tuner: Any, uses: Sequence[ProblemUse], trials: int, timeout_s: float | None = None,
              log: Callable[[str], None] | None = None) -> list[Any]:
    """Tune each problem with ``tuner`` (autocnn.search.tuner.Tuner) under one budget of trials (and
    of seconds, when given), split by time share; one TuneOutcome per problem."""
    from autocnn.search.network import expected_seconds

    weights = [u.count * expected_seconds(u.problem.op, u.problem) for u in uses]
    whole = sum(weights) or 1.0
    outcomes = []
    for use, n, w in zip(uses, split_trials(uses, trials), weights):
        share = None if timeout_s is None else max(5.0, timeout_s * w / whole)
        if log:
            log(f"{use.problem.op} {use.problem.shape_string()} (x{use.count}): {n} trials")
        outcomes.append(tuner.tune(use.problem.op, use.problem, trials=n, timeout_s=share))
    forget([u.problem for u in uses])
    return outcomes


def _device_index(model: nn.Module, device: Any) -> int:
    if device is not None:
        d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if d.type != "cuda":
            raise ValueError(f"device must be a CUDA device (an index or 'cuda:N'), not {device!r}")
        return d.index or 0
    for p in model.parameters():
        if p.device.type == "cuda":
            return p.device.index or 0
    return 0


def tune(model: nn.Module, example_input: Any, trials: int = 200, *, timeout_s: float | None = None,
         precision: str | None = None, training: bool = True, device: Any = None, storage: str | None = None,
         sampler: str = "tpe", seed: int | None = None, progress: bool = True, tuner: Any = None,
         log: Callable[[str], None] | None = None) -> list[Any]:
    """Tune every kernel a training step of ``model`` on ``example_input`` runs, on a GPU, and keep
    the winners in the tuning database (the model's layers use them from their next call).

    ``trials`` is the budget for the whole model (``timeout_s`` too, when given). ``precision``
    as ``collect_problems`` takes it: "fp32" / "tf32" for the float32 layers, "bf16" / "fp16" for
    the problems the model computes in that dtype (under torch.autocast, or converted to it).
    ``tuner``: an autocnn.search.tuner.Tuner to use instead of one on ``device`` (default: the
    model's CUDA device, else 0). One TuneOutcome per problem.
    """
    from autocnn.search.tuner import TuneSettings

    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ValueError(f"trials must be a positive integer (the budget for the whole model), not {trials!r}")
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, not {timeout_s}")
    settings = TuneSettings(trials=trials, sampler=sampler, seed=seed, storage=storage)   # checks the sampler
    index = _device_index(model, device)
    uses = collect_problems(model, example_input, precision=precision, training=training)
    if not uses:
        if log:
            log("the model has no layer autocnn's kernels run: nothing to tune")
        return []
    if tuner is not None:
        return tune_uses(tuner, uses, trials, timeout_s, log)
    from autocnn.store import TuningDatabase
    from autocnn.measurement.sources import GpuSource
    from autocnn.search.tuner import Tuner

    source = GpuSource(index)
    try:
        return tune_uses(Tuner(source, TuningDatabase(), settings, progress=progress, log=log), uses, trials,
                         timeout_s, log)
    finally:
        source.close()


# -- the command line: autocnn tune --torch-model package.module:factory ------------------------------

def load_factory(spec: str) -> nn.Module:
    """The model ``package.module:factory`` builds (the factory is called without arguments)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--torch-model takes package.module:factory (a function returning a "
                         f"torch.nn.Module), not {spec!r}")
    # The working directory, as for ``python -m``: the console script's path does not include it,
    # and a user's model usually lives there rather than in an installed package.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--torch-model: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ValueError(f"--torch-model: {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"--torch-model: {spec} is not callable")
    model = target()
    if not isinstance(model, nn.Module):
        raise TypeError(f"--torch-model: {spec}() returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def parse_input_shape(text: str) -> tuple[int, int, int]:
    """``C,H,W`` (e.g. ``3,224,224``) as three positive integers."""
    parts = [t.strip() for t in str(text).split(",")]
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--input-shape takes C,H,W as three positive integers, e.g. 3,224,224; not {text!r}")
    return (int(parts[0]), int(parts[1]), int(parts[2]))


def factory_problems(spec: str, input_shape: str | Sequence[int], batch: int,
                     precision: str | None = None, layout: Layout | str | None = None) -> list[ProblemUse]:
    """The training-step problems of the model ``package.module:factory`` builds, at ``batch`` inputs of
    ``input_shape`` (C,H,W): everything ``autocnn tune --torch-model`` checks before it opens a GPU.
    ``layout`` nhwc: the model and its input in channels_last, as a channels_last model runs (nchw, the
    default: as the factory builds it, the input contiguous)."""
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"--batch must be a positive integer, not {batch!r}")
    layout = DEFAULT_LAYOUT if layout is None else layout_named(layout, "--layout")
    shape = parse_input_shape(input_shape) if isinstance(input_shape, str) else tuple(input_shape)
    model = load_factory(spec)
    example = torch.empty((batch, *shape), device="meta")
    if layout.channels_last:
        model = model.to(memory_format=memory_format(layout))
        example = example.contiguous(memory_format=memory_format(layout))
    return collect_problems(model, example, precision=precision)


def tune_factory(tuner: Any, spec: str, input_shape: str | Sequence[int], batch: int, trials: int,
                 timeout_s: float | None = None, precision: str | None = None,
                 log: Callable[[str], None] | None = None, layout: Layout | str | None = None) -> list[Any]:
    """``autocnn tune --torch-model spec --input-shape C,H,W --batch N [--layout nhwc]``: the model's
    training-step kernels at that batch, tuned with the command's tuner under one budget of ``trials``."""
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ValueError(f"--trials must be a positive integer (the budget for the whole model), not {trials!r}")
    return tune_uses(tuner, factory_problems(spec, input_shape, batch, precision, layout), trials, timeout_s, log)
