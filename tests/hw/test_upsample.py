"""Amaranth-simulator tests of the fancy-upsampling row core against the model
(SPEC.md 3.2): every mode, odd widths, narrow planes, plane edges, back-pressure."""

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from dlbooster.jpeg import model
from dlbooster.hw.upsample import RowUpsampler


def _rows_for(plane, h, v):
    """The core's input rows for every output row of the plane: (p, q, mode)."""
    rows, cols = plane.shape
    narrow = h == 2 and cols <= 2
    for out_row in range(rows * v):
        r = out_row // v
        if v == 2:
            odd = out_row % 2
            q = plane[min(r + 1, rows - 1)] if odd else plane[max(r - 1, 0)]
        else:
            odd, q = 0, plane[r]
        yield plane[r], q, {"h2": h == 2, "v2": v == 2 and not narrow, "odd": odd, "narrow": narrow}


def _run(plane, h, v, pixels, valid_percent=100, ready_percent=100, seed=1):
    dut = RowUpsampler(pixels)
    beats = []
    for p, q, mode in _rows_for(plane, h, v):
        for start in range(0, len(p), pixels):
            n = min(pixels, len(p) - start)
            pad = lambda a: [int(x) for x in a[start:start + n]] + [0] * (pixels - n)  # noqa: E731
            beats.append({"p": pad(p), "q": pad(q), "n": n, "first": start == 0,
                          "last": start + n == len(p), **mode})
    rng = random.Random(seed)
    rows, current = [], []

    async def bench(ctx):
        pending = list(beats)
        clocks = 0
        while len(rows) < plane.shape[0] * v:
            offer = bool(pending) and rng.random() * 100 < valid_percent
            if offer:
                ctx.set(dut.i.payload, pending[0])
            ctx.set(dut.i.valid, offer)
            ready = rng.random() * 100 < ready_percent
            ctx.set(dut.o.ready, ready)
            if ready and ctx.get(dut.o.valid):
                out = ctx.get(dut.o.payload)
                assert bool(out.first) == (not current)
                current.extend(out.samples[k] for k in range(out.n))
                if out.last:
                    rows.append(current[:])
                    current.clear()
            took = offer and ctx.get(dut.i.ready)
            await ctx.tick()
            clocks += 1
            if took:
                pending.pop(0)
            assert clocks < 20 * len(beats) + 50, "no progress"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return np.array(rows, dtype=np.uint8)


@pytest.mark.parametrize("h,v", [(2, 1), (1, 2), (2, 2), (1, 1)])
@pytest.mark.parametrize("cols", [1, 2, 3, 8, 13])
def test_matches_the_model(h, v, cols):
    rng = np.random.default_rng(cols * 10 + h * 3 + v)
    plane = rng.integers(0, 256, (3, cols)).astype(np.uint8)
    plane[0, 0], plane[-1, -1] = 0, 255
    got = _run(plane, h, v, pixels=4)
    expect = model.upsample(plane, h, v, plane.shape[0] * v, cols * h)
    assert np.array_equal(got, expect)


@pytest.mark.parametrize("h,v", [(2, 2), (2, 1)])
def test_back_pressure_and_extremes(h, v):
    rng = np.random.default_rng(7)
    plane = rng.choice(np.array([0, 1, 254, 255], dtype=np.uint8), (4, 21))
    got = _run(plane, h, v, pixels=8, valid_percent=60, ready_percent=55, seed=3)
    assert np.array_equal(got, model.upsample(plane, h, v, 4 * v, 21 * h))


def test_one_beat_per_clock():
    """Full beats of one long row stream through at one per clock."""
    dut = RowUpsampler(8)
    count = [0]

    async def bench(ctx):
        ctx.set(dut.o.ready, 1)
        for k in range(32):
            ctx.set(dut.i.payload, {"p": [k] * 8, "q": [k] * 8, "n": 8, "first": k == 0,
                                    "last": k == 31, "h2": 1, "v2": 1, "odd": 0, "narrow": 0})
            ctx.set(dut.i.valid, 1)
            if k:
                assert ctx.get(dut.i.ready)
            count[0] += ctx.get(dut.o.valid)
            await ctx.tick()
        ctx.set(dut.i.valid, 0)
        for _ in range(3):
            count[0] += ctx.get(dut.o.valid)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert count[0] == 32
