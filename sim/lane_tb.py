"""cocotb testbench of the whole decoder lane (``dlbooster.hw.lane.Lane``, ``probes=True``).

Run through :func:`dlbooster.sim.flow.run_cocotb` (``tests/sim/test_lane_rtl.py`` and
:func:`dlbooster.sim.lane_debug.debug_lane` do). Parameters come from the environment:

- ``DLB_JOB``: a JSON list of ``{"path", "valid_percent", "ready_percent", "seed"}``:
  the files, one after another (each once the previous one is ``done``), 4 bytes per
  beat with random gaps on the input and random back-pressure on the pixel output.
  An empty file (nothing to feed) is reported as skipped.
- ``DLB_OUT``: where the JSON report goes: per file the lane's status, clocks, frame size
  and pixel count, the :class:`dlbooster.sim.verify.Verdict` and, for files the model
  decodes, :func:`dlbooster.sim.verify.stage_differences` (where the entropy decoder,
  IDCT or plane/upsampling stage first leaves the model).

The test fails when any file's verdict fails or a stage differs; no output bit may be
X/Z; a file that does not end within twice :func:`dlbooster.sim.verify.cycle_bound`
clocks, stretched by the gaps, is reported as hung and the lane is reset.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict
from pathlib import Path

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from dlbooster.hw.color import rgb_pixels
from dlbooster.hw.entropy import InputBeat
from dlbooster.hw.headers import FrameInfo
from dlbooster.sim.harness import TIMEOUT, LaneResult, pack
from dlbooster import jpeg
from dlbooster.sim.verify import cycle_bound, padded_blocks, stage_differences, verify_lane

_RGB = rgb_pixels(8)
_N = (_RGB["n"].offset, (1 << _RGB["n"].width) - 1)
_RGB_OFF = _RGB["rgb"].offset


async def _reset(dut) -> None:
    dut.rst.value = 1
    dut.reset.value = 0
    dut.input__valid.value = 0
    dut.o__ready.value = 0
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0


def _pixels(raw: int) -> list[list[int]]:
    n = (raw >> _N[0]) & _N[1]
    return [[(raw >> (_RGB_OFF + 24 * k + 8 * c)) & 0xFF for c in range(3)] for k in range(n)]


async def _decode(dut, data: bytes, valid_percent: int, ready_percent: int, rng: random.Random):
    beats = [pack(InputBeat, {"data": int.from_bytes(data[i:i + 4], "little"), "n": len(data[i:i + 4]),
                              "last": i + 4 >= len(data)}) for i in range(0, len(data), 4)]
    slowest = max(1, min(valid_percent, ready_percent))
    bound = 2 * cycle_bound(len(data), padded_blocks(jpeg.parse(data))) * 100 // slowest
    pos = cycles = 0
    pixels, probes = [], {"coef": [], "rows": [], "ycc": []}
    status = TIMEOUT
    info = 0
    while True:
        offer = pos < len(beats) and rng.random() * 100 < valid_percent
        if offer:
            dut.input__payload.value = beats[pos]
        dut.input__valid.value = int(offer)
        ready = rng.random() * 100 < ready_percent
        dut.o__ready.value = int(ready)
        await ReadOnly()
        took = offer and int(dut.input__ready.value)
        if ready and int(dut.o__valid.value):
            raw = dut.o__payload.value
            assert raw.is_resolvable, f"pixel beat with X/Z bits: {raw}"
            pixels += _pixels(int(raw))
        for name in probes:
            raw = getattr(dut, f"probe_{name}").value
            assert raw.is_resolvable, f"probe_{name} has X/Z bits: {raw}"
            raw = int(raw)
            if raw & 1:
                probes[name].append(raw >> 1)
        done = int(dut.done.value)
        if done:
            status, info = int(dut.status.value), int(dut.info.value)
        await RisingEdge(dut.clk)
        cycles += 1
        if took:
            pos += 1
        if done:
            assert pos == len(beats), f"done after {pos} of {len(beats)} input beats"
            break
        if cycles > bound:
            dut.input__valid.value = 0
            await _reset(dut)
            break
    dut.input__valid.value = 0
    for _ in range(3):
        await RisingEdge(dut.clk)
    return status, info, cycles, pixels, probes


def info_size(info: int) -> tuple[int, int]:
    """(width, height) from :data:`FrameInfo` bits."""
    return ((info >> FrameInfo["width"].offset) & 0xFFFF, (info >> FrameInfo["height"].offset) & 0xFFFF)


@cocotb.test()
async def decode_files(dut):
    """Decode the job's files back to back; judge each (module doc)."""
    jobs = json.loads(Path(os.environ["DLB_JOB"]).read_text())
    max_width = int(os.environ.get("DLB_MAX_WIDTH", "8192"))
    lanes = int(os.environ.get("DLB_LANES", "4"))
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    await _reset(dut)
    report = []
    for job in jobs:
        data = Path(job["path"]).read_bytes()
        if not data:
            report.append({"path": job["path"], "skipped": "empty file: no beat to feed", "ok": True,
                           "status": None, "cycles": 0, "width": 0, "height": 0, "pixels": 0,
                           "verdict": None, "stages": []})
            continue
        rng = random.Random(job["seed"])
        status, info, cycles, pixels, probes = await _decode(
            dut, data, job["valid_percent"], job["ready_percent"], rng)
        width, height = info_size(info)
        rgb = np.array(pixels, dtype=np.uint8).reshape(-1, 3)
        if status == 0 and len(rgb) == width * height:
            rgb = rgb.reshape(height, width, 3)
        # Clocks measured with gaps; judge the bound on the gap-free equivalent.
        slowest = max(1, min(job["valid_percent"], job["ready_percent"]))
        verdict = verify_lane(LaneResult(status, cycles * slowest // 100, width, height, rgb), data, max_width)
        stages = stage_differences(data, probes["coef"], probes["rows"], probes["ycc"], lanes, max_width) \
            if verdict.expect == "decode" else []
        report.append({"path": job["path"], "status": status, "cycles": cycles, "width": width,
                       "height": height, "pixels": len(pixels), "verdict": asdict(verdict),
                       "stages": stages, "ok": verdict.ok and not stages})
    Path(os.environ["DLB_OUT"]).write_text(json.dumps(report, indent=1))
    failed = [r for r in report if not r["ok"]]
    assert not failed, "\n".join(f"{r['path']}: {r['verdict']['detail']} {r['stages']}" for r in failed)
