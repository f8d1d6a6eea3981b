"""``dlbooster bench``: each benchmark's arguments, and the dispatch to it."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from pathlib import Path

from dlbooster.bench.common import Refused, machine, table
from dlbooster.bench.decoder import bench_decode, bench_device, bench_entropy, bench_idct, bench_lane, bench_parse
from dlbooster.bench.train import bench_backward
from dlbooster.support import argtypes
from dlbooster.support.files import json_target_problem, walk_inputs
from dlbooster.support.samples import default_corpus

# Pillow, PyTorch and torchvision, the IEEE 1180 limits, and the runtime and records
# benchmarks are imported where they are used, so that `import dlbooster.cli` (every
# `dlbooster` run, --help too) does not load them.

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "inputs", "run"]

HELP = "benchmarks (tables on stdout, JSON with --json)"
#: None: ``bench --help`` lists the benchmarks, each with its help.
DESCRIPTION = None


def _positive_list(text: str) -> str:
    """argparse type: comma-separated integers of at least 1, or nothing (kept as the text)."""
    for item in text.split(",") if text else ():
        if not item.strip().isdigit() or int(item) < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: give integers of at least 1, separated by commas")
    return text


def _recode_spec(text: str) -> str:
    """argparse type: ``SUBSAMPLING@QUALITY`` for ``--recode`` (kept as the text)."""
    sub, _, quality = text.partition("@")
    if sub not in _RECODE_SUBSAMPLING or not quality.isdigit() or not 1 <= int(quality) <= 100:
        raise argparse.ArgumentTypeError(f"{text!r}: give SUBSAMPLING@QUALITY with SUBSAMPLING in "
                                         f"{', '.join(_RECODE_SUBSAMPLING)} and QUALITY 1..100")
    return text


def _one_or_more(kind):
    """argparse type: ``kind``'s comma-separated list, which may not be empty."""
    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError("give at least one value")
        return kind(text)
    return check


def _choices_list(*choices: str):
    """argparse type: a non-empty comma-separated subset of ``choices`` (kept as the text)."""
    def check(text: str) -> str:
        items = text.split(",")
        if not text or any(item not in choices for item in items) or len(set(items)) < len(items):
            raise argparse.ArgumentTypeError(f"{text!r}: give one or more of {', '.join(choices)}, each once, "
                                             f"separated by commas")
        return text
    return check


#: argparse type: comma-separated IDCT lane counts (rows per clock), each 1, 2 or 4.
_idct_lanes = _choices_list("1", "2", "4")


def _ieee_blocks(text: str) -> int:
    """argparse type: 0 (no IEEE 1180 test) or at least the 10,000 blocks per run that
    IEEE 1180-1990 specifies (fewer judge its error limits on too small a sample)."""
    if not text.strip().isdigit() or 0 < int(text) < 10000:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 (no test) or at least 10000, the standard's "
                                         f"blocks per run")
    return int(text)


