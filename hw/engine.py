"""Lane engine: one decoder lane with its job reader and writer, run one job at a time.

:class:`LaneEngine` takes a :data:`Job`, streams the input through a
:class:`~dlbooster.hw.lane.Lane` into the output buffer, and hands back one
:data:`Completion` per job, whatever happens:

- status 0, or the lane's status (1..0x3F, :func:`dlbooster.hw.lane.status_reason`):
  the host decodes those images on the CPU;
- :class:`~dlbooster.hw.regs.DeviceStatus` for the device's own outcomes: a bad job, an output buffer
  smaller than ``width * height * 3`` (found from the frame header before any pixel is
  written, so nothing is written), a memory error response, or the watchdog.

The watchdog counts clocks in which nothing moves (no request, data beat, response, lane
input or output); at ``watchdog`` clocks the job completes with
:attr:`~dlbooster.hw.regs.DeviceStatus.WATCHDOG` at once, and the engine then waits, taking no job, for its
outstanding memory transactions to finish (AXI4 allows no abandoning them; a memory that
never answers keeps the engine out of service until reset).
"""

from amaranth import Module, Mux, ResetSignal, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .axi import LaneBus
from .gating import ClockGate
from .lane import Lane
from .reader import JobReader
from .regs import DeviceStatus
from .writer import JobWriter

__all__ = ["Job", "Completion", "LaneEngine"]


#: A decode job: input at ``in_addr`` (``in_len`` bytes), RGB output to ``out_addr``
#: (``out_cap`` bytes available), ``id`` returned in the completion.
Job = data.StructLayout({"in_addr": 64, "in_len": 32, "out_addr": 64, "out_cap": 32, "id": 32})

#: A job's outcome: ``status`` (0 = decoded), the ``lane`` that ran it, the frame's
#: ``width``/``height`` (0 before the frame header), ``bytes`` written, ``clocks`` from
#: taking the job to completing it, Huffman ``symbols`` decoded.
Completion = data.StructLayout({"id": 32, "status": 8, "lane": 8, "width": 16, "height": 16,
                                "bytes": 32, "clocks": 32, "symbols": 32})


