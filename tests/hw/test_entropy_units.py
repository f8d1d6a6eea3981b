"""Amaranth-simulator unit tests of the entropy decoder's sub-blocks.

EXTEND, the Huffman table loader/lookup and the byte unstuffer, each against an
independent Python statement of T.81 / libjpeg-turbo behaviour, on hypothesis inputs.
"""


from amaranth import Module, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dlbooster.hw.entropy import HuffmanTables, Unstuffer, extend

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _run(dut, bench, clocked=True):
    sim = Simulator(dut)
    if clocked:
        sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


class _Extend(wiring.Component):
    bits: In(16)
    size: In(4)
    value: Out(signed(17))

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.value.eq(extend(self.bits, self.size))
        return m


def _extend_ref(bits: int, s: int) -> int:
    # T.81 Figure F.12: V < 2^(s-1) means negative, V - (2^s - 1).
    if s == 0:
        return 0
    return bits - (1 << s) + 1 if bits < (1 << (s - 1)) else bits


def test_extend_every_size_and_value_edge():
    dut = _Extend()
    cases = [(b, s) for s in range(16) for b in {0, 1, (1 << s) - 1, (1 << max(s - 1, 0)),
                                               max((1 << max(s - 1, 0)) - 1, 0)} if b < (1 << s) or s == 0]

    async def bench(ctx):
        for bits, s in cases:
            ctx.set(dut.bits, bits if s else 0)
            ctx.set(dut.size, s)
            assert ctx.get(dut.value) == _extend_ref(bits if s else 0, s), (bits, s)

    _run(dut, bench, clocked=False)


@st.composite
def huffman_tables(draw):
    """Valid DHT payloads: counts that keep the Kraft sum within the code space."""
    counts = []
    space = 2  # codes still free at the current length
    total = 0
    for _ in range(16):
        n = draw(st.integers(0, max(0, min(space, 256 - total, 40))))
        counts.append(n)
        total += n
        space = (space - n) * 2
    if total == 0:
        counts[draw(st.integers(0, 15))] = 1
        total = 1
    symbols = draw(st.lists(st.integers(0, 255), min_size=total, max_size=total))
    return counts, symbols


def _lookup_ref(counts, symbols, window: int):
    code = 0
    k = 0
    for length, n in enumerate(counts, start=1):
        top = window >> (16 - length)
        if code <= top < code + n:
            return length, symbols[k + top - code]
        code = (code + n) << 1
        k += n
    return None


@SETTINGS
@given(tables=st.lists(huffman_tables(), min_size=2, max_size=2),
       windows=st.lists(st.integers(0, 0xFFFF), min_size=40, max_size=40),
       slots=st.lists(st.integers(0, 7), min_size=2, max_size=2, unique=True))
def test_huffman_lookup_and_lookahead_match_canonical_codes(tables, windows, slots):
    dut = HuffmanTables()

    async def bench(ctx):
        for slot, (counts, symbols) in zip(slots, tables):
            for i, byte in enumerate(bytes(counts) + bytes(symbols)):
                ctx.set(dut.write.payload, {"table": slot, "index": i, "byte": byte})
                ctx.set(dut.write.valid, 1)
                while not ctx.get(dut.write.ready):
                    await ctx.tick()
                await ctx.tick()
        ctx.set(dut.write.valid, 0)
        for _ in range(260):  # let the last lookahead fill finish
            await ctx.tick()
        for slot, (counts, symbols) in zip(slots, tables):
            # Probe every code's first window too, not only random ones.
            code, probes = 0, list(windows)
            for length, n in enumerate(counts, start=1):
                probes += [(code + j) << (16 - length) for j in range(min(n, 4))]
                code = (code + n) << 1
            ctx.set(dut.select, slot)
            for window in probes:
                ctx.set(dut.window, window)
                expect = _lookup_ref(counts, symbols, window)
                if expect is None:
                    assert not ctx.get(dut.valid), hex(window)
                    assert not ctx.get(dut.fast), hex(window)
                else:
                    assert ctx.get(dut.valid), hex(window)
                    assert (ctx.get(dut.length), ctx.get(dut.symbol)) == expect, hex(window)
                    length, symbol = expect
                    # The lookahead answers exactly the codes of at most 8 bits.
                    assert ctx.get(dut.fast) == (length <= 8), hex(window)
                    if length <= 8:
                        assert (ctx.get(dut.fast_length), ctx.get(dut.fast_total),
                                ctx.get(dut.fast_symbol)) == (length, length + (symbol & 15), symbol)

    _run(dut, bench)