def _lanes_list(text: str) -> str:
    """argparse type: comma-separated device lane counts, each as ``--lanes`` takes one
    (1..32), or nothing (kept as the text)."""
    _positive_list(text)
    for item in text.split(",") if text else ():
        argtypes.lanes(item)
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="kind", required=True)
    for kind, text in (("parse", "header parse + classify, microseconds per file"),
                       ("decode", "Pillow vs cpu backend vs reference model, images/s"),
                       ("entropy", "entropy decoder core in Verilator: symbols per clock"),
                       ("idct", "IDCT core in Verilator: IEEE 1180, clocks/block, stalls it causes"),
                       ("lane", "whole decoder lane in Verilator: clocks per pixel, RGB vs Pillow"),
                       ("device", "simulated decoder device: clocks/s, images/s, 1..N lanes"),
                       ("host", "runtime host cost per image, driving an instant device"),
                       ("loader", "Loader images/s vs torchvision DataLoader; sim lanes"),
                       ("backward", "training iteration time: autograd vs split backward"),
                       ("records", "Progressive Compressed Records: bytes, PSNR, read and loader "
                                   "throughput per fidelity; optional training comparison")):
        p = kinds.add_parser(kind, help=text, description=text)
        if kind == "records":
            p.add_argument("paths", nargs="*", metavar="DATASET",
                           help="ImageFolder roots or folders of images (default: the corpus's "
                                "hymenoptera and ImageNet sample photos)")
            p.add_argument("--fidelities", type=_one_or_more(_positive_list),
                           help="comma-separated fidelities to read and load (default: 1, 2, 5 and full)")
            p.add_argument("--rounds", type=argtypes.positive, default=5, help="alternating read rounds")
            p.add_argument("--sample", type=argtypes.positive, default=16, help="images whose PSNR is measured")
            p.add_argument("--images-per-record", type=argtypes.positive, default=256)
            p.add_argument("--loader-epochs", type=argtypes.count, default=2, help="timed Loader epochs (0: none)")
            p.add_argument("--batch-size", type=argtypes.positive, default=32)
            p.add_argument("--workers", type=argtypes.positive, default=2, help="CPU decode threads")
            p.add_argument("--train-epochs", type=argtypes.count, default=0, help="training comparison epochs (0: none)")
            p.add_argument("--train-fidelity", type=argtypes.positive, default=2, help="the low fidelity trained at")
            p.add_argument("--model", default="resnet18")
            p.add_argument("--image-size", type=argtypes.positive, default=112, help="training crop, pixels")
        elif kind != "backward":
            p.add_argument("paths", nargs="*", metavar="PATH",
                           help="files or folders (default: the corpus ImageNet sample photos)")
            p.add_argument("--limit", type=argtypes.count, default=0, help="use at most N files (0: all)")
        p.add_argument("--json", metavar="FILE", help="write the results as JSON (-: to stdout, the table to "
                                                      "stderr)")
        if kind == "parse":
            p.add_argument("--repeat", type=argtypes.positive, default=20, help="timed repetitions per file")
        elif kind == "idct":
            p.add_argument("--lanes", default="1,2,4", type=_idct_lanes,
                           help="comma-separated IDCT lane counts (rows per clock: 1, 2 or 4) to measure")
            p.add_argument("--ieee-blocks", type=_ieee_blocks, default=10000,
                           help="blocks per IEEE 1180 run: 0 skips the test, else at least the standard's "
                                "10000")
        elif kind == "lane":
            p.add_argument("--per-file", action="store_true", help="print a row per file")
            p.add_argument("--max-width", type=argtypes.max_width, default=8192, help="the lane's line-buffer width")
            p.add_argument("--all", action="store_true",
                           help="also run the files classify() rejects and check how the lane stops")
            p.add_argument("--recode", metavar="SUBSAMPLING@QUALITY", type=_recode_spec,
                           help="re-encode every input with Pillow first, e.g. 4:2:0@90 "
                                "(subsampling 4:4:4, 4:2:2, 4:2:0 or gray)")
        elif kind == "device":
            p.add_argument("--lanes", default="1", type=_one_or_more(_lanes_list),
                           help="comma-separated lane counts of the builds to run")
            p.add_argument("--max-width", type=argtypes.max_width, default=8192, help="the device's line-buffer width")
            p.add_argument("--no-clock-gating", dest="clock_gating", action="store_false",
                           help="simulate the boards' design, without the simulation build's clock gates "
                                "(hw/gating.py) and unsigned arithmetic (IDCT passes, colour): the "
                                "same results, more work per clock")
        elif kind == "host":
            p.add_argument("--batch-size", type=argtypes.positive, default=64)
            p.add_argument("--epochs", type=argtypes.positive, default=3,
                           help="timed rounds after one warm-up epoch: each an epoch where the instrument "
                                "writes the pixels and a control epoch where it writes none")
            p.add_argument("--lanes", type=argtypes.lanes, default=4, help="lanes the instant device reports")
            p.add_argument("--cpu-workers", type=argtypes.positive, default=1, help="the service's CPU threads")
        elif kind == "loader":
            p.add_argument("--batch-size", type=argtypes.positive, default=32)
            p.add_argument("--epochs", type=argtypes.positive, default=2, help="timed epochs (after one warm-up)")
            p.add_argument("--rounds", type=argtypes.positive, default=3, help="alternating timed rounds of each loader")
            p.add_argument("--size", type=argtypes.positive, default=224, help="random-resized-crop size")
            p.add_argument("--workers", type=argtypes.positive, default=2,
                           help="torchvision DataLoader workers = dlbooster CPU threads")
            p.add_argument("--sim-lanes", default="", type=_lanes_list,
                           help="comma-separated lane counts for the sim backend (default: none)")
            p.add_argument("--sim-files", type=argtypes.positive, default=8, help="files through the sim backend")
            p.add_argument("--sim-max-width", type=argtypes.max_width, default=512, help="the sim device's line-buffer width")
        elif kind == "backward":
            p.add_argument("--model", default="resnet18", help="torchvision model")
            p.add_argument("--batch-size", default="32", type=_positive_list, help="comma-separated batch sizes")
            p.add_argument("--dtype", default="fp32", type=_choices_list("fp32", "bf16"),
                           help="comma-separated: fp32, bf16 (autocast)")
            p.add_argument("--image-size", type=argtypes.positive, default=224)
            p.add_argument("--device", type=argtypes.torch_device, default="cpu", help="cpu, cuda or cuda:N")
            p.add_argument("--iterations", type=argtypes.positive, default=1, help="timed iterations per round")
            p.add_argument("--rounds", type=argtypes.positive, default=15, help="alternating rounds of each schedule")
            p.add_argument("--warmup", type=argtypes.count, default=1, help="untimed iterations first")
            p.add_argument("--streams", type=argtypes.positive, default=2, help="side CUDA streams of the split schedule")
        elif kind == "entropy":
            p.add_argument("--per-file", action="store_true", help="print a row per file")
            p.add_argument("--ready", type=argtypes.percent, default=100,
                           help="percent of clocks the coefficient output is ready (1..100)")
        elif kind == "decode":
            p.add_argument("--backends", default="pillow,cpu,model", type=_choices_list("pillow", "cpu", "model"),
                           help="comma-separated subset of pillow,cpu,model")


