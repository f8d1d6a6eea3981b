"""Entropy (Huffman) decoder core: about one symbol per clock.

Decodes the entropy-coded segment of one interleaved baseline scan (T.81 F.2.2) into
quantised coefficient blocks, bit-exact with :func:`dlbooster.jpeg.model.entropy_decode`
(which follows libjpeg-turbo ``jdhuff.c``).

Sub-blocks, each a component of its own:

- :class:`Unstuffer`: takes 4 bytes per beat, removes byte stuffing (``FF 00``, as
  ``jdhuff.c`` ``fill_bit_buffer``), stops at markers and at fill bytes before a stuffed
  zero (``FF FF .. 00``, which libjpeg-turbo decodes two ways), and in seek mode skips
  bytes up to the next marker (restart handling, T.81 F.2.2.5).
- :class:`HuffmanTables`: 4 DC + 4 AC tables, loaded from DHT payload bytes; computes
  the canonical code limits as the bytes arrive (T.81 Annex C) and looks a 16-bit window
  up in one clock: code length, symbol, validity.
- :class:`EntropyDecoder`: a 64-bit left-aligned bit buffer refilled 4 bytes at a time,
  one symbol (code + extra bits) decoded and consumed per clock (two for codes longer
  than 8 bits), DC prediction,
  run/size AC decoding with ZRL/EOB, MCU composition from the sampling factors,
  restart intervals, and the fault checks of SPEC.md section 2.

Status codes (:class:`Status`) equal the reference model's entropy-stage codes.
"""

from __future__ import annotations

import enum
import operator
from functools import reduce

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .gating import ClockGate

__all__ = [
    "Status",
    "InputBeat",
    "TableWrite",
    "ComponentConfig",
    "ScanConfig",
    "CoefBeat",
    "Unstuffer",
    "HuffmanTables",
    "EntropyDecoder",
    "extend",
]

# T.81 Figure A.6: natural index of zigzag position k.
_ZIGZAG = (0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5,
           12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6, 7, 14, 21, 28,
           35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
           58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63)


class Status(enum.IntEnum):
    """Completion status (the same numbers as ``dlbooster.jpeg.model``'s entropy stage)."""

    OK = 0
    BAD_CODE = 1           # no code matches within 16 bits
    COEF_OVERFLOW = 2      # a block exceeds 64 coefficients
    UNEXPECTED_MARKER = 3  # a marker inside entropy data before the MCU was complete
    BAD_RESTART = 4        # wrong or missing RSTn at a restart boundary
    TRUNCATED = 5          # end of data (or a non-RST marker) before the last MCU
    AFTER_SCAN = 6         # after the last MCU, the first marker other than RSTn is not
    #                        EOI, or the data ends without EOI (the gateware's own code:
    #                        the model's callers screen such files with classify's
    #                        "after-scan")
    FILL_BEFORE_STUFFING = 7   # an MCU needs data past FF fill bytes before a stuffed
    #                            zero (FF FF.. 00), which T.81 B.1.1.2 does not allow and
    #                            libjpeg-turbo decodes two ways (see Unstuffer)

    @property
    def reason(self) -> str | None:
        """The reason string of :data:`dlbooster.jpeg.model.STATUS_REASONS` (``after-scan``
        as :func:`dlbooster.jpeg.classify` spells it); None for OK."""
        return _REASONS.get(self)


_REASONS = {
    Status.BAD_CODE: "bad-huffman-code", Status.COEF_OVERFLOW: "coefficient-overflow",
    Status.UNEXPECTED_MARKER: "unexpected-marker", Status.BAD_RESTART: "bad-restart",
    Status.TRUNCATED: "truncated", Status.AFTER_SCAN: "after-scan",
    Status.FILL_BEFORE_STUFFING: "fill-before-stuffing",
}


#: One beat of entropy-coded input: ``n`` valid bytes (1..4), byte 0 in ``data[0:8]``
#: comes first; ``last`` marks the final beat of the scan's data.
InputBeat = data.StructLayout({"data": 32, "n": 3, "last": 1})

#: One byte of a DHT table payload: ``index`` 0..15 are the code counts (in order,
#: index 0 first), 16.. the symbols. ``table`` 0..3 selects a DC table, 4..7 an AC table.
TableWrite = data.StructLayout({"table": 3, "index": 9, "byte": 8})

#: Per-component scan configuration: sampling factors (1 or 2) and table selectors.
ComponentConfig = data.StructLayout({"h": 2, "v": 2, "dc": 2, "ac": 2})

#: Scan configuration, held stable from ``start`` until ``done``.
#: For a one-component scan set ``h = v = 1`` (one block per MCU, T.81 A.2.2);
#: ``mcux``/``mcuy`` count MCUs per row/column; ``restart`` is the DRI value (0 = none).
ScanConfig = data.StructLayout({
    "ncomp": 2,
    "comp": data.ArrayLayout(ComponentConfig, 3),
    "mcux": 16,
    "mcuy": 16,
    "restart": 16,
})

