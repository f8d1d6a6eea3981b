"""``dlbooster decode [--backend B] [--out DIR] [--json] [--verify] PATH...``: decode files
or folders (walked recursively, linked folders followed once); exit 0 when every input
decoded (ok or fallback), 1 when any input errored (or, with ``--verify``, differs from
Pillow; with ``--out``, its PNG could not be written) or there was no input at all, 2 on
bad usage."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

from dlbooster.backends import (BACKENDS, CpuBackend, LargeFile, decode_pillow, decode_results, get_backend,
                                read_input)
from dlbooster.cli.escapes import CONTROL
from dlbooster.errors import DecodeError
from dlbooster.jpeg import DEFAULT_MAX_WIDTH
from dlbooster.support import argtypes
from dlbooster.support.files import save_png, walk_inputs

# The boards (Amaranth) and tqdm are imported where they are used, so that `import
# dlbooster.cli` (every `dlbooster` run, --help too) does not load them.

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = "decode JPEG files to RGB"
DESCRIPTION = "Decode files or folders (recursively) exactly like PIL.Image.open(f).convert('RGB')."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dlbooster.hw.build.boards import BOARDS

    parser.add_argument("paths", nargs="+", metavar="PATH")
    parser.add_argument("--backend", choices=BACKENDS, default="auto")
    parser.add_argument("--max-width", type=argtypes.max_width, default=DEFAULT_MAX_WIDTH,
                        help="line-buffer width of the modelled lane or the simulated device (pixels)")
    parser.add_argument("--lanes", type=argtypes.lanes, default=1, help="decoder lanes of the simulated device (sim)")
    parser.add_argument("--board", choices=sorted(BOARDS), help="pynq/xrt: the board (default $DLBOOSTER_BOARD)")
    parser.add_argument("--binary", metavar="BIT_OR_XCLBIN", help="pynq/xrt: its bitstream or xclbin "
                                                                   "(default $DLBOOSTER_BINARY)")
    parser.add_argument("--out", metavar="DIR", help="write one lossless PNG per input")
    parser.add_argument("--json", action="store_true", help='print {"results": [...], "summary": {...}}')
    parser.add_argument("--verify", action="store_true",
                        help="also decode with Pillow and count inputs whose result differs")


def _batched(inputs, batch, backend, cpu, progress):
    """``((path, name), DecodeResult)`` for every input, decoded ``batch`` at a time."""
    for start in range(0, len(inputs), batch):
        chunk = inputs[start:start + batch]
        yield from zip(chunk, decode_results([path for path, _ in chunk], backend, cpu=cpu))
        progress.update(len(chunk))


def run(args: argparse.Namespace) -> int:
    """Decode ``args.paths`` (printing a line per input, or ``--json``); the exit status."""
    from tqdm import tqdm

    from dlbooster.device.boards import BoardError

    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
        print(f"dlbooster decode: --out {args.out} exists and is not a folder", file=sys.stderr)
        return 2
    options = {"model": {"max_width": args.max_width},
               "sim": {"max_width": args.max_width, "lanes": args.lanes},
               "pynq": {"board": args.board, "binary": args.binary},
               "xrt": {"board": args.board, "binary": args.binary}}.get(args.backend, {})
    try:
        backend = get_backend(args.backend, **options)
    except ValueError as exc:            # a board backend without its board and binary
        print(f"dlbooster decode: {exc}", file=sys.stderr)
        return 2
    except BoardError as exc:            # named, but not there or not loadable
        print(f"dlbooster decode: backend {args.backend}: {exc}", file=sys.stderr)
        return 1
    cpu = CpuBackend()
    inputs = walk_inputs(args.paths)
    results = []
    counts: Counter = Counter()
    mismatches = []
    unsaved = []
    # The simulated device takes a batch at a time, so that all its lanes are busy.
    batch = 8 * args.lanes if hasattr(backend, "decode_many") else 1
    progress = tqdm(total=len(inputs), desc="decode", unit="file", file=sys.stderr,
                    disable=None if len(inputs) > 1 else True)
    for (path, name), result in _batched(inputs, batch, backend, cpu, progress):
        record = result.to_json()
        counts[(result.status, result.backend, result.reason)] += 1
        if args.verify:
            try:
                try:
                    source = read_input(path)[0]
                except LargeFile:
                    source = path             # Pillow reads it from the file
                reference = decode_pillow(source)
            except DecodeError:
                reference = None
            same = (reference is None and result.image is None) or (
                reference is not None and result.image is not None
                and reference.shape == result.image.shape and (reference == result.image).all())
            record["matches_pillow"] = bool(same)
            if not same:
                mismatches.append(path)
        if args.out and result.image is not None:
            target = Path(args.out) / f"{name}.png"
            try:
                save_png(result.image, target)
                record["png"] = str(target)
            except OSError as exc:
                record["png_error"] = f"{type(exc).__name__}: {exc.strerror or exc}"
                unsaved.append(path)
                print(f"dlbooster decode: {path}: PNG not written to {target} ({record['png_error']})",
                      file=sys.stderr)
        results.append(record)
    progress.close()
    errors = sum(n for (status, _, _), n in counts.items() if status == "error")
    summary = {
        "inputs": len(inputs),
        "ok": sum(n for (s, _, _), n in counts.items() if s == "ok"),
        "fallback": sum(n for (s, _, _), n in counts.items() if s == "fallback"),
        "error": errors,
        "by_reason": {f"{s}:{r}": n for (s, _, r), n in sorted(counts.items(), key=str) if r},
    }
    if args.verify:
        summary["pillow_mismatches"] = len(mismatches)
    if args.out:
        summary["png_not_written"] = len(unsaved)
    if args.json:
        json.dump({"results": results, "summary": summary}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        for record in results:
            if record["status"] != "ok" or len(results) <= 20:
                detail = f": {record['detail']}" if record.get("detail") else ""
                print(f"{record['status']:8} {record['backend'] or '-':6} "
                      f"{record['reason'] or '-':22} " + f"{record['path']}{detail}".translate(CONTROL))
        print(f"{summary['inputs']} inputs: {summary['ok']} ok, {summary['fallback']} fallback, "
              f"{summary['error']} error" + (f", {len(mismatches)} differ from Pillow" if args.verify else "")
              + (f", {len(unsaved)} PNG(s) not written" if unsaved else ""))
        for key, n in summary["by_reason"].items():
            print(f"  {n:6}  {key}")
    for path in mismatches:
        print(f"differs from Pillow: {path}".translate(CONTROL), file=sys.stderr)
    return 1 if errors or mismatches or unsaved or not inputs else 0