def _unstuff_ref(data: bytes):
    """libjpeg-turbo fill_bit_buffer: data bytes up to the first marker, and the marker;
    fill bytes before a stuffed zero (``FF FF.. 00``) stop the data too ("fill")."""
    out = bytearray()
    i = 0
    while i < len(data):
        if data[i] != 0xFF:
            out.append(data[i])
            i += 1
            continue
        j = i + 1
        while j < len(data) and data[j] == 0xFF:
            j += 1
        if j == len(data):
            return bytes(out), None
        if data[j] == 0:
            if j > i + 1:
                return bytes(out), "fill"
            out.append(0xFF)
            i = j + 1
            continue
        return bytes(out), data[j]
    return bytes(out), None


stuffed_bytes = st.lists(st.sampled_from([0x00, 0x12, 0xFF, 0xFF, 0xD3, 0xD9, 0x7A]) | st.integers(0, 255),
                         min_size=0, max_size=40).map(bytes)


@SETTINGS
@given(data=stuffed_bytes, take_every=st.integers(1, 3), gaps=st.booleans())
@example(data=b"\x12\x34\xff\xff\x00\x56", take_every=1, gaps=False)       # fill before a stuffed zero
@example(data=b"\xff\x00\xff\xff\xff\x00\x12", take_every=2, gaps=True)
@example(data=b"\x12\xff\xff\xd3\x00", take_every=1, gaps=False)            # fill before a marker: allowed
def test_unstuffer_matches_libjpeg_fill(data, take_every, gaps):
    dut = Unstuffer()
    expect, marker = _unstuff_ref(data)
    beats = [data[i:i + 4] for i in range(0, len(data), 4)] or [b""]

    async def bench(ctx):
        got = bytearray()
        bi = 0
        for cycle in range(40 * len(beats) + 40):
            offer_input = bi < len(beats) and not (gaps and cycle % 3 == 1)
            if offer_input:
                chunk = beats[bi]
                ctx.set(dut.input.payload, {"data": int.from_bytes(chunk.ljust(4, b"\0"), "little"),
                                            "n": len(chunk), "last": bi == len(beats) - 1})
            ctx.set(dut.input.valid, offer_input)
            take = cycle % take_every == 0
            ctx.set(dut.take, take)
            n = ctx.get(dut.offer_n)
            if take and n:
                got += ctx.get(dut.offer_data).to_bytes(4, "big")[:n]
            if offer_input and ctx.get(dut.input.ready):
                bi += 1
            stopped_marker = ctx.get(dut.marker_valid)
            at_end = ctx.get(dut.at_end)
            fill_fault = ctx.get(dut.fill_fault)
            if stopped_marker or at_end or fill_fault:
                break
            await ctx.tick()
        assert bytes(got) == expect
        if marker is None:
            assert at_end and not stopped_marker and not fill_fault
        elif marker == "fill":
            assert fill_fault and not stopped_marker and ctx.get(dut.offer_n) == 0
        else:
            assert stopped_marker and ctx.get(dut.marker) == marker and not fill_fault

    _run(dut, bench)


@SETTINGS
@given(junk=stuffed_bytes.map(lambda b: b.replace(b"\xff", b"\xff\x00")), rst=st.integers(0, 7),
       tail=st.binary(max_size=6))
def test_unstuffer_seek_finds_next_marker(junk, rst, tail):
    """Seek mode (restart handling) drops data and stuffing (fill bytes before a stuffed
    zero too), stops at FF Dn, consumes it."""
    dut = Unstuffer()
    data = junk + b"\xff\xff\x00" + junk + b"\xff\xff" + bytes([0xD0 + rst]) + tail
    beats = [data[i:i + 4] for i in range(0, len(data), 4)]
    expect_tail, _ = _unstuff_ref(tail)

    async def bench(ctx):
        bi = 0
        found = False
        got = bytearray()
        for _ in range(20 * len(beats) + 20):
            if bi < len(beats):
                chunk = beats[bi]
                ctx.set(dut.input.payload, {"data": int.from_bytes(chunk.ljust(4, b"\0"), "little"),
                                            "n": len(chunk), "last": bi == len(beats) - 1})
            ctx.set(dut.input.valid, bi < len(beats))
            ctx.set(dut.seek, not found)
            ctx.set(dut.take, found)
            ctx.set(dut.consume_marker, 0)
            if found and (ctx.get(dut.at_end) or ctx.get(dut.marker_valid)):
                break
            if not found and ctx.get(dut.marker_valid):
                assert ctx.get(dut.offer_n) == 0
                assert ctx.get(dut.marker) == 0xD0 + rst
                ctx.set(dut.consume_marker, 1)
                found = True
            elif found and ctx.get(dut.offer_n):
                got += ctx.get(dut.offer_data).to_bytes(4, "big")[:ctx.get(dut.offer_n)]
            if bi < len(beats) and ctx.get(dut.input.ready):
                bi += 1
            await ctx.tick()
        assert found
        assert bytes(got) == expect_tail

    _run(dut, bench)