def inputs(args: argparse.Namespace) -> list[tuple[str, bytes]]:
    """A benchmark's input files as ``(path, bytes)``: its PATH arguments walked (folders
    recursively), or the corpus's ImageNet sample photos; at most ``--limit`` of them.

    Raises:
        Refused: no input file, one that cannot be read, or no corpus to default to.
    """
    paths = args.paths
    if not paths:
        paths = [str(_corpus(args, "PATH") / "imagenet-sample-images")]
    files = [p for p, _ in walk_inputs(paths)]
    if not args.paths:        # the photographs, not the corpus's _provenance.tsv beside them
        files = [p for p in files if p.lower().endswith((".jpg", ".jpeg"))]
    if not files:
        raise Refused(f"dlbooster bench {args.kind}: no input files")
    if args.limit:
        files = files[: args.limit]
    inputs = []
    for p in files:
        try:
            inputs.append((p, Path(p).read_bytes()))
        except OSError as exc:
            raise Refused(f"dlbooster bench: {p}: {exc.strerror or exc}") from None
    return inputs


def _corpus(args: argparse.Namespace, what: str) -> Path:
    """The shared corpus for a benchmark given no inputs.

    Raises:
        Refused: none found, or ``$DLBOOSTER_CORPUS`` names no folder (it is not passed over
            for another corpus).
    """
    kind = args.kind
    named = os.environ.get("DLBOOSTER_CORPUS")
    if named and not Path(named).is_dir():
        raise Refused(f"dlbooster bench {kind}: DLBOOSTER_CORPUS={named}: no such folder")
    corpus = default_corpus()
    if corpus is None:
        raise Refused(f"dlbooster bench {kind}: no {what} given and no shared corpus found (set DLBOOSTER_CORPUS)")
    return corpus


def _check_json(args: argparse.Namespace) -> None:
    """Refuse a ``--json`` FILE that cannot be written, before minutes of measurement."""
    problem = json_target_problem(args.json)
    if problem:
        raise Refused(f"dlbooster bench {args.kind}: {problem}")


_RECODE_SUBSAMPLING = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2, "gray": None}


def _recode(files: list[tuple[str, bytes]], spec: str) -> tuple[list[tuple[str, bytes]], int]:
    """Each input re-encoded by Pillow as ``spec`` = ``SUBSAMPLING@QUALITY`` (the rows
    keep the original path); returns ``(files, inputs Pillow could not recode)``."""
    from PIL import Image

    sub, _, quality = _recode_spec(spec).partition("@")
    out, dropped = [], 0
    for path, data in files:
        buf = io.BytesIO()
        options = {} if sub == "gray" else {"subsampling": _RECODE_SUBSAMPLING[sub]}
        try:
            with Image.open(io.BytesIO(data)) as im:
                im.convert("L" if sub == "gray" else "RGB").save(buf, "JPEG", quality=int(quality), **options)
        except Exception:  # noqa: BLE001 - Pillow cannot decode or encode it: nothing to recode
            dropped += 1
            continue
        out.append((path, buf.getvalue()))
    return out, dropped


