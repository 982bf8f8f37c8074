#!/usr/bin/env python3
"""Training-step time of each zoo network against PyTorch at its best, and ResNet-18 on autocnn.torch.

A step is forward, softmax cross-entropy, backward and an Adam update, with the batch already on
the device. For each zoo network and precision (fp32: FP32-accurate on both sides, cuDNN's TF32
off; tf32: autocnn's tf32 kernels against cuDNN and cuBLAS with TF32 allowed):

* autocnn: the cuda backend (tuned kernels, the step captured as a CUDA graph), reading its input
  buffers (``Sequential.input_buffers``); in fp32 also with the batch copied in every step
  (staged), kernel by kernel without graphs (eager), and the numpy backend on one CPU thread;
* autocnn.torch: the same network in PyTorch with its layers converted (``autocnn.torch.convert``),
  the whole step captured in a CUDA graph;
* PyTorch: the same network, the whole step (forward, loss, backward, Adam with capturable=True)
  captured in a CUDA graph, cuDNN benchmark on; and in eager mode, as before.

ResNet-18 (defined here in plain PyTorch, batch 64, 3x224x224): the model converted with
autocnn.torch.convert against itself unconverted, both captured in CUDA graphs, same precision,
with the share of a step's device time spent in autocnn's operators (from torch.profiler: every
kernel and memset launched inside an ``autocnn::`` operator, an eager step profiled). Writes JSON
and prints the tables last.

    python scripts/bench_training.py --networks kriz09,vgg_cifar --tune-trials 6 --out bench_training.json
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BATCH = {"kriz09": 128, "scherer10": 60, "convnet18": 128, "chellapilla06": 128, "lenet5": 128, "vgg_cifar": 128}
from autocnn.precision import PRECISION_NAMES, precision_named  # noqa: E402

PRECISIONS = PRECISION_NAMES
RESNET_BATCH = 64


# -- the zoo networks in PyTorch ------------------------------------------------------------------------

def torch_model(model, device: str = "cuda"):
    """The same layers in PyTorch (asymmetric padding as an explicit zero pad)."""
    from torch import nn as tnn

    from autocnn.nn.layers import Activation, AvgPool2d, Conv2d, Dense, Flatten

    acts = {"none": None, "relu": tnn.ReLU, "tanh": tnn.Tanh, "logistic": tnn.Sigmoid}
    mods = []
    for layer in model.layers:
        if isinstance(layer, Conv2d):
            pt, pl, pb, pr = layer.padding
            pad = (pt, pl)
            if pt != pb or pl != pr:
                mods.append(tnn.ZeroPad2d((pl, pr, pt, pb)))
                pad = (0, 0)
            mods.append(tnn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride, pad,
                                   dilation=layer.dilation, groups=layer.groups, bias=layer.use_bias))
        elif isinstance(layer, AvgPool2d):
            pt, pl, pb, pr = layer.padding
            if pt != pb or pl != pr:
                raise ValueError("asymmetric pooling padding has no PyTorch equivalent")
            mods.append(tnn.AvgPool2d(layer.window, layer.stride, (pt, pl), count_include_pad=layer.count_pad))
        elif isinstance(layer, Dense):
            mods.append(tnn.Linear(layer.in_features, layer.out_features, bias=layer.use_bias))
        elif isinstance(layer, Flatten):
            mods.append(tnn.Flatten())
            continue
        elif not isinstance(layer, Activation):
            raise ValueError(f"no PyTorch equivalent for {type(layer).__name__}")
        act = acts[getattr(layer, "activation", "none")]
        if act is not None:
            mods.append(act())
    return tnn.Sequential(*mods).to(device)


def copy_weights(model, net) -> None:
    """The built autocnn model's weights into its PyTorch twin (Dense weights are in x out there, out x in here)."""
    import torch
    from torch import nn as tnn

    weights = model.get_weights()
    layers = [m for m in net if isinstance(m, (tnn.Conv2d, tnn.Linear))]
    names = [layer.name for layer in model.layers if layer.params()]
    if len(layers) != len(names):
        raise ValueError(f"{len(names)} weighted layers in the autocnn model, {len(layers)} in the PyTorch twin")
    with torch.no_grad():
        for name, module in zip(names, layers):
            w = weights[f"{name}.weight"]
            module.weight.copy_(torch.from_numpy(w.T.copy() if isinstance(module, tnn.Linear) else w))
            if module.bias is not None:
                module.bias.copy_(torch.from_numpy(weights[f"{name}.bias"]))


# -- ResNet-18, plain PyTorch ---------------------------------------------------------------------------

