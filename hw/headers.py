"""JPEG header parser core: file bytes in, tables, scan configuration and scan data out.

:class:`HeaderParser` reads a JPEG from SOI up to the end of the first SOS header one
byte per clock (T.81 B.2-B.2.4): it streams DHT payloads into the entropy decoder's
tables, keeps DQT tables (8- or 16-bit, zigzag to natural order) and copies the scan
components' tables into the IDCT once the scan is known, checks the frame against the
hardware profile (SPEC.md section 2), sets the :data:`ScanConfig` and pulses ``start``,
then forwards the rest of the file to the entropy decoder at the input's rate.

Anything the lane cannot decode stops the parser with a :class:`HeaderStatus` code and
drains the input up to its ``last`` beat, one beat per clock. The
colour-space rule is libjpeg-turbo's (``jdapimin.c``): JFIF implies YCbCr; else an Adobe
APP14 transform 0 means RGB; else component ids 82, 71, 66 mean RGB; else YCbCr. The
runtime's pre-screen (:func:`dlbooster.jpeg.classify`) still decides Pillow's header
quirks, which the hardware does not replicate.
"""

import enum

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .t81 import ZIGZAG
from .entropy import InputBeat, ScanConfig, TableWrite
from .idct import QuantWrite

__all__ = ["FrameInfo", "HeaderParser", "HeaderStatus"]


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


#: The frame as the parser found it; valid once ``done`` (the scan started) or a frame
#: check failed.
FrameInfo = data.StructLayout({
    "width": 16, "height": 16, "ncomp": 2, "h": 2, "v": 2, "restart": 16,
})

_SKIP_MARKERS = list(range(0xE0, 0xF0)) + [0xFE]
_PARAMLESS = list(range(0xD0, 0xD8)) + [0x01]


