"""One decoder lane: JPEG bytes in, RGB pixels out in raster order.

:class:`Lane` chains the cores: :class:`~dlbooster.hw.headers.HeaderParser` ->
:class:`~dlbooster.hw.entropy.EntropyDecoder` -> :class:`~dlbooster.hw.idct.Idct` ->
a :class:`~dlbooster.hw.planes.PlaneBuffer` per component -> a
:class:`~dlbooster.hw.upsample.RowUpsampler` per chroma component (its 16-sample rows
split into 8-sample pieces, cropped to the image) -> :class:`~dlbooster.hw.color.ColorConverter`.
Gray images skip the chroma path (Cb = Cr = 128 gives R = G = B = Y).

A header the lane cannot decode ends the image with the parser's
:class:`~dlbooster.hw.headers.HeaderStatus`; an entropy-decoder fault ends it with
``0x20 | Status`` and resets the pixel path (``Status.AFTER_SCAN``, 0x26, when the scan
is not followed by EOI, which can come after the last pixel); an IDCT range fault (see
:func:`dlbooster.hw.idct.block_rows`) is reported as ``0x30`` when the image ends. In
each case the input is drained and the next image starts cleanly; the host decodes
such images on the CPU (:func:`status_reason` names the reason as
:func:`dlbooster.jpeg.classify` would). The input takes a file up to its ``last`` beat,
then nothing until the image's ``done``, so a source may offer the next file at once.
"""

from amaranth import Cat, Module, Mux, ResetSignal, Signal
from amaranth.hdl import ResetInserter
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .color import ColorConverter, rgb_pixels, ycbcr_pixels
from .entropy import CoefBeat, EntropyDecoder, InputBeat, Status
from .gating import ClockGate
from .headers import FrameInfo, HeaderParser, HeaderStatus
from .idct import Idct, block_rows
from .planes import PlaneBuffer
from .upsample import RowUpsampler

__all__ = ["Lane", "STATUS_ENTROPY", "STATUS_IDCT_RANGE", "status_reason"]

#: Status of an image whose entropy-coded data was faulty: ``STATUS_ENTROPY | Status``.
STATUS_ENTROPY = 0x20
#: Status of an image with a block outside the exact IDCT range (``range_fault``).
STATUS_IDCT_RANGE = 0x30


def status_reason(status: int) -> str | None:
    """Name a lane status as the host does: the reason code of
    :func:`dlbooster.jpeg.classify` (header stops, ``after-scan``) or of
    :data:`dlbooster.jpeg.model.STATUS_REASONS` (entropy faults), ``idct-range`` for 0x30;
    None for 0.

    Raises:
        ValueError: not a status the lane reports.
    """
    if status == 0:
        return None
    if status == STATUS_IDCT_RANGE:
        return "idct-range"
    if status & 0xF0 == STATUS_ENTROPY and status != STATUS_ENTROPY:
        return Status(status & 0x0F).reason
    return HeaderStatus(status).reason


