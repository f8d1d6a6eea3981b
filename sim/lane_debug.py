"""Run the lane's cocotb testbench (``sim/lane_tb.py``) on files, from Python or the CLI.

``dlbooster debug-lane FILE...`` uses :func:`debug_lane`: every file goes through the lane
(generated Verilog with probe ports, on Verilator or Icarus), is judged against
Pillow/the model (:mod:`dlbooster.sim.verify`), and each stage of every file the model
decodes is compared with the model's; failing files are run again alone with a waveform
dump (FST; VCD on a Verilator without the lz4 headers) whose path is reported.
"""

from __future__ import annotations

import json
import os
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from .flow import export_verilog, run_cocotb

__all__ = ["LaneRun", "debug_lane", "lane_verilog", "run_lane_testbench"]


def lane_verilog(max_width: int = 8192, lanes: int = 4) -> str:
    """Verilog of ``Lane(max_width, lanes, probes=True)`` (toplevel ``lane``)."""
    from dlbooster.hw.lane import Lane

    return export_verilog(Lane(max_width, lanes, probes=True), "lane")


@dataclass
class LaneRun:
    """One testbench run: the per-file ``report`` (see ``sim/lane_tb.py``), the cocotb
    ``test_dir`` (kept when something failed or waves were asked for) and the waveform
    files in it; ``failed`` lists the report entries that did not pass (an empty file is
    reported with ``skipped``: the lane takes no file without bytes)."""

    report: list[dict]
    test_dir: Path
    waves: list[Path] = field(default_factory=list)

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.report if not r["ok"]]


def run_lane_testbench(paths: list[str | os.PathLike], *, simulator: str = "verilator",
                       max_width: int = 8192, lanes: int = 4, valid_percent: int = 100,
                       ready_percent: int = 100, seed: int = 1, waves: bool = False,
                       verilog: str | None = None) -> LaneRun:
    """Decode ``paths`` back to back in the lane's cocotb testbench.

    Args:
        simulator: ``verilator`` or ``icarus``.
        valid_percent, ready_percent: percent of clocks the input offers a beat / the
            output is ready (random, from ``seed`` and the file's path).
        waves: dump a waveform into ``test_dir`` (see :func:`dlbooster.sim.flow.run_cocotb`).
        verilog: :func:`lane_verilog` output, when the caller already has it.

    Raises:
        RuntimeError: the testbench ended without a report (build or simulator failure).
    """
    verilog = verilog or lane_verilog(max_width, lanes)
    with tempfile.TemporaryDirectory(prefix="dlb-lane-") as tmp:
        job = Path(tmp) / "job.json"
        out = Path(tmp) / "report.json"
        job.write_text(json.dumps([{"path": str(Path(p).resolve()), "valid_percent": valid_percent,
                                    "ready_percent": ready_percent,
                                    "seed": seed + zlib.crc32(str(Path(p).resolve()).encode())}
                                   for p in paths]))
        _, _, test_dir = run_cocotb(
            "lane", verilog, "dlbooster.sim.lane_tb", simulator=simulator, waves=waves,
            extra_env={"DLB_JOB": str(job), "DLB_OUT": str(out), "DLB_MAX_WIDTH": str(max_width),
                       "DLB_LANES": str(lanes)})
        if not out.exists():
            raise RuntimeError(f"the lane testbench wrote no report; see {test_dir / 'sim.log'}")
        report = json.loads(out.read_text())
    dumps = sorted(p for p in test_dir.glob("*") if p.suffix in (".fst", ".vcd")) if test_dir.exists() else []
    return LaneRun(report, test_dir, dumps)


def debug_lane(paths: list[str | os.PathLike], *, simulator: str = "verilator", max_width: int = 8192,
               waves_on_failure: bool = True, **options) -> tuple[LaneRun, dict[str, LaneRun]]:
    """:func:`run_lane_testbench` on ``paths``, then each failing file again alone with a
    waveform dump. Returns ``(run, {path: rerun with waves})``."""
    verilog = lane_verilog(max_width, options.get("lanes", 4))
    run = run_lane_testbench(paths, simulator=simulator, max_width=max_width, verilog=verilog, **options)
    reruns = {}
    if waves_on_failure:
        for r in run.failed:
            reruns[r["path"]] = run_lane_testbench([r["path"]], simulator=simulator, max_width=max_width,
                                                   verilog=verilog, waves=True, **options)
    return run, reruns
