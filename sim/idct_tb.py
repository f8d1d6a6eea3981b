"""cocotb testbench of the IDCT core (``dlbooster.hw.idct.Idct``).

Run through :func:`dlbooster.sim.flow.run_cocotb` (``tests/sim/test_idct_rtl.py`` does).
Parameters come from the environment:

- ``DLB_JOB``: an ``.npz`` with ``blocks`` (int16 (N, 64), natural order), ``comps``
  (N,), ``quant`` ((3, 64) tables in natural order), ``valid_percent``,
  ``ready_percent`` and ``seed`` (random gaps on the input and output streams).
- ``DLB_OUT``: where to write the samples (uint8 (N, 8, 8)), ``range_fault`` (N,) and
  ``cycles`` as ``.npz``.

The core must give, for every block in input order, 8 rows (row 0..7, ``last`` on row 7)
tagged with the block's component and position, with ``range_fault`` exactly where
:func:`dlbooster.jpeg.model.idct_islow` with the component's table finds the block out of
range (``in_range`` False) and samples equal to the model's on every other block; no
output bit may be X/Z; and it must
finish within ``(beats + 16 * blocks + 256) * 200 / min(valid, ready)`` clocks.
"""

from __future__ import annotations

import os
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from dlbooster.jpeg import model
from dlbooster.hw.entropy import CoefBeat
from dlbooster.hw.idct import BlockRow, QuantWrite, block_beats, quant_writes
from dlbooster.sim.harness import pack

_ROW = [(name, field.offset, (1 << field.width) - 1) for name, field in BlockRow]
_SAMPLES = BlockRow["samples"].offset


@cocotb.test()
async def transform_blocks(dut):
    """Stream the job's blocks through the core and compare with the model."""
    job = np.load(os.environ["DLB_JOB"])
    blocks, comps, quant = job["blocks"], job["comps"], job["quant"]
    valid_percent, ready_percent = int(job["valid_percent"]), int(job["ready_percent"])
    rng = random.Random(int(job["seed"]))
    n = len(blocks)
    expect = np.empty((n, 8, 8), dtype=np.uint8)
    in_range = np.empty(n, dtype=bool)
    for c in range(len(quant)):
        sel = comps == c
        expect[sel], in_range[sel] = model.idct_islow(blocks[sel], quant[c])

    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    dut.quant__valid.value = 0
    dut.coef__valid.value = 0
    dut.o__ready.value = 0
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    for c in range(len(quant)):
        for w in quant_writes(c, quant[c]):
            dut.quant__payload.value = pack(QuantWrite, w)
            dut.quant__valid.value = 1
            await RisingEdge(dut.clk)
    dut.quant__valid.value = 0

    beats = [pack(CoefBeat, b) for i in range(n)
             for b in block_beats(blocks[i], int(comps[i]), i & 0xFFFF, i >> 16)]
    bound = (len(beats) + 16 * n + 256) * 200 // max(1, min(valid_percent, ready_percent, 100))
    samples = np.zeros((n, 8, 8), dtype=np.uint8)
    faults = np.zeros(n, dtype=bool)
    rows = 0
    pos = 0
    cycles = 0
    while rows < 8 * n:
        offer = pos < len(beats) and rng.random() * 100 < valid_percent
        if offer:
            dut.coef__payload.value = beats[pos]
        dut.coef__valid.value = int(offer)
        ready = rng.random() * 100 < ready_percent
        dut.o__ready.value = int(ready)
        await ReadOnly()
        took = offer and int(dut.coef__ready.value)
        if ready and int(dut.o__valid.value):
            raw = dut.o__payload.value
            assert raw.is_resolvable, f"output row with X/Z bits: {raw}"
            raw = int(raw)
            row = {name: (raw >> off) & mask for name, off, mask in _ROW if name != "samples"}
            block, r = divmod(rows, 8)
            tag = (int(comps[block]), block & 0xFFFF, block >> 16)
            assert (row["comp"], row["bx"], row["by"], row["row"]) == (*tag, r), \
                f"row {rows}: got {row}, expected block {block} row {r}"
            assert row["last"] == (r == 7), f"block {block}: last on row {r}"
            samples[block, r] = [(raw >> (_SAMPLES + 8 * c)) & 0xFF for c in range(8)]
            if r == 7:
                faults[block] = bool(row["range_fault"])
                assert not in_range[block] or (samples[block] == expect[block]).all(), (
                    f"block {block} (component {tag[0]}): core\n{samples[block]}\n"
                    f"model\n{expect[block]}\ncoefficients {blocks[block].tolist()}")
                assert faults[block] == (not in_range[block]), \
                    f"block {block}: range_fault {faults[block]}, model in_range {in_range[block]}"
            rows += 1
        await RisingEdge(dut.clk)
        cycles += 1
        if took:
            pos += 1
        assert cycles <= bound, f"{rows} of {8 * n} rows after {cycles} clocks"
    assert pos == len(beats)
    if os.environ.get("DLB_OUT"):
        np.savez(os.environ["DLB_OUT"], samples=samples, range_fault=faults, cycles=cycles)
