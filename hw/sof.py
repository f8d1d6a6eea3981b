"""SOF0/SOF1 segment parser: the frame header.

:class:`SofParser` reads a baseline or extended sequential frame header (T.81 B.2.2):
precision, height, width, ``Nf`` and, per component, its id, sampling factors and
quantisation table, and checks what the lane's profile needs of it as it reads (8-bit
samples, 1 or 3 components, a length that matches ``Nf``). The header parser judges
the rest (sampling, size, colour space) once the scan header is read too.
"""

from amaranth import Array, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .markers import HeaderStatus, SegmentBytes

__all__ = ["FrameHeader", "SofParser"]

#: The frame header as :class:`SofParser` read it: ``valid`` once a SOF segment of this
#: file ended (then the fields hold it); ``width``, ``height`` (16 bits, pixels), ``nf``
#: (8 bits, components); per component 0..2 (those below ``nf``) its ``id`` (8 bits),
#: ``h``, ``v`` (4 bits, sampling factors) and ``tq`` (2 bits, quantisation table).
FrameHeader = wiring.Signature({
    "valid": Out(1),
    "width": Out(16), "height": Out(16), "nf": Out(8),
    "id": Out(8).array(3), "h": Out(4).array(3), "v": Out(4).array(3), "tq": Out(2).array(3),
})


class SofParser(wiring.Component):
    """SOF0/SOF1 segments (see the module docstring).

    Ports:
        segment: :data:`~dlbooster.hw.markers.SegmentBytes` of SOF0 and SOF1 segments.
        frame: :data:`FrameHeader`.

    ``frame.valid`` is cleared as a file begins (``segment.first``); the fields keep the
    last file's frame (the entropy decoder reads its scan configuration until the scan is
    done). It fails with :class:`~dlbooster.hw.markers.HeaderStatus` ``MALFORMED`` for a
    length that does not match ``Nf``, a ``Tq`` above 3 or a segment cut short,
    ``PRECISION`` for samples not of 8 bits, ``COMPONENTS`` for an ``Nf`` not 1 or 3.
    """

    def __init__(self):
        super().__init__({
            "segment": In(SegmentBytes),
            "frame": Out(FrameHeader),
        })

    def elaborate(self, platform):
        m = Module()
        seg, frame = self.segment, self.frame
        byte, k = seg.byte, seg.index
        comp_id, comp_h, comp_v, comp_tq = (Array(frame.id), Array(frame.h), Array(frame.v),
                                            Array(frame.tq))
        eight_bit = Signal()         # the precision byte is 8: nothing else of it is needed
        comp = Signal(2)             # component of the byte at k >= 6
        field = Signal(2)            # its field (0 C, 1 H/V, 2 Tq)

        def fail(code):
            m.d.comb += [seg.fail.eq(1), seg.status.eq(code)]

        with m.If(seg.first):
            m.d.sync += frame.valid.eq(0)
        with m.If(seg.active):
            with m.If(seg.valid & seg.more):
                m.d.comb += seg.take.eq(1)
                with m.Switch(k):
                    with m.Case(0):
                        m.d.sync += eight_bit.eq(byte == 8)
                    with m.Case(1):
                        m.d.sync += frame.height[8:16].eq(byte)
                    with m.Case(2):
                        m.d.sync += frame.height[0:8].eq(byte)
                    with m.Case(3):
                        m.d.sync += frame.width[8:16].eq(byte)
                    with m.Case(4):
                        m.d.sync += frame.width[0:8].eq(byte)
                    with m.Case(5):
                        m.d.sync += [frame.nf.eq(byte), comp.eq(0), field.eq(0)]
                        # 3 * Nf as shift-add: a constant product maps to a DSP on ECP5.
                        with m.If((seg.remaining - 1) != (byte << 1) + byte):
                            fail(HeaderStatus.MALFORMED)
                        with m.Elif(~eight_bit):
                            fail(HeaderStatus.PRECISION)
                        with m.Elif((byte != 1) & (byte != 3)):
                            fail(HeaderStatus.COMPONENTS)
                    with m.Default():
                        # Component and field: counters, not (k - 6) // 3 and % 3, whose
                        # divider was the parser's critical path.
                        m.d.sync += [field.eq(Mux(field == 2, 0, field + 1)),
                                     comp.eq(comp + (field == 2))]
                        with m.Switch(field):
                            with m.Case(0):
                                m.d.sync += comp_id[comp].eq(byte)
                            with m.Case(1):
                                m.d.sync += [comp_h[comp].eq(byte[4:8]), comp_v[comp].eq(byte[0:4])]
                            with m.Case(2):
                                m.d.sync += comp_tq[comp].eq(byte[0:2])
                                with m.If(byte > 3):
                                    fail(HeaderStatus.MALFORMED)
            with m.Elif(~seg.more):
                m.d.sync += frame.valid.eq(1)
                with m.If(k < 6):
                    fail(HeaderStatus.MALFORMED)
                with m.Else():
                    m.d.comb += seg.done.eq(1)
            with m.Elif(seg.end):
                fail(HeaderStatus.MALFORMED)
        return m
