"""The decoder device: N lane engines behind AXI4-Lite control and one AXI4 master.

:class:`Device` is the top level that packages for boards (PYNQ block designs, Alveo RTL
kernels) and that the simulated device (:mod:`dlbooster.sim.device`) runs:

- ``ap_clk``, ``ap_rst_n`` (synchronous, active low; registered once, so the device
  enters and leaves reset one clock after ``ap_rst_n`` falls and rises: the AXI valids
  and ``interrupt`` are low from the clock it falls, and the AXI4-Lite slave accepts
  nothing in the clock after it rises);
- ``s_axi_control_*``: AXI4-Lite slave with the registers of :mod:`dlbooster.hw.regs`
  (ap_ctrl_hs at 0x00-0x0C, the job and completion FIFOs, configuration);
- ``m_axi_gmem_*``: AXI4 master, 64-bit addresses, ``data_width``-bit data, incrementing
  bursts of up to 16 beats, ``ARID``/``AWID`` = lane; read data of different IDs may
  interleave; ``RREADY`` and ``BREADY`` are always high (space is reserved before asking);
- ``interrupt``: ``GIE & (IER & ISR) != 0``, active high.

Jobs are taken from the job FIFO by the lowest-numbered idle lane, one per clock, while
the device is started; completions enter the completion FIFO in the order jobs finish
(match them by job id). The read address channel is granted to the lowest-numbered lane asking
(held until accepted, as AXI4 requires); the write address and data channels together
to the lowest-numbered lane asking, until its address is accepted and its ``WLAST``
taken (its data may be offered before its address is accepted).
"""

from amaranth import Cat, ClockDomain, ClockSignal, Module, Mux, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .axi import Resp, axi4_lite_slave_ports, axi4_master_ports
from .engine import Completion, Job, LaneEngine
from .regs import MAGIC, Reg

#: The widest frame a JPEG can declare (T.81 B.2.2: X is 16 bits).
MAX_JPEG_WIDTH = 65535

__all__ = ["Device"]