class Lane(wiring.Component):
    """A whole decoder lane (see the module docstring).

    Args:
        max_width: widest image, in pixels (line-buffer size).
        lanes: the IDCT's rows per clock (4 keeps pace with the entropy decoder).
        probes: add read-only debug ports that show each beat handed between the stages
            (for stage-by-stage comparison with the reference model in simulation; they
            change nothing else).
        clock_gating: run the header parser, the entropy decoder's Huffman tables, the
            plane buffers, the upsamplers and colour conversion behind clock gates
            (:class:`~dlbooster.hw.gating.ClockGate`) that stop their clocks while they
            are idle, blocks that work in the same clocks behind one (for simulation
            builds; the lane makes the same handshakes with the same valid data, clock for
            clock, either way).
        sim_arithmetic: the IDCT's passes and colour conversion in the forms a simulator
            evaluates without sign extensions (:class:`~dlbooster.hw.idct.IdctPass`
            ``modular``, :class:`~dlbooster.hw.color.ColorConverter` ``unsigned``), for
            simulation builds: the same outputs, clock for clock.

    Ports:
        reset: synchronous reset of the whole lane.
        input: :data:`InputBeat` stream of one file after another, ``last`` on each
            file's final beat.
        o: :func:`dlbooster.hw.color.rgb_pixels` ``(8)`` stream: 8 pixels per beat
            (``n`` valid), ``row_end`` on a row's last beat, ``last`` on the image's.
        info: :data:`FrameInfo` of the current image (valid from the first pixel).
        status: 0, or why the image ended early (valid with ``done``).
        done: pulses once per image, after its last pixel or when it was abandoned.
        start: pulses when the scan starts; ``info`` is valid from then on.
        symbols: Huffman symbols the entropy decoder decoded in this image's scan.
        probe_coef, probe_rows, probe_ycc (with ``probes``): ``{fire, beat}``, ``fire``
            high in a clock where the beat is taken: a :data:`~dlbooster.hw.entropy.CoefBeat`
            from the entropy decoder, a :func:`~dlbooster.hw.idct.block_rows` beat from
            the IDCT, a :func:`~dlbooster.hw.color.ycbcr_pixels` beat into colour conversion.
    """

    def __init__(self, max_width: int = 8192, lanes: int = 4, probes: bool = False, clock_gating: bool = False,
                 sim_arithmetic: bool = False):
        self.max_width = max_width
        self.lanes = lanes
        self.probes = probes
        self.clock_gating = clock_gating
        self.sim_arithmetic = sim_arithmetic
        ports = {
            "reset": In(1),
            "input": In(stream.Signature(InputBeat)),
            "o": Out(stream.Signature(rgb_pixels(8))),
            "info": Out(FrameInfo),
            "status": Out(8),
            "done": Out(1),
            "start": Out(1),
            "symbols": Out(32),
        }
        if probes:
            for name, layout in (("coef", CoefBeat), ("rows", block_rows(lanes)), ("ycc", ycbcr_pixels(8))):
                ports[f"probe_{name}"] = Out(data.StructLayout({"fire": 1, "beat": layout}))
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        abort = Signal()   # resets the pixel path after an entropy fault
        max_blocks = -(-self.max_width // 8)
        lane_reset = ResetSignal("sync") | self.reset
        # Blocks that work in the same clocks share a gate: a gate costs the simulator its
        # enable and its clock's trigger in every clock, and a block clocked while idle
        # changes nothing. The header parser and the Huffman tables (which change only
        # while a DHT segment is loaded) work while the headers are read.
        header_gate = ClockGate("headers", self.clock_gating)
        m.submodules.headers = hp = header_gate.wrap(HeaderParser(self.max_width))
        m.submodules.entropy = ent = EntropyDecoder(tables_gate=header_gate)
        header_gate.add(m, ~hp.idle | ~ent.tables_idle, lane_reset)
        m.submodules.idct = idct = ResetInserter(abort)(Idct(self.lanes, modular=self.sim_arithmetic))
        # Behind the IDCT, the pixel path's blocks are idle about half of the clocks: with
        # clock gating they run only in clocks one of their gate's blocks is busy or reset
        # (the IDCT itself is busy in 98 % of them, docs/benchmarks.md). The chroma planes
        # take their blocks in turn and give their rows together, and the upsamplers and
        # the colour converter pass the same pixels on: a gate for each of those groups.
        blocks = {f"plane{c}": PlaneBuffer(max_blocks, band_blocks=2 if c == 0 else 1, lanes=self.lanes)
                  for c in range(3)}
        blocks.update({f"up{c}": RowUpsampler(8) for c in (1, 2)}, color=ColorConverter(8, self.sim_arithmetic))
        groups = {"plane0": ["plane0"], "chroma": ["plane1", "plane2"], "pixels": ["up1", "up2", "color"]}
        for gate_name, names in groups.items():
            gate = ClockGate(gate_name, self.clock_gating)
            for name in names:
                m.submodules[name] = gate.wrap(ResetInserter(abort)(blocks[name]))
            gate.add(m, Cat(*(~blocks[name].idle for name in names)).any() | abort, lane_reset)
        planes = [blocks[f"plane{c}"] for c in range(3)]
        ups = [blocks["up1"], blocks["up2"]]
        color = blocks["color"]

        # Once a file's last beat is in, the next file waits for ``done``: its header
        # must not restart the stages while this image is still coming out.
        tail = Signal()
        m.d.comb += [hp.input.payload.eq(self.input.payload),
                     hp.input.valid.eq(self.input.valid & ~tail),
                     self.input.ready.eq(hp.input.ready & ~tail)]
        with m.If(self.done):
            m.d.sync += tail.eq(0)
        with m.Elif(self.input.valid & self.input.ready & self.input.payload.last):
            m.d.sync += tail.eq(1)
        wiring.connect(m, hp.tables, ent.tables)
        wiring.connect(m, hp.quant, idct.quant)
        wiring.connect(m, hp.entropy, ent.input)
        wiring.connect(m, ent.coef, idct.coef)
        m.d.comb += [ent.scan.eq(hp.scan), ent.start.eq(hp.start), self.info.eq(hp.info),
                     self.start.eq(hp.start), self.symbols.eq(ent.symbols)]

        # Plane geometry (T.81 A.1.1): luma is the image, chroma ceil(W / h0) x ceil(H / v0).
        info, scan = hp.info, hp.scan
        three = info.ncomp == 3
        h2 = three & (scan.comp[0].h == 2)
        v2 = three & (scan.comp[0].v == 2)
        luma_blocks = Mux(three, scan.mcux * scan.comp[0].h, scan.mcux)
        chroma_cols = Mux(h2, (info.width + 1) >> 1, info.width)
        chroma_rows = Mux(v2, (info.height + 1) >> 1, info.height)
        narrow = h2 & (chroma_cols <= 2)
        m.d.comb += [planes[0].config.blocks_wide.eq(luma_blocks),
                     planes[0].config.bands.eq(scan.mcuy), planes[0].config.rows.eq(info.height),
                     planes[0].config.cols.eq(info.width), planes[0].config.tall.eq(v2)]
        for c in (1, 2):
            cfg = planes[c].config
            m.d.comb += [cfg.blocks_wide.eq(scan.mcux), cfg.bands.eq(scan.mcuy),
                         cfg.rows.eq(chroma_rows), cfg.cols.eq(chroma_cols), cfg.tall.eq(0),
                         cfg.v_ctx.eq(v2), cfg.h2.eq(h2), cfg.v2.eq(v2), cfg.narrow.eq(narrow)]
        for p in planes:
            m.d.comb += p.start.eq(hp.start)

        # IDCT rows to the component's plane.
        comp = idct.o.payload.comp
        m.d.comb += idct.o.ready.eq(Mux(comp == 0, planes[0].i.ready,
                                        Mux(comp == 1, planes[1].i.ready, planes[2].i.ready)))
        for c, p in enumerate(planes):
            m.d.comb += [p.i.payload.eq(idct.o.payload), p.i.valid.eq(idct.o.valid & (comp == c))]
        range_fault = Signal()
        with m.If(idct.o.valid & idct.o.ready & idct.o.payload.range_fault):
            m.d.sync += range_fault.eq(1)

        # Chroma: upsample, then 8-sample pieces aligned with luma's, rows beyond H dropped.
        pieces = []
        for c in (1, 2):
            up = ups[c - 1]
            wiring.connect(m, planes[c].o, up.i)
            half = Signal(name=f"half{c}")          # second 8 samples of a 16-sample beat
            row = Signal(16, name=f"crow{c}")        # upsampled row number
            col = Signal(16, name=f"ccol{c}")        # first sample of the piece
            o = up.o.payload
            wide = o.n > 8
            n_here = Mux(half, o.n - 8, Mux(wide, 8, o.n))
            left = info.width - col
            piece = Signal(data.StructLayout({"valid": 1, "s": data.ArrayLayout(8, 8), "drop": 1}),
                           name=f"piece{c}")
            take = Signal(name=f"take{c}")
            m.d.comb += [piece.valid.eq(up.o.valid), piece.drop.eq((row >= info.height) | (left <= 0))]
            for k in range(8):
                m.d.comb += piece.s[k].eq(Mux(half, o.samples[8 + k], o.samples[k]))
            done_beat = half | ~wide
            m.d.comb += up.o.ready.eq(take & done_beat)
            with m.If(take):
                m.d.sync += [half.eq(~done_beat), col.eq(col + n_here)]
                with m.If(done_beat & o.last):
                    m.d.sync += [row.eq(row + 1), col.eq(0)]
            with m.If(hp.start):
                m.d.sync += [half.eq(0), row.eq(0), col.eq(0)]
            pieces.append((piece, take))

        # Join luma with the chroma pieces (dropped pieces are skipped first).
        y = planes[0].o
        cin = color.i.payload
        chroma_ready = Signal()
        m.d.comb += chroma_ready.eq(~three | (pieces[0][0].valid & ~pieces[0][0].drop
                                              & pieces[1][0].valid & ~pieces[1][0].drop))
        for piece, take in pieces:
            m.d.comb += take.eq(three & piece.valid & (piece.drop | (chroma_ready & y.valid & color.i.ready)))
        pixels_left = Signal(32)
        m.d.comb += [color.i.valid.eq(y.valid & chroma_ready), y.ready.eq(color.i.ready & chroma_ready)]
        for k in range(8):
            m.d.comb += [cin.y[k].eq(y.payload.p[k]),
                         cin.cb[k].eq(Mux(three, pieces[0][0].s[k], 128)),
                         cin.cr[k].eq(Mux(three, pieces[1][0].s[k], 128))]
        m.d.comb += [cin.n.eq(y.payload.n), cin.row_end.eq(y.payload.last),
                     cin.last.eq(pixels_left == y.payload.n)]
        with m.If(hp.start):
            m.d.sync += pixels_left.eq(info.width * info.height)
        with m.Elif(y.valid & y.ready):
            m.d.sync += pixels_left.eq(pixels_left - y.payload.n)
        wiring.connect(m, color.o, wiring.flipped(self.o))

        # Image end: a header stop; an entropy fault (pixel path reset at once); or
        # both the last pixel out and the entropy decoder finished (the file's bytes all
        # taken and its ending checked), whichever comes second.
        pixels_out = Signal()
        scan_done = Signal()
        last_out = self.o.valid & self.o.ready & self.o.payload.last
        m.d.comb += abort.eq(ent.done & (ent.status != 0))
        with m.If(hp.done & (hp.status != 0)):
            m.d.comb += [self.done.eq(1), self.status.eq(hp.status)]
        with m.Elif(abort):
            m.d.comb += [self.done.eq(1), self.status.eq(STATUS_ENTROPY | ent.status)]
        with m.Elif((pixels_out | last_out) & (scan_done | ent.done)):
            m.d.comb += [self.done.eq(1), self.status.eq(Mux(range_fault, STATUS_IDCT_RANGE, 0))]
        with m.If(hp.start | self.done):
            m.d.sync += [pixels_out.eq(0), scan_done.eq(0)]
        with m.Else():
            with m.If(last_out):
                m.d.sync += pixels_out.eq(1)
            with m.If(ent.done):
                m.d.sync += scan_done.eq(1)
        with m.If(hp.start):
            m.d.sync += range_fault.eq(0)
        if self.probes:
            for probe, port in ((self.probe_coef, ent.coef), (self.probe_rows, idct.o), (self.probe_ycc, color.i)):
                m.d.comb += [probe.fire.eq(port.valid & port.ready), probe.beat.eq(port.payload)]
        # The gated domains take ``reset`` as their domain reset (above); ``sync`` here.
        return ResetInserter(self.reset)(m)