class LaneEngine(wiring.Component):
    """One lane running jobs (see the module docstring).

    Args:
        index: this lane's number (reported in completions).
        max_width: widest image, in pixels.
        data_width: memory bus width, bits.
        idct_lanes: the IDCT's rows per clock (see :class:`dlbooster.hw.device.Device`).
        clock_gating: see :class:`dlbooster.hw.lane.Lane`; the job reader is gated too.
        sim_arithmetic: see :class:`dlbooster.hw.lane.Lane`.

    Ports:
        job: :data:`Job` stream (taken only while the engine is idle).
        done: :data:`Completion` stream.
        bus: :data:`~dlbooster.hw.axi.LaneBus`.
        watchdog: clocks without movement before a job is abandoned (0: never).
        busy: a job (or its outstanding transactions) holds the engine.
    """

    def __init__(self, index: int = 0, max_width: int = 8192, data_width: int = 128, idct_lanes: int = 2,
                 clock_gating: bool = False, sim_arithmetic: bool = False):
        self.index, self.max_width, self.data_width, self.idct_lanes = index, max_width, data_width, idct_lanes
        self.clock_gating, self.sim_arithmetic = clock_gating, sim_arithmetic
        super().__init__({
            "job": In(stream.Signature(Job)),
            "done": Out(stream.Signature(Completion)),
            "bus": Out(LaneBus(data_width)),
            "watchdog": In(32),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        lane_reset = Signal()
        m.submodules.lane = lane = Lane(self.max_width, self.idct_lanes, clock_gating=self.clock_gating,
                                           sim_arithmetic=self.sim_arithmetic)
        m.d.comb += lane.reset.eq(lane_reset)
        # Most of the time the reader waits with nothing in flight while the lane takes
        # its buffered bytes.
        reader_gate = ClockGate("reader", self.clock_gating)
        reader = JobReader(self.data_width)
        m.submodules.reader = reader_gate.wrap(reader)
        reader_gate.add(m, ~reader.idle, ResetSignal("sync"))
        m.submodules.writer = writer = JobWriter(self.data_width)
        bus = self.bus
        for name in ("ar", "r"):
            wiring.connect(m, getattr(reader.bus, name), wiring.flipped(getattr(bus, name)))
        for name in ("aw", "w", "b"):
            wiring.connect(m, getattr(writer.bus, name), wiring.flipped(getattr(bus, name)))
        wiring.connect(m, reader.o, lane.input)
        wiring.connect(m, lane.o, writer.i)

        job = Signal(Job)
        out = Signal(Completion)
        status = out.status
        quiet = reader.quiet & writer.quiet
        idle = Signal(32)                    # clocks without movement
        moved = reader.progress | writer.progress
        timed_out = (self.watchdog != 0) & (idle >= self.watchdog)
        word_mask = self.data_width // 8 - 1
        m.d.comb += [self.done.payload.eq(out), self.done.payload.lane.eq(self.index),
                     self.done.payload.bytes.eq(writer.written)]

        with m.FSM():
            with m.State("IDLE"):
                # Quiet already, but never a new job over an old job's memory traffic.
                m.d.comb += [self.job.ready.eq(quiet), lane_reset.eq(1)]
                p = self.job.payload
                bad = (p.in_len == 0) | ((p.in_addr | p.out_addr) & word_mask).any()
                with m.If(self.job.valid & quiet):
                    m.d.sync += [job.eq(p), out.id.eq(p.id), out.status.eq(Mux(bad, DeviceStatus.BAD_JOB, 0)),
                                 out.width.eq(0), out.height.eq(0), out.clocks.eq(0), out.symbols.eq(0),
                                 idle.eq(0)]
                    m.d.comb += [reader.start.eq(~bad), writer.start.eq(1)]
                    with m.If(bad):
                        m.next = "POST"
                    with m.Else():
                        m.next = "RUN"
                m.d.comb += [reader.addr.eq(p.in_addr), reader.length.eq(p.in_len),
                             writer.addr.eq(p.out_addr), writer.capacity.eq(p.out_cap)]
            with m.State("RUN"):
                info = lane.info
                with m.If(lane.start):
                    m.d.sync += [out.width.eq(info.width), out.height.eq(info.height)]
                    with m.If(info.width * info.height * 3 > job.out_cap):
                        m.d.sync += status.eq(DeviceStatus.OUTPUT_TOO_SMALL)
                        m.next = "FLUSH"
                with m.If(lane.done):
                    m.d.sync += [status.eq(lane.status), out.symbols.eq(lane.symbols)]
                    m.next = "FLUSH"
                with m.If(reader.error):
                    m.d.sync += status.eq(DeviceStatus.READ_ERROR)
                    m.next = "FLUSH"
                with m.If(writer.error | writer.overflow):
                    m.d.sync += status.eq(DeviceStatus.WRITE_ERROR)
                    m.next = "FLUSH"
                with m.If(timed_out):
                    m.d.sync += status.eq(DeviceStatus.WATCHDOG)
                    m.next = "POST"
            with m.State("FLUSH"):
                # The input is finished with; the writer sends the rest (or drops it on error).
                m.d.comb += [lane_reset.eq(1), reader.cancel.eq(1), writer.flush.eq(1),
                             writer.discard.eq(status != 0)]
                with m.If(writer.error & (status == 0)):
                    m.d.sync += status.eq(DeviceStatus.WRITE_ERROR)
                with m.If(quiet):
                    m.next = "POST"
                with m.If(timed_out):
                    m.d.sync += status.eq(DeviceStatus.WATCHDOG)
                    m.next = "POST"
            with m.State("POST"):
                m.d.comb += [lane_reset.eq(1), reader.cancel.eq(1), writer.discard.eq(1),
                             self.done.valid.eq(1)]
                with m.If(self.done.ready):
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.comb += [lane_reset.eq(1), reader.cancel.eq(1), writer.discard.eq(1)]
                with m.If(quiet):
                    m.next = "IDLE"
        m.d.comb += self.busy.eq(~self.job.ready)
        with m.If(~self.job.ready & ~self.done.valid):
            m.d.sync += out.clocks.eq(out.clocks + 1)
        with m.If(moved | lane.input.valid & lane.input.ready | lane.o.valid & lane.o.ready):
            m.d.sync += idle.eq(0)
        with m.Elif(~self.job.ready):
            m.d.sync += idle.eq(idle + 1)
        return m
