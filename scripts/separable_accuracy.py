#!/usr/bin/env python3
"""The accuracy of separable filters (seed 002): each network trained on a data set
with 2D filters, then with separable filters at each setting, same seed, same data, same schedule.

The seed reports about one point of test accuracy lost to rank-1 filters and training 13% faster.
Per run this prints the final test accuracy, the median epoch time after the first (the first pays
for compiling and, with --autotune quick, for tuning), each separable layer's rank, and the
update route chosen at build. Every run's history goes to --out/separable_accuracy.json as it
finishes, so a run stopped part-way keeps what it had.

Usage (GPU host):
    python scripts/separable_accuracy.py --data-root .data/fashion-mnist --epochs 10 --out results/
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NETWORKS = ("convnet18", "conv4")
SETTINGS = ("off", "1", "energy")


def layer_summary(model: Any) -> list[dict[str, Any]]:
    """The convolution layers' separable state after training: rank, route, the energy rule's share."""
    from autocnn.nn.conv_layer import Conv2d

    out = []
    for layer in model.layers:
        if not isinstance(layer, Conv2d):
            continue
        choice = layer.rank_choice
        out.append({"layer": layer.name, "kernel": list(layer.kernel_size), "rank": layer.separable_rank,
                    "route": layer.separable_update_route,
                    "energy_kept": None if choice is None else float(choice.kept[choice.rank - 1])})
    return out


def run_one(network: str, setting: str, args: argparse.Namespace) -> dict[str, Any]:
    from autocnn.nn.training import train

    start = time.perf_counter()
    report = train(network, dataset=args.dataset, epochs=args.epochs, batch_size=args.batch_size,
                   backend=args.backend, seed=args.seed, data_root=args.data_root, limit=args.limit,
                   verbose=False, autotune=args.autotune if args.backend == "cuda" else None,
                   separable=setting)
    epochs = list(report.history.seconds)
    later = epochs[1:] or epochs
    return {"network": network, "separable": setting, "final_test_accuracy": report.final_test_accuracy,
            "test_accuracy": report.test_accuracy, "loss": list(report.history.loss),
            "epoch_seconds": epochs, "median_epoch_s": statistics.median(later),
            "wall_s": time.perf_counter() - start, "layers": layer_summary(report.model),
            "dispatch": report.dispatch_report}


def ranks_text(row: dict[str, Any]) -> str:
    ranks = [str(layer["rank"]) if layer["rank"] is not None else "2D" for layer in row["layers"]]
    return "/".join(ranks)


def table(rows: list[dict[str, Any]], header: str) -> str:
    lines = [header, "",
             "| network | filters | ranks per conv | test acc | vs 2D (points) | epoch s | vs 2D time |",
             "|---|---|---|---:|---:|---:|---:|"]
    dense = {r["network"]: r for r in rows if r["separable"] == "off"}
    for r in rows:
        base = dense.get(r["network"])
        points = "" if base is None or r is base else f"{100 * (r['final_test_accuracy'] - base['final_test_accuracy']):+.2f}"
        speed = "" if base is None or r is base else f"{base['median_epoch_s'] / r['median_epoch_s']:.2f}x"
        label = "2D" if r["separable"] == "off" else f"separable {r['separable']}"
        lines.append(f"| {r['network']} | {label} | {ranks_text(r)} | {r['final_test_accuracy']:.4f} | {points} "
                     f"| {r['median_epoch_s']:.2f} | {speed} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--networks", default=",".join(NETWORKS), help="zoo networks (default convnet18,conv4)")
    ap.add_argument("--settings", default=",".join(SETTINGS),
                    help="separable settings as autocnn train takes them (default off,1,energy; off is the "
                         "2D baseline each row is compared with)")
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=None, help="use only this many images of each split")
    ap.add_argument("--backend", choices=("cuda", "numpy"), default="cuda")
    ap.add_argument("--autotune", choices=("off", "quick", "full"), default="off",
                    help="for problems no record covers (default off: untuned kernels run their defaults, "
                         "and the table says so)")
    ap.add_argument("--out", type=Path, default=Path("."), help="folder for separable_accuracy.json")
    args = ap.parse_args(argv)

    from autocnn.nn.zoo import NETWORKS as ZOO
    from autocnn.separable.setting import parse_separable_text

    networks = [n for n in args.networks.split(",") if n]
    settings = [s for s in args.settings.split(",") if s]
    unknown = [n for n in networks if n not in ZOO]
    if unknown:
        ap.error(f"--networks: unknown {', '.join(unknown)}; the zoo has {', '.join(ZOO)}")
    for s in settings:
        try:
            parse_separable_text(s)
        except ValueError as exc:
            ap.error(f"--settings: {exc}")
    if args.epochs < 1 or args.batch_size < 1:
        ap.error("--epochs and --batch-size must be >= 1")
    if args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out} is a file; give a folder")
    args.out.mkdir(parents=True, exist_ok=True)

    gpu = "CPU (numpy backend)"
    if args.backend == "cuda":
        from autocnn.device import current_device

        gpu = current_device(0).name
    rows: list[dict[str, Any]] = []
    for network in networks:
        for setting in settings:
            row = run_one(network, setting, args)
            rows.append(row)
            print(f"{network:10s} separable={setting:8s} ranks {ranks_text(row):12s} acc "
                  f"{row['final_test_accuracy']:.4f} epoch {row['median_epoch_s']:.2f} s "
                  f"(wall {row['wall_s']:.0f} s)", flush=True)
            (args.out / "separable_accuracy.json").write_text(json.dumps(
                {"gpu": gpu, "args": {k: str(v) for k, v in vars(args).items()}, "runs": rows}, indent=1))
    header = (f"{args.dataset}, {args.epochs} epochs, batch {args.batch_size}, seed {args.seed}, {gpu}, "
              f"autotune {args.autotune if args.backend == 'cuda' else 'n/a'}")
    print(table(rows, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