def resnet18(num_classes: int = 1000):
    """ResNet-18 (He et al. 2016) as torchvision builds it: a 7x7 stride-2 stem, 3x3 max pooling,
    four stages of two basic blocks (64, 128, 256, 512 maps; 1x1 stride-2 projections), global
    average pooling and one linear layer."""
    from torch import nn as tnn

    class BasicBlock(tnn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(cout)
            self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(cout)
            self.relu = tnn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + identity)

    layers = [tnn.Conv2d(3, 64, 7, 2, 3, bias=False), tnn.BatchNorm2d(64), tnn.ReLU(inplace=True),
              tnn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(512, num_classes)]
    net = tnn.Sequential(*layers)
    for m in net.modules():
        if isinstance(m, tnn.Conv2d):
            tnn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return net


# -- PyTorch steps ----------------------------------------------------------------------------------------

def torch_precision(precision: str) -> None:
    """cuDNN and cuBLAS at the precision compared: TF32 off for fp32, allowed for tf32."""
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = precision_named(precision).tf32
    torch.backends.cuda.matmul.allow_tf32 = precision_named(precision).tf32


def torch_batch(input_shape, classes: int, batch: int):
    import torch

    return (torch.randn(batch, *input_shape, device="cuda"), torch.randint(0, classes, (batch,), device="cuda"))


def torch_step(net, x, y, capturable: bool = False):
    """One training step of ``net`` on (x, y) as a user writes it: zero the gradients, forward, loss,
    backward, Adam."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.Adam(net.parameters(), lr=1e-3, capturable=capturable)

    def step(zero: bool = True):
        if zero:
            opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        opt.step()

    return step, opt


def time_torch(net, x, y, steps: int) -> float:
    """PyTorch eager."""
    import torch

    step, _ = torch_step(net, x, y)
    for _ in range(10):
        step()
    return _event_time(step, steps, torch.cuda.synchronize)


def capture_torch_step(net, x, y):
    """The whole step (forward, loss, backward, capturable Adam) as one CUDA graph (capture_step)."""
    return capture_step(*torch_step(net, x, y, capturable=True))


def capture_step(step, opt):
    """A training step and its optimizer as one CUDA graph, by PyTorch's recipe: warm-up on a side
    stream (this also compiles the kernels of a converted model), then capture with the gradients
    unset, so that the graph allocates them from its own pool."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step(zero=False)
    return graph


def time_torch_graph(net, x, y, steps: int) -> float:
    import torch

    graph = capture_torch_step(net, x, y)
    for _ in range(10):
        graph.replay()
    return _event_time(graph.replay, steps, torch.cuda.synchronize)


