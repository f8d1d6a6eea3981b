"""APPn and COM segment parser: what the colour-space rule needs, the rest skipped.

:class:`AppParser` takes every byte of an APPn or COM segment and notes a JFIF APP0
header (identifier ``JFIF\\0`` and at least its 14 bytes) and an Adobe APP14 segment's
colour transform (its 12th byte, after the identifier ``Adobe``), as libjpeg-turbo's
``jdmarker.c`` does: the header parser's colour-space rule reads them.
"""

from amaranth import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .markers import APP0, APP14, HeaderStatus, SegmentBytes

__all__ = ["AppParser"]

_JFIF = int.from_bytes(b"JFIF\0", "big")
_ADOBE = int.from_bytes(b"Adobe", "big")


class AppParser(wiring.Component):
    """APPn and COM segments (see the module docstring).

    Ports:
        segment: :data:`~dlbooster.hw.markers.SegmentBytes` of APPn and COM segments.
        jfif: the file has a JFIF APP0 header.
        adobe: the file has an Adobe APP14 segment with a transform byte.
        untransformed: that byte is 0 (the components are not YCbCr: RGB or CMYK), valid
            with ``adobe``; the colour-space rule needs no more of it.

    ``jfif`` and ``adobe`` are cleared as a file begins (``segment.first``). A segment cut
    short by the end of the file is malformed.
    """

    def __init__(self):
        super().__init__({
            "segment": In(SegmentBytes),
            "jfif": Out(1),
            "adobe": Out(1),
            "untransformed": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        seg = self.segment
        # The payload's first 5 bytes, the first one highest; read only once all 5 are in,
        # so never cleared.
        tag = Signal(40)

        with m.If(seg.first):
            m.d.sync += [self.jfif.eq(0), self.adobe.eq(0)]
        with m.If(seg.active):
            with m.If(~seg.more):
                m.d.comb += seg.done.eq(1)
                with m.If((seg.marker == APP0) & (tag == _JFIF) & (seg.index >= 14)):
                    m.d.sync += self.jfif.eq(1)
            with m.Elif(seg.valid):
                m.d.comb += seg.take.eq(1)
                with m.If(seg.index < 5):
                    m.d.sync += tag.eq(Cat(seg.byte, tag[:32]))
                with m.If((seg.marker == APP14) & (seg.index == 11) & (tag == _ADOBE)):
                    m.d.sync += [self.adobe.eq(1), self.untransformed.eq(seg.byte == 0)]
            with m.Elif(seg.end):
                m.d.comb += [seg.fail.eq(1), seg.status.eq(HeaderStatus.MALFORMED)]
        return m
