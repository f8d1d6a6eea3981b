"""JPEG marker scanner: a file's bytes in, its marker segments out to their parsers.

:class:`MarkerScanner` reads SOI, then marker after marker (``FF``, fill bytes, the
code, the segment's 2-byte length; T.81 B.1.1.2-B.1.1.4) one byte per clock up to the
end of the first SOS segment, and hands the payload of each segment to the parser of
its kind through a :data:`SegmentBytes` port: APPn and COM, DQT, DHT, SOF0/SOF1, DRI,
SOS. A parser takes the bytes it needs and says when its segment is done or why it is
faulty. The scanner stops at a marker outside the hardware profile (progressive,
lossless, hierarchical, arithmetic coding, DNL, EOI before SOS) with its
:class:`HeaderStatus`, and at the first fault a parser reports.
"""

import enum

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .t81 import Marker

__all__ = ["APP0", "APP14", "FileBytes", "HeaderStatus", "MarkerScanner", "SegmentBytes"]


class HeaderStatus(enum.IntEnum):
    """Why the parser stopped (0: the scan started)."""

    OK = 0
    NOT_JPEG = 1          # no SOI
    MALFORMED = 2         # bad marker, length, segment field, or input ended early
    PROGRESSIVE = 3
    LOSSLESS = 4
    HIERARCHICAL = 5
    ARITHMETIC = 6
    PRECISION = 7         # not 8-bit samples
    COMPONENTS = 8        # not 1 or 3 components
    COLOR_TRANSFORM = 9   # RGB (Adobe transform 0 or 'R','G','B' ids)
    SAMPLING = 10         # not 4:4:4, 4:2:2, 4:4:0 or 4:2:0
    DNL = 11              # height 0 (defined by a DNL marker)
    NO_SCAN = 12          # EOI before SOS
    NON_INTERLEAVED = 13  # the first scan does not hold every component
    MISSING_TABLE = 14
    BAD_TABLE = 15        # Huffman code space overflow, DC symbol > 15, quantiser > 32767
    WIDTH = 16            # wider than the lane's line buffers

    @property
    def reason(self) -> str | None:
        """The reason code :func:`dlbooster.jpeg.classify` gives such a file; None for OK."""
        if self is HeaderStatus.OK:
            return None
        if self is HeaderStatus.MALFORMED:
            return "malformed-header"
        return self.name.lower().replace("_", "-")


#: APPn's code is ``APP0 + n`` (T.81 Table B.1); :class:`~dlbooster.hw.t81.Marker` does
#: not name the sixteen. APP0 holds JFIF's header, APP14 Adobe's.
APP0 = 0xE0
APP14 = APP0 + 14

#: Every marker begins with this byte; more of them before a marker's code are fill
#: bytes (T.81 B.1.1.2).
_PREFIX = 0xFF

#: Markers without a segment, skipped between segments as libjpeg-turbo's jdmarker.c
#: skips them.
_PARAMLESS = [Marker.TEM, Marker.RST0, Marker.RST1, Marker.RST2, Marker.RST3,
              Marker.RST4, Marker.RST5, Marker.RST6, Marker.RST7]
_APPN = [APP0 + n for n in range(16)]

#: The file's bytes one at a time, from the header parser's byte source to the scanner.
#: ``byte`` (8 bits) is at hand when ``valid``, and consumed in a clock with ``take``;
#: ``end``: the file's last byte was consumed (no byte will come).
FileBytes = wiring.Signature({
    "byte": Out(8), "valid": Out(1), "end": Out(1), "take": In(1),
})

