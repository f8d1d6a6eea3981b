"""Amaranth-simulator tests of the plane buffer: blocks in MCU order in, raster rows
with their neighbours out, cropped to the plane's real size."""

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from dlbooster.hw.planes import PlaneBuffer


def _expected(plane, rows, cols, v_ctx):
    out = []
    for r in range(rows):
        for odd in ((0, 1) if v_ctx else (0,)):
            nbr = r if not v_ctx else (min(r + 1, rows - 1) if odd else max(r - 1, 0))
            out.append((odd, plane[r, :cols].tolist(), plane[nbr, :cols].tolist()))
    return out


def _run(plane, band_blocks, h_blocks, lanes, rows, cols, v_ctx, seed=1, gaps=True, images=1,
         ready_percent=70, valid_percent=80):
    bh, bw = plane.shape[0] // 8, plane.shape[1] // 8
    dut = PlaneBuffer(max_blocks=bw + 3, band_blocks=2, lanes=lanes)
    beats = []
    for my in range(bh // band_blocks):
        for mx in range(bw // h_blocks):
            for j in range(band_blocks):
                for i in range(h_blocks):
                    by, bx = my * band_blocks + j, mx * h_blocks + i
                    block = plane[8 * by:8 * by + 8, 8 * bx:8 * bx + 8]
                    for g in range(8 // lanes):
                        beats.append({"by": by, "bx": bx, "row": g * lanes, "last": g == 8 // lanes - 1,
                                      "samples": block[g * lanes:(g + 1) * lanes].ravel().tolist()})
    rng = random.Random(seed)
    results = []

    async def bench(ctx):
        ctx.set(dut.config, {"blocks_wide": bw, "bands": bh // band_blocks, "rows": rows, "cols": cols,
                             "tall": band_blocks == 2, "v_ctx": v_ctx, "h2": 1, "v2": v_ctx,
                             "narrow": 0})
        for _ in range(images):
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            got, current = [], None
            pending = list(beats)
            clocks = 0
            while not (ctx.get(dut.done) and not ctx.get(dut.o.valid)):
                offer = bool(pending) and (not gaps or rng.random() * 100 < valid_percent)
                if offer:
                    ctx.set(dut.i.payload, pending[0])
                ctx.set(dut.i.valid, offer)
                ready = not gaps or rng.random() * 100 < ready_percent
                ctx.set(dut.o.ready, ready)
                if ready and ctx.get(dut.o.valid):
                    o = ctx.get(dut.o.payload)
                    if o.first:
                        current = (o.odd, [], [])
                    current[1].extend(o.p[k] for k in range(o.n))
                    current[2].extend(o.q[k] for k in range(o.n))
                    if o.last:
                        got.append(current)
                took = offer and ctx.get(dut.i.ready)
                await ctx.tick()
                clocks += 1
                if took:
                    pending.pop(0)
                assert clocks < 20 * (len(beats) + rows * 2 * (cols // 8 + 1)) + 200, "stuck"
            ctx.set(dut.i.valid, 0)
            assert not pending
            results.append(got)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return results


@pytest.mark.parametrize("band_blocks,h_blocks,lanes,v_ctx", [
    (2, 2, 4, True),    # 4:2:0 luma geometry, chroma-like context reads
    (1, 1, 1, True),    # 4:2:0 chroma
    (1, 2, 2, False),   # 4:2:2 luma
    (2, 1, 4, False),
])
def test_rows_and_neighbours(band_blocks, h_blocks, lanes, v_ctx):
    rng = np.random.default_rng(band_blocks * 8 + h_blocks * 4 + lanes)
    bh, bw = 5 * band_blocks, 2 * h_blocks + (h_blocks == 1)   # 5 bands: the 3-slot ring wraps
    plane = rng.integers(0, 256, (8 * bh, 8 * bw)).astype(np.uint8)
    rows, cols = 8 * bh - 5, 8 * bw - 3
    got = _run(plane, band_blocks, h_blocks, lanes, rows, cols, v_ctx)[0]
    assert got == _expected(plane, rows, cols, v_ctx)


def test_two_images_back_to_back_without_gaps():
    rng = np.random.default_rng(3)
    plane = rng.integers(0, 256, (32, 24)).astype(np.uint8)
    runs = _run(plane, 1, 1, 1, 31, 17, True, gaps=False, images=2)
    assert runs[0] == runs[1] == _expected(plane, 31, 17, True)


@pytest.mark.parametrize("valid_percent,ready_percent", [(90, 4), (15, 100)])
def test_context_rows_survive_either_side_being_slow(valid_percent, ready_percent):
    """A slow reader: the writer must not refill the slot of the band above while its
    last row is still a neighbour to read. A slow writer: the reader must not read a
    band's last rows before the next band (their lower neighbour) is complete."""
    rng = np.random.default_rng(11)
    plane = rng.integers(0, 256, (8 * 7, 8 * 6)).astype(np.uint8)
    got = _run(plane, 1, 1, 1, 8 * 7 - 2, 8 * 6, True, ready_percent=ready_percent,
               valid_percent=valid_percent)[0]
    assert got == _expected(plane, 8 * 7 - 2, 8 * 6, True)