def autocnn_share(step, steps: int = 3) -> dict:
    """Device time of an eager step (a graph replay hides its launches behind one cudaGraphLaunch),
    and the part of it launched inside autocnn's operators (``device_share`` of the profiler trace)."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text()).get("traceEvents", [])
    return device_share(events, steps)


def device_share(events: list, steps: int, prefix: str = "autocnn::") -> dict:
    """From a Chrome trace of torch.profiler: device time per step, and the part launched by operators
    whose name starts with ``prefix``.

    Each kernel, memset or copy is traced back, by its correlation id, to the driver or runtime call
    that launched it, and counts when that call lies inside such an operator on the same host
    thread. That covers every launch an operator makes (generated kernels, cuBLAS calls of a
    formulation, memsets of zeroed outputs), by any name.
    """
    ops: dict = {}
    for e in events:
        if e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith(prefix):
            ops.setdefault(e.get("tid"), []).append((e["ts"], e["ts"] + e.get("dur", 0)))
    launches = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = (e.get("tid"), e["ts"])
    if ops and not set(ops) & {tid for tid, _ in launches.values()}:
        # Host threads named differently in the two kinds of event: a step's operators do not overlap
        # in time (the backward waits for the forward), so any thread's operator will do.
        ops = {None: [span for spans in ops.values() for span in spans]}
        launches = {k: (None, ts) for k, (_, ts) in launches.items()}
    total = ours = 0.0
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memset", "gpu_memcpy"):
            continue
        total += e.get("dur", 0)
        tid, ts = launches.get(e.get("args", {}).get("correlation"), (None, None))
        if ts is not None and any(a <= ts <= b for a, b in ops.get(tid, ())):
            ours += e.get("dur", 0)
    return {"device_us_per_step": total / steps, "autocnn_us_per_step": ours / steps,
            "autocnn_share": ours / total if total else None}


# -- autocnn ------------------------------------------------------------------------------------------------

def time_autocnn_cuda(model, batch: int, steps: int, graphs: bool = True, staged: bool = False) -> float:
    """Like PyTorch's loop, the step reads a batch already on the device: in the model's input
    buffers (``input_buffers``), or with ``staged``, copied into them from other device arrays
    every step."""
    import cupy as cp

    from autocnn import nn

    model.build(batch)
    model.use_graphs = graphs
    model.compile(nn.Adam(1e-3))
    x = cp.random.standard_normal((batch, *model.input_shape), dtype=cp.float32)
    y = cp.random.randint(0, model.num_classes, batch).astype(cp.int64)
    if not staged:
        x_buf, y_buf = model.input_buffers()
        x_buf[...] = x
        y_buf[...] = y
        x, y = x_buf, y_buf

    def step():
        model.train_step_async(x, y)

    for _ in range(10):
        step()
    return _event_time(step, steps, model.backend.synchronize)


def _event_time(step, steps: int, sync) -> float:
    """Median per-step time (ms) over 5 runs of ``steps`` steps, host and device both counted."""
    runs = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        runs.append((time.perf_counter() - t0) / steps * 1e3)
    return statistics.median(runs)


def time_numpy(name: str, batch: int, steps: int) -> float:
    import numpy as np

    from autocnn import nn

    model = nn.build_network(name, backend=nn.NumpyBackend(blas_threads=1), seed=0)
    model.build(batch)
    model.compile(nn.Adam(1e-3))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, model.num_classes, batch)
    model.train_step(x, y)   # warm-up: first-touch allocations
    times: list[float] = []
    # At least ``steps`` steps, more (up to 100) while they add up to less than 2 s: the small
    # networks' steps take milliseconds, and their median needs more than two samples.
    while len(times) < steps or (sum(times) < 2000 and len(times) < 100):
        t0 = time.perf_counter()
        model.train_step(x, y)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


# -- the rows ---------------------------------------------------------------------------------------------

def zoo_row(name: str, precision: str, args) -> dict:
    import autocnn.torch as at
    from autocnn import nn

    batch = BATCH.get(name, 128)
    model = nn.build_network(name, backend="cuda", seed=0)
    model.precision = precision
    if args.tune_trials:
        model.tune(batch, trials=args.tune_trials * len(model.problems(batch)), progress=False)
    row = {"network": name, "precision": precision, "batch": batch,
           "autocnn_cuda_ms": time_autocnn_cuda(model, batch, args.steps)}
    sources = sorted({d.source for d in model.dispatch})
    if precision_named(precision).tf32x3:
        row["autocnn_staged_ms"] = time_autocnn_cuda(model, batch, args.steps, staged=True)
        row["autocnn_eager_ms"] = time_autocnn_cuda(model, batch, args.steps, graphs=False)
        row["numpy_1thread_ms"] = time_numpy(name, batch, args.cpu_steps) if args.cpu_steps else None
    torch_precision(precision)
    x, y = torch_batch(model.input_shape, model.num_classes, batch)
    row["pytorch_eager_ms"] = time_torch(torch_model(model), x, y, args.steps)
    row["pytorch_graph_ms"] = time_torch_graph(torch_model(model), x, y, args.steps)
    converted = torch_model(model)
    at.convert(converted, precision, verbose=False)
    row["autocnn_torch_graph_ms"] = time_torch_graph(converted, x, y, args.steps)
    row["vs_pytorch_graph"] = row["pytorch_graph_ms"] / row["autocnn_cuda_ms"]
    row["vs_pytorch_eager"] = row["pytorch_eager_ms"] / row["autocnn_cuda_ms"]
    row["kernel_sources"] = sources
    row["dispatch"] = model.dispatch_report()
    return row


def resnet_row(precision: str, args) -> dict:
    import torch

    import autocnn.torch as at

    torch.manual_seed(0)
    torch_precision(precision)
    plain = resnet18().cuda()
    converted = copy.deepcopy(plain)
    report = at.convert(converted, precision, verbose=False)
    x, y = torch_batch((3, 224, 224), 1000, RESNET_BATCH)
    if args.resnet_trials:
        at.tune(converted, x, trials=args.resnet_trials, progress=False)
    at.prepare(converted, x)
    row = {"network": "resnet18", "precision": precision, "batch": RESNET_BATCH,
           "pytorch_graph_ms": time_torch_graph(plain, x, y, args.steps),
           "autocnn_torch_graph_ms": time_torch_graph(converted, x, y, args.steps),
           "conversion": report.to_dict()}
    row["vs_unconverted"] = row["pytorch_graph_ms"] / row["autocnn_torch_graph_ms"]
    share = autocnn_share(torch_step(converted, x, y)[0])
    row.update(share)
    row["autocnn_share_of_graph_step"] = share["autocnn_us_per_step"] / 1e3 / row["autocnn_torch_graph_ms"]
    row["dispatch"] = at.dispatch_report()
    return row


def _fmt(v, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def print_tables(rows: list[dict], resnet: list[dict]) -> None:
    print("\n| network | precision | batch | autocnn ms/step (graph) | staged | no graphs | autocnn.torch (graph) | "
          "PyTorch graph ms/step | PyTorch eager | numpy 1 thread | vs PyTorch graph | vs PyTorch eager |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['network']} | {r['precision']} | {r['batch']} | {r['autocnn_cuda_ms']:.3f} | "
              f"{_fmt(r.get('autocnn_staged_ms'))} | {_fmt(r.get('autocnn_eager_ms'))} | "
              f"{r['autocnn_torch_graph_ms']:.3f} | {r['pytorch_graph_ms']:.3f} | {r['pytorch_eager_ms']:.3f} | "
              f"{_fmt(r.get('numpy_1thread_ms'), '.1f')} | {r['vs_pytorch_graph']:.2f} | {r['vs_pytorch_eager']:.2f} |")
    if resnet:
        print("\n| ResNet-18 | batch | unconverted ms/step (graph) | converted ms/step (graph) | speed-up | "
              "autocnn share of device time | of the graph step |")
        print("|---|---|---|---|---|---|---|")
        for r in resnet:
            print(f"| {r['precision']} | {r['batch']} | {r['pytorch_graph_ms']:.3f} | {r['autocnn_torch_graph_ms']:.3f} | "
                  f"{r['vs_unconverted']:.2f} | {_fmt(r['autocnn_share'], '.1%')} | "
                  f"{r['autocnn_share_of_graph_step']:.1%} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--networks", default=",".join(BATCH), help="zoo networks (none: '')")
    ap.add_argument("--precisions", default=",".join(PRECISIONS), help="fp32, tf32 or both (default)")
    ap.add_argument("--steps", type=int, default=50, help="timed GPU steps per run")
    ap.add_argument("--cpu-steps", type=int, default=2,
                    help="timed numpy steps at least (more, up to 100, while they take under 2 s); 0: skip")
    ap.add_argument("--tune-trials", type=int, default=0,
                    help="trials per kernel problem to tune each network first (0: use the database as it is)")
    ap.add_argument("--no-resnet", action="store_true", help="leave out ResNet-18")
    ap.add_argument("--resnet-trials", type=int, default=0,
                    help="trials to tune ResNet-18's kernels first, for the whole model (0: the database as it is)")
    ap.add_argument("--out", type=Path, default=Path("bench_training.json"))
    args = ap.parse_args(argv)
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown or not precisions:
        ap.error(f"--precisions: {unknown or args.precisions!r}; choose from {', '.join(PRECISIONS)}")
    networks = [n.strip() for n in args.networks.split(",") if n.strip()]

    rows, resnet = [], []
    for name in networks:
        for precision in precisions:
            row = zoo_row(name, precision, args)
            rows.append(row)
            print(f"{name:14s} {precision} batch {row['batch']:4d}  autocnn {row['autocnn_cuda_ms']:8.3f} ms  "
                  f"autocnn.torch {row['autocnn_torch_graph_ms']:8.3f} ms  PyTorch graph {row['pytorch_graph_ms']:8.3f} "
                  f"ms  eager {row['pytorch_eager_ms']:8.3f} ms  x{row['vs_pytorch_graph']:.2f} vs PyTorch graph "
                  f"({', '.join(row['kernel_sources'])})", flush=True)
            args.out.write_text(json.dumps({"zoo": rows, "resnet18": resnet}, indent=1))
    if not args.no_resnet:
        for precision in precisions:
            row = resnet_row(precision, args)
            resnet.append(row)
            print(f"resnet18       {precision} batch {row['batch']:4d}  converted {row['autocnn_torch_graph_ms']:8.3f} ms  "
                  f"unconverted {row['pytorch_graph_ms']:8.3f} ms  x{row['vs_unconverted']:.2f}  autocnn "
                  f"{_fmt(row['autocnn_share'], '.1%')} of device time", flush=True)
            args.out.write_text(json.dumps({"zoo": rows, "resnet18": resnet}, indent=1))
    print_tables(rows, resnet)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    raise SystemExit(main())
