"""``dlbooster debug-lane [--simulator S] [--max-width W] PATH...``: run files through the
lane's cocotb testbench; for each one that fails, the first stage that leaves the
reference model and a waveform (FST) of its run (:mod:`dlbooster.sim.lane_debug`);
exit 1 when any file failed."""

from __future__ import annotations

import argparse
import sys

from dlbooster.jpeg import DEFAULT_MAX_WIDTH
from dlbooster.support import argtypes
from dlbooster.support.files import walk_inputs

# The simulation (cocotb, the simulator build) is imported where it runs, so that `import
# dlbooster.cli` (every `dlbooster` run, --help too) does not load it.

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = "files through the lane's cocotb testbench, stage by stage against the model, waveforms of failures"
DESCRIPTION = ("Run each JPEG through the decoder lane's cocotb testbench on the generated Verilog, judge it "
               "against Pillow and the reference model, and compare each stage with the model's; failing "
               "files are run again alone with a waveform dump, whose path is printed. Exit 1 when a file "
               "fails.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="JPEG files or folders")
    parser.add_argument("--simulator", choices=("verilator", "icarus"), default="verilator",
                        help="the simulator cocotb runs (default verilator)")
    parser.add_argument("--max-width", type=argtypes.max_width, default=DEFAULT_MAX_WIDTH,
                        help="the lane's line-buffer width")
    parser.add_argument("--valid", type=argtypes.percent, default=100,
                        help="percent of clocks the input offers a beat (1-100)")
    parser.add_argument("--ready", type=argtypes.percent, default=100,
                        help="percent of clocks the output is ready (1-100)")


def run(args: argparse.Namespace) -> int:
    """Run ``args.paths`` through the lane's testbench, printing a verdict per file (and, for
    each failure, its stages and waveform): 0 when every file passed, 1 when one failed, 2
    when there is no input or one cannot be read."""
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
    result, reruns = debug_lane(paths, simulator=args.simulator, max_width=args.max_width,
                                valid_percent=args.valid, ready_percent=args.ready)
    for r in result.report:
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
    return 1 if result.failed else 0
