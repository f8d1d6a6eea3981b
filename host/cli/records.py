"""``dlbooster records write SRC OUT`` / ``records info DIR``: Progressive Compressed
Records (:mod:`dlbooster.records.pcr`): write an ImageFolder as multi-fidelity records;
print bytes and PSNR per fidelity."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from dlbooster.bench.common import table
from dlbooster.cli.escapes import CONTROL
from dlbooster.support import argtypes

# The records themselves are imported where they are used, so that `import dlbooster.cli`
# (every `dlbooster` run, --help too) does not load them.

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = "Progressive Compressed Records: multi-fidelity data sets"
DESCRIPTION = ("Progressive Compressed Records: write them from an ImageFolder, or report on a record set "
               "(docs/records.md).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="{write,info}", required=True)
    w = actions.add_parser("write", help="write record files from an ImageFolder",
                           description="Re-encode the ImageFolder SRC losslessly as progressive JPEGs "
                                       "(jpegtran) and write record files grouped by scan into OUT (SRC "
                                       "with train/ and val/ gives OUT/train and OUT/val); exit 1 when a "
                                       "file was skipped, 2 when the command refused or failed.")
    w.add_argument("src", metavar="SRC")
    w.add_argument("out", metavar="OUT")
    w.add_argument("--images-per-record", type=argtypes.positive, default=256, help="images per record file")
    w.add_argument("--no-verify", action="store_true",
                   help="skip the check that each image's full decode equals its source's")
    w.add_argument("--workers", type=argtypes.positive, help="jpegtran processes at once (default: CPU count)")
    w.add_argument("--json", action="store_true", help="print the report as JSON")
    i = actions.add_parser("info", help="bytes per fidelity and PSNR against full fidelity",
                           description="Bytes per fidelity of the record set DIR, and the PSNR of each "
                                       "fidelity against full fidelity over a sample of its images.")
    i.add_argument("src", metavar="DIR")
    i.add_argument("--sample", type=argtypes.positive, default=16, help="images whose PSNR is measured")
    i.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """``records write`` (0 when every image was written, 1 when one was skipped, 2 when the
    command refused or failed, its files removed) or ``records info`` (0, or 2 for a set
    that cannot be read)."""
    from dlbooster.records.pcr import (RecordError, RecordFile, RecordSet, info, make_folders, record_paths,
                                       remove_empty_folders, signals_held, source_classes, write_records)

    if args.action == "write":
        src = Path(args.src)
        if not args.src:                      # Path("") is ".": the current folder, which nobody meant
            print("dlbooster records write: SRC is empty: give the folder of images to write", file=sys.stderr)
            return 2
        if not src.is_dir():
            print(f"dlbooster records write: {src}: {'not a folder' if src.exists() else 'no such folder'}",
                  file=sys.stderr)
            return 2
        # The hymenoptera layout (train/ and val/) becomes two record sets, as `train` reads it;
        # train/ alone one set of its classes (`train` takes its classes from it, not "train").
        pairs = [(src / split, Path(args.out) / split) for split in ("train", "val") if (src / split).is_dir()] \
            if (src / "train").is_dir() else [(src, Path(args.out))]
        # Every pair is checked before the first is written: a refusal after the train
        # set would leave it behind (inside SRC's val/, a new class of its ImageFolder).
        problem, listings = None, []
        if not args.out:
            problem = "OUT is empty: give the folder to write the records to"
        elif Path(os.path.realpath(args.out)).is_relative_to(os.path.realpath(src)):
            problem = f"{args.out}: inside the source folder {src}"
        for source, out in pairs:
            for folder in (Path(args.out), out):
                if problem is None and (folder.is_symlink() or folder.exists()) and not folder.is_dir():
                    problem = f"{folder}: not a folder"
            if problem is None and out.is_dir() and record_paths(out):
                problem = f"{out}: already holds record files (remove them, or give another OUT)"
            if problem is None:
                try:
                    listings.append(source_classes(source))
                except OSError as exc:
                    problem = str(exc)
        classes = [listing[1] for listing in listings]
        if problem is None and len(classes) == 2 and classes[0] != classes[1]:
            # `train --records` refuses such a pair; it is refused before it is written.
            problem = (f"{src}: train/ and val/ have different classes (train: {', '.join(classes[0])}; "
                       f"val: {', '.join(classes[1])})")
        if problem is not None:
            print(f"dlbooster records write: {problem}", file=sys.stderr)
            return 2
        reports, lines = {}, []
        written: list[str] = []
        made: list[Path] = []
        try:
            # The folders this command makes (OUT, OUT/train): a failure removes them.
            made = make_folders(pairs[0][1])
            for (source, out), listing in zip(pairs, listings):
                def show(done, total, name=source.name):
                    if not args.json and sys.stderr.isatty() and (done == total or done % 50 == 0):
                        print(f"\r{name}: {done}/{total} images", end="\n" if done == total else "",
                              file=sys.stderr, flush=True)
                report = write_records(source, out, images_per_record=args.images_per_record,
                                       verify=not args.no_verify, workers=args.workers, progress=show,
                                       listing=listing)
                written += report.records
                reports[str(out)] = report.to_json()
                # Printed once every set is written: a later failure removes this one.
                lines.append(f"{out}: {report.images} images in {len(report.records)} record file(s), "
                             f"{report.scans} scan groups; {report.record_bytes:,} bytes "
                             f"({report.record_bytes / max(report.source_bytes, 1):.3f} of the sources' "
                             f"{report.source_bytes:,}); {len(report.skipped)} skipped")
                # A reason names its input already ("PATH: jpegtran failed: ...").
                lines += [(f"  skipped {reason}" if reason.startswith(f"{path}: ")
                           else f"  skipped {path}: {reason}").translate(CONTROL) for path, reason in report.skipped]
        except BaseException as exc:
            with signals_held():
                for path in written:          # train/ without val/ is no data set
                    Path(path).unlink(missing_ok=True)
                remove_empty_folders(made)
            if not isinstance(exc, (OSError, RecordError, ValueError)):
                raise
            removed = f" (the record files written to {pairs[0][1]} are removed)" if written else ""
            print(f"dlbooster records write: {exc}{removed}", file=sys.stderr)
            return 2
        print(json.dumps(reports, indent=1) if args.json else "\n".join(lines))
        return 1 if any(r["skipped"] for r in reports.values()) else 0
    try:
        result = info(RecordSet(args.src), sample=args.sample)
    except (OSError, ValueError) as exc:                # RecordError is a ValueError
        # Name every damaged (or unreadable) file, not only the first the set stopped at.
        paths = record_paths(args.src) if os.path.isdir(args.src) else []
        damaged = []
        for path in paths:
            try:
                RecordFile(path)
            except (OSError, RecordError) as bad:
                damaged.append(str(bad))
        # `records write` makes train/ and val/ sets of a hymenoptera-style folder.
        sets = [name for name in ("train", "val") if os.path.isdir(os.path.join(args.src, name))
                and record_paths(os.path.join(args.src, name))]
        hint = f"; it holds the record sets {' and '.join(f'{n}/' for n in sets)}: give one" if sets else ""
        if len(damaged) > 1:
            print(f"dlbooster records info: {args.src}: {len(damaged)} of {len(paths)} record files are damaged "
                  f"or unreadable:\n" + "\n".join(f"  {d}" for d in damaged), file=sys.stderr)
        else:
            print(f"dlbooster records info: {exc}{hint}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{result['root']}: {result['images']} images in {result['records']} record file(s), "
          f"{result['scans']} scan groups; sources {result['source_bytes']:,} bytes; "
          f"PSNR against full fidelity over {result['sample']} images")
    for name in result["unmeasured"]:
        print(f"  not measured: {name} (Pillow does not decode it)")
    # None: every measured image equal to full fidelity's, or none measured.
    db = lambda v: "-" if not result["sample"] else "inf" if v is None else f"{v:.2f}"  # noqa: E731
    share = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    rows = [[r["fidelity"], f"{r['bytes']:,}", share(r["of_source"]), share(r["of_full"]), r["identical"],
             db(r["psnr_mean_db"]), db(r["psnr_min_db"])] for r in result["fidelities"]]
    print(table(["fidelity", "bytes", "of sources", "of full", "identical", "PSNR mean dB", "PSNR min dB"], rows))
    print("PSNR over the images not yet identical to full fidelity's (identical: how many are)")
    return 0
