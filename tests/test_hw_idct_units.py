"""Amaranth-simulator tests of the pipelined 1-D ISLOW pass against SPEC.md 3.1."""

import random

from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st

from dlbooster.hw.idct import LATENCY, IdctPass, TransposeBuffer
from reference_impl import _one_pass as idct_1d


def _run(vectors, enables):
    """Feed vectors (holding each while ``en`` is low) and collect the outputs."""
    dut = IdctPass(width=32)
    got = []

    async def bench(ctx):
        pending = list(vectors)
        for en in enables:
            ctx.set(dut.en, en)
            if pending:
                for n, value in enumerate(pending[0]):
                    ctx.set(dut.i[n], value)
                ctx.set(dut.i_valid, 1)
            else:
                ctx.set(dut.i_valid, 0)
            if en and ctx.get(dut.o_valid):
                got.append([ctx.get(dut.o[n]) for n in range(8)])
            await ctx.tick()
            if en and pending:
                pending.pop(0)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got


int32 = st.integers(-(1 << 31), (1 << 31) - 1)
small = st.integers(-2048, 2047)


@settings(max_examples=20, deadline=None)
@given(vectors=st.lists(st.lists(small | int32, min_size=8, max_size=8), min_size=1, max_size=12),
       seed=st.integers(0, 1000))
def test_pass_is_exact_with_back_pressure(vectors, seed):
    rng = random.Random(seed)
    enables = [rng.random() < 0.7 for _ in range(4 * len(vectors) + 4 * LATENCY)]
    enables += [True] * (len(vectors) + LATENCY + 1)  # let everything drain
    got = _run(vectors, enables)
    assert got == [idct_1d(v) for v in vectors]


def test_latency_is_the_documented_one():
    dut = IdctPass(width=32)

    async def bench(ctx):
        ctx.set(dut.en, 1)
        for n in range(8):
            ctx.set(dut.i[n], n + 1)
        ctx.set(dut.i_valid, 1)
        await ctx.tick()
        ctx.set(dut.i_valid, 0)
        for clock in range(1, LATENCY + 2):
            if ctx.get(dut.o_valid):
                assert clock == LATENCY
                assert [ctx.get(dut.o[n]) for n in range(8)] == idct_1d(list(range(1, 9)))
                return
            await ctx.tick()
        raise AssertionError("no output")

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


@settings(max_examples=15, deadline=None)
@given(blocks=st.lists(st.lists(st.lists(int32, min_size=8, max_size=8), min_size=8, max_size=8),
                       min_size=1, max_size=4),
       seed=st.integers(0, 1000))
def test_transpose_buffer_streams_blocks_with_gaps(blocks, seed):
    """Columns in, rows out, block after block, with random valid and ready gaps."""
    rng = random.Random(seed)
    dut = TransposeBuffer(width=32)
    columns = [[block[r][c] for r in range(8)] for block in blocks for c in range(8)]
    expect = [list(row) for block in blocks for row in block]
    got = []

    async def bench(ctx):
        pending = list(columns)
        for _ in range(40 * len(blocks) + 40):
            offer = bool(pending) and rng.random() < 0.8
            if offer:
                for n, value in enumerate(pending[0]):
                    ctx.set(dut.i.payload.data[n], value)
            ctx.set(dut.i.valid, offer)
            ready = rng.random() < 0.7
            ctx.set(dut.o.ready, ready)
            if ready and ctx.get(dut.o.valid):
                got.append([ctx.get(dut.o.payload.data[n]) for n in range(8)])
            took = offer and ctx.get(dut.i.ready)
            await ctx.tick()
            if took:
                pending.pop(0)
            if len(got) == len(expect):
                break

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == expect


def test_transpose_buffer_sustains_one_vector_per_clock():
    dut = TransposeBuffer(width=16)
    blocks = [[[b * 100 + r * 8 + c for c in range(8)] for r in range(8)] for b in range(3)]
    columns = [[block[r][c] for r in range(8)] for block in blocks for c in range(8)]
    got = []

    async def bench(ctx):
        ctx.set(dut.o.ready, 1)
        for column in columns:
            for n, value in enumerate(column):
                ctx.set(dut.i.payload.data[n], value)
            ctx.set(dut.i.valid, 1)
            assert ctx.get(dut.i.ready), "input stalled while streaming"
            if ctx.get(dut.o.valid):
                got.append([ctx.get(dut.o.payload.data[n]) for n in range(8)])
            await ctx.tick()
        ctx.set(dut.i.valid, 0)
        for _ in range(9):
            if ctx.get(dut.o.valid):
                got.append([ctx.get(dut.o.payload.data[n]) for n in range(8)])
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == [row for block in blocks for row in block]
