"""``autocnn train``: a zoo network (or a network JSON file) trained on a data set, its arguments
turned once into a TrainCommand; the training itself is autocnn.nn.training's."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autocnn.cli.checks import say, train_preflight
from autocnn.cli.problems import WORKSPACE_HELP, zoo_text
from autocnn.device import set_workspace_limit
from autocnn.dispatch.quick import AUTOTUNE_MODES
from autocnn.precision import DEFAULT_PRECISION, PRECISION_NAMES


def add_parser(sub: Any) -> None:
    """The ``train`` command's parser, under the top-level ``sub``parsers."""
    tr = sub.add_parser("train", help="train a zoo network on tuned kernels")
    tr.add_argument("--network", required=True, help=f"{zoo_text()} or a JSON file")
    tr.add_argument("--dataset", default="fashion-mnist", help="fashion-mnist (default), mnist or cifar10")
    tr.add_argument("--data-root", default=None, help="folder of the data set files")
    tr.add_argument("--epochs", type=int, default=10)
    tr.add_argument("--batch-size", type=int, default=64,
                    help="mini-batch size (default 64: lenet5 reaches 90%% on Fashion-MNIST in 10 epochs)")
    tr.add_argument("--backend", default="cuda", choices=("cuda", "numpy"))
    tr.add_argument("--optimizer", default="adam", help="sgd, adam or rprop")
    tr.add_argument("--lr", type=float, default=None)
    tr.add_argument("--lr-schedule", default="cosine", choices=("cosine", "none"),
                    help="learning-rate schedule over the epochs (default cosine; RPROP ignores it)")
    tr.add_argument("--no-standardize", action="store_true",
                    help="keep pixel values in [0, 1] instead of zero mean and unit variance")
    tr.add_argument("--precision", choices=PRECISION_NAMES, default=DEFAULT_PRECISION.name,
                    help="the convolutions' precision on the cuda backend: fp32 (default, FP32-accurate), "
                         "tf32 (tensor cores round operands to TF32), or mixed precision bf16 or fp16 "
                         "(convolutions and pooling on 16-bit tensors, FP32 master weights, optimizer and loss; "
                         "fp16 with dynamic loss scaling). The numpy backend computes fp32 and tf32 in float32 "
                         "and emulates bf16 and fp16 roundings. The dispatch table shows each layer's")
    tr.add_argument("--autotune", choices=AUTOTUNE_MODES, default=None,
                    help="on the cuda backend, for kernel problems that no tuning record covers: quick "
                         "(measure a handful of candidates, about 2 s each, and keep the fastest as a quick "
                         "record that a later full tuning replaces), full (tune with a small trial budget) "
                         "or off (run the nearest shape's or the default config untuned); default: "
                         "$AUTOCNN_AUTOTUNE, else quick")
    tr.add_argument("--workspace-limit", default=None, metavar="SIZE",
                    help=WORKSPACE_HELP + "; lookups and quick tuning hand out no config that needs more")
    tr.add_argument("--separable", default="off", metavar="RANK|energy[:SHARE]|off",
                    help="separable filters (seed 002) on every stride-1 convolution with a filter of at least "
                         "2x2: an integer rank (1 is the seed's), 'energy' (the smallest rank per layer keeping "
                         "90%% of its filters' energy), 'energy:SHARE' or a share such as 0.95, or off (default)")
    tr.add_argument("--seed", type=int, default=None)
    tr.add_argument("--limit", type=int, default=None, help="use only this many training images")
    tr.add_argument("--save", type=Path, default=None, help="write the trained weights (.npz)")
    tr.add_argument("--no-fuse", action="store_true",
                    help="keep every layer on its own kernels: no fused kernel (conv_bwd_fused, conv_pool_fwd, "
                         "conv_pool_dz), even where the tuning records show one faster")
    tr.add_argument("--json", action="store_true")
    tr.set_defaults(func=lambda parsed: run_train(train_command(parsed)))


@dataclass(frozen=True)
class TrainCommand:
    """``autocnn train`` as given: what autocnn.nn.training.train runs, and what the command writes."""

    network: str
    dataset: str
    data_root: str | None
    epochs: int
    batch_size: int
    backend: str
    optimizer: str
    lr: float | None
    lr_schedule: str | None          # None: a constant rate
    standardize: bool
    precision: str
    autotune: str | None             # None: $AUTOCNN_AUTOTUNE, else quick
    workspace_limit: str | None
    separable: str
    seed: int | None
    limit: int | None
    save: Path | None
    fuse: bool | None                # False: no fused kernel; None: where the tuning records show one faster
    json: bool


def train_command(args: argparse.Namespace) -> TrainCommand:
    return TrainCommand(
        network=args.network, dataset=args.dataset, data_root=args.data_root, epochs=args.epochs,
        batch_size=args.batch_size, backend=args.backend, optimizer=args.optimizer, lr=args.lr,
        lr_schedule=None if args.lr_schedule == "none" else args.lr_schedule, standardize=not args.no_standardize,
        precision=args.precision, autotune=args.autotune, workspace_limit=args.workspace_limit,
        separable=args.separable, seed=args.seed, limit=args.limit, save=args.save,
        fuse=False if args.no_fuse else None, json=args.json)


def run_train(command: TrainCommand) -> int:
    from autocnn.nn.training import train

    # --seed, --batch-size, --save and the directories, before any data is read
    train_preflight(command.seed, command.batch_size, command.epochs, command.limit, command.save, command.backend,
                    command.autotune)
    if command.workspace_limit is not None:
        set_workspace_limit(command.workspace_limit)
    report = train(command.network, dataset=command.dataset, epochs=command.epochs, batch_size=command.batch_size,
                   backend=command.backend, optimizer=command.optimizer, lr=command.lr, seed=command.seed,
                   data_root=command.data_root, limit=command.limit, verbose=not command.json,
                   standardize=command.standardize, precision=command.precision, autotune=command.autotune,
                   separable=command.separable, fuse=command.fuse, lr_schedule=command.lr_schedule)
    saved = _save_weights(report.model, command.save) if command.save else None
    if command.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(report.summary())
        print(report.dispatch_report)
        if saved is not None:
            print(f"weights written to {saved}")
    return 0 if saved is None or saved == command.save else 1


def _save_weights(model: Any, path: Path) -> Path:
    """Write the trained weights to ``path``; where that fails anyway (checked before training, but
    a disk may fill meanwhile), to a file in the temporary directory, said on stderr."""
    import tempfile

    try:
        model.save(path)
        return path
    except OSError as exc:
        fallback = Path(tempfile.mkstemp(prefix="autocnn-weights-", suffix=".npz")[1])
        model.save(fallback)
        say(f"--save {path}: {exc.strerror or exc}; the trained weights were written to {fallback} instead")
        return fallback
