"""Job reader: a job's JPEG bytes from memory, as the lane's input beats.

:class:`JobReader` reads ``length`` bytes from ``addr`` in incrementing bursts on a
:data:`~dlbooster.hw.axi.LaneBus` and hands them on 4 bytes per beat
(:data:`~dlbooster.hw.entropy.InputBeat`, ``last`` on the file's final beat).

Bounds: it asks only for the bus words that hold the job's bytes, ``ceil(length / W)``
words from ``addr`` (``W`` = bus bytes; ``addr`` must be aligned to ``W``), so it never
reads past the input's last word whatever the JPEG says; the bytes of the last word past
``length`` are dropped. A burst never crosses a ``burst * W``-byte boundary, hence never a
4 KiB one (AXI4 A3.4.1). Space for every requested word is reserved in the FIFO before
the request goes out, so read data is always accepted (``RREADY`` held high).
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .axi import LaneBus
from .entropy import InputBeat

__all__ = ["JobReader"]


class JobReader(wiring.Component):
    """Reads one job's input (see the module docstring).

    Args:
        data_width: bus width in bits (64, 128, 256 or 512).
        depth: FIFO depth in bus words (at least ``2 * burst``: two bursts in flight).
        burst: longest burst in beats (a power of two, at most 256).

    Ports:
        start: pulse: load ``addr`` (bytes, aligned to the bus word) and ``length`` (bytes, > 0).
        cancel: level: ask for nothing more (a request already presented still completes)
            and drop the data that arrives.
        bus: ``ar`` and ``r`` of a :data:`~dlbooster.hw.axi.LaneBus` (``aw``/``w``/``b``
            unused).
        o: :data:`~dlbooster.hw.entropy.InputBeat` stream.
        quiet: no request outstanding and nothing buffered.
        error: a read response since ``start`` was not OKAY.
        progress: a request or a data beat moved this clock (for the watchdog).
        idle: no register or FIFO entry of the reader changes in this clock: no start,
            cancel, request issued or outstanding (its ARREADY and read data may come), beat
            taken, and the FIFO's output register not being refilled. A function of
            registers only, for a :class:`~dlbooster.hw.gating.ClockGate`.
    """

    def __init__(self, data_width: int = 128, depth: int = 32, burst: int = 16):
        assert data_width in (64, 128, 256, 512) and depth >= 2 * burst
        self.data_width, self.depth, self.burst = data_width, depth, burst
        super().__init__({
            "start": In(1), "addr": In(64), "length": In(32), "cancel": In(1),
            "bus": Out(LaneBus(data_width)),
            "o": Out(stream.Signature(InputBeat)),
            "quiet": Out(1), "error": Out(1), "progress": Out(1), "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        word_bytes = self.data_width // 8
        shift = word_bytes.bit_length() - 1
        beats_per_word = word_bytes // 4
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=self.data_width, depth=self.depth)

        word = Signal(64 - shift)             # next word address to ask for
        words_left = Signal(32)               # words not yet asked for
        inflight = Signal(range(self.depth + 1))
        bytes_left = Signal(32)               # bytes not yet handed to the lane
        sub = Signal(range(beats_per_word))   # 4-byte beat within the head word
        ar_valid = Signal()
        ar = self.bus.ar
        m.d.comb += ar.valid.eq(ar_valid)

        # Burst: up to the next burst-aligned boundary, no more than the words left.
        # 1..burst, unsigned: Amaranth makes a difference signed, and a signed compare
        # costs a simulator sign extensions of both sides.
        to_boundary = (self.burst - word[:self.burst.bit_length() - 1]).as_unsigned()
        length = Signal(range(self.burst + 1))
        m.d.comb += length.eq(Mux(words_left < to_boundary, words_left, to_boundary))
        room = self.depth - fifo.level - inflight
        r = self.bus.r
        arrived = r.valid
        asked = Signal(range(self.burst + 1))
        issue = ~ar_valid & ~self.cancel & ~self.start & (words_left != 0) & (room >= length)
        with m.If(issue):
            m.d.sync += [ar_valid.eq(1), ar.payload.addr.eq(word << shift), ar.payload.len.eq(length - 1),
                         word.eq(word + length), words_left.eq(words_left - length)]
            m.d.comb += asked.eq(length)
        with m.Elif(ar.ready):
            m.d.sync += ar_valid.eq(0)
        m.d.sync += inflight.eq(inflight + asked - arrived)
        m.d.comb += [fifo.w_data.eq(r.payload.data), fifo.w_en.eq(arrived)]
        with m.If(self.start):
            m.d.sync += [word.eq(self.addr[shift:]),
                         words_left.eq((self.length + word_bytes - 1) >> shift),
                         bytes_left.eq(self.length), sub.eq(0), self.error.eq(0)]
        with m.Elif(arrived & r.payload.err):
            m.d.sync += self.error.eq(1)
        # A cancelled job asks for nothing more, even once ``cancel`` falls again.
        with m.If(self.cancel & ~self.start):
            m.d.sync += [words_left.eq(0), bytes_left.eq(0), sub.eq(0)]

        # Unpack the head word into 4-byte beats.
        o = self.o
        n = Mux(bytes_left >= 4, 4, bytes_left)
        m.d.comb += [o.valid.eq(fifo.r_rdy & (bytes_left != 0) & ~self.cancel),
                     o.payload.data.eq(fifo.r_data.word_select(sub, 32)),
                     o.payload.n.eq(n), o.payload.last.eq(bytes_left <= 4)]
        end_of_word = (sub == beats_per_word - 1) | (bytes_left <= 4)
        with m.If(self.cancel):
            m.d.comb += fifo.r_en.eq(1)
        with m.Elif(o.valid & o.ready):
            m.d.comb += fifo.r_en.eq(end_of_word)
            m.d.sync += [bytes_left.eq(bytes_left - n), sub.eq(Mux(end_of_word, 0, sub + 1))]
        # From registers only (a clock gate's enable, hw/gating.py): an outstanding read
        # (``inflight``, counted from the request's issue) stands for ARREADY and RVALID.
        # An AXI4 slave sends read data only for a request it accepted.
        m.d.comb += self.idle.eq(~(self.start | self.cancel | issue | (inflight != 0)
                                   | (o.valid & o.ready) | ((fifo.level != 0) & ~fifo.r_rdy)))
        m.d.comb += [self.quiet.eq(~ar_valid & (inflight == 0) & (fifo.level == 0)),
                     self.progress.eq(arrived | (ar.valid & ar.ready) | (o.valid & o.ready))]
        return m
