"""JPEG header parser core: file bytes in, tables, scan configuration and scan data out.

:class:`HeaderParser` reads a JPEG from SOI up to the end of the first SOS header one
byte per clock (T.81 B.2-B.2.4): its :class:`~dlbooster.hw.markers.MarkerScanner` hands
each marker segment to the parser of its kind, which streams DHT payloads into the
entropy decoder's tables (:class:`~dlbooster.hw.dht.DhtParser`), keeps DQT tables (8-
or 16-bit, zigzag to natural order; :class:`~dlbooster.hw.dqt.DqtParser`), reads the
frame (:class:`~dlbooster.hw.sof.SofParser`), the restart interval and scan header
(:class:`~dlbooster.hw.sos.ScanParser`) and notes JFIF and Adobe segments
(:class:`~dlbooster.hw.app.AppParser`). Then the parser checks the frame against the
hardware profile (SPEC.md section 2), copies the scan components' quantisation tables
into the IDCT, sets the :data:`ScanConfig` and pulses ``start``, and forwards the rest
of the file to the entropy decoder at the input's rate.

Anything the lane cannot decode stops the parser with a :class:`HeaderStatus` code and
drains the input up to its ``last`` beat, one beat per clock. The
colour-space rule is libjpeg-turbo's (``jdapimin.c``): JFIF implies YCbCr; else an Adobe
APP14 transform 0 means RGB; else component ids 82, 71, 66 mean RGB; else YCbCr. The
runtime's pre-screen (:func:`dlbooster.jpeg.classify`) still decides Pillow's header
quirks, which the hardware does not replicate.
"""

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .app import AppParser
from .dht import DhtParser
from .dqt import DqtParser
from .entropy import InputBeat, ScanConfig, TableWrite
from .idct import QuantWrite
from .markers import HeaderStatus, MarkerScanner
from .sof import SofParser
from .sos import ScanParser

__all__ = ["FrameInfo", "HeaderParser", "HeaderStatus"]