class HeaderParser(wiring.Component):
    """JPEG header parser (see the module docstring).

    Args:
        max_width: widest frame accepted (the lane's line-buffer width), in pixels.

    Ports:
        input: :data:`InputBeat` stream of the file, from its first byte; ``last`` on the
            final beat.
        tables: :data:`TableWrite` stream to :class:`dlbooster.hw.entropy.EntropyDecoder`.
        quant: :data:`QuantWrite` stream to :class:`dlbooster.hw.idct.Idct`.
        scan, start: the scan configuration and its start pulse (entropy decoder).
        entropy: :data:`InputBeat` stream of the bytes after the SOS header.
        info: :data:`FrameInfo`.
        status: :class:`HeaderStatus`, valid with ``done``.
        done: pulses once, when the scan starts or the parser stopped (input drained).
        busy: high from the first input beat until ``done``.
        idle: high in clocks in which none of the parser's registers changes: while it
            passes scan bytes straight from ``input`` to ``entropy``, up to the file's last
            beat (for :class:`dlbooster.hw.gating.ClockGate`).
    """

    def __init__(self, max_width: int = 8192):
        self.max_width = max_width
        super().__init__({
            "input": In(stream.Signature(InputBeat)),
            "tables": Out(stream.Signature(TableWrite)),
            "quant": Out(stream.Signature(QuantWrite)),
            "scan": Out(ScanConfig),
            "start": Out(1),
            "entropy": Out(stream.Signature(InputBeat)),
            "info": Out(FrameInfo),
            "status": Out(5),
            "done": Out(1),
            "busy": Out(1),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()

        # Byte source: the held input beat and the count of its bytes not yet taken (0
        # whenever no beat is held). The beat's data shifts down a byte per byte taken, so
        # while bytes remain the next one is its low byte (no byte-select multiplexer in
        # front of the parser's decisions), and a byte is there when the count is not 0
        # (no compare with the beat's length).
        held = Signal(InputBeat)
        held_valid = Signal()
        left = Signal(3)
        take = Signal()
        byte = Signal(8)
        byte_valid = left != 0
        m.d.comb += byte.eq(held.data[:8])
        at_end = held_valid & held.last & (left == 0)
        with m.If(take):
            m.d.sync += [left.eq(left - 1), held.data.eq(held.data >> 8)]
        refill = (left == 0) | ((left == 1) & take)
        forwarding = Signal()        # in FORWARD
        passing = Signal()           # FORWARD, input beats go straight to ``entropy``
        draining = Signal()          # DRAIN, input beats are dropped

        # Quantisation tables, natural order: address (Tq, index).
        m.submodules.qmem = qmem = Memory(shape=16, depth=256, init=[])
        qw = qmem.write_port()
        qr = qmem.read_port(transparent_for=())
        zigzag = Array(Const(int(z), 6) for z in ZIGZAG)

        status = Signal(5)
        remaining = Signal(16)       # bytes left in the segment
        in_seg = Signal()            # remaining != 0, registered: it gates every segment byte
        k = Signal(9)                # position inside the current item
        sof_comp = Signal(2)         # SOF: component of the byte at k >= 6
        sof_field = Signal(2)        # SOF: its field (0 C, 1 H/V, 2 Tq)
        hi = Signal(8)               # a 16-bit field's first byte
        sel = Signal(3)              # table being loaded (DHT: Tc * 4 + Th; DQT: Tq)
        wide = Signal()              # 16-bit DQT entries
        counts_total = Signal(9)
        code = Signal(17)
        q_defined = Signal(4)
        q_bad = Signal(4)
        h_defined = Signal(8)
        h_bad = Signal(8)
        have_frame = Signal()
        jfif = Signal()
        adobe = Signal()
        adobe_transform = Signal(8)
        app_tag = Signal(40)         # the first 5 bytes of an APPn payload
        precision = Signal(8)
        width = Signal(16)
        height = Signal(16)
        nf = Signal(8)
        comp_id = Array(Signal(8, name=f"id{c}") for c in range(3))
        comp_h = Array(Signal(4, name=f"h{c}") for c in range(3))
        comp_v = Array(Signal(4, name=f"v{c}") for c in range(3))
        comp_tq = Array(Signal(2, name=f"tq{c}") for c in range(3))
        comp_td = Array(Signal(2, name=f"td{c}") for c in range(3))
        comp_ta = Array(Signal(2, name=f"ta{c}") for c in range(3))
        restart = Signal(16)
        sos_todo = Signal(9)         # SOS: component selector and table bytes still to come
        sos_comp = Signal(2)         # SOS: component of the next such byte
        copy_comp = Signal(2)
        failed = Signal(8)           # which frame checks failed, judged at the end of SOS

        marker = Signal(8)
        copying = Signal()           # in QUANT: a table read is issued this clock
        copy_k = Signal(6)
        quant_valid = Signal()
        quant_comp = Signal(2)
        m.d.comb += [
            self.info.width.eq(width), self.info.height.eq(height), self.info.ncomp.eq(nf[:2]),
            self.info.h.eq(comp_h[0][:2]), self.info.v.eq(comp_v[0][:2]),
            self.info.restart.eq(restart), self.status.eq(status),
        ]

        # A segment byte is consumed only while remaining > 0; running out of segment
        # mid-item is a malformed segment.
        seg_byte = byte_valid & in_seg

        def consume():
            m.d.comb += take.eq(1)
            m.d.sync += [remaining.eq(remaining - 1), in_seg.eq(remaining != 1)]

        def fail(code_):
            m.d.sync += status.eq(code_)
            m.next = "DRAIN"

        def segment_done():
            with m.If(~in_seg):
                m.next = "MARK"

        # The frame checks CHECK applies, in priority order: (failed, status) pairs.
        three = nf == 3
        ids_rgb = (comp_id[0] == 82) & (comp_id[1] == 71) & (comp_id[2] == 66)
        rgb = three & ~jfif & Mux(adobe, adobe_transform == 0, ids_rgb)
        factors_ok = Cat(*((comp_h[c] >= 1) & (comp_h[c] <= 4) & (comp_v[c] >= 1)
                           & (comp_v[c] <= 4) for c in range(3))).all() | ~three
        gray_ok = (comp_h[0] >= 1) & (comp_h[0] <= 4) & (comp_v[0] >= 1) & (comp_v[0] <= 4)
        sampling_ok = ((comp_h[0] <= 2) & (comp_v[0] <= 2) & (comp_h[1] == 1) & (comp_v[1] == 1)
                       & (comp_h[2] == 1) & (comp_v[2] == 1))
        unique = ((comp_id[0] != comp_id[1]) & (comp_id[0] != comp_id[2])
                  & (comp_id[1] != comp_id[2])) | ~three
        missing = Cat(*(((c < nf) & ~(q_defined.bit_select(comp_tq[c], 1)
                                      & h_defined.bit_select(Cat(comp_td[c], Const(0, 1)), 1)
                                      & h_defined.bit_select(Cat(comp_ta[c], Const(1, 1)), 1)))
                        for c in range(3))).any()
        bad = Cat(*(((c < nf) & (q_bad.bit_select(comp_tq[c], 1)
                                 | h_bad.bit_select(Cat(comp_td[c], Const(0, 1)), 1)
                                 | h_bad.bit_select(Cat(comp_ta[c], Const(1, 1)), 1)))
                    for c in range(3))).any()
        frame_checks = [(rgb, HeaderStatus.COLOR_TRANSFORM),
                        (~factors_ok | ~unique | (~three & ~gray_ok), HeaderStatus.MALFORMED),
                        (three & ~sampling_ok, HeaderStatus.SAMPLING),
                        (height == 0, HeaderStatus.DNL),
                        ((width == 0) | (height > 65500) | (width > 65500), HeaderStatus.MALFORMED),
                        (missing, HeaderStatus.MISSING_TABLE),
                        (bad, HeaderStatus.BAD_TABLE),
                        (width > self.max_width, HeaderStatus.WIDTH)]

        with m.FSM():
            with m.State("SOI0"):
                m.d.comb += take.eq(byte_valid)
                with m.If(byte_valid):
                    # The restart interval is part of the scan configuration the entropy
                    # decoder reads until its scan is done, which can be long after the
                    # last byte was forwarded: it is cleared when the next file begins.
                    m.d.comb += self.busy.eq(1)
                    m.d.sync += restart.eq(0)
                    with m.If(byte == 0xFF):
                        m.next = "SOI1"
                    with m.Else():
                        fail(HeaderStatus.NOT_JPEG)
            with m.State("SOI1"):
                m.d.comb += [self.busy.eq(1), take.eq(byte_valid)]
                with m.If(byte_valid):
                    with m.If(byte == 0xD8):
                        m.next = "MARK"
                    with m.Else():
                        fail(HeaderStatus.NOT_JPEG)
                with m.Elif(at_end):
                    fail(HeaderStatus.NOT_JPEG)
            with m.State("MARK"):
                m.d.comb += [self.busy.eq(1), take.eq(byte_valid)]
                with m.If(byte_valid):
                    with m.If(byte == 0xFF):
                        m.next = "CODE"
                    with m.Else():   # bytes between segments (libjpeg warns; Pillow-dependent)
                        fail(HeaderStatus.MALFORMED)
                with m.Elif(at_end):
                    fail(HeaderStatus.MALFORMED)
            with m.State("CODE"):
                m.d.comb += [self.busy.eq(1), take.eq(byte_valid)]
                with m.If(byte_valid):
                    m.d.sync += [sel.eq(byte[0:3]), k.eq(0)]
                    with m.Switch(byte):
                        with m.Case(0xFF):   # fill byte
                            pass
                        with m.Case(*_PARAMLESS):
                            m.next = "MARK"
                        with m.Case(0xC0, 0xC1, 0xC4, 0xDB, 0xDD, 0xDA, *_SKIP_MARKERS):
                            m.d.sync += hi.eq(byte)
                            m.next = "LEN0"
                        with m.Case(0xC2):
                            fail(HeaderStatus.PROGRESSIVE)
                        with m.Case(0xC3, 0xCB):
                            fail(HeaderStatus.LOSSLESS)
                        with m.Case(0xC5, 0xC6, 0xC7, 0xCD, 0xCE, 0xCF, 0xDE, 0xDF):
                            fail(HeaderStatus.HIERARCHICAL)
                        with m.Case(0xC9, 0xCA, 0xCC):
                            fail(HeaderStatus.ARITHMETIC)
                        with m.Case(0xDC):
                            fail(HeaderStatus.DNL)
                        with m.Case(0xD9):
                            fail(HeaderStatus.NO_SCAN)
                        with m.Default():
                            fail(HeaderStatus.MALFORMED)
                with m.Elif(at_end):
                    fail(HeaderStatus.MALFORMED)

            with m.State("LEN0"):
                m.d.comb += [self.busy.eq(1), take.eq(byte_valid)]
                with m.If(byte_valid):
                    m.d.sync += [marker.eq(hi), hi.eq(byte)]
                    m.next = "LEN1"
                with m.Elif(at_end):
                    fail(HeaderStatus.MALFORMED)
            with m.State("LEN1"):
                m.d.comb += [self.busy.eq(1), take.eq(byte_valid)]
                length = Cat(byte, hi)
                with m.If(byte_valid):
                    m.d.sync += [remaining.eq(length - 2), in_seg.eq(length != 2), k.eq(0), app_tag.eq(0)]
                    with m.If(length < 2):
                        fail(HeaderStatus.MALFORMED)
                    with m.Elif(marker == 0xDB):
                        m.next = "DQT"
                    with m.Elif(marker == 0xC4):
                        m.next = "DHT"
                    with m.Elif((marker == 0xC0) | (marker == 0xC1)):
                        with m.If(have_frame):
                            fail(HeaderStatus.MALFORMED)
                        with m.Else():
                            m.next = "SOF"
                    with m.Elif(marker == 0xDD):
                        with m.If(length != 4):
                            fail(HeaderStatus.MALFORMED)
                        with m.Else():
                            m.next = "DRI"
                    with m.Elif(marker == 0xDA):
                        m.next = "SOS"
                    with m.Else():
                        m.next = "SKIP"
                with m.Elif(at_end):
                    fail(HeaderStatus.MALFORMED)


            with m.State("SKIP"):    # APPn / COM: note JFIF and Adobe, skip the rest
                m.d.comb += self.busy.eq(1)
                with m.If(~in_seg):
                    with m.If((marker == 0xE0) & (app_tag == int.from_bytes(b"JFIF\0", "big"))
                              & (k >= 14)):
                        m.d.sync += jfif.eq(1)
                    m.next = "MARK"
                with m.Elif(byte_valid):
                    consume()
                    m.d.sync += k.eq(Mux(k == 511, k, k + 1))
                    with m.If(k < 5):
                        m.d.sync += app_tag.eq(Cat(byte, app_tag[:32]))
                    with m.If((marker == 0xEE) & (k == 11)
                              & (app_tag == int.from_bytes(b"Adobe", "big"))):
                        m.d.sync += [adobe.eq(1), adobe_transform.eq(byte)]
                with m.Elif(at_end):
                    fail(HeaderStatus.MALFORMED)

            def table_head(name, first_state, start):
                """A DQT/DHT table's first byte (Pq/Tc <= 1, Tq/Th <= 3), or the segment end."""
                with m.State(name):
                    m.d.comb += self.busy.eq(1)
                    segment_done()
                    with m.If(seg_byte):
                        consume()
                        with m.If((byte[4:8] > 1) | (byte[0:4] > 3)):
                            fail(HeaderStatus.MALFORMED)
                        with m.Else():
                            m.d.sync += [k.eq(0), *start(byte[4], byte[0:2])]
                            m.next = first_state
                    with m.Elif(at_end & in_seg):
                        fail(HeaderStatus.MALFORMED)

            table_head("DQT", "DQT_VAL", lambda pq, tq: [
                wide.eq(pq), sel.eq(tq), q_bad.bit_select(tq, 1).eq(0)])
            with m.State("DQT_VAL"):
                m.d.comb += self.busy.eq(1)
                value = Mux(wide, Cat(byte, hi), byte)
                with m.If(seg_byte):
                    consume()
                    with m.If(wide & ~k[0]):
                        m.d.sync += [hi.eq(byte), k.eq(k + 1)]
                    with m.Else():
                        index = Mux(wide, k[1:7], k[0:6])
                        m.d.comb += [qw.en.eq(1), qw.addr.eq(Cat(zigzag[index], sel[:2])),
                                     qw.data.eq(value)]
                        with m.If(value > 32767):
                            m.d.sync += q_bad.bit_select(sel[:2], 1).eq(1)
                        m.d.sync += k.eq(k + 1)
                        with m.If(index == 63):
                            m.d.sync += q_defined.bit_select(sel[:2], 1).eq(1)
                            m.next = "DQT"
                with m.Elif(byte_valid | at_end):
                    fail(HeaderStatus.MALFORMED)

            table_head("DHT", "DHT_COUNTS", lambda tc, th: [
                sel.eq(Cat(th, tc)), counts_total.eq(0), code.eq(0),
                h_bad.bit_select(Cat(th, tc), 1).eq(0)])
            with m.State("DHT_COUNTS"):
                m.d.comb += self.busy.eq(1)
                with m.If(seg_byte):
                    m.d.comb += [self.tables.valid.eq(1), self.tables.payload.table.eq(sel),
                                 self.tables.payload.index.eq(k), self.tables.payload.byte.eq(byte)]
                    with m.If(self.tables.ready):
                        consume()
                        total = counts_total + byte
                        grown = code + byte
                        m.d.sync += [counts_total.eq(total), code.eq(grown << 1), k.eq(k + 1)]
                        # jdhuff.c: every code must fit its length and not be all ones.
                        with m.If(grown >= (Const(1, 17) << (k[:4] + 1))):
                            m.d.sync += h_bad.bit_select(sel, 1).eq(1)
                        with m.If(k == 15):
                            with m.If(total > 256):
                                fail(HeaderStatus.MALFORMED)
                            with m.Elif(total == 0):
                                m.d.sync += h_defined.bit_select(sel, 1).eq(1)
                                m.next = "DHT"
                            with m.Else():
                                m.next = "DHT_SYMBOLS"
                with m.Elif(byte_valid | at_end):
                    fail(HeaderStatus.MALFORMED)
            with m.State("DHT_SYMBOLS"):
                m.d.comb += self.busy.eq(1)
                with m.If(seg_byte):
                    m.d.comb += [self.tables.valid.eq(1), self.tables.payload.table.eq(sel),
                                 self.tables.payload.index.eq(k), self.tables.payload.byte.eq(byte)]
                    with m.If(self.tables.ready):
                        consume()
                        m.d.sync += [k.eq(k + 1), counts_total.eq(counts_total - 1)]
                        with m.If(~sel[2] & (byte > 15)):
                            m.d.sync += h_bad.bit_select(sel, 1).eq(1)
                        with m.If(counts_total == 1):
                            m.d.sync += h_defined.bit_select(sel, 1).eq(1)
                            m.next = "DHT"
                with m.Elif(byte_valid | at_end):
                    fail(HeaderStatus.MALFORMED)

            with m.State("SOF"):
                m.d.comb += self.busy.eq(1)
                with m.If(seg_byte):
                    consume()
                    m.d.sync += k.eq(k + 1)
                    with m.Switch(k):
                        with m.Case(0):
                            m.d.sync += precision.eq(byte)
                        with m.Case(1):
                            m.d.sync += height[8:16].eq(byte)
                        with m.Case(2):
                            m.d.sync += height[0:8].eq(byte)
                        with m.Case(3):
                            m.d.sync += width[8:16].eq(byte)
                        with m.Case(4):
                            m.d.sync += width[0:8].eq(byte)
                        with m.Case(5):
                            m.d.sync += [nf.eq(byte), sof_comp.eq(0), sof_field.eq(0)]
                            # 3 * Nf as shift-add: a constant product maps to a DSP on ECP5.
                            with m.If((remaining - 1) != (byte << 1) + byte):
                                fail(HeaderStatus.MALFORMED)
                            with m.Elif(precision != 8):
                                fail(HeaderStatus.PRECISION)
                            with m.Elif((byte != 1) & (byte != 3)):
                                fail(HeaderStatus.COMPONENTS)
                        with m.Default():
                            # Component sof_comp, field sof_field: counters, not (k - 6) // 3
                            # and % 3, whose divider was the parser's critical path.
                            c = sof_comp
                            m.d.sync += [sof_field.eq(Mux(sof_field == 2, 0, sof_field + 1)),
                                         sof_comp.eq(sof_comp + (sof_field == 2))]
                            with m.Switch(sof_field):
                                with m.Case(0):
                                    m.d.sync += comp_id[c].eq(byte)
                                with m.Case(1):
                                    m.d.sync += [comp_h[c].eq(byte[4:8]), comp_v[c].eq(byte[0:4])]
                                with m.Case(2):
                                    m.d.sync += comp_tq[c].eq(byte[0:2])
                                    with m.If(byte > 3):
                                        fail(HeaderStatus.MALFORMED)
                with m.Elif(~in_seg):
                    m.d.sync += have_frame.eq(1)
                    with m.If(k < 6):
                        fail(HeaderStatus.MALFORMED)
                    with m.Else():
                        m.next = "MARK"
                with m.Elif(at_end):
                    fail(HeaderStatus.MALFORMED)

            with m.State("DRI"):
                m.d.comb += self.busy.eq(1)
                segment_done()
                with m.If(seg_byte):
                    consume()
                    m.d.sync += restart.eq(Cat(byte, restart[:8]))
                with m.Elif(at_end & in_seg):
                    fail(HeaderStatus.MALFORMED)

            with m.State("SOS"):
                m.d.comb += self.busy.eq(1)
                with m.If(~have_frame):
                    fail(HeaderStatus.MALFORMED)
                with m.Elif(seg_byte):
                    consume()
                    m.d.sync += k.eq(k + 1)
                    with m.If(k == 0):
                        m.d.sync += [sos_todo.eq(byte << 1), sos_comp.eq(0)]
                        with m.If((remaining - 1) != 3 + 2 * byte):
                            fail(HeaderStatus.MALFORMED)
                        with m.Elif(byte != nf):
                            fail(HeaderStatus.NON_INTERLEAVED)
                    with m.Elif(sos_todo != 0):
                        # Counters, not k <= 2 * Ns and (k - 1) >> 1: both were on the
                        # parser's critical path.
                        c = sos_comp
                        m.d.sync += sos_todo.eq(sos_todo - 1)
                        with m.If(k[0]):
                            with m.If(byte != comp_id[c]):
                                fail(HeaderStatus.MALFORMED)   # not the frame's order
                        with m.Else():
                            m.d.sync += [comp_td[c].eq(byte[4:6]), comp_ta[c].eq(byte[0:2]),
                                         sos_comp.eq(sos_comp + 1)]
                            with m.If((byte[4:8] > 3) | (byte[0:4] > 3)):
                                fail(HeaderStatus.MALFORMED)
                with m.Elif(~in_seg):
                    # The frame checks are judged here, from registers that no longer
                    # change, and registered for CHECK: the state machine and the status
                    # then depend on 8 flags, not on the checks' logic (2 % fewer
                    # instructions per clock in the Verilator model).
                    m.d.sync += failed.eq(Cat(f for f, _ in frame_checks))
                    m.next = "CHECK"
                with m.Elif(at_end):
                    fail(HeaderStatus.MALFORMED)

            with m.State("CHECK"):
                m.d.comb += self.busy.eq(1)
                with m.If(at_end):   # no entropy-coded data at all
                    fail(HeaderStatus.MALFORMED)
                for i, (_, code_) in enumerate(frame_checks):
                    with m.Elif(failed[i]):
                        fail(code_)
                with m.Else():
                    m.d.sync += [k.eq(0), copy_comp.eq(0)]
                    m.next = "QUANT"

            # Copy each scan component's quantisation table into the IDCT (natural order).
            with m.State("QUANT"):
                m.d.comb += [self.busy.eq(1), qr.addr.eq(Cat(k[:6], comp_tq[copy_comp])),
                             copying.eq(1)]
                with m.If(self.quant.ready | ~self.quant.valid):
                    m.d.sync += k.eq(k + 1)
                    with m.If(k[:6] == 63):
                        m.d.sync += [copy_comp.eq(copy_comp + 1), k.eq(0)]
                        with m.If(copy_comp + 1 == nf):
                            m.next = "QUANT_LAST"
            with m.State("QUANT_LAST"):
                m.d.comb += self.busy.eq(1)
                with m.If(self.quant.ready | ~self.quant.valid):
                    m.next = "START"

            with m.State("START"):
                m.d.comb += [self.busy.eq(1), self.start.eq(~quant_valid), self.done.eq(~quant_valid)]
                with m.If(~quant_valid):
                    m.next = "FORWARD"
            with m.State("FORWARD"):
                m.d.comb += forwarding.eq(1)
                # The rest of the held beat first, then the input beats as they come.
                with m.If(byte_valid):
                    m.d.comb += [self.entropy.valid.eq(1),
                                 self.entropy.payload.data.eq(held.data),
                                 self.entropy.payload.n.eq(left), self.entropy.payload.last.eq(held.last)]
                    with m.If(self.entropy.ready):
                        m.d.sync += left.eq(0)
                        with m.If(held.last):
                            m.d.sync += held_valid.eq(0)
                            m.next = "IDLE"
                with m.Elif(held_valid & held.last):
                    m.d.sync += [held_valid.eq(0), left.eq(0)]
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += [passing.eq(1), self.entropy.valid.eq(self.input.valid),
                                 self.entropy.payload.eq(self.input.payload)]
                    with m.If(self.input.valid & self.entropy.ready & self.input.payload.last):
                        m.d.sync += [held_valid.eq(0), left.eq(0)]
                        m.next = "IDLE"
            with m.State("DRAIN"):
                # Drop the held beat, then one input beat per clock up to the file's last.
                m.d.comb += self.busy.eq(1)
                with m.If(held_valid & held.last):
                    m.d.comb += self.done.eq(1)
                    m.d.sync += [held_valid.eq(0), left.eq(0)]
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += draining.eq(1)
                    m.d.sync += [held_valid.eq(0), left.eq(0)]
                    with m.If(self.input.valid & self.input.payload.last):
                        m.d.comb += self.done.eq(1)
                        m.next = "IDLE"
            with m.State("IDLE"):
                m.d.sync += [status.eq(HeaderStatus.OK), have_frame.eq(0), jfif.eq(0),
                             adobe.eq(0), q_defined.eq(0),
                             h_defined.eq(0), q_bad.eq(0), h_bad.eq(0)]
                m.next = "SOI0"

        # Scan configuration (T.81 A.2): one MCU is hmax x vmax blocks of the first
        # component and one block of each chroma component; a one-component scan has
        # one block per MCU whatever its sampling factors.
        h2 = three & (comp_h[0] == 2)
        v2 = three & (comp_v[0] == 2)
        m.d.comb += [
            self.scan.ncomp.eq(nf[:2]), self.scan.restart.eq(restart),
            self.scan.mcux.eq((width + Mux(h2, 15, 7)) >> Mux(h2, 4, 3)),
            self.scan.mcuy.eq((height + Mux(v2, 15, 7)) >> Mux(v2, 4, 3)),
        ]
        for c in range(3):
            m.d.comb += [self.scan.comp[c].h.eq(Mux(three, comp_h[c], 1)),
                         self.scan.comp[c].v.eq(Mux(three, comp_v[c], 1)),
                         self.scan.comp[c].dc.eq(comp_td[c]), self.scan.comp[c].ac.eq(comp_ta[c])]

        with m.If(self.quant.ready | ~quant_valid):
            m.d.sync += [quant_valid.eq(copying), copy_k.eq(k[:6]), quant_comp.eq(copy_comp)]
        m.d.comb += [self.quant.valid.eq(quant_valid), self.quant.payload.comp.eq(quant_comp),
                     self.quant.payload.index.eq(copy_k), self.quant.payload.value.eq(qr.data),
                     qr.en.eq(self.quant.ready | ~quant_valid)]

        # While FORWARD passes beats on, only the file's last beat changes a register.
        m.d.comb += self.idle.eq(passing & ~(self.input.valid & self.input.payload.last))
        # The byte source takes the next beat when its bytes are used up, except after the
        # file's last beat (the next file waits for IDLE) and while FORWARD passes beats on.
        m.d.comb += self.input.ready.eq(Mux(passing, self.entropy.ready,
                                            draining | (refill & ~(held_valid & held.last) & ~forwarding)))
        with m.If(self.input.valid & self.input.ready & ~passing & ~draining):
            m.d.sync += [held.eq(self.input.payload), held_valid.eq(1), left.eq(self.input.payload.n)]
        return m