#: A marker segment's payload, from the scanner to the parser of the segment's kind.
#:
#: Driven by the scanner:
#:
#: - ``first``: pulse, a file's first byte is consumed; the parser forgets what the last
#:   file's segments defined.
#: - ``active``: the parser's segment is being read, from the clock after its length
#:   until the clock of the parser's ``done`` or ``fail``.
#: - ``marker``: the segment's marker code (8 bits), valid while ``active``.
#: - ``byte``, ``valid``, ``end``: the next byte of the file (:data:`FileBytes`); it may
#:   lie past the segment.
#: - ``more``: the segment has bytes left; ``remaining`` (16 bits): how many.
#: - ``index`` (9 bits): segment bytes consumed since its length, or since the last one
#:   consumed with ``rewind``; it stops at 511.
#:
#: Driven by the parser, while ``active`` only:
#:
#: - ``take``: consume the byte (only when ``valid`` and ``more``); with ``rewind`` the
#:   next byte's ``index`` is 0.
#: - ``done``: the segment is parsed (only when not ``more``); the scanner reads the next
#:   marker.
#: - ``fail``: the segment is faulty, ``status`` (:class:`HeaderStatus`) says how; the
#:   scanner stops.
SegmentBytes = wiring.Signature({
    "first": Out(1), "active": Out(1), "marker": Out(8),
    "byte": Out(8), "valid": Out(1), "end": Out(1),
    "more": Out(1), "remaining": Out(16), "index": Out(9),
    "take": In(1), "rewind": In(1), "done": In(1), "fail": In(1), "status": In(HeaderStatus),
})


