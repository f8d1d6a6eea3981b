"""Amaranth-simulator tests of the IDCT parts: the pipelined 1-D ISLOW pass against
SPEC.md 3.1, the transpose buffer, and the whole core against the model."""

import random

import numpy as np
import pytest
from amaranth.hdl import Fragment
from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st

from dlbooster.jpeg import model
from dlbooster.hw.idct import (LATENCY, MODULAR_BITS, Idct, IdctPass, TransposeBuffer, block_beats,
                                quant_writes)
from reference_impl import _one_pass as idct_1d


def _run(vectors, enables, fits=None, gaps=None, width=32, modular=False):
    """Feed vectors (holding each while ``en`` is low; with ``gaps``, a bubble before
    vector k on each enabled clock while gaps[k] says so) and collect the outputs; each
    vector's index rides in ``t_i``, and with a ``fits`` list each output's ``o_fit`` is
    appended."""
    dut = IdctPass(width=width, tag_width=8, modular=modular)
    got = []

    async def bench(ctx):
        pending = list(enumerate(vectors))
        bubble = list(gaps or [])
        for en in enables:
            ctx.set(dut.en, en)
            gap = bool(pending) and bubble and bubble[0]
            if pending and not gap:
                index, vector = pending[0]
                for n, value in enumerate(vector):
                    ctx.set(dut.i[n], value)
                ctx.set(dut.t_i, index)
                ctx.set(dut.i_valid, 1)
            else:
                ctx.set(dut.i_valid, 0)
            if en and ctx.get(dut.o_valid):
                assert ctx.get(dut.t_o) == len(got)
                got.append([ctx.get(dut.o[n]) for n in range(8)])
                if fits is not None:
                    fits.append(ctx.get(dut.o_fit))
            await ctx.tick()
            if en and pending:
                if gap:
                    bubble[0] = False
                else:
                    pending.pop(0)
                    bubble = bubble[1:]

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
    """Outputs, in order with their tags, through back-pressure and bubbles."""
    rng = random.Random(seed)
    enables = [rng.random() < 0.7 for _ in range(6 * len(vectors) + 4 * LATENCY)]
    enables += [True] * (2 * len(vectors) + LATENCY + 1)  # let everything drain
    gaps = [rng.random() < 0.4 for _ in vectors]
    got = _run(vectors, enables, gaps=gaps)
    assert got == [idct_1d(v) for v in vectors]


@pytest.mark.parametrize("width", [16, 32])
def test_pass_is_exact_at_every_corner_of_its_input_range(width):
    """Each output and each register is linear in the inputs, so its extremes lie at
    vectors of the inputs' extremes: all 256 of them come out exact, in registers sized
    from the inputs' range (34 output bits for 16-bit inputs, 50 for 32; interval
    arithmetic ignores that inputs recur in several sums, so this is 2 bits more than
    the corners reach)."""
    low, high = -(1 << (width - 1)), (1 << (width - 1)) - 1
    vectors = [[high if (k >> n) & 1 else low for n in range(8)] for k in range(256)]
    got = _run(vectors, [True] * (len(vectors) + LATENCY + 1), width=width)
    assert got == [idct_1d(v) for v in vectors]
    dut = IdctPass(width=width)
    Fragment.get(dut, None)       # elaborated, as a design would be
    assert dut.out_width == {16: 34, 32: 50}[width]