def _print_idct(result: dict) -> None:
    for config in result["configs"]:
        lanes = config["lanes"]
        print(f"\nIDCT lanes={lanes} ({config['samples_per_clock']} samples/clock)")
        if "ieee1180" in config:
            ieee = config["ieee1180"]
            print(f"IEEE 1180-1990 on the RTL, {ieee['blocks_per_run']} blocks per run: "
                  f"{'PASS' if ieee['passed'] else 'FAIL'}")
            rows = [[f"{r['range'][0]}..{r['range'][1]}", r["sign"], r["peak"], f"{r['pmse']:.4f}",
                     f"{r['omse']:.4f}", f"{r['pme']:.4f}", f"{r['ome']:.5f}"] for r in ieee["runs"]]
            from dlbooster.jpeg.ieee1180 import LIMITS

            rows.append(["limits", "", *(f"{LIMITS[k]:g}" for k in ("peak", "pmse", "omse", "pme", "ome"))])
            print(table(["range", "sign", "peak", "pmse", "omse", "pme", "ome"], rows))
        print(table(["blocks", "count", "clocks", "clocks/block", "latency (clocks)"],
                     [[k, config[k]["blocks"], config[k]["cycles"], f"{config[k]['clocks_per_block']:.3f}",
                       config[k]["latency"]] for k in ("dense_64_beats", "dc_only_2_beats")]))
        # The slowdown is the entropy decoder's: its last symbol with the IDCT behind it
        # over alone; "last sample" adds the IDCT's drain after that symbol.
        print(table(["photos", "files", "symbols/block", "entropy alone", "entropy with IDCT",
                      "slowdown", "worst file", "files held up", "last sample"],
                     [[k, t["files"], f"{t['symbols_per_block']:.2f}", t["entropy_alone"], t["entropy_done"],
                       f"{t['slowdown']:.4f}", f"{t['worst_file_slowdown']:.4f}", t["files_held_up"],
                       t["with_idct"]] for k, t in config["photos"].items()]))
        print("clocks; slowdown = entropy with IDCT / entropy alone")
        print(f"{config['model_mismatches']} files differ from the model")


def _check_model(args: argparse.Namespace) -> None:
    """Refuse a ``--model`` torchvision does not have, before any work."""
    import torchvision

    if args.model not in torchvision.models.list_models(module=torchvision.models):
        raise Refused(f"dlbooster bench {args.kind}: --model {args.model}: not a torchvision classification "
                      f"model (torchvision.models.list_models(module=torchvision.models))")


