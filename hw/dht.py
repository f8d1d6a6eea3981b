"""DHT segment parser: Huffman table payloads streamed to the entropy decoder.

:class:`DhtParser` reads a DHT segment's tables (T.81 B.2.4.2): each a ``Tc``/``Th``
byte (``Tc`` 0: DC, 1: AC; ``Th`` 0..3), 16 code counts and as many symbols as they
add up to, and passes each count and symbol on as a :data:`~dlbooster.hw.entropy.TableWrite`
as the entropy decoder takes it. It checks the counts as libjpeg-turbo's ``jdhuff.c``
does (every code must fit its length and not be all ones; DC symbols at most 15) and
keeps which tables the file defined and which of them are bad.
"""

from amaranth import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .entropy import TableWrite
from .markers import HeaderStatus, SegmentBytes

__all__ = ["DhtParser"]


class DhtParser(wiring.Component):
    """DHT segments (see the module docstring).

    Ports:
        segment: :data:`~dlbooster.hw.markers.SegmentBytes` of DHT segments.
        tables: :data:`~dlbooster.hw.entropy.TableWrite` stream: table ``Tc * 4 + Th``,
            index 0..15 the counts, 16.. the symbols. A byte is consumed when it is taken.
        defined: bit ``Tc * 4 + Th`` (8 bits): that table was loaded in this file.
        bad: bit ``Tc * 4 + Th`` (8 bits): its last load overflowed the code space or held
            a DC symbol above 15.

    ``defined`` and ``bad`` are cleared as a file begins (``segment.first``). A ``Tc``
    above 1 or ``Th`` above 3, counts adding up to more than 256, or a segment that ends
    inside a table, is malformed.
    """

    def __init__(self):
        super().__init__({
            "segment": In(SegmentBytes),
            "tables": Out(stream.Signature(TableWrite)),
            "defined": Out(8),
            "bad": Out(8),
        })

    def elaborate(self, platform):
        m = Module()
        seg = self.segment
        byte, k = seg.byte, seg.index
        seg_byte = seg.valid & seg.more

        sel = Signal(3)              # table being loaded: Tc * 4 + Th
        total = Signal(9)            # the counts' sum, then the symbols still to come
        # Code space left at the current length: 2 ** length minus its first free code; the
        # next length has twice what this one's codes leave. Kept instead of the first free
        # code, so that the check compares a count with a register, not a sum with a power
        # of two decoded from the index (that was the parser's critical path on ECP5).
        space = Signal(17)

        def fail():
            m.d.comb += [seg.fail.eq(1), seg.status.eq(HeaderStatus.MALFORMED)]

        def write():
            m.d.comb += [self.tables.valid.eq(1), self.tables.payload.table.eq(sel),
                         self.tables.payload.index.eq(k), self.tables.payload.byte.eq(byte)]

        with m.If(seg.first):
            m.d.sync += [self.defined.eq(0), self.bad.eq(0)]
        with m.If(seg.active):
            # A fault returns the parser to TABLE too, where the next segment begins.
            with m.FSM():
                with m.State("TABLE"):      # a table's Tc/Th byte, or the segment's end
                    with m.If(~seg.more):
                        m.d.comb += seg.done.eq(1)
                    with m.If(seg_byte):
                        m.d.comb += [seg.take.eq(1), seg.rewind.eq(1)]
                        with m.If((byte[4:8] > 1) | (byte[0:4] > 3)):
                            fail()
                        with m.Else():
                            table = Cat(byte[0:2], byte[4])
                            m.d.sync += [sel.eq(table), total.eq(0), space.eq(2),
                                         self.bad.bit_select(table, 1).eq(0)]
                            m.next = "COUNTS"
                    with m.Elif(seg.end & seg.more):
                        fail()
                with m.State("COUNTS"):
                    with m.If(seg_byte):
                        write()
                        with m.If(self.tables.ready):
                            m.d.comb += seg.take.eq(1)
                            grown_total = total + byte
                            m.d.sync += [total.eq(grown_total), space.eq((space - byte) << 1)]
                            # jdhuff.c: every code must fit its length and not be all ones
                            # (after a bad count, space is meaningless and bad stays set).
                            with m.If(byte >= space):
                                m.d.sync += self.bad.bit_select(sel, 1).eq(1)
                            with m.If(k == 15):
                                with m.If(grown_total > 256):
                                    fail()
                                    m.next = "TABLE"
                                with m.Elif(grown_total == 0):
                                    m.d.sync += self.defined.bit_select(sel, 1).eq(1)
                                    m.next = "TABLE"
                                with m.Else():
                                    m.next = "SYMBOLS"
                    with m.Elif(seg.valid | seg.end):
                        fail()
                        m.next = "TABLE"
                with m.State("SYMBOLS"):
                    with m.If(seg_byte):
                        write()
                        with m.If(self.tables.ready):
                            m.d.comb += seg.take.eq(1)
                            m.d.sync += total.eq(total - 1)
                            with m.If(~sel[2] & (byte > 15)):
                                m.d.sync += self.bad.bit_select(sel, 1).eq(1)
                            with m.If(total == 1):
                                m.d.sync += self.defined.bit_select(sel, 1).eq(1)
                                m.next = "TABLE"
                    with m.Elif(seg.valid | seg.end):
                        fail()
                        m.next = "TABLE"
        return m
