"""Job writer: the lane's RGB pixels into a job's output buffer in memory.

:class:`JobWriter` packs :func:`~dlbooster.hw.color.rgb_pixels` beats (up to 8 pixels,
24 bytes) into bus words of ``W`` bytes, R, G, B of the first pixel at the lowest
address (the raster ``H x W x 3`` uint8 layout), and writes them in incrementing bursts
on a :data:`~dlbooster.hw.axi.LaneBus`; the image's last word carries byte strobes for
its real bytes only.

Bounds: every byte taken counts against ``capacity``; a beat that would pass it is
dropped and ``overflow`` set, so no strobe ever covers a byte at or past
``addr + capacity``. A burst is asked for only when all its words are buffered, never
crosses a ``burst * W``-byte boundary (hence never a 4 KiB one, AXI4 A3.4.1), and its
data is offered at once, without waiting for the address to be accepted.
"""

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .axi import LaneBus
from .color import rgb_pixels

__all__ = ["JobWriter"]


class JobWriter(wiring.Component):
    """Writes one job's output (see the module docstring).

    At most :attr:`MAX_PENDING` bursts wait for their write responses; a memory that holds
    responses back holds the writer back.

    Args:
        data_width: bus width in bits (64, 128, 256 or 512).
        depth: FIFO depth in bus words (at least ``2 * burst``).
        burst: longest burst in beats (a power of two, at most 256).

    Ports:
        start: pulse: load ``addr`` (bytes, aligned to the bus word) and ``capacity`` (bytes).
        i: :func:`~dlbooster.hw.color.rgb_pixels` ``(8)`` stream.
        flush: level: the input has ended; write out the partial last word.
        discard: level: write nothing more (a burst already asked for is still sent, with
            no strobes set)
            and drop everything buffered or offered.
        bus: ``aw``, ``w`` and ``b`` of a :data:`~dlbooster.hw.axi.LaneBus`.
        written: bytes sent with their strobes set since ``start``.
        quiet: nothing buffered, no burst in progress, every write response back.
        overflow: a beat was dropped because it would pass ``capacity``.
        error: a write response since ``start`` was not OKAY.
        progress: a request, data beat or response moved this clock (for the watchdog).
    """

    MAX_PENDING = 16

    def __init__(self, data_width: int = 128, depth: int = 32, burst: int = 16):
        assert data_width in (64, 128, 256, 512) and depth >= 2 * burst
        self.data_width, self.depth, self.burst = data_width, depth, burst
        super().__init__({
            "start": In(1), "addr": In(64), "capacity": In(32),
            "i": In(stream.Signature(rgb_pixels(8))),
            "flush": In(1), "discard": In(1),
            "bus": Out(LaneBus(data_width)),
            "written": Out(32), "quiet": Out(1), "overflow": Out(1), "error": Out(1),
            "progress": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        wb = self.data_width // 8
        shift = wb.bit_length() - 1
        entry = data.StructLayout({"data": self.data_width, "n": range(wb + 1)})
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=entry.size, depth=self.depth)
        head = entry(fifo.r_data)

        # Packer: ``count`` bytes in ``buf``; a beat (24 bytes at most) is taken while fewer
        # than two words are held, one word leaves per clock.
        cap = 2 * wb + 24
        buf = Signal(8 * cap)
        count = Signal(range(cap + 1))
        taken = Signal(32)                     # bytes accepted since start
        beat = self.i.payload
        nbytes = Signal(5)
        m.d.comb += nbytes.eq(beat.n * 3)
        capacity = Signal(32)
        fits = taken + nbytes <= capacity
        # Only the beat's ``n`` pixels: the bytes above them must stay zero in ``buf``.
        pixels = Cat(Mux(k < beat.n, beat.rgb[k].as_value(), 0) for k in range(8))
        m.d.comb += self.i.ready.eq((count < 2 * wb) | self.discard)
        take = self.i.valid & self.i.ready & ~self.discard & ~self.overflow & fits
        full = count >= wb
        partial = self.flush & ~self.i.valid & (count != 0) & ~full
        push = (full | partial) & fifo.w_rdy & ~self.discard
        m.d.comb += [fifo.w_data.eq(Cat(buf[:self.data_width], Mux(full, wb, count)[:entry.size - self.data_width])),
                     fifo.w_en.eq(push)]
        rest = Mux(push, buf >> (8 * wb), buf)
        left = Signal(range(cap + 1))
        m.d.comb += left.eq(Mux(push, Mux(full, count - wb, 0), count))
        with m.If(self.start | self.discard):
            m.d.sync += [buf.eq(0), count.eq(0)]
        with m.Elif(take | push):
            # Only when bytes move: a simulator then skips the wide shift in other clocks.
            m.d.sync += [buf.eq(rest | Mux(take, pixels << (left * 8), 0)),
                         count.eq(left + Mux(take, nbytes, 0))]
        with m.If(self.start):
            m.d.sync += [taken.eq(0), self.overflow.eq(0), capacity.eq(self.capacity)]
        with m.Elif(take):
            m.d.sync += taken.eq(taken + nbytes)
        with m.Elif(self.i.valid & self.i.ready & ~self.discard & ~fits):
            m.d.sync += self.overflow.eq(1)

        # Bursts: ask when the burst's words are all buffered (fewer at the end); the data
        # may go before the address is accepted (AXI4 A3.3.1: a slave may wait for WVALID).
        word = Signal(64 - shift)
        aw_valid = Signal()
        w_left = Signal(range(self.burst + 1))    # beats of the current burst still to send
        pending = Signal(range(self.MAX_PENDING + 1))   # bursts asked whose response is not back
        aw, w, b = self.bus.aw, self.bus.w, self.bus.b
        # 1..burst, unsigned: Amaranth makes a difference signed, and a signed compare
        # costs a simulator sign extensions of both sides.
        to_boundary = (self.burst - word[:self.burst.bit_length() - 1]).as_unsigned()
        level = fifo.level
        length = Mux(level < to_boundary, level, to_boundary)
        ready_to_ask = (level >= to_boundary) | (self.flush & ~self.i.valid & (count == 0) & (level != 0))
        m.d.comb += aw.valid.eq(aw_valid)
        asked = Signal()
        with m.If(~aw_valid & (w_left == 0) & (pending < self.MAX_PENDING) & ~self.discard & ~self.start
                  & ready_to_ask):
            m.d.sync += [aw_valid.eq(1), aw.payload.addr.eq(word << shift), aw.payload.len.eq(length - 1),
                         word.eq(word + length), w_left.eq(length)]
            m.d.comb += asked.eq(1)
        with m.Elif(aw.ready):
            m.d.sync += aw_valid.eq(0)
        with m.If(self.start):
            m.d.sync += word.eq(self.addr[shift:])
        # Beats sent after ``discard`` (a burst already asked for) carry no strobes: the
        # host may have taken the buffer back once the job completed.
        m.d.comb += [w.valid.eq((w_left != 0) & fifo.r_rdy), w.payload.data.eq(head.data),
                     w.payload.last.eq(w_left == 1)]
        m.d.comb += w.payload.strb.eq(Mux(self.discard, 0, Mux(head.n == wb, (1 << wb) - 1, (1 << head.n) - 1)))
        with m.If(w.valid & w.ready):
            m.d.comb += fifo.r_en.eq(1)
            m.d.sync += w_left.eq(w_left - 1)
            with m.If(~self.discard):
                m.d.sync += self.written.eq(self.written + head.n)
        with m.Elif(self.discard & (w_left == 0) & ~aw_valid & ~asked):
            m.d.comb += fifo.r_en.eq(1)
        with m.If(self.start):
            m.d.sync += [self.written.eq(0), self.error.eq(0)]
        with m.Elif(b.valid & b.payload.err):
            m.d.sync += self.error.eq(1)
        m.d.sync += pending.eq(pending + asked - b.valid)
        m.d.comb += [self.quiet.eq((count == 0) & (fifo.level == 0) & ~aw_valid & (w_left == 0) & (pending == 0)),
                     self.progress.eq((aw.valid & aw.ready) | (w.valid & w.ready) | b.valid | take)]
        return m
