"""Amaranth-simulator tests of the pipelined 1-D ISLOW pass against SPEC.md 3.1."""

import random

from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st

from dlbooster.hw.idct import LATENCY, IdctPass
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
