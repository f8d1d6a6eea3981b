"""``dlbooster train [DATA] ...``: the main job: training fed by the decoder
(:mod:`dlbooster.train.trainer`); with no DATA, on crops of the real photographs
scikit-image ships, decoded by the simulated device."""

from __future__ import annotations

import argparse
import os
import sys

from dlbooster.backends import BACKENDS
from dlbooster.records.fidelity import check_threshold
from dlbooster.support import argtypes

# The trainer and the boards (Amaranth) are imported where they are used, so that
# `import dlbooster.cli` (every `dlbooster` run, --help too) does not load them.

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = "the main job: train a torchvision model fed by the decoder"
DESCRIPTION = ("Train a torchvision classifier on an ImageFolder (train/ and val/ sub-folders, or every fifth "
               "file per class held out), its images decoded by the chosen backend. With no DATA: crops of "
               "the real photographs scikit-image ships, on the simulated decoder.")


def _fidelity(text: str) -> int | str:
    """argparse type: ``auto`` or a number of scans (at least 1)."""
    return text if text == "auto" else argtypes.integer_in(1)(text)


def _similarity(text: str) -> float:
    """argparse type: a cosine similarity threshold in (-1, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    try:
        return check_threshold(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be in (-1, 1], not {text}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dlbooster.hw.build.boards import BOARDS

    parser.add_argument("data", nargs="?", metavar="DATA")
    parser.add_argument("--backend", choices=BACKENDS,
                        help="decode backend (default: sim without DATA, else auto)")
    parser.add_argument("--lanes", type=argtypes.lanes, default=1, help="simulated device lanes (sim)")
    parser.add_argument("--devices", type=argtypes.positive, default=1, help="simulated devices per rank (sim)")
    parser.add_argument("--max-width", type=argtypes.max_width, default=256,
                        help="simulated device line buffers, pixels (sim)")
    parser.add_argument("--board", choices=sorted(BOARDS), help="pynq/xrt: the board (default $DLBOOSTER_BOARD)")
    parser.add_argument("--binary", metavar="BIT_OR_XCLBIN", help="pynq/xrt: its bitstream or xclbin "
                                                                   "(default $DLBOOSTER_BINARY)")
    parser.add_argument("--model", default="resnet18", help="torchvision model name")
    parser.add_argument("--epochs", type=argtypes.positive, help="epochs (default: 6 without DATA, else 1)")
    parser.add_argument("--steps", type=argtypes.positive, help="stop after this many optimiser steps")
    parser.add_argument("--batch-size", type=argtypes.positive, default=32, help="images per step per rank")
    parser.add_argument("--lr", type=float, help="peak learning rate (default 0.1 x global batch / 256; "
                                                 "0.05 without DATA)")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--warmup-epochs", type=float, default=0.0)
    parser.add_argument("--image-size", type=argtypes.positive,
                        help="crop size, pixels (default 224; 112 without DATA)")
    parser.add_argument("--backward", choices=("autograd", "split"), default="autograd",
                        help="plain autograd, or input/weight-gradient split scheduling")
    parser.add_argument("--streams", type=argtypes.positive, default=2, help="side CUDA streams for --backward split")
    parser.add_argument("--device", type=argtypes.torch_device, help="cpu, cuda or cuda:N (default: cuda when present)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=argtypes.positive, help="CPU decode threads per rank (default: one per core)")
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome-trace JSON (Perfetto)")
    parser.add_argument("--checkpoint", metavar="FILE", help="save after every epoch")
    parser.add_argument("--checkpoint-every", type=argtypes.count, default=0, metavar="STEPS",
                        help="also save every STEPS steps")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint when it exists")
    parser.add_argument("--records", metavar="DIR", help="train on Progressive Compressed Records (dlbooster "
                                                         "records write) instead of DATA")
    parser.add_argument("--fidelity", metavar="K|auto", type=_fidelity,
                        help="with --records: scans per training image, or auto (gradient similarity)")
    parser.add_argument("--fidelity-threshold", type=_similarity,
                        help="gradient cosine similarity --fidelity auto must reach (default 0.9)")
    parser.add_argument("--json", action="store_true", help="print the run's summary as JSON")


def run(args: argparse.Namespace) -> int:
    """Train as ``args`` says, printing a line per epoch and a summary (or ``--json``): 0 when
    done, 1 when there was nothing to train on, a board failed or a file could not be
    written, 2 on bad usage."""
    from dlbooster.device.boards import BoardError
    from dlbooster.train.trainer import NoTrainingData, TrainConfig, format_epoch, record_sets, summary_json, train

    if args.fidelity is not None and args.records is None:
        print("dlbooster train: --fidelity needs --records", file=sys.stderr)
        return 2
    if args.fidelity_threshold is not None and args.fidelity != "auto":
        print("dlbooster train: --fidelity-threshold applies to --fidelity auto only", file=sys.stderr)
        return 2
    if args.records is not None and args.data is not None:
        print("dlbooster train: give DATA or --records, not both", file=sys.stderr)
        return 2
    if args.records is not None:
        if args.epochs is None and args.steps is None:
            args.epochs = 1
    elif args.data is None:   # the packaged-photograph run: small crops, a few quick epochs
        args.epochs = args.epochs if args.epochs is not None or args.steps is not None else 6
        args.image_size = args.image_size or 112
        args.lr = args.lr if args.lr is not None else 0.05
    elif args.epochs is None and args.steps is None:
        args.epochs = 1
    args.image_size = args.image_size or 224
    # Record images are progressive JPEGs, which only the CPU path decodes.
    backend = args.backend or ("cpu" if args.records else "sim" if args.data is None else "auto")
    fidelity = args.fidelity
    config = TrainConfig(data=args.data, backend=backend, lanes=args.lanes, max_width=args.max_width,
                         devices=args.devices, board=args.board, binary=args.binary, model=args.model, epochs=args.epochs, steps=args.steps,
                         batch_size=args.batch_size, lr=args.lr, momentum=args.momentum,
                         weight_decay=args.weight_decay, label_smoothing=args.label_smoothing,
                         warmup_epochs=args.warmup_epochs, image_size=args.image_size, backward=args.backward,
                         streams=args.streams, device=args.device, seed=args.seed, workers=args.workers,
                         trace=args.trace, checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every,
                         resume=args.resume, progress=not args.json, records=args.records,
                         fidelity=fidelity,
                         fidelity_threshold=0.9 if args.fidelity_threshold is None else args.fidelity_threshold)
    try:
        config.check()                    # before the banner: a refused run announces nothing
        sets = record_sets(args.records) if args.records is not None else None
        if isinstance(fidelity, int):
            scans = sets[0].scans
            if fidelity > scans:
                raise ValueError(f"fidelity {fidelity}: the records in {args.records} have 1..{scans} scans "
                                 f"(give 1..{scans}, or auto)")
    except (ValueError, FileNotFoundError) as exc:    # RecordError is a ValueError
        print(f"dlbooster train: {exc}", file=sys.stderr)
        return 2
    quiet = args.json or int(os.environ.get("RANK", "0")) != 0
    if not quiet:
        where = (f"records {args.records} (fidelity {args.fidelity or 'full'})" if args.records else args.data
                 or "crops of the real photographs scikit-image ships (one class per photograph)")
        print(f"training {args.model} on {where}; decode backend {backend}"
              + (f" ({args.lanes} lane(s), {args.max_width}-pixel line buffers)" if backend == "sim" else "")
              + f", backward {args.backward}", file=sys.stderr)
    try:
        summary = train(config, on_epoch=None if quiet else lambda r: print(format_epoch(r), flush=True), sets=sets)
    except (ValueError, FileNotFoundError) as exc:   # RecordError is a ValueError
        print(f"dlbooster train: {exc}", file=sys.stderr)
        return 2
    except NoTrainingData as exc:
        print(f"dlbooster train: {exc}", file=sys.stderr)
        return 1
    except BoardError as exc:            # named, but not there or not loadable
        print(f"dlbooster train: backend {backend}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:               # a checkpoint that cannot be written (a full disk...)
        print(f"dlbooster train: {exc}", file=sys.stderr)
        return 1
    if summary.get("trace_error"):
        print(f"dlbooster train: {summary['trace_error']}", file=sys.stderr)
    if int(os.environ.get("RANK", "0")) != 0:
        return 1 if summary.get("trace_error") else 0
    if args.json:
        print(summary_json(summary))
    else:
        top1 = "-" if summary["val_top1"] is None else f"{100 * summary['val_top1']:.1f}%"
        losses = " -> ".join("-" if v is None else f"{v:.4f}" for v in (summary["loss_first"], summary["loss_last"]))
        print(f"{summary['steps']} steps, {summary['images']} images, {summary['images_per_s']:.1f} images/s, "
              f"loss {losses}, val top-1 {top1}, "
              f"host cores {summary['host_cores']:.2f}, world size {summary['world_size']}")
        print(f"decode outcomes: {summary['outcomes']} ({summary['fallbacks']} CPU fallbacks)")
        if summary["resumed_from"] is not None and not summary["steps"]:
            n = summary["resumed_from"]
            print(f"{args.checkpoint} had already trained {n} step{'s' if n != 1 else ''}, as far as these "
                  f"options go: nothing left to train (raise --epochs or --steps to go on)", file=sys.stderr)
        choice = summary.get("fidelity_choice")
        if choice is not None:
            scores = ", ".join(f"{k}: {v:.3f}" for k, v in choice["scores"].items())
            if str(choice["fidelity"]) in choice["scores"]:
                print(f"fidelity {choice['fidelity']} chosen: the lowest whose gradients' cosine similarity to "
                      f"full fidelity's reached {choice['threshold']} ({scores})")
            else:
                print(f"fidelity {choice['fidelity']} (full) chosen: no lower fidelity's gradients reached a cosine "
                      f"similarity of {choice['threshold']} to full fidelity's ({scores})")
        if summary["untrained"]:
            n = summary["untrained"]
            print(f"{n} decoded image{'s were' if n != 1 else ' was'} not trained on: a batch had a rank with "
                  f"no decoded sample (or one, where batch norm needs two), so no rank stepped on it",
                  file=sys.stderr)
        wide = summary["outcomes"].get("fallback:width", 0)
        if wide:
            print(f"{wide} images were wider than the device's {args.max_width}-pixel line buffers and "
                  f"were decoded on the CPU; --max-width sets the simulated device's width", file=sys.stderr)
        if summary["trace"] and not summary.get("trace_error"):
            print(f"trace: {summary['trace']} (open in https://ui.perfetto.dev)")
    return 1 if summary.get("trace_error") else 0