class MarkerScanner(wiring.Component):
    """Marker scanner of the header parser (see the module docstring).

    Ports:
        bytes: :data:`FileBytes` of the file, from its first byte.
        app, dqt, dht, sof, dri, sos: :data:`SegmentBytes` to the parsers of APPn and
            COM, DQT, DHT, SOF0/SOF1, DRI and SOS segments.
        frame: a SOF segment was read in this file (:class:`~dlbooster.hw.sof.SofParser`'s
            ``frame.valid``): a second one is malformed.
        start: pulse: read the next file's headers (after ``done`` or ``fail``).
        busy: high in every clock from the file's first byte until ``done`` or ``fail``.
        done: pulse: the SOS segment is parsed (the scan's data comes next).
        fail, status: pulse: the headers are faulty or outside the hardware profile,
            :class:`HeaderStatus` ``status`` says why.

    After ``done`` or ``fail`` the scanner takes no byte until ``start``.
    """

    def __init__(self):
        super().__init__({
            "bytes": In(FileBytes),
            "app": Out(SegmentBytes), "dqt": Out(SegmentBytes), "dht": Out(SegmentBytes),
            "sof": Out(SegmentBytes), "dri": Out(SegmentBytes), "sos": Out(SegmentBytes),
            "frame": In(1),
            "start": In(1),
            "busy": Out(1),
            "done": Out(1),
            "fail": Out(1),
            "status": Out(HeaderStatus),
        })

    def elaborate(self, platform):
        m = Module()
        byte, valid, end = self.bytes.byte, self.bytes.valid, self.bytes.end
        segments = {"APP": self.app, "DQT": self.dqt, "DHT": self.dht,
                    "SOF": self.sof, "DRI": self.dri, "SOS": self.sos}

        marker = Signal(8)
        remaining = Signal(16)       # bytes left in the segment; LEN0 loads its high byte
        more = Signal()              # remaining != 0, registered: it gates every segment byte
        index = Signal(9)
        first = Signal()
        take = Signal()              # a marker byte is consumed
        for seg in segments.values():
            m.d.comb += [seg.first.eq(first), seg.marker.eq(marker), seg.byte.eq(byte),
                         seg.valid.eq(valid), seg.end.eq(end), seg.more.eq(more),
                         seg.remaining.eq(remaining), seg.index.eq(index)]

        # Only the active parser takes or rewinds.
        seg_take = Cat(seg.take for seg in segments.values()).any()
        rewind = Cat(seg.rewind for seg in segments.values()).any()
        m.d.comb += self.bytes.take.eq(take | seg_take)
        with m.If(seg_take):
            m.d.sync += [remaining.eq(remaining - 1), more.eq(remaining != 1),
                         index.eq(Mux(rewind, 0, Mux(index == 511, index, index + 1)))]

        def fail(code):
            m.d.comb += [self.fail.eq(1), self.status.eq(code)]
            m.next = "STOP"

        with m.FSM():
            with m.State("SOI0"):
                m.d.comb += [self.busy.eq(valid), take.eq(valid), first.eq(valid)]
                with m.If(valid):
                    with m.If(byte == _PREFIX):
                        m.next = "SOI1"
                    with m.Else():
                        fail(HeaderStatus.NOT_JPEG)
            with m.State("SOI1"):
                m.d.comb += [self.busy.eq(1), take.eq(valid)]
                with m.If(valid):
                    with m.If(byte == Marker.SOI):
                        m.next = "MARK"
                    with m.Else():
                        fail(HeaderStatus.NOT_JPEG)
                with m.Elif(end):
                    fail(HeaderStatus.NOT_JPEG)
            with m.State("MARK"):
                m.d.comb += [self.busy.eq(1), take.eq(valid)]
                with m.If(valid):
                    with m.If(byte == _PREFIX):
                        m.next = "CODE"
                    with m.Else():   # bytes between segments (libjpeg warns; Pillow-dependent)
                        fail(HeaderStatus.MALFORMED)
                with m.Elif(end):
                    fail(HeaderStatus.MALFORMED)
            with m.State("CODE"):
                m.d.comb += [self.busy.eq(1), take.eq(valid)]
                with m.If(valid):
                    with m.Switch(byte):
                        with m.Case(_PREFIX):   # a fill byte
                            pass
                        with m.Case(*_PARAMLESS):
                            m.next = "MARK"
                        with m.Case(Marker.SOF0, Marker.SOF1, Marker.DHT, Marker.DQT, Marker.DRI,
                                    Marker.SOS, *_APPN, Marker.COM):
                            m.d.sync += marker.eq(byte)
                            m.next = "LEN0"
                        with m.Case(Marker.SOF2):
                            fail(HeaderStatus.PROGRESSIVE)
                        with m.Case(Marker.SOF3, Marker.SOF11):
                            fail(HeaderStatus.LOSSLESS)
                        with m.Case(Marker.SOF5, Marker.SOF6, Marker.SOF7, Marker.SOF13,
                                    Marker.SOF14, Marker.SOF15, Marker.DHP, Marker.EXP):
                            fail(HeaderStatus.HIERARCHICAL)
                        with m.Case(Marker.SOF9, Marker.SOF10, Marker.DAC):
                            fail(HeaderStatus.ARITHMETIC)
                        with m.Case(Marker.DNL):
                            fail(HeaderStatus.DNL)
                        with m.Case(Marker.EOI):
                            fail(HeaderStatus.NO_SCAN)
                        with m.Default():
                            fail(HeaderStatus.MALFORMED)
                with m.Elif(end):
                    fail(HeaderStatus.MALFORMED)
            with m.State("LEN0"):
                m.d.comb += [self.busy.eq(1), take.eq(valid)]
                with m.If(valid):
                    m.d.sync += remaining[8:].eq(byte)
                    m.next = "LEN1"
                with m.Elif(end):
                    fail(HeaderStatus.MALFORMED)
            with m.State("LEN1"):
                m.d.comb += [self.busy.eq(1), take.eq(valid)]
                length = Cat(byte, remaining[8:])
                with m.If(valid):
                    m.d.sync += [remaining.eq(length - 2), more.eq(length != 2), index.eq(0)]
                    with m.If(length < 2):
                        fail(HeaderStatus.MALFORMED)
                    with m.Elif(marker == Marker.DQT):
                        m.next = "DQT"
                    with m.Elif(marker == Marker.DHT):
                        m.next = "DHT"
                    with m.Elif((marker == Marker.SOF0) | (marker == Marker.SOF1)):
                        with m.If(self.frame):
                            fail(HeaderStatus.MALFORMED)
                        with m.Else():
                            m.next = "SOF"
                    with m.Elif(marker == Marker.DRI):
                        with m.If(length != 4):
                            fail(HeaderStatus.MALFORMED)
                        with m.Else():
                            m.next = "DRI"
                    with m.Elif(marker == Marker.SOS):
                        m.next = "SOS"
                    with m.Else():
                        m.next = "APP"
                with m.Elif(end):
                    fail(HeaderStatus.MALFORMED)

            for name, seg in segments.items():
                with m.State(name):
                    m.d.comb += [self.busy.eq(1), seg.active.eq(1)]
                    with m.If(seg.fail):
                        fail(seg.status)
                    with m.Elif(seg.done):
                        if seg is self.sos:
                            m.d.comb += self.done.eq(1)
                            m.next = "STOP"
                        else:
                            m.next = "MARK"

            with m.State("STOP"):
                with m.If(self.start):
                    m.next = "SOI0"
        return m
