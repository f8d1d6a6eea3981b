"""Amaranth-simulator tests of the clock gate (hw/gating.py) and of the ``idle`` outputs
that open it: each block behind a :class:`ClockGate` (header parser, Huffman tables, job
reader, plane buffer, upsampler, colour conversion, and the whole lane) must give the
same handshakes and the same valid data, clock for clock, as the same block clocked
freely, under random valid/ready patterns, aborts and resets, and its gate must actually
shut."""

import random

import numpy as np
import pytest
from amaranth import Elaboratable, Fragment, Module, ResetSignal, Signal
from amaranth.hdl import ResetInserter
from amaranth.lib import wiring
from amaranth.sim import Simulator

from dlbooster import jpeg
from dlbooster.hw.color import ColorConverter
from dlbooster.hw.entropy import HuffmanTables
from dlbooster.hw.gating import ClockGate
from dlbooster.hw.headers import HeaderParser
from dlbooster.hw.lane import Lane
from dlbooster.hw.planes import PlaneBuffer
from dlbooster.hw.reader import JobReader
from dlbooster.hw.upsample import RowUpsampler

from jpegtools import gen


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
    """The block twice, as hw/lane.py composes its pixel path: clocked freely, and behind a
    clock gate. ``clear`` resets both (the gated one through its domain reset), ``abort``
    is a ResetInserter inside the gate that opens it (the pixel path's abort; the tests of
    blocks without one leave it low); ``closed`` is high in clocks the gate is shut."""

    def __init__(self, make):
        self.free, self.gated = make(), make()
        self.gate = ClockGate("gated", True)
        self.clear, self.abort, self.closed = Signal(), Signal(), Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.free = ResetInserter(self.clear)(ResetInserter(self.abort)(self.free))
        m.submodules.gated = self.gate.wrap(ResetInserter(self.abort)(self.gated))
        self.gate.add(m, ~self.gated.idle | self.abort, ResetSignal("sync") | self.clear)
        m.d.comb += self.closed.eq(self.gated.idle & ~self.abort & ~self.clear)
        return m


def _simulate(dut, bench) -> None:
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def _seen(ctx, block, inputs, outputs, extra=()):
    """What the rest of the lane sees of a block in this clock: its inputs' readies, its
    outputs' valids and valid payloads, and ``extra`` signals."""
    seen = [ctx.get(getattr(block, name).ready) for name in inputs]
    for name in outputs:
        port = getattr(block, name)
        valid = ctx.get(port.valid)
        seen.append((valid, ctx.get(port.payload.as_value()) if valid else None))
    return seen + [ctx.get(get(block)) for get in extra]


