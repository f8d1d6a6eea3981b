"""Plane buffer: one component's IDCT blocks in, raster rows (with neighbours) out.

:class:`PlaneBuffer` turns the IDCT's block rows, which arrive in MCU order, into raster
rows of one component, 8 samples per beat, for the upsampler (SPEC.md 3.2) or, for
luma, straight for colour conversion. It holds ``bands`` iMCU rows ("bands", 8 or 16
sample rows each) in a ring: the IDCT fills one band while the reader walks another.
With vertical context (``v_ctx``: chroma of an h1v2 or h2v2 image) every plane row r is
read twice, as the output rows 2r (with its neighbour r - 1) and 2r + 1 (with r + 1),
neighbours clamped to the plane's real rows; a band is then read only once the next
band is complete (its first row is the last row's lower neighbour), and a band's slot is
refilled only after the band below it no longer needs its last row. Rows and columns
are cropped to the component's real size, so the upsampler's edge rules apply there.
"""

from amaranth import Array, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .idct import block_rows
from .upsample import row_in

__all__ = ["PlaneBuffer", "PlaneConfig"]

#: Geometry of one component's plane for one image, held from ``start`` to the end.
#: ``blocks_wide``: blocks per row of the MCU-padded block grid; ``bands``: iMCU rows;
#: ``rows``/``cols``: the real plane size (ceil(H * v / vmax), ceil(W * h / hmax)); ``tall``:
#: bands of two block rows (the component's v = 2) instead of one;
#: ``v_ctx``: read every row twice with its neighbours; ``h2``, ``v2``, ``narrow``: the
#: upsampling mode passed on in every output beat (see :func:`dlbooster.hw.upsample.row_in`).
PlaneConfig = data.StructLayout({
    "blocks_wide": 16, "bands": 16, "rows": 16, "cols": 16, "tall": 1,
    "v_ctx": 1, "h2": 1, "v2": 1, "narrow": 1,
})


