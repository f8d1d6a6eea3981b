"""Amaranth-simulator tests of the clock gate (hw/gating.py) and of the ``idle`` outputs
that open it: each block behind a :class:`ClockGate` must give the same handshakes and
the same valid data, clock for clock, as the same block clocked freely, under random
valid/ready patterns and resets."""

import random

import pytest
from amaranth import Elaboratable, Fragment, Module, ResetSignal, Signal
from amaranth.hdl import ResetInserter
from amaranth.lib import wiring
from amaranth.sim import Simulator

from dlbooster.hw.color import ColorConverter
from dlbooster.hw.gating import ClockGate
from dlbooster.hw.upsample import RowUpsampler


class _Counter(Elaboratable):
    """Counts the clocks in which ``en`` is high; idle otherwise."""

    def __init__(self):
        self.en, self.idle, self.count = Signal(), Signal(), Signal(8)

    def elaborate(self, platform):
        m = Module()
        with m.If(self.en):
            m.d.sync += self.count.eq(self.count + 1)
        m.d.comb += self.idle.eq(~self.en)
        return m


class _Pair(Elaboratable):
    """The block twice: clocked freely, and behind a clock gate; one ``clear`` resets both."""

    def __init__(self, make, gated: bool = True):
        self.free, self.gated = make(), make()
        self.gate = ClockGate("gated", gated)
        self.clear = Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.free = ResetInserter(self.clear)(self.free)
        m.submodules.gated = self.gate.wrap(self.gated)
        self.gate.add(m, ~self.gated.idle, ResetSignal("sync") | self.clear)
        return m


def test_the_gate_stops_the_clock_only_while_the_block_is_idle_and_opens_for_a_reset():
    pair = _Pair(_Counter)
    rng = random.Random(3)
    counts = []

    async def bench(ctx):
        for step in range(200):
            en = rng.random() < 0.3
            clear = step % 37 == 36
            ctx.set(pair.free.en, en)
            ctx.set(pair.gated.en, en)
            ctx.set(pair.clear, clear)
            await ctx.tick()
            counts.append((ctx.get(pair.free.count), ctx.get(pair.gated.count)))

    sim = Simulator(pair)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert all(a == b for a, b in counts)
    assert max(a for a, _ in counts) >= 5 and any(a == 0 for a, _ in counts[40:])


def test_an_ungated_clock_gate_leaves_the_block_in_sync():
    gate = ClockGate("gated", False)
    block = _Counter()
    assert gate.wrap(block) is block
    m = Module()
    m.submodules.block = block
    gate.add(m, Signal(), Signal())
    assert not Fragment.get(m, None).domains


@pytest.mark.parametrize("make", [lambda: RowUpsampler(8), lambda: ColorConverter(8)],
                         ids=["upsampler", "colour"])
def test_a_gated_stream_block_makes_the_same_handshakes_with_the_same_data(make):
    """Random beats (any payload bits: every mode of the upsampler) offered in bursts
    with gaps, random back-pressure, and a reset now and then."""
    pair = _Pair(make)
    rng = random.Random(11)
    blocks = (pair.free, pair.gated)
    payload_bits = len(pair.free.i.payload.as_value())
    moved = [0]

    async def bench(ctx):
        for step in range(1500):
            offer = rng.random() < (0.9 if (step // 60) % 2 else 0.15)
            payload = rng.getrandbits(payload_bits)
            ready = rng.random() < 0.7
            ctx.set(pair.clear, step % 500 == 499)
            for b in blocks:
                ctx.set(b.i.valid, offer)
                ctx.set(b.i.payload.as_value(), payload)
                ctx.set(b.o.ready, ready)
            free, gated = (
                (ctx.get(b.i.ready), ctx.get(b.o.valid),
                 ctx.get(b.o.payload.as_value()) if ctx.get(b.o.valid) else None) for b in blocks)
            assert free == gated, f"clock {step}"
            moved[0] += free[1] and ready
            await ctx.tick()

    sim = Simulator(pair)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert moved[0] > 200