#: One output beat. Each block starts with its DC beat (``first``); every non-zero AC
#: coefficient follows as a beat with its natural-order ``index``; the block's final
#: beat has ``last`` set (an end-of-block beat with ``coef = 0`` when the block ended with
#: EOB or a ZRL reaching position 64). ``count`` on the last beat is the number of
#: coefficient beats of the block (DC included). ``bx``/``by`` is the block's position
#: in the component's MCU-padded block grid.
CoefBeat = data.StructLayout({
    "comp": 2,
    "bx": 16,
    "by": 16,
    "index": 6,
    "value": signed(16),
    "coef": 1,
    "first": 1,
    "last": 1,
    "count": 7,
})


def extend(bits, s):
    """EXTEND (T.81 F.2.2.1, Figure F.12): the signed value of ``s`` extra bits.

    Args:
        bits: Amaranth value holding the ``s`` extra bits right-aligned (16 bits wide).
        s: Amaranth value, 0..15.

    Returns:
        A ``signed(17)`` expression; 0 when ``s`` is 0.
    """
    top = (bits >> (s - 1)[:4])[0]
    neg = bits.as_signed() - ((Const(1, 17) << s) - 1).as_signed()
    return Mux(s == 0, 0, Mux(top, bits, neg))


class Unstuffer(wiring.Component):
    """Byte unstuffing and marker detection, 4 bytes per clock.

    Ports:
        input: entropy-coded bytes (:data:`InputBeat`).
        offer_n / offer_data: data bytes available now (0..4; the first byte in bits
            ``[24:32]`` of ``offer_data``, i.e. left-aligned, MSB first).
        take: the consumer takes all offered bytes this clock (ignored when
            ``offer_n`` is 0).
        seek: drop data bytes instead of offering them, up to the next marker.
        marker_valid / marker: a marker (``FF xx``, ``xx`` not 00/FF) is at the front.
        consume_marker: drop that marker (2 bytes) this clock.
        fill_fault: a stuffed zero that followed fill bytes (``FF FF.. 00``) is at the
            front: it is not offered (a seek drops it). T.81 B.1.1.2 allows fill bytes
            only before markers; ``jdhuff.c``'s slow path reads the sequence as one FF
            data byte, but its fast path (``decode_mcu_fast``, taken when no restart
            interval is set and enough bytes are buffered) reads a marker there, fills
            zero bits and, redoing the MCU on the slow path, keeps coefficients the fast
            pass wrote: which one Pillow's output follows depends on its input buffering.
        at_end: the input has ended and every byte was consumed (a lone trailing FF
            counts as consumed).
        flush: drop everything up to and including the last input beat (draining).
        clear: reset to the empty state (start of a new scan).
    """

    def __init__(self):
        super().__init__({
            "input": In(stream.Signature(InputBeat)),
            "offer_n": Out(3),
            "offer_data": Out(32),
            "take": In(1),
            "seek": In(1),
            "marker_valid": Out(1),
            "marker": Out(8),
            "consume_marker": In(1),
            "fill_fault": Out(1),
            "at_end": Out(1),
            "flush": In(1),
            "clear": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        win = Signal(64)        # up to 8 bytes, byte 0 in win[0:8]
        wn = Signal(4)          # valid bytes in win
        ended = Signal()        # the last input beat was accepted
        after_fill = Signal()   # the last byte dropped was an FF fill byte

        b = [win[8 * j: 8 * j + 8] for j in range(8)]
        ff = [b[j] == 0xFF for j in range(4)]
        # Leading non-FF data bytes among the first min(wn, 4); the last true If wins.
        run = Signal(3)
        for j in range(4):
            with m.If(Cat(*[~ff[i] & (wn > i) for i in range(j + 1)]).all()):
                m.d.comb += run.eq(j + 1)

        consume = Signal(4)     # bytes dropped from the front this clock
        m.d.comb += consume.eq(0)

        front_marker = ff[0] & (wn >= 2) & (b[1] != 0x00) & (b[1] != 0xFF)
        m.d.comb += [
            self.marker_valid.eq(front_marker),
            self.marker.eq(b[1]),
            self.at_end.eq(ended & ((wn == 0) | ((wn == 1) & ff[0]))),
        ]

        # What the front offers: run data bytes, or FF from a stuffed FF 00.
        stuffed = ff[0] & (wn >= 2) & (b[1] == 0x00)
        fill = ff[0] & (wn >= 2) & (b[1] == 0xFF)
        m.d.comb += self.fill_fault.eq(stuffed & after_fill)
        dropped_fill = Signal()
        # Byte 0 to the MSB, bytes past the run cleared.
        swapped = Signal(32)
        # The mask as a shift, not a table of constants: the same function of run, which
        # a simulator computes in a few operations instead of bit by bit.
        m.d.comb += swapped.eq(Cat(b[3], b[2], b[1], b[0]) & ~(Const(0xFFFFFFFF, 32) >> (run * 8)))
        with m.If(run != 0):
            with m.If(~self.seek):
                m.d.comb += [self.offer_n.eq(run), self.offer_data.eq(swapped)]
                with m.If(self.take):
                    m.d.comb += consume.eq(run)
            with m.Else():
                m.d.comb += consume.eq(run)
        with m.Elif(stuffed):
            with m.If(self.seek):
                m.d.comb += consume.eq(2)
            with m.Elif(~after_fill):
                m.d.comb += [self.offer_n.eq(1), self.offer_data.eq(0xFF000000)]
                with m.If(self.take):
                    m.d.comb += consume.eq(2)
        with m.Elif(fill):
            m.d.comb += [consume.eq(1), dropped_fill.eq(1)]
        with m.Elif(front_marker & self.consume_marker):
            m.d.comb += consume.eq(2)

        remaining = Signal(4)
        shifted = Signal(64)
        accept = Signal()
        incoming = Signal(64)
        beat = self.input.payload
        m.d.comb += [
            remaining.eq(wn - consume),
            shifted.eq(win >> (consume * 8)),
            self.input.ready.eq(~ended & (remaining <= 4) & ~self.clear),
            accept.eq(self.input.valid & self.input.ready),
            incoming.eq((beat.data & ~(Const(0xFFFFFFFF, 32) << (beat.n * 8))[:32]) << (remaining * 8)),
        ]
        with m.If(self.clear | self.flush):
            m.d.sync += after_fill.eq(0)
        with m.Elif(consume != 0):
            m.d.sync += after_fill.eq(dropped_fill)
        with m.If(self.clear):
            m.d.sync += [wn.eq(0), ended.eq(0), win.eq(0)]
        with m.Elif(self.flush):
            m.d.sync += [wn.eq(0), win.eq(0), ended.eq(ended | (accept & beat.last))]
        with m.Elif(accept):
            m.d.sync += [win.eq(shifted | incoming), wn.eq(remaining + beat.n), ended.eq(beat.last)]
        with m.Else():
            m.d.sync += [win.eq(shifted), wn.eq(remaining)]
        return m


class HuffmanTables(wiring.Component):
    """Eight Huffman tables (DC 0-3 as 0-3, AC 0-3 as 4-7) with a one-clock lookup.

    Loading: stream the DHT payload of a table (16 counts, then the symbols) through
    ``write``. Per code length l the core keeps the left-aligned limit
    ``lim[l] = (firstcode[l] + count[l]) << (16 - l)`` and the symbol offset
    ``delta[l] = valptr[l] - firstcode[l]`` (T.81 C.2, F.2.2.3 DECODE); the limits never
    decrease with l, so the code length is one more than the number of limits the
    window reaches.

    Lookup (combinational): ``select`` (table 0..7), ``window`` (next 16 bits, MSB first) give
    ``length`` (1..16), ``symbol`` and ``valid`` (a code of at most 16 bits matched).

    Lookahead (combinational, short path): codes of at most 8 bits occupy the prefix
    ``[0, lim[8])`` of the code space, so the next 8 bits index a 256-entry table per
    Huffman table holding the code length, the total shift (length + extra bits) and the
    symbol; ``fast`` says the window starts with such a code. The table is filled while
    the symbols are loaded (``write`` is not ready during the fill, and ``filling`` is
    set until it ends: at most 256 extra clocks per table).

    ``idle``: high in clocks in which no register or memory of the core changes (no
    ``write`` beat offered and no fill running), for a :class:`~dlbooster.hw.gating.ClockGate`:
    the tables are loaded from DHT segments before the scan and only looked up during it.
    """

    def __init__(self):
        super().__init__({
            "write": In(stream.Signature(TableWrite)),
            "select": In(3),
            "window": In(16),
            "length": Out(5),
            "symbol": Out(8),
            "valid": Out(1),
            "filling": Out(1),
            "fast": Out(1),
            "fast_length": Out(4),
            "fast_total": Out(5),
            "fast_symbol": Out(8),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        # One small memory per code length l, word per table: limit (17 bits) and delta
        # (8 bits); the lookup reads all 16 for the selected table at once (LUT RAM).
        limits = []
        for l in range(16):
            mem = Memory(shape=25, depth=8, init=[0] * 8)
            m.submodules[f"length{l + 1}"] = mem
            limits.append((mem.write_port(), mem.read_port(domain="comb")))
        # Symbols: one 256-entry memory per table, all read at once; the (early) table
        # select then picks one, keeping the select off the late index path.
        tables = []
        for t in range(8):
            mem = Memory(shape=8, depth=256, init=[0] * 256)
            m.submodules[f"symbols{t}"] = mem
            tables.append((mem.write_port(), mem.read_port(domain="comb")))

        # Loading: running canonical code and symbol index over the 16 counts.
        code = Signal(18)
        valptr = Signal(9)
        w = self.write.payload
        base = Mux(w.index == 0, 0, code)
        vbase = Mux(w.index == 0, 0, valptr)
        nxt = Signal(18)
        m.d.comb += nxt.eq(base + w.byte)
        for l, (port, _) in enumerate(limits):
            m.d.comb += [
                port.addr.eq(w.table),
                port.data.eq(Cat((nxt << (15 - l))[:17], (vbase - base)[:8])),
                port.en.eq(self.write.valid & self.write.ready & (w.index == l)),
            ]
        with m.If(self.write.valid & self.write.ready & (w.index < 16)):
            m.d.sync += [code.eq(nxt << 1), valptr.eq(vbase + w.byte)]

        # Lookahead fill: walk the symbols' canonical codes (length, code) as they arrive.
        counts = Array([Signal(8, name=f"count{l + 1}") for l in range(16)])
        slen = Signal(5)     # length of the next symbol's code (0: before length 1)
        sleft = Signal(9)    # symbols of that length still to come
        scode = Signal(17)   # code of the next symbol
        fill_base = Signal(8)
        fill_left = Signal(9)
        fill_entry = Signal(17)
        fill_table = Signal(3)
        lookahead = []
        for t in range(8):
            mem = Memory(shape=17, depth=256, init=[0] * 256)
            m.submodules[f"lookahead{t}"] = mem
            lookahead.append((mem.write_port(), mem.read_port(domain="comb")))
        for t, (port, _) in enumerate(lookahead):
            m.d.comb += [
                port.addr.eq(fill_base),
                port.data.eq(fill_entry),
                port.en.eq((fill_left != 0) & (fill_table == t)),
            ]
        m.d.comb += [self.filling.eq(fill_left != 0), self.idle.eq(~self.write.valid & (fill_left == 0))]
        is_symbol = (w.index >= 16) & (w.index < 16 + 256)
        spare = Signal(3)  # 8 - code length: the code covers 2**spare lookahead entries
        m.d.comb += spare.eq(8 - slen)
        with m.If(fill_left != 0):
            m.d.sync += [fill_base.eq(fill_base + 1), fill_left.eq(fill_left - 1)]
        with m.Elif(self.write.valid & (w.index < 16)):
            m.d.comb += self.write.ready.eq(1)
            m.d.sync += counts[w.index[:4]].eq(w.byte)
            with m.If(w.index == 0):
                m.d.sync += [slen.eq(0), sleft.eq(0), scode.eq(0)]
        with m.Elif(self.write.valid & is_symbol & (sleft == 0) & (slen < 16)):
            m.d.sync += [slen.eq(slen + 1), sleft.eq(counts[slen[:4]]), scode.eq(scode << 1)]
        with m.Elif(self.write.valid):
            m.d.comb += self.write.ready.eq(1)
            with m.If(is_symbol & (sleft != 0)):
                m.d.sync += [scode.eq(scode + 1), sleft.eq(sleft - 1)]
                with m.If(slen <= 8):
                    m.d.sync += [
                        fill_table.eq(w.table),
                        fill_base.eq((scode << spare)[:8]),
                        fill_left.eq(Const(1, 9) << spare),
                        fill_entry.eq(Cat(slen[:4], (slen + w.byte[:4])[:5], w.byte)),
                    ]
        for t, (wr, _) in enumerate(tables):
            m.d.comb += [
                wr.en.eq(self.write.valid & self.write.ready & (w.table == t) & is_symbol),
                wr.addr.eq((w.index - 16)[:8]),
                wr.data.eq(w.byte),
            ]

        # Lookup.
        ge = Signal(16)
        for l, (_, port) in enumerate(limits):
            # A limit of length l + 1 is a code shifted left by 15 - l: its low bits are
            # zero, so only the window's first l + 1 bits take part in the compare.
            m.d.comb += [port.addr.eq(self.select),
                         ge[l].eq(self.window[15 - l:] >= port.data[15 - l:17])]
        # The code length is the first l whose limit the window is below. One-hot, so that
        # length and symbol index are AND-OR trees rather than a 16-deep priority chain.
        first = Signal(16)
        m.d.comb += [first[l].eq(~ge[l] & (ge[:l].all() if l else 1)) for l in range(16)]
        length = Signal(5)
        index = Signal(8)
        # Each length bit an OR of the one-hot bits of the lengths that have it (17 when
        # every limit is reached), written bit by bit: Yosys then has no shared OR cells to
        # regroup into wires assigned in pieces, which a simulator must evaluate every
        # clock; as whole wires they are evaluated only when a long code is registered
        # (sim/netlist/sink.py). The same function as OR-ing ``first[l] ? l + 1 : 0``.
        m.d.comb += [length[b].eq(Cat(*(first[l] for l in range(16) if (l + 1) >> b & 1),
                                      *((ge.all(),) if 17 >> b & 1 else ())).any())
                     for b in range(5)]
        m.d.comb += index.eq(reduce(operator.or_, (Mux(first[l], (self.window[15 - l:] + port.data[17:])[:8], 0)
                                                  for l, (_, port) in enumerate(limits))))
        m.d.comb += [rd.addr.eq(index) for _, rd in tables]
        m.d.comb += [rd.addr.eq(self.window[8:]) for _, rd in lookahead]
        entry = Signal(17)
        m.d.comb += [
            entry.eq(Array([rd.data for _, rd in lookahead])[self.select]),
            # ~ge[7], compared on its own: ``fast`` is needed in every clock, the
            # comparators only for a long code.
            self.fast.eq(self.window[8:] < limits[7][1].data[8:17]),
            self.fast_length.eq(entry[:4]),
            self.fast_total.eq(entry[4:9]),
            self.fast_symbol.eq(entry[9:]),
        ]
        m.d.comb += [
            self.symbol.eq(Array([rd.data for _, rd in tables])[self.select]),
            self.length.eq(length),
            self.valid.eq(length <= 16),
        ]
        return m


class EntropyDecoder(wiring.Component):
    """Huffman decoder of one interleaved baseline scan, one symbol per clock.

    Usage: load the tables through ``tables``, set ``scan`` (:data:`ScanConfig`),
    pulse ``start``, stream the entropy-coded bytes (from the byte after the SOS header
    up to and including the marker that ends the scan, or to the end of the file) into
    ``input`` with ``last`` on the final beat, and take coefficient beats from
    ``coef``. ``done`` pulses when the core is idle again with ``status`` valid; the core
    has then consumed all input up to ``last`` (also after a fault), so the next scan
    starts cleanly.

    Args:
        tables_gate: a :class:`~dlbooster.hw.gating.ClockGate` the :class:`HuffmanTables`
            run behind (its owner adds it, opened by ``~tables_idle``: the tables change
            only while they are loaded); None runs them in ``sync``.

    Ports:
        scan, start, busy, done, status, symbols (Huffman symbols decoded, DC and AC
        including EOB/ZRL), tables (:data:`TableWrite` stream), input
        (:data:`InputBeat` stream), coef (:data:`CoefBeat` stream), tables_idle (the
        tables' ``idle``).

    Throughput: one symbol per clock for codes of up to 8 bits (the lookahead table of
    :class:`HuffmanTables`), two for longer codes, while the bit buffer holds the
    symbol's code and extra bits and ``coef`` is ready; the buffer refills 4 bytes per
    clock. 0.985 symbols per clock on the ImageNet sample photos (docs/benchmarks.md).

    Pipeline: the loop through the bit buffer (lookahead read, total shift, shift) runs in
    one clock; long codes are looked up by the comparators into a register first; the
    symbol's value (extra bits, EXTEND, DC prediction) is computed in a second stage, and
    the beat is registered in a third. Fault decisions do not gate the buffer's shift.
    """

    def __init__(self, tables_gate: ClockGate | None = None):
        self.tables_gate = tables_gate
        super().__init__({
            "scan": In(ScanConfig),
            "start": In(1),
            "busy": Out(1),
            "done": Out(1),
            "status": Out(3),
            "symbols": Out(32),
            "tables": In(stream.Signature(TableWrite)),
            "input": In(stream.Signature(InputBeat)),
            "coef": Out(stream.Signature(CoefBeat)),
            "tables_idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.unstuff = us = Unstuffer()
        hf = HuffmanTables()
        m.submodules.huff = self.tables_gate.wrap(hf) if self.tables_gate else hf
        m.d.comb += [
            hf.write.valid.eq(self.tables.valid),
            hf.write.payload.eq(self.tables.payload),
            self.tables.ready.eq(hf.write.ready),
            self.tables_idle.eq(hf.idle),
        ]
        wiring.connect(m, wiring.flipped(self.input), us.input)

        cfg = self.scan
        buf = Signal(64)             # left-aligned: next bit is buf[63]
        cnt = Signal(7)              # valid bits in buf
        k = Signal(7)                # next coefficient position in zigzag order
        comp = Signal(2)
        bxi = Signal(1)
        byi = Signal(1)
        mcu_x = Signal(16)
        mcu_y = Signal(16)
        rst_count = Signal(16)
        next_rst = Signal(3)
        pred = Array([Signal(32, name=f"pred{c}") for c in range(3)])
        ncoef = Signal(7)
        status = Signal(3)

        # The table of the next symbol, registered so that the table memories are read
        # from a flip-flop rather than from the block bookkeeping.
        select = Signal(3)
        ccfg = cfg.comp[comp]
        h2 = ccfg.h == 2
        v2 = ccfg.v == 2
        is_dc = k == 0

        window = buf[32:]
        m.d.comb += [
            hf.select.eq(select),
            hf.window.eq(window[16:]),
        ]
        # Codes of up to 8 bits come from the lookahead table in the same clock; a
        # longer code is looked up by the comparators and registered first ("slow"),
        # then consumed in the next clock, so the comparators stay off the loop.
        # A long code's total (code + extra bits) is added from the registered length and
        # symbol, in parallel with the lookahead read, not after the symbol memory.
        slow = Signal(data.StructLayout({"valid": 1, "ok": 1, "length": 5, "symbol": 8}))
        fast = hf.fast
        length = Signal(5)
        sym = Signal(8)
        need = Signal(6)
        m.d.comb += [
            length.eq(Mux(fast, hf.fast_length, slow.length)),
            sym.eq(Mux(fast, hf.fast_symbol, slow.symbol)),
            need.eq(Mux(fast, hf.fast_total, slow.length + slow.symbol[:4])),
        ]
        size = sym[:4]
        run = Mux(is_dc, 0, sym[4:])

        # Stage 2 register: a decoded symbol waiting for its value (extra bits, EXTEND,
        # DC prediction), computed off the bit-buffer loop (T.81 F.2.2.1).
        r1 = Signal(data.StructLayout({
            "valid": 1, "after": 16, "size": 4, "dc": 1, "coef": 1, "last": 1,
            "comp": 2, "bx": 16, "by": 16, "index": 6, "count": 7,
        }))
        out_free = ~self.coef.valid | self.coef.ready
        r1_free = ~r1.valid | out_free
        value = Signal(signed(17))
        unused = Signal(5)
        m.d.comb += [
            unused.eq(16 - r1.size),
            value.eq(extend(r1.after >> unused, r1.size)),
        ]
        beat = self.coef.payload
        with m.If(self.coef.ready):
            m.d.sync += self.coef.valid.eq(0)
        with m.If(r1.valid & out_free):
            total = pred[r1.comp] + value
            with m.If(r1.dc):
                m.d.sync += pred[r1.comp].eq(total)
            m.d.sync += [
                self.coef.valid.eq(1),
                beat.comp.eq(r1.comp), beat.bx.eq(r1.bx), beat.by.eq(r1.by),
                beat.index.eq(r1.index), beat.coef.eq(r1.coef), beat.first.eq(r1.dc),
                beat.last.eq(r1.last), beat.count.eq(r1.count),
                beat.value.eq(Mux(~r1.coef, 0, Mux(r1.dc, total[:16], value[:16]))),
                r1.valid.eq(0),
            ]

        stopped = us.marker_valid | us.at_end | us.fill_fault
        # Nothing is decoded while the last table's lookahead is still being filled.
        found = ~hf.filling & (fast | (slow.valid & slow.ok))
        have_bits = found & (need <= cnt)
        no_code = ~hf.filling & ~fast & slow.valid & ~slow.ok
        starved = found & (need > cnt) & stopped

        # Bit buffer refill: all four offered bytes fit when cnt <= 32 (deciding on the
        # pre-consumption count keeps the lookup off the path to the input's ready).
        # They are placed behind the buffer's cnt valid bits (bits below are zero), and the
        # whole buffer then shifts by the consumed bits: the same as shifting the refill
        # by cnt - consumed, but the only shift after the lookup is the one by ``need``
        # (the refill's shift by ``cnt`` starts from a register).
        decode = Signal()            # a symbol is consumed this clock
        consumed = Signal(6)
        take = Signal()
        refill = Signal(64)
        m.d.comb += refill.eq(Cat(Const(0, 32), us.offer_data) >> cnt)

        # Block/MCU bookkeeping on a block's end.
        block_done = Signal()
        last_block_in_mcu = (comp == cfg.ncomp - 1) & (bxi == h2) & (byi == v2)
        last_mcu = (mcu_x == cfg.mcux - 1) & (mcu_y == cfg.mcuy - 1)
        restart_due = (cfg.restart != 0) & (rst_count + 1 == cfg.restart)

        kk = Signal(7)
        m.d.comb += kk.eq(k + run)
        natural = Array([Const(n, 6) for n in _ZIGZAG])

        symbols = Signal(32)
        m.d.comb += [self.symbols.eq(symbols), self.status.eq(status)]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += us.clear.eq(1)
                with m.If(self.start):
                    m.d.sync += [
                        buf.eq(0), cnt.eq(0), k.eq(0), comp.eq(0), bxi.eq(0), byi.eq(0),
                        mcu_x.eq(0), mcu_y.eq(0), rst_count.eq(0), next_rst.eq(0),
                        ncoef.eq(0), status.eq(Status.OK), symbols.eq(0),
                        pred[0].eq(0), pred[1].eq(0), pred[2].eq(0),
                        select.eq(Cat(cfg.comp[0].dc, Const(0, 1))), slow.valid.eq(0),
                    ]
                    m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += self.busy.eq(1)
                fault = Signal(3)
                with m.If(no_code):
                    m.d.comb += fault.eq(Status.BAD_CODE)
                with m.Elif(starved):
                    m.d.comb += fault.eq(Mux(us.fill_fault, Status.FILL_BEFORE_STUFFING,
                                             Mux(us.marker_valid & (us.marker[3:] == 0b11010),
                                                 Status.UNEXPECTED_MARKER, Status.TRUNCATED)))
                with m.Elif(have_bits & ~is_dc & (size != 0) & (kk > 63)):
                    m.d.comb += fault.eq(Status.COEF_OVERFLOW)
                with m.Elif(have_bits & ~is_dc & (size == 0) & (run == 15) & (k + 16 > 64)):
                    m.d.comb += fault.eq(Status.COEF_OVERFLOW)
                with m.If(fault != 0):
                    m.d.sync += status.eq(fault)
                    m.next = "DRAIN"
                # The bit buffer moves on whatever the fault decision (a faulty scan is
                # drained), keeping that decision off the loop; the rest waits for it.
                with m.If(have_bits & r1_free):
                    m.d.comb += [consumed.eq(need), decode.eq(1)]
                    m.d.sync += slow.valid.eq(0)
                with m.Elif(~hf.filling & ~fast & ~slow.valid & ((cnt >= 16) | stopped)):
                    m.d.sync += [slow.valid.eq(1), slow.ok.eq(hf.valid), slow.length.eq(hf.length),
                                 slow.symbol.eq(hf.symbol)]
                with m.If(decode & (fault == 0)):
                    m.d.sync += [
                        symbols.eq(symbols + 1),
                        r1.after.eq((window << length)[16:32]), r1.size.eq(size),
                        r1.dc.eq(is_dc), r1.comp.eq(comp),
                    ]
                    with m.If(is_dc):
                        # A block's position, with its first symbol (the DC): the AC
                        # symbols after it keep it.
                        m.d.sync += [r1.valid.eq(1), r1.coef.eq(1), r1.last.eq(0),
                                     r1.index.eq(0), k.eq(1), ncoef.eq(1),
                                     r1.bx.eq((mcu_x << h2) | bxi), r1.by.eq((mcu_y << v2) | byi)]
                    with m.Elif(size != 0):
                        m.d.sync += [
                            r1.valid.eq(1), r1.coef.eq(1), r1.last.eq(kk == 63),
                            r1.index.eq(natural[kk[:6]]), r1.count.eq(ncoef + 1),
                            k.eq(kk + 1), ncoef.eq(ncoef + 1),
                        ]
                        m.d.comb += block_done.eq(kk == 63)
                    with m.Elif(run == 15):
                        m.d.sync += k.eq(k + 16)
                        with m.If(k + 16 == 64):
                            m.d.sync += [r1.valid.eq(1), r1.coef.eq(0), r1.last.eq(1),
                                         r1.index.eq(0), r1.count.eq(ncoef)]
                            m.d.comb += block_done.eq(1)
                    with m.Else():  # EOB (libjpeg treats any run with size 0 but ZRL as EOB)
                        m.d.sync += [r1.valid.eq(1), r1.coef.eq(0), r1.last.eq(1),
                                     r1.index.eq(0), r1.count.eq(ncoef)]
                        m.d.comb += block_done.eq(1)
                next_comp = Signal(2)
                m.d.comb += next_comp.eq(comp)
                with m.If(block_done):
                    m.d.sync += k.eq(0)
                    with m.If(bxi != h2):
                        m.d.sync += bxi.eq(1)
                    with m.Elif(byi != v2):
                        m.d.sync += [bxi.eq(0), byi.eq(1)]
                    with m.Elif(comp != cfg.ncomp - 1):
                        m.d.sync += [bxi.eq(0), byi.eq(0)]
                        m.d.comb += next_comp.eq(comp + 1)
                    with m.Else():
                        m.d.sync += [bxi.eq(0), byi.eq(0)]
                        m.d.comb += next_comp.eq(0)
                    m.d.sync += [comp.eq(next_comp),
                                 select.eq(Cat(cfg.comp[next_comp].dc, Const(0, 1)))]
                with m.Elif(decode):
                    m.d.sync += select.eq(Cat(ccfg.ac, Const(1, 1)))
                with m.If(block_done & last_block_in_mcu):
                    with m.If(last_mcu):
                        m.next = "TAIL"
                    with m.Else():
                        with m.If(mcu_x == cfg.mcux - 1):
                            m.d.sync += [mcu_x.eq(0), mcu_y.eq(mcu_y + 1)]
                        with m.Else():
                            m.d.sync += mcu_x.eq(mcu_x + 1)
                        m.d.sync += rst_count.eq(Mux(restart_due, 0, rst_count + 1))
                        with m.If(restart_due):
                            m.next = "RESTART"
                # Refill from the unstuffer. Not gated by the fault decision (a faulty scan
                # is drained anyway), so the symbol lookup stays off the unstuffer's path.
                with m.If((cnt <= 32) & (us.offer_n != 0)):
                    m.d.comb += [take.eq(1), us.take.eq(1)]
                # Shifted by ``need`` whether or not the symbol is consumed, so that the
                # shifter works while the bits-available compare decides.
                merged = buf | Mux(take, refill, 0)
                m.d.sync += [
                    buf.eq(Mux(decode, merged << need, merged)),
                    cnt.eq(cnt - consumed + Mux(take, us.offer_n * 8, 0)),
                ]
            with m.State("RESTART"):
                # T.81 F.2.2.5 / jdhuff.c process_restart: drop buffered bits, skip to
                # the next marker, which must be the expected RSTn. The predictors are
                # reset once the symbols before the marker have left stage 2.
                m.d.comb += [self.busy.eq(1), us.seek.eq(1)]
                m.d.sync += [buf.eq(0), cnt.eq(0)]
                with m.If(~r1.valid & us.marker_valid):
                    with m.If(us.marker == 0xD0 + next_rst):
                        m.d.comb += us.consume_marker.eq(1)
                        m.d.sync += [next_rst.eq(next_rst + 1),
                                     pred[0].eq(0), pred[1].eq(0), pred[2].eq(0)]
                        m.next = "RUN"
                    with m.Else():
                        m.d.sync += status.eq(Status.BAD_RESTART)
                        m.next = "DRAIN"
                with m.Elif(~r1.valid & us.at_end):
                    m.d.sync += status.eq(Status.BAD_RESTART)
                    m.next = "DRAIN"
            with m.State("TAIL"):
                # After the last MCU: skip leftover bits, padding and RSTn markers up to
                # EOI, the only ending jpeg.classify accepts (libjpeg reads any
                # marker there, and a DHT or second SOS would change Pillow's result).
                m.d.comb += [self.busy.eq(1), us.seek.eq(1)]
                m.d.sync += [buf.eq(0), cnt.eq(0)]
                with m.If(us.marker_valid):
                    with m.If(us.marker[3:] == 0b11010):
                        m.d.comb += us.consume_marker.eq(1)
                    with m.Else():
                        with m.If(us.marker != 0xD9):
                            m.d.sync += status.eq(Status.AFTER_SCAN)
                        m.next = "DRAIN"
                with m.Elif(us.at_end):
                    m.d.sync += status.eq(Status.AFTER_SCAN)
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.comb += [self.busy.eq(1), us.flush.eq(1)]
                with m.If(us.at_end & ~r1.valid & out_free):
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += [self.done.eq(1), us.clear.eq(1)]
                m.next = "IDLE"
        return m


def scan_program(info) -> tuple[dict, list[dict], int, int]:
    """What a loader writes into the core for the first scan of a parsed JPEG.

    Args:
        info: :class:`dlbooster.jpeg.JpegInfo` of a hardware-decodable file.

    Returns:
        ``(config, table_writes, start, end)``: the :data:`ScanConfig` value as a dict,
        the :data:`TableWrite` beats as dicts (tables the scan uses, DC then AC), and the
        byte range ``[start, end)`` of the input to stream: the entropy-coded segment
        and the marker that ends it.
    """
    frame, scan = info.frame, info.scans[0]
    hmax, vmax = frame.hmax, frame.vmax
    comps = []
    for index, td, ta in scan.components:
        c = frame.components[index]
        h, v = (c.h, c.v) if len(scan.components) > 1 else (1, 1)
        comps.append({"h": h, "v": v, "dc": td, "ac": ta})
    comps += [{"h": 1, "v": 1, "dc": 0, "ac": 0}] * (3 - len(comps))
    if len(scan.components) > 1:
        mcux, mcuy = -(-frame.width // (8 * hmax)), -(-frame.height // (8 * vmax))
    else:
        c = frame.components[scan.components[0][0]]
        mcux = -(-(-(-frame.width * c.h // hmax)) // 8)
        mcuy = -(-(-(-frame.height * c.v // vmax)) // 8)
    config = {"ncomp": len(scan.components), "comp": comps, "mcux": mcux, "mcuy": mcuy,
              "restart": scan.restart_interval}
    writes = []
    for slot, tables, base in ((2, scan.dc_tables, 0), (3, scan.ac_tables, 4)):
        for t in sorted({c[slot - 1] for c in scan.components}):
            table = tables[t]
            payload = bytes(table.counts) + table.symbols
            writes += [{"table": base + t, "index": i, "byte": b} for i, b in enumerate(payload)]
    end = min(scan.data_end + 2, info.size)
    return config, writes, scan.data_start, end