class Device(wiring.Component):
    """The decoder device (see the module docstring).

    Args:
        lanes: decoder lanes (1..32).
        max_width: widest image, pixels (each lane's line buffers).
        data_width: AXI4 data width, bits (64, 128, 256 or 512).
        job_depth: job FIFO entries.
        done_depth: completion FIFO entries.
        watchdog: the watchdog register's value after reset, clocks.
        idct_lanes: each IDCT's rows per clock. 2, the default, costs 0.4 % more clocks
            than 4 on the ImageNet sample photos (docs/benchmarks.md) for about
            half the IDCT's LUTs and multipliers: a lane then fits the PYNQ-Z2's xc7z020
            (``dlbooster synth``).
        clock_gating: clock-gate each lane's idle blocks (:class:`dlbooster.hw.gating.ClockGate`),
            for the simulated device; boards are built without it. The device makes the same
            handshakes with the same valid data, clock for clock, either way.
        sim_arithmetic: each lane's IDCT passes hold their values modulo ``2**48``
            (:class:`dlbooster.hw.idct.IdctPass` ``modular``) and its colour conversion
            works in offset binary (:class:`dlbooster.hw.color.ColorConverter`
            ``unsigned``): for the simulated device, whose Verilator model then does no
            sign extensions there; boards keep the signed forms. The same outputs, clock
            for clock, either way.

    Raises:
        ValueError: ``lanes`` outside 1..32, ``max_width`` outside 1..65535, or
            ``job_depth`` or ``done_depth`` outside 1..255.
    """

    def __init__(self, lanes: int = 1, max_width: int = 8192, data_width: int = 128, job_depth: int = 16,
                 done_depth: int = 16, watchdog: int = 1 << 24, idct_lanes: int = 2, clock_gating: bool = False,
                 sim_arithmetic: bool = False):
        # The BUSY register has a bit per lane; CONFIG holds each FIFO's depth in 8 bits.
        if not 1 <= lanes <= 32:
            raise ValueError(f"a device has 1 to 32 lanes, not {lanes}")
        if not 1 <= max_width <= MAX_JPEG_WIDTH:
            # A frame's width is 16 bits (T.81 B.2.2): wider line buffers hold nothing.
            raise ValueError(f"max_width is 1 to {MAX_JPEG_WIDTH} pixels, not {max_width}")
        if not 1 <= job_depth <= 255:
            raise ValueError(f"the job FIFO holds 1 to 255 entries, not {job_depth}")
        if not 1 <= done_depth <= 255:
            raise ValueError(f"the completion FIFO holds 1 to 255 entries, not {done_depth}")
        self.lanes, self.max_width, self.data_width = lanes, max_width, data_width
        self.job_depth, self.done_depth, self.watchdog, self.idct_lanes = job_depth, done_depth, watchdog, idct_lanes
        self.clock_gating, self.sim_arithmetic = clock_gating, sim_arithmetic
        self.id_width = max(1, (lanes - 1).bit_length())
        ports = {"ap_clk": In(1), "ap_rst_n": In(1), "interrupt": Out(1)}
        ports.update(axi4_lite_slave_ports("s_axi_control"))
        ports.update(axi4_master_ports("m_axi_gmem", data_width, self.id_width))
        super().__init__(ports)

    def _port(self, prefix, name):
        return getattr(self, f"{prefix}_{name}")

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain()
        # ap_rst_n is registered once before it resets anything: no logic then depends on a
        # top-level input through the reset, so the reset tree is a single flop's fan-out
        # (and a simulator does not re-evaluate it whenever an input changes).
        rst = Signal(init=1, reset_less=True)
        m.d.sync += rst.eq(~self.ap_rst_n)
        m.d.comb += [ClockSignal().eq(self.ap_clk), ResetSignal().eq(rst)]
        # AXI requires the valids low while ap_rst_n is low, also in the first such clock,
        # before the registered reset acts; what the device does in that clock is undone
        # by the reset in the next one.
        up = self.ap_rst_n
        engines = []
        for i in range(self.lanes):
            engine = LaneEngine(i, self.max_width, self.data_width, self.idct_lanes, self.clock_gating,
                                self.sim_arithmetic)
            m.submodules[f"lane{i}"] = engine
            engines.append(engine)
        m.submodules.jobs = jobs = SyncFIFOBuffered(width=Job.size, depth=self.job_depth)
        m.submodules.dones = dones = SyncFIFOBuffered(width=Completion.size, depth=self.done_depth)
        ctl = lambda name: self._port("s_axi_control", name)   # noqa: E731
        mem = lambda name: self._port("m_axi_gmem", name)      # noqa: E731

        # Registers.
        started = Signal()
        auto_restart = Signal()
        ap_done = Signal()
        gie = Signal()
        ier = Signal(2)
        isr = Signal(2)
        watchdog = Signal(32, init=self.watchdog)
        staged = Signal(Job)
        all_idle = (jobs.level == 0) & ~Cat(e.busy for e in engines).any()
        finished = started & all_idle & ~auto_restart
        with m.If(finished):
            m.d.sync += [started.eq(0), ap_done.eq(1)]

        # AXI4-Lite writes: address and data accepted together, then the response.
        bvalid = Signal()
        # Nothing is accepted in the clock the registered reset still holds after ap_rst_n rises.
        write = ctl("awvalid") & ctl("wvalid") & ~bvalid & ~rst
        m.d.comb += [ctl("awready").eq(write), ctl("wready").eq(write), ctl("bvalid").eq(bvalid & up),
                     ctl("bresp").eq(Resp.OKAY)]
        with m.If(write):
            m.d.sync += bvalid.eq(1)
        with m.Elif(ctl("bready")):
            m.d.sync += bvalid.eq(0)
        # Offsets above the register map do not alias onto it: writes there are ignored.
        waddr = Mux(ctl("awaddr")[8:] == 0, ctl("awaddr")[2:8], 0x3F)
        wdata = ctl("wdata")
        push = Signal()
        pop = Signal()
        # A staging register was written since the last push: a one-shot start queues
        # that job (XRT's kernel call writes the arguments, then AP_START).
        staged_new = Signal()
        # As Xilinx's ap_ctrl_hs cores do, an event sets its ISR bit only while IER enables it.
        isr_set = Cat(finished, dones.w_en) & ier
        isr_toggle = Signal(2)
        with m.If(write):
            with m.Switch(waddr):
                with m.Case(Reg.AP_CTRL >> 2):
                    with m.If(wdata[0]):
                        m.d.sync += started.eq(1)
                        m.d.comb += push.eq(~wdata[7] & staged_new)
                    m.d.sync += auto_restart.eq(wdata[7])
                with m.Case(Reg.GIE >> 2):
                    m.d.sync += gie.eq(wdata[0])
                with m.Case(Reg.IER >> 2):
                    m.d.sync += ier.eq(wdata[:2])
                with m.Case(Reg.ISR >> 2):
                    m.d.comb += isr_toggle.eq(wdata[:2])
                for reg, field in ((Reg.JOB_IN_ADDR_LO, staged.in_addr[:32]),
                                   (Reg.JOB_IN_ADDR_HI, staged.in_addr[32:]),
                                   (Reg.JOB_IN_LEN, staged.in_len),
                                   (Reg.JOB_OUT_ADDR_LO, staged.out_addr[:32]),
                                   (Reg.JOB_OUT_ADDR_HI, staged.out_addr[32:]),
                                   (Reg.JOB_OUT_CAP, staged.out_cap),
                                   (Reg.JOB_ID, staged.id)):
                    with m.Case(reg >> 2):
                        m.d.sync += [field.eq(wdata), staged_new.eq(1)]
                with m.Case(Reg.WATCHDOG >> 2):
                    m.d.sync += watchdog.eq(wdata)
                with m.Case(Reg.JOB_PUSH >> 2):
                    m.d.comb += push.eq(1)
                with m.Case(Reg.DONE_POP >> 2):
                    m.d.comb += pop.eq(1)
        with m.If(push):
            m.d.sync += staged_new.eq(0)
        # A new event wins over a clear written in the same clock (none is lost).
        m.d.sync += isr.eq((isr ^ isr_toggle) | isr_set)
        # One-shot mode drops the oldest completion when a lane must post to a full FIFO:
        # XRT's own kernel calls never pop theirs, and would stall after done_depth runs.
        make_room = Signal()
        m.d.comb += [jobs.w_data.eq(staged), jobs.w_en.eq(push), dones.r_en.eq(pop | make_room),
                     self.interrupt.eq(gie & (ier & isr).any() & up)]

        # AXI4-Lite reads: one at a time; reading AP_CTRL clears ap_done.
        rvalid = Signal()
        rdata = Signal(32)
        m.d.comb += [ctl("arready").eq(~rvalid & ~rst), ctl("rvalid").eq(rvalid & up), ctl("rdata").eq(rdata),
                     ctl("rresp").eq(Resp.OKAY)]
        head = Completion(dones.r_data)
        busy = Cat(e.busy for e in engines)
        config = (self.lanes | (self.data_width // 8) << 8 | self.job_depth << 16
                  | min(self.done_depth, 255) << 24)
        values = {
            Reg.AP_CTRL: Cat(started, ap_done, all_idle, ap_done, 0, 0, 0, auto_restart),
            Reg.GIE: gie, Reg.IER: ier, Reg.ISR: isr,
            Reg.JOB_IN_ADDR_LO: staged.in_addr[:32], Reg.JOB_IN_ADDR_HI: staged.in_addr[32:],
            Reg.JOB_IN_LEN: staged.in_len, Reg.JOB_OUT_ADDR_LO: staged.out_addr[:32],
            Reg.JOB_OUT_ADDR_HI: staged.out_addr[32:], Reg.JOB_OUT_CAP: staged.out_cap,
            Reg.JOB_ID: staged.id, Reg.JOB_PUSH: self.job_depth - jobs.level,
            Reg.DONE_COUNT: dones.level,
            Reg.DONE_ID: head.id, Reg.DONE_STATUS: Cat(head.status, head.lane),
            Reg.DONE_SIZE: Cat(head.width, head.height), Reg.DONE_BYTES: head.bytes,
            Reg.DONE_CLOCKS: head.clocks, Reg.DONE_SYMBOLS: head.symbols,
            Reg.ID: MAGIC, Reg.CONFIG: config, Reg.MAX_WIDTH: self.max_width, Reg.WATCHDOG: watchdog,
            Reg.BUSY: busy,
        }
        with m.If(ctl("arvalid") & ~rvalid):
            m.d.sync += [rvalid.eq(1), rdata.eq(0)]
            with m.Switch(Mux(ctl("araddr")[8:] == 0, ctl("araddr")[2:8], 0x3F)):
                for reg, value in values.items():
                    with m.Case(reg >> 2):
                        m.d.sync += rdata.eq(value)
                        if reg == Reg.AP_CTRL:
                            with m.If(~finished):
                                m.d.sync += ap_done.eq(0)
        with m.Elif(ctl("rready")):
            m.d.sync += rvalid.eq(0)

        # Jobs to the lowest-numbered idle lane; completions from the lowest-numbered lane.
        take = Signal()
        post = Signal()
        for e in engines:
            m.d.comb += [e.job.payload.eq(jobs.r_data), e.job.valid.eq(jobs.r_rdy & started & ~take),
                         e.watchdog.eq(watchdog)]
            take_here = e.job.ready & jobs.r_rdy & started & ~take
            nxt = Signal()
            m.d.comb += nxt.eq(take | take_here)
            take = nxt
            m.d.comb += e.done.ready.eq(dones.w_rdy & ~post)
            with m.If(e.done.valid & dones.w_rdy & ~post):
                m.d.comb += dones.w_data.eq(e.done.payload)
            nxt_post = Signal()
            m.d.comb += nxt_post.eq(post | e.done.valid)
            post = nxt_post
        m.d.comb += [jobs.r_en.eq(take), dones.w_en.eq(post & dones.w_rdy),
                     make_room.eq(post & ~dones.w_rdy & ~auto_restart)]

        self._memory_port(m, engines, mem, up)
        return m

    def _memory_port(self, m, engines, mem, up):
        """Arbitrate the lanes' buses onto the AXI4 master; its valids are low while
        ``up`` (ap_rst_n) is."""
        size = (self.data_width // 8).bit_length() - 1
        for ch in ("ar", "aw"):
            m.d.comb += [mem(f"{ch}size").eq(size), mem(f"{ch}burst").eq(1), mem(f"{ch}cache").eq(0b0011)]

        # Reads: the request presented is held, with its lane, until accepted.
        locked = Signal()
        owner = Signal(self.id_width)
        choice = Signal(self.id_width)
        for i in reversed(range(self.lanes)):
            with m.If(engines[i].bus.ar.valid):
                m.d.comb += choice.eq(i)
        sel = Mux(locked, owner, choice)
        for i, e in enumerate(engines):
            ar = e.bus.ar
            with m.If(sel == i):
                m.d.comb += [mem("arvalid").eq(ar.valid & up), mem("araddr").eq(ar.payload.addr),
                             mem("arlen").eq(ar.payload.len)]
            m.d.comb += ar.ready.eq(mem("arready") & (sel == i))
        m.d.comb += mem("arid").eq(sel)
        m.d.sync += [locked.eq(mem("arvalid") & ~mem("arready")), owner.eq(sel)]

        # Writes: a lane is granted address and data channels together, until both its
        # address is accepted and its WLAST is taken; its data may go first.
        aw_pending = Signal()
        w_pending = Signal()
        writer = Signal(self.id_width)
        asking = Signal(self.id_width)
        for i in reversed(range(self.lanes)):
            with m.If(engines[i].bus.aw.valid):
                m.d.comb += asking.eq(i)
        with m.If(~aw_pending & ~w_pending & Cat(e.bus.aw.valid for e in engines).any()):
            m.d.sync += [writer.eq(asking), aw_pending.eq(1), w_pending.eq(1)]
        with m.If(mem("awvalid") & mem("awready")):
            m.d.sync += aw_pending.eq(0)
        with m.If(mem("wvalid") & mem("wready") & mem("wlast")):
            m.d.sync += w_pending.eq(0)
        for i, e in enumerate(engines):
            aw, w = e.bus.aw, e.bus.w
            mine = writer == i
            with m.If(mine):
                m.d.comb += [mem("awvalid").eq(aw_pending & aw.valid & up), mem("awaddr").eq(aw.payload.addr),
                             mem("awlen").eq(aw.payload.len), mem("wvalid").eq(w_pending & w.valid & up),
                             mem("wdata").eq(w.payload.data), mem("wstrb").eq(w.payload.strb),
                             mem("wlast").eq(w.payload.last)]
            m.d.comb += [aw.ready.eq(mem("awready") & aw_pending & mine),
                         w.ready.eq(mem("wready") & w_pending & mine)]
        m.d.comb += mem("awid").eq(writer)
        for i, e in enumerate(engines):
            m.d.comb += [e.bus.r.valid.eq(mem("rvalid") & (mem("rid") == i)),
                         e.bus.r.payload.data.eq(mem("rdata")),
                         e.bus.r.payload.err.eq(mem("rresp")[1]),
                         e.bus.b.valid.eq(mem("bvalid") & (mem("bid") == i)),
                         e.bus.b.payload.err.eq(mem("bresp")[1])]
        m.d.comb += [mem("rready").eq(1), mem("bready").eq(1)]

