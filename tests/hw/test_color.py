"""Amaranth-simulator tests of the YCbCr-to-RGB core against the model (SPEC.md 3.3)."""

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from dlbooster.jpeg import model
from dlbooster.hw.color import LATENCY, ColorConverter


def _convert(y, cb, cr, pixels, valid_percent=100, ready_percent=100, seed=1, unsigned=False):
    """Stream the samples through the core; returns RGB (N, 3) and the clocks spent."""
    dut = ColorConverter(pixels, unsigned)
    beats = [(y[k:k + pixels], cb[k:k + pixels], cr[k:k + pixels]) for k in range(0, len(y), pixels)]
    rng = random.Random(seed)
    got = []
    clocks = [0]

    async def bench(ctx):
        pending = list(beats)
        while len(got) < len(beats):
            offer = bool(pending) and rng.random() * 100 < valid_percent
            if offer:
                by, bcb, bcr = pending[0]
                ctx.set(dut.i.payload, {"y": list(map(int, by)), "cb": list(map(int, bcb)),
                                        "cr": list(map(int, bcr)), "last": len(pending) == 1})
            ctx.set(dut.i.valid, offer)
            ready = rng.random() * 100 < ready_percent
            ctx.set(dut.o.ready, ready)
            if ready and ctx.get(dut.o.valid):
                payload = ctx.get(dut.o.payload)
                got.append(([[payload.rgb[p][c] for c in range(3)] for p in range(pixels)],
                            payload.last))
            took = offer and ctx.get(dut.i.ready)
            await ctx.tick()
            clocks[0] += 1
            if took:
                pending.pop(0)
            assert clocks[0] < 20 * len(beats) + 100, "no progress"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert [last for _, last in got] == [k == len(beats) - 1 for k in range(len(beats))]
    return np.array([px for beat, _ in got for px in beat], dtype=np.uint8), clocks[0]


@pytest.mark.parametrize("unsigned", [False, True], ids=["signed", "unsigned"])
def test_every_chroma_pair_matches_the_model(unsigned):
    """All 65,536 (Cb, Cr) pairs, each with a random Y and with Y at 0 and 255 in turn, in
    the boards' signed form and the simulation's offset-binary one."""
    rng = np.random.default_rng(0)
    cb, cr = (a.ravel().astype(np.uint8) for a in np.meshgrid(np.arange(256), np.arange(256)))
    y = rng.integers(0, 256, cb.size).astype(np.uint8)
    y[::3] = 0
    y[1::3] = 255
    rgb, clocks = _convert(y, cb, cr, pixels=16, unsigned=unsigned)
    expect = model.ycbcr_to_rgb(y[None], cb[None], cr[None])[0]
    assert np.array_equal(rgb, expect)
    assert clocks <= cb.size // 16 + LATENCY + 1


@pytest.mark.parametrize("pixels,valid_percent,ready_percent,unsigned",
                         [(1, 70, 60, False), (8, 50, 100, False), (8, 100, 40, False), (8, 70, 60, True)])
def test_back_pressure(pixels, valid_percent, ready_percent, unsigned):
    rng = np.random.default_rng(pixels + valid_percent)
    y, cb, cr = (rng.integers(0, 256, 8 * 60).astype(np.uint8) for _ in range(3))
    rgb, _ = _convert(y, cb, cr, pixels, valid_percent, ready_percent, seed=ready_percent, unsigned=unsigned)
    assert np.array_equal(rgb, model.ycbcr_to_rgb(y[None], cb[None], cr[None])[0])


def test_gray_is_neutral_chroma():
    y = np.arange(256, dtype=np.uint8)
    neutral = np.full(256, 128, dtype=np.uint8)
    rgb, _ = _convert(y, neutral, neutral, pixels=8)
    assert np.array_equal(rgb, np.repeat(y[:, None], 3, axis=1))