def _starts_jpeg(path: str) -> bool:
    """Whether the file begins with a JPEG's SOI marker (False when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"\xff\xd8"
    except OSError:
        return False


def _run_records(args: argparse.Namespace) -> dict:
    from dlbooster.bench.records import bench_records, dataset_files
    from dlbooster.records.pcr import RecordError

    paths = args.paths
    if not paths:
        corpus = _corpus(args, "DATASET")
        paths = [str(corpus / "hymenoptera" / "hymenoptera_data"), str(corpus / "imagenet-sample-images")]
    for path in paths:             # every data set checked before the first is measured
        folder = Path(path)
        if not folder.is_dir():
            what = "not a folder" if folder.exists() else "no such folder"
            raise Refused(f"dlbooster bench records: {path}: {what}")
        if not any(p.is_file() for p in folder.rglob("*")):
            raise Refused(f"dlbooster bench records: {path}: no files")
        try:
            sources = dataset_files(folder)
        except OSError as exc:
            raise Refused(f"dlbooster bench records: {path}: {exc}") from None
        if not any(_starts_jpeg(f) for f in sources):
            raise Refused(f"dlbooster bench records: {path}: no JPEG files")
    if args.train_epochs:
        if not any((Path(p) / "train").is_dir() and (Path(p) / "val").is_dir() for p in paths):
            raise Refused("dlbooster bench records: --train-epochs trains on a DATASET with train/ and val/ "
                          "folders, and none of these has them")
        _check_model(args)
    fidelities = [int(k) for k in args.fidelities.split(",")] if args.fidelities else None
    try:
        result = bench_records(paths, fidelities=fidelities, rounds=args.rounds,
                               sample=args.sample, images_per_record=args.images_per_record,
                               loader_epochs=args.loader_epochs, batch_size=args.batch_size, workers=args.workers,
                               train_epochs=args.train_epochs, train_fidelity=args.train_fidelity,
                               model=args.model, image_size=args.image_size,
                               progress=lambda m: print(m, file=sys.stderr, flush=True))
    except (RecordError, FileNotFoundError) as exc:
        raise Refused(f"dlbooster bench records: {exc}") from None
    result.update(machine())
    for d in result["datasets"]:
        print(f"\n{d['name']}: {d['images']} images ({len(d['skipped'])} skipped), {d['scans']} scan groups, "
              f"written in {d['write_s']:.1f} s; sources {d['source_bytes']:,} bytes, records "
              f"{d['record_bytes']:,} ({d['record_bytes'] / d['source_bytes']:.3f})")
        db = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        print(table(["fidelity", "bytes/epoch", "of sources", "PSNR mean dB", "PSNR min dB"],
                     [[r["fidelity"], f"{r['bytes']:,}", f"{r['of_source']:.3f}", db(r["psnr_mean_db"]),
                       db(r["psnr_min_db"])] for r in d["fidelities"]]))
        rows = []
        for reader, modes in d["read"].items():
            rows.append([reader, f"{modes['cold']['bytes']:,}", f"{modes['cold']['mb_per_s']:.0f}",
                         f"{modes['cold']['images_per_s']:.0f}", f"{modes['warm']['mb_per_s']:.0f}",
                         f"{modes['warm']['images_per_s']:.0f}",
                         f"{d['loader'][reader]['images_per_s']:.0f}" if reader in d["loader"] else "-"])
        print(table(["reader", "bytes", "cold MB/s", "cold images/s", "warm MB/s", "warm images/s",
                      "Loader images/s"], rows))
    if result["training"]:
        print(table(["training run", "fidelity", "bytes/epoch", "val top-1 per epoch", "last loss", "images/s"],
                     [[r["run"], r["fidelity"] or "full", f"{r['train_bytes_per_epoch']:,}",
                       " ".join(f"{100 * v:.1f}%" for v in r["val_top1_per_epoch"] if v is not None),
                       f"{r['loss_last']:.3f}", f"{r['images_per_s']:.1f}"] for r in result["training"]]))
    return result


def run(args: argparse.Namespace) -> int:
    """Run the benchmark ``args`` names (``dlbooster bench``): print its table, write
    ``--json`` (``-``: the JSON alone on stdout, the table on stderr); 1 when a check
    inside it failed (an image differs, a core fails IEEE 1180); 2, with the reason on
    stderr, when it refused: inputs or options it cannot measure, found before the
    measurement, or a ``--json`` FILE that could be written before the run and cannot
    after it."""
    try:
        _check_json(args)
        if args.json == "-":
            with contextlib.redirect_stdout(sys.stderr):
                result, failed = _measure(args)
            print(json.dumps(result, indent=1))
            return 1 if failed else 0
        result, failed = _measure(args)
        if args.json:
            try:
                Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
            except OSError as exc:          # checked before the run; something changed since
                print(f"dlbooster bench {args.kind}: --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
                return 2
            print(f"wrote {args.json}", file=sys.stderr)
        return 1 if failed else 0
    except Refused as exc:
        print(exc, file=sys.stderr)
        return 2


def _measure(args: argparse.Namespace) -> tuple[dict, bool]:
    """The benchmark's result (printing its table) and whether a check inside it failed."""
    files = inputs(args) if args.kind not in ("backward", "records") else []
    failed = False
    if args.kind == "backward":
        _check_model(args)
        if args.device != "cpu":
            import torch

            index = int(args.device.partition(":")[2] or 0)
            if index >= torch.cuda.device_count():
                raise Refused(f"dlbooster bench backward: --device {args.device}, but PyTorch finds "
                              f"{torch.cuda.device_count()} CUDA device(s) here")

        result = bench_backward(model=args.model, batch_sizes=[int(b) for b in args.batch_size.split(",")],
                                dtypes=args.dtype.split(","), image_size=args.image_size, device=args.device,
                                iterations=args.iterations, rounds=args.rounds, warmup=args.warmup,
                                streams=args.streams)
        result.update(machine())
        print(table(["model", "batch", "dtype", "autograd ms/iter", "split ms/iter", "split / autograd"],
                     [[result["model"], c["batch_size"], c["dtype"], f"{c['autograd_s'] * 1e3:.1f}",
                       f"{c['split_s'] * 1e3:.1f}", f"{c['split_over_autograd']:.3f}"] for c in result["configs"]]))
        print("split / autograd: the median of the per-round ratios")
    elif args.kind == "records":
        result = _run_records(args)
    elif args.kind == "lane":
        dropped = 0
        if args.recode:
            files, dropped = _recode(files, args.recode)
            if not files:
                raise Refused(f"dlbooster bench lane: Pillow could not re-encode any of the {dropped} inputs")
        result = bench_lane(files, args.max_width, args.all)
        result["recode"] = args.recode
        result["recode_dropped"] = dropped
        if args.per_file:
            print(table(["file", "expect", "status", "pixels", "clocks", "clocks/pixel", "passed"],
                         [[Path(r["path"]).name, r["reason"] or r["expect"], r["status_reason"] or 0,
                           r["pixels"], r["cycles"], f"{r['clocks_per_pixel']:.3f}", r["passed"]]
                          for r in result["per_file"]]))
        print(table(["subsampling", "files", "pixels", "clocks", "clocks/pixel", "mean of files"],
                     [[k, t["files"], t["pixels"], t["cycles"], f"{t['clocks_per_pixel']:.3f}",
                       f"{t['mean_file_clocks_per_pixel']:.3f}"] for k, t in result["totals"].items()]))
        print(table(["expect", "files", "passed"],
                     [[k, o["files"], o["passed"]] for k, o in sorted(result["outcomes"].items())]))
        for r in result["per_file"]:
            if not r["passed"]:
                print(f"FAIL {r['path']}: {r['detail']}")
        recoded = f" ({dropped} inputs Pillow could not re-encode left out)" if dropped else ""
        print(f"{result['files']} files{recoded}, {result['stopped']} stopped by the lane, "
              f"{result['failed']} failed; "
              f"{result['simulated_clocks_per_s'] / 1e6:.2f} M simulated clocks/s")
        failed = bool(result["failed"])
    elif args.kind == "device":
        result = bench_device(files, [int(x) for x in args.lanes.split(",")], args.max_width, args.clock_gating)
        print(table(["lanes", "images", "device clocks", "wall s", "M clocks/s", "images/s (sim)",
                      "clocks/image", "images/s at 250 MHz", "differ from Pillow"],
                     [[c["lanes"], c["images"], c["device_clocks"], f"{c['wall_s']:.2f}",
                       f"{c['simulated_clocks_per_s'] / 1e6:.3f}", f"{c['images_per_s']:.2f}",
                       round(c["device_clocks_per_image"]), round(c["images_per_s_at_250mhz"]),
                       c["differ_from_pillow"]] for c in result["configs"]]))
        failed = any(c["differ_from_pillow"] for c in result["configs"])
    elif args.kind == "host":
        from dlbooster.bench.runtime import bench_host

        try:
            result = bench_host(files, batch_size=args.batch_size, epochs=args.epochs, lanes=args.lanes,
                                cpu_workers=args.cpu_workers)
        except ValueError as exc:
            raise Refused(f"dlbooster bench host: {exc}") from None
        result.update(machine())
        print(table(["round", "pixels written", "images", "wall s", "CPU s", "instrument s", "file reads s",
                      "host us/image", "with reads us/image", "images/s"],
                     [[r["round"], "yes" if r["pixels"] else "no (control)", r["images"], f"{r['wall_s']:.2f}",
                       f"{r['cpu_s']:.2f}", f"{r['instrument_s']:.3f}", f"{r['read_s']:.3f}",
                       f"{r['host_us_per_image']:.1f}", f"{r['with_reads_us_per_image']:.1f}",
                       f"{r['images_per_s']:.0f}"]
                      for r in result["epochs"]]))
        for kind, label in (("control", "control epochs"), ("pixels", "epochs with pixel writes")):
            switches = result["context_switches_per_image"][kind]
            print(f"thread CPU, median of the {label}, us/image: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in result["thread_cpu_us_per_image"][kind].items())
                  + ("; context switches per image: " + ", ".join(f"{k} {v:.2f}" for k, v in switches.items())
                     if switches else ""))
        print(f"host cost {result['host_us_per_image']:.1f} us/image without file reads, "
              f"{result['with_reads_us_per_image']:.1f} with them: control epochs, the host beside an idealised "
              f"DMA (goal 20: {'met' if result['goal_met'] else 'not met'})")
        print(f"host cost {result['with_pixel_writes_us_per_image']:.1f} us/image without file reads, "
              f"{result['with_pixel_writes_and_reads_us_per_image']:.1f} with them: epochs where the instrument "
              f"writes the pixels on the host's cores ({'within' if result['goal_met_with_pixel_writes'] else 'over'}"
              f" 20)")
        print(f"a header pre-screen, when it runs (first sight of a file), costs "
              f"{result['prescreen_us_per_image']:.1f} us")
    elif args.kind == "loader":
        from dlbooster.bench.runtime import bench_loader

        lanes = [int(x) for x in args.sim_lanes.split(",") if x]
        result = bench_loader(files, batch_size=args.batch_size, epochs=args.epochs, size=args.size,
                              rounds=args.rounds, workers=args.workers, sim_lanes=lanes,
                              sim_files=args.sim_files, sim_max_width=args.sim_max_width)
        result.update(machine())
        if result["left_out"]:
            print(f"{len(result['left_out'])} inputs Pillow cannot decode left out, e.g. {result['left_out'][0]}")
        rows = [[r["name"], " ".join(f"{x['images_per_s']:.0f}" for x in r["rounds"]),
                 f"{r['images_per_s']:.0f}"] for r in (result["torchvision"], result["dlbooster_cpu"])]
        print(table(["loader", "images/s per round", "median images/s"], rows))
        print(f"dlbooster / torchvision (medians): {result['speedup']:.2f}x (goal 1.3x: "
              f"{'met' if result['goal_met'] else 'not met'})")
        if result["sim"]:
            print(table(["sim lanes", "images", "on the device", "wall s", "images/s (sim)", "device clocks/image",
                          "images/s at 250 MHz", "lane busy"],
                         [[r["lanes"], r["images"], r["device_images"], f"{r['wall_s']:.1f}",
                           f"{r['images_per_s']:.2f}",
                           round(r["device_clocks_per_image"] or 0), round(r["images_per_s_at_250mhz"] or 0),
                           " ".join(f"{v:.2f}" for v in r["lane_busy"].values())] for r in result["sim"]]))
    elif args.kind == "idct":
        result = bench_idct(files, [int(x) for x in args.lanes.split(",")], args.ieee_blocks)
        _print_idct(result)
        failed = any(c["model_mismatches"] or not c.get("ieee1180", {"passed": True})["passed"]
                     for c in result["configs"])
    elif args.kind == "entropy":
        result = bench_entropy(files, args.ready)
        if args.per_file:
            print(table(["file", "status", "symbols", "clocks", "symbols/clk", "bytes/clk"],
                         [[Path(r["path"]).name, r["status"], r["symbols"], r["cycles"],
                           r["symbols_per_clock"], r["bytes_per_clock"]] for r in result["per_file"]]))
        print(table(["subsampling", "files", "symbols", "clocks", "symbols/clk", "bytes/clk"],
                     [[k, t["files"], t["symbols"], t["cycles"], f"{t['symbols_per_clock']:.4f}",
                       f"{t['bytes_per_clock']:.3f}"] for k, t in result["totals"].items()]))
        print(f"{result['files']} files ({result['faulty_streams']} faulty streams), "
              f"{result['model_mismatches']} differ from the model; "
              f"{result['simulated_clocks_per_s'] / 1e6:.2f} M simulated clocks/s")
        failed = bool(result["model_mismatches"])
    elif args.kind == "parse":
        result = bench_parse(files, args.repeat)
        print(table(["mode", "files", "mean bytes", "us mean", "us median", "us p95", "us max"],
                     [[mode, result["files"], round(result["bytes_mean"]), r["us_mean"],
                       r["us_median"], r["us_p95"], r["us_max"]]
                      for mode, r in (("full", result["full"]), ("prescreen", result["prescreen"]))]))
        print("classification: " + ", ".join(f"{'decodable' if k == 'None' else k} {v}"
                                             for k, v in sorted(result["classification"].items())))
    else:
        result = bench_decode(files, args.backends.split(","))
        print(table(["backend", "images timed", "decoded", "declined", "us/image", "images/s", "Mpixel/s"],
                     [[r["backend"], r["images"], r["decoded"], r["declined"], r["us_per_image"],
                       r["images_per_s"], r["mpixel_per_s"]] for r in result["results"]]))
        print("timed: the images every backend decodes")
    return result, failed
