"""DRI and SOS segment parser: the restart interval and the scan's Huffman tables.

:class:`ScanParser` reads a DRI segment's restart interval (T.81 B.2.4.4) and the first
SOS segment's header (B.2.3): ``Ns``, then per component its selector and DC/AC table
selectors, then ``Ss``, ``Se``, ``Ah``/``Al`` (which a baseline scan fixes, and the
lane ignores). The scan must hold every component of the frame, in the frame's order.
"""

from amaranth import Array, Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .markers import HeaderStatus, SegmentBytes
from .sof import FrameHeader

__all__ = ["ScanParser"]


class ScanParser(wiring.Component):
    """DRI and SOS segments (see the module docstring).

    Ports:
        dri, sos: :data:`~dlbooster.hw.markers.SegmentBytes` of DRI and SOS segments.
        frame: the frame header (:data:`~dlbooster.hw.sof.FrameHeader`): a scan before
            it is malformed.
        restart: the restart interval (16 bits, MCUs; 0: none).
        dc, ac: per frame component 0..2 its DC and AC Huffman table (2 bits each).

    ``restart`` is cleared as a file begins (``dri.first``): it is part of the scan
    configuration the entropy decoder reads until the last file's scan is done. It fails
    with :class:`~dlbooster.hw.markers.HeaderStatus` ``NON_INTERLEAVED`` for a scan of
    fewer components than the frame, ``MALFORMED`` for a length that does not match
    ``Ns``, components out of the frame's order, a table selector above 3, or a segment
    cut short.
    """

    def __init__(self):
        super().__init__({
            "dri": In(SegmentBytes),
            "sos": In(SegmentBytes),
            "frame": In(FrameHeader),
            "restart": Out(16),
            "dc": Out(2).array(3),
            "ac": Out(2).array(3),
        })

    def elaborate(self, platform):
        m = Module()
        dri, sos, frame = self.dri, self.sos, self.frame

        with m.If(dri.first):
            m.d.sync += self.restart.eq(0)
        with m.If(dri.active):
            with m.If(~dri.more):
                m.d.comb += dri.done.eq(1)
            with m.If(dri.valid & dri.more):
                m.d.comb += dri.take.eq(1)
                m.d.sync += self.restart.eq(Cat(dri.byte, self.restart[:8]))
            with m.Elif(dri.end & dri.more):
                m.d.comb += [dri.fail.eq(1), dri.status.eq(HeaderStatus.MALFORMED)]

        byte, k = sos.byte, sos.index
        comp_id, comp_dc, comp_ac = Array(frame.id), Array(self.dc), Array(self.ac)
        todo = Signal(9)             # component selector and table bytes still to come
        comp = Signal(2)             # component of the next such byte

        def fail(code):
            m.d.comb += [sos.fail.eq(1), sos.status.eq(code)]

        with m.If(sos.active):
            with m.If(~frame.valid):
                fail(HeaderStatus.MALFORMED)
            with m.Elif(sos.valid & sos.more):
                m.d.comb += sos.take.eq(1)
                with m.If(k == 0):
                    m.d.sync += [todo.eq(byte << 1), comp.eq(0)]
                    with m.If((sos.remaining - 1) != 3 + 2 * byte):
                        fail(HeaderStatus.MALFORMED)
                    with m.Elif(byte != frame.nf):
                        fail(HeaderStatus.NON_INTERLEAVED)
                with m.Elif(todo != 0):
                    # Counters, not k <= 2 * Ns and (k - 1) >> 1: both were on the
                    # parser's critical path.
                    m.d.sync += todo.eq(todo - 1)
                    with m.If(k[0]):
                        with m.If(byte != comp_id[comp]):
                            fail(HeaderStatus.MALFORMED)   # not the frame's order
                    with m.Else():
                        m.d.sync += [comp_dc[comp].eq(byte[4:6]), comp_ac[comp].eq(byte[0:2]),
                                     comp.eq(comp + 1)]
                        with m.If((byte[4:8] > 3) | (byte[0:4] > 3)):
                            fail(HeaderStatus.MALFORMED)
            with m.Elif(~sos.more):
                m.d.comb += sos.done.eq(1)
            with m.Elif(sos.end):
                fail(HeaderStatus.MALFORMED)
        return m
