#!/usr/bin/env python3
"""Whole training steps with and without the seeds' techniques (fused kernels, separable
filters), side by side with PyTorch, one run.

For each zoo network, the graphed autocnn training step (forward, loss, backward, Adam; the batch
already in the model's input buffers, as scripts/bench_training.py times it) in these variants:

* fused:      2D filters, fused kernels where the tuning records show them faster (the default:
              conv_bwd_fused, Scherer's one-pass backward; conv_pool_fwd and conv_pool_dz, the
              convolution fused with the averaging after it), and which ones were chosen;
* split:      the same model with ``fuse=False``, every layer on its own kernels;
* sep-1, sep-energy: separable filters at rank 1 and at the energy-chosen rank (seed 002);
* PyTorch:    the same network in PyTorch (cuDNN benchmark mode, TF32 off), the whole step captured
              in one CUDA graph.

Kernel problems that no record covers are handled by the model's autotune setting (--autotune,
default quick: a handful of candidates measured at build, about 2 s each). Writes JSON and prints
the table last.

    python scripts/bench_step_variants.py --networks kriz09,convnet18,conv4,scherer10 --out results/
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))         # bench_training, beside this file
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # autocnn

from bench_training import BATCH, copy_weights, time_autocnn_cuda, time_torch_graph, torch_batch, \
    torch_model, torch_precision  # noqa: E402

NETWORKS = ("kriz09", "convnet18", "conv4", "scherer10")
VARIANTS = ("fused", "split", "sep-1", "sep-energy")


def variant_model(name: str, variant: str, autotune: str) -> Any:
    from autocnn import nn

    model = nn.build_network(name, backend="cuda", seed=0)
    model.autotune = autotune
    if variant == "split":
        model.fuse = False
    elif variant.startswith("sep-"):
        from autocnn.separable.setting import parse_separable_text

        model.separable = parse_separable_text(variant[len("sep-"):])
    return model


def describe(model: Any) -> dict[str, Any]:
    from autocnn.nn.conv_layer import Conv2d

    convs = [layer for layer in model.layers if isinstance(layer, Conv2d)]
    return {"fusions": {c.name: list(c.fusions) for c in convs if c.fusions},
            "ranks": [c.separable_rank for c in convs],
            "routes": [c.separable_update_route for c in convs],
            "sources": sorted({d.source for d in model.dispatch})}


def network_rows(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    batch = BATCH.get(name, 128)
    rows = []
    for variant in args.variants:
        start = time.perf_counter()
        with warnings.catch_warnings():   # the layers a separable setting leaves 2D: counted below
            warnings.simplefilter("ignore")
            model = variant_model(name, variant, args.autotune)
        if variant.startswith("sep-") and not any(getattr(layer, "separable", None) and layer.separable.enabled
                                                  for layer in model.layers):
            print(f"{name:10s} {variant:10s} no layer can be separable (stride 1 and a 2x2 filter or more)")
            continue
        ms = time_autocnn_cuda(model, batch, args.steps)
        row = {"network": name, "batch": batch, "variant": variant, "ms": ms, **describe(model),
               "build_and_time_s": time.perf_counter() - start, "dispatch": model.dispatch_report()}
        rows.append(row)
        print(f"{name:10s} {variant:10s} {ms:8.3f} ms  fusions {row['fusions'] or '-'}  ranks {row['ranks']}",
              flush=True)
    torch_precision("fp32")
    reference = variant_model(name, "split", "off")
    reference.build(batch)
    net = torch_model(reference)
    copy_weights(reference, net)
    x, y = torch_batch(reference.input_shape, reference.num_classes, batch)
    rows.append({"network": name, "batch": batch, "variant": "pytorch-graph",
                 "ms": time_torch_graph(net, x, y, args.steps)})
    print(f"{name:10s} {'PyTorch':10s} {rows[-1]['ms']:8.3f} ms (CUDA graph, cuDNN FP32)", flush=True)
    return rows


def table(rows: list[dict[str, Any]], gpu: str, variants: list[str]) -> str:
    head = "| network | batch | " + " | ".join(f"{v} ms" for v in variants) + \
        " | PyTorch graph ms | fused vs split | sep-1 vs fused | fusions chosen |"
    lines = [f"Graphed training step, FP32, {gpu}:", "", head, "|" + "---|" * (head.count("|") - 1)]
    for name in dict.fromkeys(r["network"] for r in rows):
        by = {r["variant"]: r for r in rows if r["network"] == name}

        def ms(v: str) -> str:
            return f"{by[v]['ms']:.3f}" if v in by else "-"

        def ratio(a: str, b: str) -> str:   # how much faster a is than b
            return f"{by[b]['ms'] / by[a]['ms']:.2f}x" if a in by and b in by else "-"

        fusions = by.get("fused", {}).get("fusions") or {}
        chosen = "; ".join(f"{k}: {'+'.join(v)}" for k, v in fusions.items()) or "none"
        lines.append(f"| {name} | {next(iter(by.values()))['batch']} | " + " | ".join(ms(v) for v in variants) +
                     f" | {ms('pytorch-graph')} | {ratio('fused', 'split')} | {ratio('sep-1', 'fused')} | {chosen} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--networks", default=",".join(NETWORKS))
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"among {', '.join(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=50, help="timed steps per run (median of 5 runs)")
    ap.add_argument("--autotune", choices=("off", "quick", "full"), default="quick",
                    help="for kernel problems no record covers (default quick)")
    ap.add_argument("--out", type=Path, default=Path("."), help="folder for bench_step_variants.json")
    args = ap.parse_args(argv)

    from autocnn.nn.zoo import NETWORKS as ZOO

    networks = [n for n in args.networks.split(",") if n]
    args.variants = [v for v in args.variants.split(",") if v]
    if not networks or [n for n in networks if n not in ZOO]:
        ap.error(f"--networks: give zoo networks among {', '.join(ZOO)}")
    if not args.variants or [v for v in args.variants if v not in VARIANTS]:
        ap.error(f"--variants: give some of {', '.join(VARIANTS)}")
    if args.steps < 1:
        ap.error("--steps must be >= 1")
    if args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out} is a file; give a folder")
    args.out.mkdir(parents=True, exist_ok=True)

    from autocnn.device import current_device

    gpu = current_device(0).name
    rows: list[dict[str, Any]] = []
    for name in networks:
        rows += network_rows(name, args)
        (args.out / "bench_step_variants.json").write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=1))
    print(table(rows, gpu, args.variants))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