def test_a_modular_pass_gives_the_exact_outputs_modulo_2_to_the_48():
    """``modular``: every corner of the 16-bit input range, and vectors through
    back-pressure and bubbles, come out as the exact outputs modulo 2**48; inputs wider
    than 29 bits are refused (their values would not fit)."""
    low, high = -(1 << 15), (1 << 15) - 1
    corners = [[high if (k >> n) & 1 else low for n in range(8)] for k in range(256)]
    rng = random.Random(5)
    others = [[rng.randint(low, high) for _ in range(8)] for _ in range(40)]
    for vectors in (corners, others):
        enables = [rng.random() < 0.7 for _ in range(6 * len(vectors))]
        enables += [True] * (2 * len(vectors) + LATENCY + 1)
        gaps = [rng.random() < 0.4 for _ in vectors]
        got = _run(vectors, enables, gaps=gaps, width=16, modular=True)
        assert got == [[o % (1 << MODULAR_BITS) for o in idct_1d(v)] for v in vectors]
        assert any(o >= 1 << (MODULAR_BITS - 1) for out in got for o in out)     # negative outputs wrap
    widest = IdctPass(width=29, modular=True)
    Fragment.get(widest, None)
    assert widest.out_width == MODULAR_BITS
    with pytest.raises(ValueError, match="inputs of at most 29 bits, not 30"):
        IdctPass(width=30, modular=True)


near16 = st.integers(-40000, 40000)


@settings(max_examples=20, deadline=None)
@given(vectors=st.lists(st.lists(near16 | small, min_size=8, max_size=8), min_size=1, max_size=12),
       seed=st.integers(0, 1000), modular=st.booleans())
def test_o_fit_follows_its_vector(vectors, seed, modular):
    """``o_fit`` is the model's pairwise 16-bit condition for the output's vector,
    through back-pressure and bubbles, with exact and with modular values (a modular
    pass takes 16-bit inputs, whose sums still reach past 16 bits)."""
    rng = random.Random(seed)
    enables = [rng.random() < 0.7 for _ in range(6 * len(vectors) + 4 * LATENCY)]
    enables += [True] * (2 * len(vectors) + LATENCY + 1)
    gaps = [rng.random() < 0.4 for _ in vectors]
    fits = []
    if modular:
        vectors = [[max(-32768, min(32767, d)) for d in v] for v in vectors]
    _run(vectors, enables, fits, gaps, width=16 if modular else 32, modular=modular)

    def fit(x):
        return -32768 <= x <= 32767

    expect = [int(all(fit(s) for s in (d[0] + d[4], d[0] - d[4], d[2] + d[6], d[7] + d[1], d[5] + d[3],
                                           d[7] + d[3], d[5] + d[1], d[7] + d[3] + d[5] + d[1])))
              for d in vectors]
    assert fits == expect


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
                    ctx.set(dut.i.payload.data[0][n], value)
            ctx.set(dut.i.valid, offer)
            ready = rng.random() < 0.7
            ctx.set(dut.o.ready, ready)
            if ready and ctx.get(dut.o.valid):
                got.append([ctx.get(dut.o.payload.data[0][n]) for n in range(8)])
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
                ctx.set(dut.i.payload.data[0][n], value)
            ctx.set(dut.i.valid, 1)
            assert ctx.get(dut.i.ready), "input stalled while streaming"
            if ctx.get(dut.o.valid):
                got.append([ctx.get(dut.o.payload.data[0][n]) for n in range(8)])
            await ctx.tick()
        ctx.set(dut.i.valid, 0)
        for _ in range(9):
            if ctx.get(dut.o.valid):
                got.append([ctx.get(dut.o.payload.data[0][n]) for n in range(8)])
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == [row for block in blocks for row in block]


@settings(max_examples=6, deadline=None)
@given(blocks=st.lists(st.lists(st.lists(int32, min_size=8, max_size=8), min_size=8, max_size=8),
                       min_size=1, max_size=3),
       seed=st.integers(0, 1000))
def test_transpose_buffer_two_lanes(blocks, seed):
    """Two columns in and two rows out per beat, with random gaps."""
    rng = random.Random(seed)
    dut = TransposeBuffer(width=32, lanes=2)
    beats_in = [[[block[r][c] for r in range(8)] for c in (2 * j, 2 * j + 1)]
                for block in blocks for j in range(4)]
    expect = [[block[2 * i], block[2 * i + 1]] for block in blocks for i in range(4)]
    got = []

    async def bench(ctx):
        pending = list(beats_in)
        for _ in range(30 * len(blocks) + 30):
            offer = bool(pending) and rng.random() < 0.8
            if offer:
                for p in range(2):
                    for r in range(8):
                        ctx.set(dut.i.payload.data[p][r], pending[0][p][r])
            ctx.set(dut.i.valid, offer)
            ready = rng.random() < 0.7
            ctx.set(dut.o.ready, ready)
            if ready and ctx.get(dut.o.valid):
                got.append([[ctx.get(dut.o.payload.data[q][c]) for c in range(8)] for q in range(2)])
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