def test_the_gate_stops_the_clock_only_while_the_block_is_idle_and_opens_for_a_reset():
    pair = _Pair(_Counter)
    rng = random.Random(3)
    counts, closed = [], [0]

    async def bench(ctx):
        for step in range(200):
            en = rng.random() < 0.3
            clear = step % 37 == 36
            ctx.set(pair.free.en, en)
            ctx.set(pair.gated.en, en)
            ctx.set(pair.clear, clear)
            closed[0] += ctx.get(pair.closed)
            await ctx.tick()
            counts.append((ctx.get(pair.free.count), ctx.get(pair.gated.count)))

    _simulate(pair, bench)
    assert all(a == b for a, b in counts)
    assert max(a for a, _ in counts) >= 5 and any(a == 0 for a, _ in counts[40:])
    assert closed[0] > 100, "the gate must shut while the block is idle"


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
    moved, closed = [0], [0]

    async def bench(ctx):
        for step in range(1500):
            offer = rng.random() < (0.9 if (step // 60) % 2 else 0.15)
            payload = rng.getrandbits(payload_bits)
            ready = rng.random() < 0.7
            ctx.set(pair.clear, step % 500 == 499)
            ctx.set(pair.abort, step % 700 == 350)
            for b in blocks:
                ctx.set(b.i.valid, offer)
                ctx.set(b.i.payload.as_value(), payload)
                ctx.set(b.o.ready, ready)
            free, gated = (_seen(ctx, b, ["i"], ["o"]) for b in blocks)
            assert free == gated, f"clock {step}"
            moved[0] += free[1][0] and ready
            closed[0] += ctx.get(pair.closed)
            await ctx.tick()

    _simulate(pair, bench)
    assert moved[0] > 200 and closed[0] > 200


def test_a_gated_header_parser_makes_the_same_handshakes_with_the_same_data():
    """Whole files, truncated files and noise, one after another, with random gaps,
    back-pressure on every output, and resets: the gate shuts while scan bytes pass."""
    rng = random.Random(1)
    files = [gen(48, 32, subsampling=2, quality=80), gen(33, 17, subsampling=0, quality=90),
             gen(64, 17, subsampling=1, quality=70)[:150], bytes(rng.getrandbits(8) for _ in range(40)),
             gen(40, 24, subsampling=2, quality=85)]
    beats = [{"data": int.from_bytes(d[i:i + 4], "little"), "n": len(d[i:i + 4]), "last": i + 4 >= len(d)}
             for d in files for i in range(0, len(d), 4)]
    pair = _Pair(lambda: HeaderParser(64))
    closed, starts = [0], [0]

    async def bench(ctx):
        pos = 0
        for step in range(20000):
            if pos == len(beats):
                break
            offer = rng.random() < 0.8
            readies = [rng.random() < 0.8 for _ in range(3)]
            ctx.set(pair.clear, step == 900)
            for b in (pair.free, pair.gated):
                ctx.set(b.input.valid, offer)
                ctx.set(b.input.payload, beats[pos])
                for port, ready in zip((b.tables, b.quant, b.entropy), readies):
                    ctx.set(port.ready, ready)
            free, gated = (_seen(ctx, b, ["input"], ["tables", "quant", "entropy"],
                                 [lambda b: b.start, lambda b: b.done, lambda b: b.status,
                                  lambda b: b.info.as_value(), lambda b: b.scan.as_value()])
                           for b in (pair.free, pair.gated))
            assert free == gated, f"clock {step}"
            closed[0] += ctx.get(pair.closed)
            starts[0] += free[4]
            pos += offer and free[0]
            await ctx.tick()
        assert pos == len(beats)

    _simulate(pair, bench)
    assert starts[0] >= 2 and closed[0] > 100


def _random_dht(rng):
    """A DHT table payload (16 counts, then the symbols) of a random complete-enough
    canonical code: at each length fewer codes than are free, so none is all ones."""
    counts, free = [], 2
    for _ in range(16):
        n = min(rng.randrange(free), 256 - sum(counts)) if free > 1 else 0
        counts.append(n)
        free = min((free - n) * 2, 512)
    return bytes(counts) + bytes(rng.getrandbits(8) for _ in range(sum(counts)))


def test_gated_huffman_tables_load_and_look_up_the_same():
    """Tables loaded into random slots, in bursts and in slow trickles, while random
    windows are looked up every clock, and a reset in the middle of a lookahead fill: the
    same readies and lookups, clock for clock; the gate shuts between the bytes of a slow
    load. (The lane applies no abort to the tables.)"""
    rng = random.Random(3)
    pair = _Pair(HuffmanTables)
    writes = [{"table": slot, "index": i, "byte": byte}
              for slot in (0, 4, 1, 5, 7, 4) for i, byte in enumerate(_random_dht(rng))]
    outputs = ("length", "symbol", "valid", "filling", "fast", "fast_length", "fast_total", "fast_symbol")
    closed_loading, fills, hits, cleared = [0], [0], [0], [False]

    async def bench(ctx):
        for step in range(9000):
            slow = not (step // 400) % 2
            offer = bool(writes) and rng.random() < (0.05 if slow else 0.9)
            select, window = rng.randrange(8), rng.getrandbits(16)
            # Once, a reset while a lookahead fill runs in a slow stretch of a load.
            clear = not cleared[0] and step >= 1500 and slow and bool(ctx.get(pair.free.filling))
            cleared[0] |= clear
            ctx.set(pair.clear, clear)
            for b in (pair.free, pair.gated):
                ctx.set(b.write.valid, offer)
                if writes:
                    ctx.set(b.write.payload, writes[0])
                ctx.set(b.select, select)
                ctx.set(b.window, window)
            free, gated = (_seen(ctx, b, ["write"], [], [lambda b, n=n: getattr(b, n) for n in outputs])
                           for b in (pair.free, pair.gated))
            assert free == gated, f"clock {step}"
            closed_loading[0] += bool(writes) and ctx.get(pair.closed)
            fills[0] += free[4]
            hits[0] += free[3]
            if offer and free[0]:
                writes.pop(0)
            await ctx.tick()
        assert not writes

    _simulate(pair, bench)
    assert cleared[0] and closed_loading[0] > 500 and fills[0] > 200 and hits[0] > 1000


def test_a_gated_job_reader_makes_the_same_requests_and_beats():
    """Jobs of several lengths read from a memory that answers requests after a random
    latency with random gaps (now and then an error response), random back-pressure from
    the lane, a job cancelled after some of its bytes went out and held cancelled until
    the reader is quiet (as the lane engine does), short jobs whose last word lands in
    an empty FIFO (its output register refills after the last read is done), and a reset:
    the same requests, beats and status, clock for clock; the gate shuts while the reader
    has no read in flight and waits for the lane."""
    rng = random.Random(4)
    pair = _Pair(lambda: JobReader(128, depth=32, burst=16))
    blocks = (pair.free, pair.gated)
    closed, beats, requests, cancels = [0], [0], [0], [0]

    async def bench(ctx):
        bursts = []                            # [clock due, beats left] per accepted request
        cancel, sent = False, 0                # beats handed on since the job's start
        for step in range(12000):
            start = step % 1500 in (10, 1200)
            short = step % 1500 >= 1200
            if step % 3000 == 1630:
                assert sent > 0 and not ctx.get(pair.free.quiet)
                cancel, cancels[0] = True, cancels[0] + 1
            elif cancel and ctx.get(pair.free.quiet):
                cancel = False
            sent = 0 if start else sent
            r_valid = bool(bursts) and bursts[0][0] <= step and rng.random() < 0.5
            ar_ready, o_ready = rng.random() < 0.4, rng.random() < (0.3 if (step // 200) % 2 else 0.9)
            r_payload = {"data": rng.getrandbits(128), "err": rng.random() < 0.002}
            ctx.set(pair.clear, step == 7777)
            for b in blocks:
                ctx.set(b.start, start)
                ctx.set(b.cancel, cancel)
                ctx.set(b.addr, 0x1000 * (step // 1500 + 1))
                ctx.set(b.length, 5 + 4 * (step // 1500) if short else 900 + 37 * (step // 1500))
                ctx.set(b.bus.ar.ready, ar_ready)
                ctx.set(b.bus.r.valid, r_valid)
                ctx.set(b.bus.r.payload, r_payload)
                ctx.set(b.o.ready, o_ready)
            free, gated = (_seen(ctx, b, [], ["o"], [lambda b: b.bus.ar.valid,
                                                     lambda b: b.bus.ar.payload.as_value(),
                                                     lambda b: b.quiet, lambda b: b.error,
                                                     lambda b: b.progress])
                           for b in blocks)
            assert free == gated, f"clock {step}"
            closed[0] += ctx.get(pair.closed)
            beats[0] += free[0][0] and o_ready
            sent += free[0][0] and o_ready
            if r_valid:
                bursts[0][1] -= 1
                if not bursts[0][1]:
                    bursts.pop(0)
            if free[1] and ar_ready:
                requests[0] += 1
                bursts.append([step + rng.randrange(3, 30), ctx.get(pair.free.bus.ar.payload.len) + 1])
            if step == 7777:
                bursts.clear()
            await ctx.tick()

    _simulate(pair, bench)
    assert cancels[0] == 4 and requests[0] > 20 and beats[0] > 1000 and closed[0] > 2000


def test_a_gated_plane_buffer_makes_the_same_handshakes_with_the_same_data():
    """Images of every band shape, with and without vertical context, last bands of one
    row (a lone read), slow and fast input, back-pressure, an abort mid-image and a
    reset."""
    rng = random.Random(2)
    lanes = 2
    pair = _Pair(lambda: PlaneBuffer(max_blocks=6, band_blocks=2, lanes=lanes))
    closed, rows = [0], [0]

    async def bench(ctx):
        for image in range(12):
            wide, high, tall, v_ctx = image % 3 + 1, rng.choice([2, 4]), image % 2, (image // 2) % 2
            rate = 0.25 if image % 4 < 2 else 0.6
            per_band = 2 if tall else 1
            config = {"blocks_wide": wide, "bands": high // per_band, "rows": 8 * high - (7 if image % 3 == 0 else rng.randrange(8)),
                      "cols": 8 * wide - rng.randrange(8), "tall": tall, "v_ctx": v_ctx, "h2": 1, "v2": v_ctx,
                      "narrow": 0}
            beats = [{"by": band * per_band + j, "bx": x, "row": g * lanes, "last": g == 8 // lanes - 1,
                      "samples": [rng.getrandbits(8) for _ in range(8 * lanes)]}
                     for band in range(high // per_band) for x in range(wide) for j in range(per_band)
                     for g in range(8 // lanes)]
            for b in (pair.free, pair.gated):
                ctx.set(b.config, config)
                ctx.set(b.start, 1)
                ctx.set(b.i.valid, 0)
            await ctx.tick()
            for b in (pair.free, pair.gated):
                ctx.set(b.start, 0)
            quiet = 0
            for step in range(20000):
                if quiet == 30:
                    break
                offer = bool(beats) and rng.random() < rate
                ready = rng.random() < 0.6
                ctx.set(pair.abort, image == 3 and step == 60)
                ctx.set(pair.clear, image == 10 and step == 90)
                for b in (pair.free, pair.gated):
                    ctx.set(b.i.valid, offer)
                    if beats:
                        ctx.set(b.i.payload, beats[0])
                    ctx.set(b.o.ready, ready)
                free, gated = (_seen(ctx, b, ["i"], ["o"], [lambda b: b.done]) for b in (pair.free, pair.gated))
                assert free == gated, f"image {image} clock {step}"
                closed[0] += ctx.get(pair.closed)
                rows[0] += free[1][0] and ready
                if offer and free[0]:
                    beats.pop(0)
                quiet = quiet + 1 if not beats and not free[1][0] else 0
                await ctx.tick()

    _simulate(pair, bench)
    assert rows[0] > 100 and closed[0] > 100


def test_a_clock_gated_lane_gives_the_same_outputs_clock_for_clock():
    """The whole lane as the boards have it and in the simulation's form (clock gates, the
    IDCT's passes modular, colour conversion unsigned): decodable files of every
    subsampling, corrupted scans (entropy faults, the pixel path's abort), a truncated
    file, back-pressure and a lane reset mid-stream."""
    photo = gen(32, 24, subsampling=2, quality=85)

    def corrupted(seed):
        start = jpeg.parse(photo).scans[0].data_start
        out, noise = bytearray(photo), np.random.default_rng(seed)
        for at in noise.integers(start, len(photo) - 2, size=3):
            out[at] = int(noise.integers(0, 255))
        return bytes(out)

    files = [photo, gen(17, 9, subsampling=1, quality=60), gen(23, 19, subsampling="gray", quality=90),
             corrupted(1), corrupted(2), gen(24, 17, subsampling="440", quality=80), photo[:300]]
    beats = [{"data": int.from_bytes(d[i:i + 4], "little"), "n": len(d[i:i + 4]), "last": i + 4 >= len(d)}
             for d in files for i in range(0, len(d), 4)]
    lanes = (Lane(64, 4), Lane(64, 4, clock_gating=True, sim_arithmetic=True))
    top = Module()
    top.submodules.free, top.submodules.gated = lanes
    rng = random.Random(5)
    statuses, pixels = [], [0]

    async def bench(ctx):
        pos = 0
        for step in range(60000):
            if pos == len(beats):
                break
            offer, ready = rng.random() < 0.85, rng.random() < 0.7
            for lane in lanes:
                ctx.set(lane.reset, step == 7000)
                ctx.set(lane.input.valid, offer)
                ctx.set(lane.input.payload, beats[pos])
                ctx.set(lane.o.ready, ready)
            free, gated = (_seen(ctx, lane, ["input"], ["o"], [lambda b: b.done, lambda b: b.start,
                                                             lambda b: b.symbols, lambda b: b.status])
                           for lane in lanes)
            assert free == gated, f"clock {step}"
            if free[2]:
                statuses.append(free[5])
            pixels[0] += free[1][0] and ready
            pos += offer and free[0]
            await ctx.tick()

    _simulate(top, bench)
    assert len(statuses) >= 5 and 0 in statuses and any(s & 0xF0 == 0x20 for s in statuses), statuses
    assert pixels[0] > 100