class PlaneBuffer(wiring.Component):
    """Block rows of one component in (MCU order), raster row pieces out.

    Args:
        max_blocks: widest block row held (blocks), i.e. ceil(max_width * h / hmax / 8).
        band_blocks: most block rows per band (2 for a luma plane, whose v may be 2;
            1 for chroma); ``config.tall`` selects 2 per image.
        lanes: rows per input beat (the IDCT's ``lanes``).
        bands: iMCU rows held (3 allows vertical context while the next band fills).

    Memory: ``bands * 8 * band_blocks * max_blocks`` words of 8 samples (64 bits).

    Ports:
        config: :data:`PlaneConfig`; start: pulse before the image's first block.
        i: :func:`dlbooster.hw.idct.block_rows` ``(lanes)`` stream of this component's
            blocks (``by``, ``bx`` in its block grid).
        o: :func:`dlbooster.hw.upsample.row_in` ``(8)`` stream: ``p`` the row, ``q`` its
            neighbour (the row itself without vertical context), ``odd`` for output row
            2r + 1, ``first``/``last`` beat of the row, ``n`` valid samples.
        done: high once every output row of the image has been given.
        idle: high in clocks in which nothing is written, read or held in the output
            stages, and no register changes but the read stages' data (meaningless
            without a beat); for :class:`dlbooster.hw.gating.ClockGate`.
    """

    def __init__(self, max_blocks: int, band_blocks: int = 1, lanes: int = 1, bands: int = 3):
        self.max_blocks = max_blocks
        self.band_blocks = band_blocks
        self.lanes = lanes
        self.bands = bands
        super().__init__({
            "config": In(PlaneConfig),
            "start": In(1),
            "i": In(stream.Signature(block_rows(lanes))),
            "o": Out(stream.Signature(row_in(8))),
            "done": Out(1),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        lanes, nbands, wide = self.lanes, self.bands, self.max_blocks
        stride = 8 * self.band_blocks          # ring rows per slot
        ring_rows = nbands * stride
        depth = ring_rows // lanes * wide
        cfg = self.config

        # Bank q holds the ring rows congruent to q modulo ``lanes`` (one input beat
        # writes one row in each bank); two read ports give a row and its neighbour.
        wports, pports, qports = [], [], []
        for q in range(lanes):
            mem = Memory(shape=64, depth=depth, init=[])
            m.submodules[f"bank{q}"] = mem
            wports.append(mem.write_port())
            pports.append(mem.read_port(transparent_for=()))
            qports.append(mem.read_port(transparent_for=()))

        full = Array(Signal(name=f"full{b}") for b in range(nbands))
        held = Array(Signal(name=f"held{b}") for b in range(nbands))   # still read as context
        band_slot = Signal(range(nbands))         # slot of the band being written
        write_band = Signal(16)                   # band index being written

        tall = cfg.tall if self.band_blocks > 1 else Const(0, 1)
        band_rows = Mux(tall, 16, 8)

        # Write side: the ring row of each of the beat's rows.
        beat = self.i.payload
        base_row = Mux(tall, beat.by[0], 0) * 8 + beat.row
        slot_free = ~full[band_slot] & ~held[band_slot]
        m.d.comb += self.i.ready.eq(slot_free & (write_band < cfg.bands))
        fire = self.i.valid & self.i.ready
        for q in range(lanes):
            ring_row = band_slot * stride + base_row + q
            m.d.comb += [wports[q].en.eq(fire),
                         wports[q].addr.eq((ring_row // lanes) * wide + beat.bx),
                         wports[q].data.eq(beat.samples.as_value()[64 * q:64 * (q + 1)])]
        band_end = beat.last & (beat.bx == cfg.blocks_wide - 1) & (~tall | beat.by[0])
        with m.If(fire & band_end):
            m.d.sync += [full[band_slot].eq(1), write_band.eq(write_band + 1),
                         band_slot.eq(Mux(band_slot == nbands - 1, 0, band_slot + 1))]

        # Read side: output row ``orow`` of plane row ``r`` (two per row with context).
        r = Signal(16)              # plane row
        odd = Signal()
        word = Signal(range(wide + 1))
        read_band = Signal(16)
        read_slot = Signal(range(nbands))
        words = (cfg.cols + 7) >> 3
        last_word = word == words - 1
        def row_in_band(row):
            return Mux(tall, row[0:4], row[0:3])

        band_of_r_last = row_in_band(r) == band_rows - 1
        rows_done = Signal()
        m.d.comb += self.done.eq(rows_done)
        nbr = Signal(16)
        with m.If(~cfg.v_ctx):
            m.d.comb += nbr.eq(r)
        with m.Elif(odd):
            m.d.comb += nbr.eq(Mux(r + 1 >= cfg.rows, r, r + 1))
        with m.Else():
            m.d.comb += nbr.eq(Mux(r == 0, 0, r - 1))

        def ring_row(row):
            band = Signal(16)
            m.d.comb += band.eq(Mux(tall, row >> 4, row >> 3))
            return (band % nbands) * stride + row_in_band(row)

        p_ring, q_ring = ring_row(r), ring_row(nbr)
        next_ready = (read_band + 1 >= cfg.bands) | full[Mux(read_slot == nbands - 1, 0, read_slot + 1)]
        can_read = ~rows_done & full[read_slot] & (~cfg.v_ctx | next_ready)

        # One read stage (the memories' output register), then the output register.
        s1 = Signal(data.StructLayout({"valid": 1, "n": 4, "first": 1, "last": 1, "odd": 1,
                                       "pbank": range(lanes), "qbank": range(lanes)}))
        out = Signal(row_in(8))
        out_valid = Signal()
        en = ~out_valid | self.o.ready
        issue = can_read & en
        for q in range(lanes):
            m.d.comb += [pports[q].en.eq(en), qports[q].en.eq(en),
                         pports[q].addr.eq((p_ring // lanes) * wide + word),
                         qports[q].addr.eq((q_ring // lanes) * wide + word)]
        with m.If(en):
            m.d.sync += [s1.valid.eq(issue), s1.first.eq(word == 0), s1.last.eq(last_word),
                         s1.odd.eq(odd & cfg.v_ctx),
                         s1.n.eq(Mux(last_word, cfg.cols - (word << 3), 8)),
                         s1.pbank.eq(p_ring % lanes), s1.qbank.eq(q_ring % lanes),
                         out_valid.eq(s1.valid)]
            m.d.sync += [out.n.eq(s1.n), out.first.eq(s1.first), out.last.eq(s1.last),
                         out.odd.eq(s1.odd), out.h2.eq(cfg.h2), out.v2.eq(cfg.v2),
                         out.narrow.eq(cfg.narrow),
                         out.p.as_value().eq(Array(p.data for p in pports)[s1.pbank]),
                         out.q.as_value().eq(Array(p.data for p in qports)[s1.qbank])]
        m.d.comb += [self.o.valid.eq(out_valid), self.o.payload.eq(out),
                     self.idle.eq(~(self.i.valid | self.start | can_read | s1.valid | out_valid))]

        with m.If(issue):
            m.d.sync += word.eq(word + 1)
            with m.If(last_word):
                m.d.sync += word.eq(0)
                with m.If(cfg.v_ctx & ~odd):
                    m.d.sync += odd.eq(1)
                with m.Else():
                    m.d.sync += [odd.eq(0), r.eq(r + 1)]
                    # The band above is no longer needed once row 0 of this band is done.
                    with m.If(row_in_band(r) == 0):
                        prev = Mux(read_slot == 0, nbands - 1, read_slot - 1)
                        m.d.sync += held[prev].eq(0)
                    with m.If(r + 1 >= cfg.rows):
                        m.d.sync += [rows_done.eq(1), full[read_slot].eq(0), held[read_slot].eq(0)]
                    with m.Elif(band_of_r_last):
                        # The finished band stays as context for the next band's row 0.
                        m.d.sync += [full[read_slot].eq(0), held[read_slot].eq(cfg.v_ctx),
                                     read_band.eq(read_band + 1),
                                     read_slot.eq(Mux(read_slot == nbands - 1, 0, read_slot + 1))]

        with m.If(self.start):
            m.d.sync += [write_band.eq(0), band_slot.eq(0), read_band.eq(0), read_slot.eq(0),
                         r.eq(0), odd.eq(0), word.eq(0), rows_done.eq(0)]
            for b in range(nbands):
                m.d.sync += [full[b].eq(0), held[b].eq(0)]
        return m