def test_block_beats_frame_a_block_like_the_entropy_decoder():
    block = np.zeros(64, dtype=np.int16)
    block[[0, 1, 8, 63]] = [-5, 3, 7, 2]
    beats = block_beats(block, comp=2, bx=4, by=1)
    assert [(b["index"], b["value"], b["first"], b["last"], b["coef"]) for b in beats] == [
        (0, -5, 1, 0, 1), (1, 3, 0, 0, 1), (8, 7, 0, 0, 1), (63, 2, 0, 1, 1)]
    assert beats[-1]["count"] == 4 and {(b["comp"], b["bx"], b["by"]) for b in beats} == {(2, 4, 1)}
    eob = block_beats(np.zeros(64, dtype=np.int16))
    assert [(b["coef"], b["first"], b["last"], b["count"]) for b in eob] == [(1, 1, 0, 1), (0, 0, 1, 1)]


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_core_matches_the_model_in_the_amaranth_simulator(lanes):
    """The whole core (store, dequantiser, both passes, range limit and range check) on
    a few blocks with random valid/ready gaps: full-range, sparse, DC-only and zero
    blocks, three quantisation tables."""
    rng = np.random.default_rng(lanes)
    blocks = rng.integers(-40, 40, (7, 64)).astype(np.int16)
    blocks[1] = rng.integers(-32768, 32768, 64)
    blocks[2, 5:] = 0
    blocks[3, 1:] = 0
    blocks[4] = 0
    quant = [rng.integers(1, 100, 64), rng.integers(1, 32768, 64), np.ones(64, dtype=np.int64)]
    comps = [n % 3 for n in range(len(blocks))]
    dut = Idct(lanes)
    per = 8 // lanes
    got = []
    beats = [b for n, block in enumerate(blocks) for b in block_beats(block, comps[n], n, 2 * n)]
    gaps = random.Random(lanes)

    async def bench(ctx):
        for c, table in enumerate(quant):
            for w in quant_writes(c, table):
                ctx.set(dut.quant.payload, w)
                ctx.set(dut.quant.valid, 1)
                await ctx.tick()
        ctx.set(dut.quant.valid, 0)
        pending = list(beats)
        for _ in range(2000):
            offer = bool(pending) and gaps.random() < 0.8
            if offer:
                ctx.set(dut.coef.payload, pending[0])
            ctx.set(dut.coef.valid, offer)
            ready = gaps.random() < 0.7
            ctx.set(dut.o.ready, ready)
            if ready and ctx.get(dut.o.valid):
                p = ctx.get(dut.o.payload)
                got.append((p.comp, p.bx, p.by, p.row, p.last, p.range_fault,
                            [p.samples[k] for k in range(8 * lanes)]))
            took = offer and ctx.get(dut.coef.ready)
            await ctx.tick()
            if took:
                pending.pop(0)
            if len(got) == per * len(blocks):
                break

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert len(got) == per * len(blocks)
    for n, block in enumerate(blocks):
        samples, in_range = model.idct_islow(block[None], quant[comps[n]])
        mine = got[per * n:per * (n + 1)]
        assert [m[:5] for m in mine] == [(comps[n], n, 2 * n, lanes * i, int(i == per - 1))
                                         for i in range(per)]
        if in_range[0]:
            assert np.array_equal(np.array([m[6] for m in mine]).reshape(8, 8), samples[0])
        assert mine[-1][5] == (not in_range[0])
    assert any(m[5] for m in got) and not all(m[5] for m in got[per - 1::per])
