"""DQT segment parser: quantisation tables into a memory, in natural order.

:class:`DqtParser` reads a DQT segment's tables (T.81 B.2.4.1): each a ``Pq``/``Tq``
byte (``Pq`` 0: 8-bit entries, 1: 16-bit, high byte first; ``Tq`` 0..3) and 64 entries
in zigzag order, which it writes to a 4 x 64-entry memory in natural (row-major) order,
one entry per clock it is given a byte. It keeps which tables the file defined and which
hold an entry above 32767 (libjpeg-turbo's ``jdmarker.c`` rejects those). The header
parser reads the memory to copy the scan components' tables into the IDCT.
"""

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .markers import HeaderStatus, SegmentBytes
from .t81 import ZIGZAG

__all__ = ["DqtParser"]


class DqtParser(wiring.Component):
    """DQT segments (see the module docstring).

    Ports:
        segment: :data:`~dlbooster.hw.markers.SegmentBytes` of DQT segments.
        defined: bit ``Tq`` (4 bits): table ``Tq`` was loaded in this file.
        bad: bit ``Tq`` (4 bits): its last load held an entry above 32767.
        read_addr: the entry to read, 8 bits: ``Cat(index, Tq)``, ``index`` 0..63 in
            natural order.
        read_en: read ``read_addr`` in this clock.
        read_data: the entry (16 bits, unsigned) read at the last clock with ``read_en``.

    ``defined`` and ``bad`` are cleared as a file begins (``segment.first``); the memory
    keeps the last file's tables. A ``Pq`` above 1 or ``Tq`` above 3, or a segment that
    ends inside a table, is malformed.
    """

    def __init__(self):
        super().__init__({
            "segment": In(SegmentBytes),
            "defined": Out(4),
            "bad": Out(4),
            "read_addr": In(8),
            "read_en": In(1),
            "read_data": Out(16),
        })

    def elaborate(self, platform):
        m = Module()
        seg = self.segment
        byte, k = seg.byte, seg.index
        seg_byte = seg.valid & seg.more

        m.submodules.mem = mem = Memory(shape=16, depth=256, init=[])
        write = mem.write_port()
        read = mem.read_port(transparent_for=())
        m.d.comb += [read.addr.eq(self.read_addr), read.en.eq(self.read_en),
                     self.read_data.eq(read.data)]
        zigzag = Array(Const(int(z), 6) for z in ZIGZAG)

        wide = Signal()              # 16-bit entries
        tq = Signal(2)               # table being loaded
        hi = Signal(8)               # a 16-bit entry's first byte

        def fail():
            m.d.comb += [seg.fail.eq(1), seg.status.eq(HeaderStatus.MALFORMED)]

        with m.If(seg.first):
            m.d.sync += [self.defined.eq(0), self.bad.eq(0)]
        with m.If(seg.active):
            # A fault returns the parser to TABLE too, where the next segment begins.
            with m.FSM():
                with m.State("TABLE"):      # a table's Pq/Tq byte, or the segment's end
                    with m.If(~seg.more):
                        m.d.comb += seg.done.eq(1)
                    with m.If(seg_byte):
                        m.d.comb += [seg.take.eq(1), seg.rewind.eq(1)]
                        with m.If((byte[4:8] > 1) | (byte[0:4] > 3)):
                            fail()
                        with m.Else():
                            m.d.sync += [wide.eq(byte[4]), tq.eq(byte[0:2]),
                                         self.bad.bit_select(byte[0:2], 1).eq(0)]
                            m.next = "VALUES"
                    with m.Elif(seg.end & seg.more):
                        fail()
                with m.State("VALUES"):
                    value = Mux(wide, Cat(byte, hi), byte)
                    with m.If(seg_byte):
                        m.d.comb += seg.take.eq(1)
                        with m.If(wide & ~k[0]):
                            m.d.sync += hi.eq(byte)
                        with m.Else():
                            index = Mux(wide, k[1:7], k[0:6])
                            m.d.comb += [write.en.eq(1), write.addr.eq(Cat(zigzag[index], tq)),
                                         write.data.eq(value)]
                            with m.If(value > 32767):
                                m.d.sync += self.bad.bit_select(tq, 1).eq(1)
                            with m.If(index == 63):
                                m.d.sync += self.defined.bit_select(tq, 1).eq(1)
                                m.next = "TABLE"
                    with m.Elif(seg.valid | seg.end):
                        fail()
                        m.next = "TABLE"
        return m