#: The frame as the parser found it; valid once ``done`` (the scan started) or a frame
#: check failed.
FrameInfo = data.StructLayout({
    "width": 16, "height": 16, "ncomp": 2, "h": 2, "v": 2, "restart": 16,
})


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
        m.submodules.markers = markers = MarkerScanner()
        m.submodules.app = app = AppParser()
        m.submodules.dqt = dqt = DqtParser()
        m.submodules.dht = dht = DhtParser()
        m.submodules.sof = sof = SofParser()
        m.submodules.scan = scan = ScanParser()
        wiring.connect(m, markers.app, app.segment)
        wiring.connect(m, markers.dqt, dqt.segment)
        wiring.connect(m, markers.dht, dht.segment)
        wiring.connect(m, markers.sof, sof.segment)
        wiring.connect(m, markers.dri, scan.dri)
        wiring.connect(m, markers.sos, scan.sos)
        wiring.connect(m, sof.frame, scan.frame)
        wiring.connect(m, dht.tables, wiring.flipped(self.tables))
        frame = sof.frame
        m.d.comb += markers.frame.eq(frame.valid)

        # Byte source: the held input beat and the count of its bytes not yet taken (0
        # whenever no beat is held). The beat's data shifts down a byte per byte taken, so
        # while bytes remain the next one is its low byte (no byte-select multiplexer in
        # front of the parser's decisions), and a byte is there when the count is not 0
        # (no compare with the beat's length).
        held = Signal(InputBeat)
        held_valid = Signal()
        left = Signal(3)
        take = markers.bytes.take
        byte_valid = left != 0
        at_end = held_valid & held.last & (left == 0)
        m.d.comb += [markers.bytes.byte.eq(held.data[:8]), markers.bytes.valid.eq(byte_valid),
                     markers.bytes.end.eq(at_end)]
        with m.If(take):
            m.d.sync += [left.eq(left - 1), held.data.eq(held.data >> 8)]
        refill = (left == 0) | ((left == 1) & take)
        forwarding = Signal()        # in FORWARD
        passing = Signal()           # FORWARD, input beats go straight to ``entropy``
        draining = Signal()          # DRAIN, input beats are dropped

        status = Signal(5)
        failed = Signal(8)           # which frame checks failed, judged at the end of SOS
        copy_index = Signal(6)       # in QUANT: the table entry read this clock
        copy_comp = Signal(2)
        copying = Signal()           # in QUANT: a table read is issued this clock
        copy_k = Signal(6)
        quant_valid = Signal()
        quant_comp = Signal(2)
        nf, comp_id, comp_h, comp_v = frame.nf, frame.id, frame.h, frame.v
        m.d.comb += [
            self.info.width.eq(frame.width), self.info.height.eq(frame.height),
            self.info.ncomp.eq(nf[:2]), self.info.h.eq(comp_h[0][:2]), self.info.v.eq(comp_v[0][:2]),
            self.info.restart.eq(scan.restart), self.status.eq(status),
        ]

        def fail(code_):
            m.d.sync += status.eq(code_)
            m.next = "DRAIN"

        # The frame checks CHECK applies, in priority order: (failed, status) pairs.
        three = nf == 3
        ids_rgb = (comp_id[0] == 82) & (comp_id[1] == 71) & (comp_id[2] == 66)
        rgb = three & ~app.jfif & Mux(app.adobe, app.untransformed, ids_rgb)
        factors_ok = Cat(*((comp_h[c] >= 1) & (comp_h[c] <= 4) & (comp_v[c] >= 1)
                           & (comp_v[c] <= 4) for c in range(3))).all() | ~three
        gray_ok = (comp_h[0] >= 1) & (comp_h[0] <= 4) & (comp_v[0] >= 1) & (comp_v[0] <= 4)
        sampling_ok = ((comp_h[0] <= 2) & (comp_v[0] <= 2) & (comp_h[1] == 1) & (comp_v[1] == 1)
                       & (comp_h[2] == 1) & (comp_v[2] == 1))
        unique = ((comp_id[0] != comp_id[1]) & (comp_id[0] != comp_id[2])
                  & (comp_id[1] != comp_id[2])) | ~three

        q_defined, q_bad, h_defined, h_bad = dqt.defined, dqt.bad, dht.defined, dht.bad
        comp_tq, comp_td, comp_ta = frame.tq, scan.dc, scan.ac
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
                        (frame.height == 0, HeaderStatus.DNL),
                        ((frame.width == 0) | (frame.height > 65500) | (frame.width > 65500),
                         HeaderStatus.MALFORMED),
                        (missing, HeaderStatus.MISSING_TABLE),
                        (bad, HeaderStatus.BAD_TABLE),
                        (frame.width > self.max_width, HeaderStatus.WIDTH)]

        with m.FSM():
            with m.State("HEADERS"):
                m.d.comb += self.busy.eq(markers.busy)
                with m.If(markers.fail):
                    fail(markers.status)
                with m.Elif(markers.done):
                    # The frame checks are judged here, from registers that no longer
                    # change, and registered for CHECK: the state machine and the status
                    # then depend on 8 flags, not on the checks' logic (2 % fewer
                    # instructions per clock in the Verilator model).
                    m.d.sync += failed.eq(Cat(f for f, _ in frame_checks))
                    m.next = "CHECK"

            with m.State("CHECK"):
                m.d.comb += self.busy.eq(1)
                with m.If(at_end):   # no entropy-coded data at all
                    fail(HeaderStatus.MALFORMED)
                for i, (_, code_) in enumerate(frame_checks):
                    with m.Elif(failed[i]):
                        fail(code_)
                with m.Else():
                    m.d.sync += [copy_index.eq(0), copy_comp.eq(0)]
                    m.next = "QUANT"

            # Copy each scan component's quantisation table into the IDCT (natural order).
            with m.State("QUANT"):
                m.d.comb += [self.busy.eq(1), dqt.read_addr.eq(Cat(copy_index, Array(comp_tq)[copy_comp])),
                             copying.eq(1)]
                with m.If(self.quant.ready | ~self.quant.valid):
                    m.d.sync += copy_index.eq(copy_index + 1)
                    with m.If(copy_index == 63):
                        m.d.sync += copy_comp.eq(copy_comp + 1)
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
                m.d.sync += status.eq(HeaderStatus.OK)
                m.d.comb += markers.start.eq(1)
                m.next = "HEADERS"

        # Scan configuration (T.81 A.2): one MCU is hmax x vmax blocks of the first
        # component and one block of each chroma component; a one-component scan has
        # one block per MCU whatever its sampling factors.
        h2 = three & (comp_h[0] == 2)
        v2 = three & (comp_v[0] == 2)
        m.d.comb += [
            self.scan.ncomp.eq(nf[:2]), self.scan.restart.eq(scan.restart),
            self.scan.mcux.eq((frame.width + Mux(h2, 15, 7)) >> Mux(h2, 4, 3)),
            self.scan.mcuy.eq((frame.height + Mux(v2, 15, 7)) >> Mux(v2, 4, 3)),
        ]
        for c in range(3):
            m.d.comb += [self.scan.comp[c].h.eq(Mux(three, comp_h[c], 1)),
                         self.scan.comp[c].v.eq(Mux(three, comp_v[c], 1)),
                         self.scan.comp[c].dc.eq(scan.dc[c]), self.scan.comp[c].ac.eq(scan.ac[c])]

        with m.If(self.quant.ready | ~quant_valid):
            m.d.sync += [quant_valid.eq(copying), copy_k.eq(copy_index), quant_comp.eq(copy_comp)]
        m.d.comb += [self.quant.valid.eq(quant_valid), self.quant.payload.comp.eq(quant_comp),
                     self.quant.payload.index.eq(copy_k), self.quant.payload.value.eq(dqt.read_data),
                     dqt.read_en.eq(self.quant.ready | ~quant_valid)]

        # While FORWARD passes beats on, only the file's last beat changes a register.
        m.d.comb += self.idle.eq(passing & ~(self.input.valid & self.input.payload.last))
        # The byte source takes the next beat when its bytes are used up, except after the
        # file's last beat (the next file waits for IDLE) and while FORWARD passes beats on.
        m.d.comb += self.input.ready.eq(Mux(passing, self.entropy.ready,
                                            draining | (refill & ~(held_valid & held.last) & ~forwarding)))
        with m.If(self.input.valid & self.input.ready & ~passing & ~draining):
            m.d.sync += [held.eq(self.input.payload), held_valid.eq(1), left.eq(self.input.payload.n)]
        return m
