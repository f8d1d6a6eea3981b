"""cocotb testbench of the decoder device top (``dlbooster.hw.device.Device``) on its AXI ports.

Run through :func:`dlbooster.sim.flow.run_cocotb` (``tests/sim/test_device_cocotb.py`` does) on
a 2-lane build (toplevel ``dlbooster_decoder``). The host side mirrors the driver
:class:`dlbooster.device.driver.DecoderDevice` with cocotbext-axi's ``AxiLiteMaster`` on
``s_axi_control``; host memory is cocotbext-axi's ``AxiRam`` (sparse, 64-bit addresses)
on ``m_axi_gmem``; both follow ``ap_rst_n``. Parameters come from the environment:

- ``DLB_JOB``: a JSON object ``{"seed": int, "backpressure": [paths], "reset": [paths],
  "too_small": [path]}`` naming the JPEG files of each test.
- ``DLB_OUT``: a JSON file the tests add their completions to (``{test: [completion]}``).

Memory layout: every buffer sits in a window above 4 GiB (``JOB_*_ADDR_HI`` = 1) filled
with random bytes first, and straddles a 4 KiB page boundary at an offset that is not a
multiple of the 256-byte burst span. The expected RGB of each file is Pillow's
``Image.open(...).convert("RGB")``.

Checked throughout (:class:`AxiMonitor`), on every clock edge:

- AR, AW and W: once ``VALID`` is high it stays high, with the same payload, until
  ``READY`` (AXI4 A3.2.1); after the first edge in reset ``ARVALID``, ``AWVALID``,
  ``WVALID``, the AXI4-Lite ``BVALID``/``RVALID`` and ``interrupt`` are low (A3.1.2);
- ``RREADY`` and ``BREADY`` are always high (the device's documented contract);
- every burst is INCR, ``AxSIZE`` = the bus word, at most 16 beats, word-aligned, inside
  one 4 KiB page (A3.4.1); reads only inside a job's input words, writes only inside a
  job's output words; W beats belong to their AW in order (they may come first),
  ``WLAST`` exactly on each burst's
  last beat;
- AXI4-Lite: ``BVALID``/``RVALID`` stay high with stable ``BRESP``/``RDATA``/``RRESP``
  until ``BREADY``/``RREADY``; every response is OKAY.

Per test:

- ``backpressure_out_of_order``: six files of every sampling on 2 lanes with random
  pauses on all five AXI4 channels and all five AXI4-Lite channels; each completion is
  matched by job id (they complete out of order), status 0, frame size and byte count
  right, each output byte equal to Pillow's; every AR, AW, W and AXI4-Lite B and R
  channel was held waiting for READY at least once; no other byte of memory changes and no page
  outside the window appears; each job's input words are read exactly once and its
  output words written exactly once, by the lane its completion names, with exactly
  ``width * height * 3`` strobes set; completions raised the interrupt.
- ``reset_mid_job``: two jobs, ``ap_rst_n`` pulsed low in the middle of a write burst of
  the first one's output (some of its beats sent); afterwards the registers hold their reset values, and the same two
  jobs run again decode correctly with the traffic checks above (the memory compared
  with its state right after the reset).
- ``output_too_small``: ``ap_ctrl_hs`` one-shot mode (``AP_START`` alone): a job with
  capacity ``width * height * 3 - 1`` completes with OUTPUT_TOO_SMALL (0x41), its size and
  0 bytes, no write burst and no byte of memory changed; the same job with exactly
  ``width * height * 3`` bytes decodes, touching nothing past its buffer; ``AP_DONE`` is
  raised (and clears on read) and interrupts through ``IER = AP_DONE``.
"""

from __future__ import annotations

import io
import json
import os
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, First, RisingEdge
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam, AxiResp
from PIL import Image

from dlbooster.device.driver import Completion
from dlbooster.hw.regs import MAGIC, Ctrl, DeviceStatus, Irq, Reg

#: Bytes per bus word of the tested build (128-bit data).
WORD = 16
PAGE = 4096
#: Start of the memory window: above 4 GiB, so the address registers' high words matter.
BASE = 0x1_2345_0000
LANES = 2
JOB_DEPTH = 16
#: Device clocks a wait for a completion may take before the test fails.
WAIT_CLOCKS = 200_000


def _words(addr: int, length: int) -> range:
    """Addresses of the bus words holding ``length`` bytes from ``addr``."""
    return range(addr, addr + -(-length // WORD) * WORD, WORD)


@dataclass
class Job:
    """One decode job: its file, Pillow's RGB and where it lives in memory."""

    job_id: int
    data: bytes
    expected: np.ndarray
    in_addr: int
    out_addr: int
    out_cap: int

    @property
    def out_len(self) -> int:
        return self.expected.size


@dataclass
class Burst:
    """One accepted AR or AW request (``strobes``: byte strobes set in a write's W beats)."""

    id: int
    addr: int
    len: int
    strobes: int = 0


class AxiMonitor:
    """Checks the AXI4 master and AXI4-Lite slave rules on every clock edge (module
    docstring) and records the accepted bursts; violations are collected, not raised,
    so a test reports them all at its end."""

    def __init__(self, dut):
        self.dut = dut
        self.violations: list[str] = []
        self.inputs: list[tuple[int, int]] = []     # (start, end) of the input words
        self.outputs: list[tuple[int, int]] = []    # (start, end) of the output words
        self.reads: list[Burst] = []
        self.writes: list[Burst] = []
        self.w_beats = 0
        #: Clocks each channel's VALID waited for READY.
        self.stalls: Counter[str] = Counter()
        self._w_queue: list[tuple[Burst, int]] = []   # bursts whose data is due, beats sent
        self._w_early: list[tuple[int, int, int]] = []  # W beats taken before their AW (allowed)
        self._held: dict[str, tuple] = {}
        self._reset_edges = 0
        mem = lambda name: getattr(dut, f"m_axi_gmem_{name}")        # noqa: E731
        ctl = lambda name: getattr(dut, f"s_axi_control_{name}")     # noqa: E731
        self.channels = {
            "AR": (mem("arvalid"), mem("arready"), [mem(n) for n in ("arid", "araddr", "arlen", "arsize", "arburst")]),
            "AW": (mem("awvalid"), mem("awready"), [mem(n) for n in ("awid", "awaddr", "awlen", "awsize", "awburst")]),
            "W": (mem("wvalid"), mem("wready"), [mem(n) for n in ("wdata", "wstrb", "wlast")]),
            "lite B": (ctl("bvalid"), ctl("bready"), [ctl("bresp")]),
            "lite R": (ctl("rvalid"), ctl("rready"), [ctl("rdata"), ctl("rresp")]),
        }
        self.resets_low = [mem("arvalid"), mem("awvalid"), mem("wvalid"), ctl("bvalid"), ctl("rvalid"),
                           dut.interrupt]

    def open_burst(self) -> tuple[Burst, int] | None:
        """The write burst whose data is being sent and the beats sent so far, if any."""
        return self._w_queue[0] if self._w_queue else None

    def clear_records(self) -> None:
        """Forget the recorded bursts (after a reset: they belong to abandoned jobs)."""
        self.reads.clear()
        self.writes.clear()
        self.w_beats = 0

    def _flag(self, message: str) -> None:
        if len(self.violations) < 50:
            self.violations.append(f"{get_sim_time('ns'):.0f} ns: {message}")

    async def run(self) -> None:
        dut = self.dut
        while True:
            await RisingEdge(dut.ap_clk)
            if not int(dut.ap_rst_n.value):
                if self._reset_edges > 0:
                    high = [s._name for s in self.resets_low if int(s.value)]
                    if high:
                        self._flag(f"high during reset: {high}")
                self._reset_edges += 1
                self._held.clear()
                self._w_queue.clear()
                self._w_early.clear()
                continue
            self._reset_edges = 0
            if not (int(dut.m_axi_gmem_rready.value) and int(dut.m_axi_gmem_bready.value)):
                self._flag("RREADY or BREADY low")
            for name, (valid, ready, fields) in self.channels.items():
                self._channel(name, int(valid.value), int(ready.value), fields)

    def _channel(self, name: str, valid: int, ready: int, fields) -> None:
        held = self._held.pop(name, None)
        if not valid:
            if held is not None:
                self._flag(f"{name}VALID dropped before READY")
            return
        payload = tuple(int(f.value) for f in fields)
        if held is not None and held != payload:
            self._flag(f"{name} payload changed while waiting for READY: {held} -> {payload}")
        if not ready:
            self._held[name] = payload
            self.stalls[name] += 1
            return
        if name in ("AR", "AW"):
            self._request(name, *payload)
        elif name == "W":
            self._beat(*payload)
        elif payload[-1] != AxiResp.OKAY:
            self._flag(f"{name} response {payload[-1]}")

    def _request(self, name: str, ident: int, addr: int, length: int, size: int, burst: int) -> None:
        span = (length + 1) * WORD
        if burst != 1 or 1 << size != WORD or length > 15 or addr % WORD:
            self._flag(f"{name} burst addr {addr:#x} len {length} size {size} burst {burst}")
        if addr % PAGE + span > PAGE:
            self._flag(f"{name} burst at {addr:#x}, {length + 1} beats, crosses a 4 KiB boundary")
        regions = self.inputs if name == "AR" else self.outputs
        if not any(start <= addr and addr + span <= end for start, end in regions):
            self._flag(f"{name} burst {addr:#x}..{addr + span:#x} outside every job's "
                       f"{'input' if name == 'AR' else 'output'} words")
        record = Burst(ident, addr, length)
        if name == "AR":
            self.reads.append(record)
        else:
            self.writes.append(record)
            self._w_queue.append((record, 0))
            early, self._w_early = self._w_early, []
            for beat in early:
                self._beat(*beat)

    def _beat(self, data: int, strb: int, last: int) -> None:
        if not self._w_queue:
            # A master may send write data before its address is accepted (AXI4 A3.3.1);
            # it is checked against the burst once the AW arrives.
            self._w_early.append((data, strb, last))
            return
        record, sent = self._w_queue[0]
        sent += 1
        record.strobes += bin(strb).count("1")
        self.w_beats += 1
        if bool(last) != (sent == record.len + 1):
            self._flag(f"WLAST={last} on beat {sent} of a {record.len + 1}-beat burst at {record.addr:#x}")
        if sent == record.len + 1:
            self._w_queue.pop(0)
        else:
            self._w_queue[0] = (record, sent)


def gaps(rng: random.Random, busy: float):
    """Pause pattern for a cocotbext-axi channel: runs of 1..6 paused clocks started with
    probability ``busy``, between runs of 1..4 free clocks."""
    while True:
        if rng.random() < busy:
            yield from [True] * rng.randint(1, 6)
        else:
            yield from [False] * rng.randint(1, 4)


class Testbench:
    """Clock, reset, memory model, register master and monitor of one test."""

    def __init__(self, dut, seed: int, pages: int):
        self.dut = dut
        self.rng = random.Random(seed)
        cocotb.start_soon(Clock(dut.ap_clk, 10, unit="ns").start())
        dut.ap_rst_n.value = 0
        # The model's len() must fit a signed 64-bit index: 2**62 bytes hold the window, and
        # the monitor checks every burst's full 64-bit address.
        self.ram = AxiRam(AxiBus.from_prefix(dut, "m_axi_gmem"), dut.ap_clk, dut.ap_rst_n, reset_active_level=False,
                          size=1 << 62)
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axi_control"), dut.ap_clk, dut.ap_rst_n,
                                  reset_active_level=False)
        self.monitor = AxiMonitor(dut)
        cocotb.start_soon(self.monitor.run())
        self.window = pages * PAGE
        self.ram.write(BASE, self.rng.randbytes(self.window))
        self.pages = set(self.ram.mem.segs)
        self.slots = 0
        self.interrupts = 0

    def pause_everything(self, busy: float) -> None:
        """Random pauses on every AXI4 channel of the memory and AXI4-Lite channel of the host."""
        channels = [self.ram.write_if.aw_channel, self.ram.write_if.w_channel, self.ram.write_if.b_channel,
                    self.ram.read_if.ar_channel, self.ram.read_if.r_channel,
                    self.axil.write_if.aw_channel, self.axil.write_if.w_channel, self.axil.write_if.b_channel,
                    self.axil.read_if.ar_channel, self.axil.read_if.r_channel]
        for channel in channels:
            channel.set_pause_generator(gaps(random.Random(self.rng.random()), busy))

    async def reset(self, clocks: int = 4) -> None:
        self.dut.ap_rst_n.value = 0
        await ClockCycles(self.dut.ap_clk, clocks)
        self.dut.ap_rst_n.value = 1
        await ClockCycles(self.dut.ap_clk, 2)

    # Memory ------------------------------------------------------------------------

    def place(self, size: int) -> int:
        """Address of a new buffer of ``size`` bytes (< 4 KiB): word-aligned, straddling the
        next free page boundary of the window, 64 bytes or more from any other buffer."""
        assert size < PAGE
        boundary = BASE + (2 * self.slots + 1) * PAGE
        self.slots += 1
        assert boundary + PAGE <= BASE + self.window, "window too small"
        return boundary - (size // 2) // WORD * WORD

    def job(self, job_id: int, path: str, cap_delta: int = 0) -> Job:
        """A job for the file at ``path``, its input copied into memory; output capacity
        ``width * height * 3 + cap_delta``."""
        data = Path(path).read_bytes()
        expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        in_addr = self.place(len(data))
        self.ram.write(in_addr, data)
        out_addr = self.place(expected.size)
        self.monitor.inputs.append((in_addr, _words(in_addr, len(data)).stop))
        self.monitor.outputs.append((out_addr, _words(out_addr, expected.size).stop))
        return Job(job_id, data, expected, in_addr, out_addr, expected.size + cap_delta)

    def snapshot(self) -> bytes:
        return self.ram.read(BASE, self.window)

    def check_memory(self, before: bytes, decoded: list[Job]) -> None:
        """Every byte of the window equals ``before`` except the decoded jobs' outputs,
        which equal Pillow's RGB; no page outside the window was written."""
        assert set(self.ram.mem.segs) == self.pages, "a write reached memory outside the window: pages " + \
            ", ".join(f"{p:#x}" for p in sorted(set(self.ram.mem.segs) - self.pages))
        expected = bytearray(before)
        for job in decoded:
            got = np.frombuffer(self.ram.read(job.out_addr, job.out_len), np.uint8).reshape(job.expected.shape)
            differ = np.argwhere(got != job.expected)
            assert len(differ) == 0, (f"job {job.job_id:#x}: {len(differ)} output bytes differ from Pillow, first at "
                                      f"(y, x, c) = {tuple(differ[0])}: {got[tuple(differ[0])]} != "
                                      f"{job.expected[tuple(differ[0])]}")
            offset = job.out_addr - BASE
            expected[offset:offset + job.out_len] = job.expected.tobytes()
        now = self.snapshot()
        if now != bytes(expected):
            where = next(i for i in range(len(now)) if now[i] != expected[i])
            raise AssertionError(f"memory changed outside the outputs: first at {BASE + where:#x}")

    def check_traffic(self, jobs: list[Job], done: dict[int, Completion]) -> None:
        """Each decoded job's input words read exactly once and output words written exactly
        once, all by the lane its completion names; strobes set = bytes written."""
        for job in jobs:
            lane = done[job.job_id].lane
            for kind, bursts, (start, length) in (("read", self.monitor.reads, (job.in_addr, len(job.data))),
                                                   ("written", self.monitor.writes, (job.out_addr, job.out_len))):
                words = _words(start, length)
                mine = [b for b in bursts if words.start <= b.addr < words.stop]
                ids = sorted({b.id for b in mine})
                assert ids == [lane], f"job {job.job_id:#x}: {kind} by ids {ids}, its completion names lane {lane}"
                got = sorted(b.addr + WORD * k for b in mine for k in range(b.len + 1))
                assert got == list(words), f"job {job.job_id:#x}: words {kind} are not its {len(words)} words once each"
                if kind == "written":
                    strobes = sum(b.strobes for b in mine)
                    assert strobes == job.out_len, f"job {job.job_id:#x}: {strobes} strobes set, {job.out_len} bytes"

    def check_protocol(self) -> None:
        assert not self.monitor.violations, "AXI rule violations:\n" + "\n".join(self.monitor.violations)
        assert not self.monitor._w_early, f"{len(self.monitor._w_early)} W beats never got their AW"

    # Registers (as dlbooster.device.driver.DecoderDevice programs them) ----------------------

    async def read(self, reg: int) -> int:
        resp = await self.axil.read(reg, 4)
        assert resp.resp == AxiResp.OKAY, f"read {Reg(reg).name}: {resp.resp}"
        return int.from_bytes(resp.data, "little")

    async def write(self, reg: int, value: int) -> None:
        resp = await self.axil.write(reg, (value & 0xFFFFFFFF).to_bytes(4, "little"))
        assert resp.resp == AxiResp.OKAY, f"write {Reg(reg).name}: {resp.resp}"

    async def configure(self) -> None:
        """ID and CONFIG as the driver reads them; the build's parameters."""
        assert await self.read(Reg.ID) == MAGIC
        config = await self.read(Reg.CONFIG)
        assert (config & 0xFF, config >> 8 & 0xFF, config >> 16 & 0xFF, config >> 24) == (LANES, WORD, JOB_DEPTH, 16)
        assert await self.read(Reg.MAX_WIDTH) == 256

    async def start(self) -> None:
        """Streaming mode, as DecoderDevice.start."""
        await self.write(Reg.GIE, 1)
        await self.write(Reg.IER, Irq.COMPLETION)
        await self.write(Reg.AP_CTRL, Ctrl.AP_START | Ctrl.AUTO_RESTART)

    async def submit(self, job: Job) -> None:
        assert await self.read(Reg.JOB_PUSH) > 0, "job FIFO full"
        for reg, value in ((Reg.JOB_IN_ADDR_LO, job.in_addr), (Reg.JOB_IN_ADDR_HI, job.in_addr >> 32),
                           (Reg.JOB_IN_LEN, len(job.data)), (Reg.JOB_OUT_ADDR_LO, job.out_addr),
                           (Reg.JOB_OUT_ADDR_HI, job.out_addr >> 32), (Reg.JOB_OUT_CAP, job.out_cap),
                           (Reg.JOB_ID, job.job_id), (Reg.JOB_PUSH, 1)):
            await self.write(reg, value)

    async def poll(self) -> list[Completion]:
        out = []
        for _ in range(await self.read(Reg.DONE_COUNT)):
            status = await self.read(Reg.DONE_STATUS)
            size = await self.read(Reg.DONE_SIZE)
            out.append(Completion(await self.read(Reg.DONE_ID), status & 0xFF, status >> 8 & 0xFF, size & 0xFFFF,
                                  size >> 16, await self.read(Reg.DONE_BYTES), await self.read(Reg.DONE_CLOCKS),
                                  await self.read(Reg.DONE_SYMBOLS)))
            await self.write(Reg.DONE_POP, 1)
        return out

    async def wait_interrupt(self) -> None:
        """Until ``interrupt`` is high; fails after :data:`WAIT_CLOCKS` clocks."""
        if not int(self.dut.interrupt.value):
            fired = await First(RisingEdge(self.dut.interrupt), ClockCycles(self.dut.ap_clk, WAIT_CLOCKS))
            assert isinstance(fired, RisingEdge), f"no interrupt within {WAIT_CLOCKS} clocks"
        self.interrupts += 1

    async def collect(self, count: int) -> list[Completion]:
        """``count`` completions in arrival order, waiting on the interrupt between polls
        and clearing ISR as DecoderDevice.wait does."""
        done: list[Completion] = []
        while len(done) < count:
            found = await self.poll()
            if not found:
                pending = await self.read(Reg.ISR)
                if pending:
                    await self.write(Reg.ISR, pending)
                found = await self.poll()
                if not found:
                    await self.wait_interrupt()
            done += found
        assert len(done) == count, f"{len(done)} completions for {count} jobs"
        return done


def _job_file() -> dict:
    return json.loads(Path(os.environ["DLB_JOB"]).read_text())


def _report(test: str, completions: list[Completion]) -> None:
    path = Path(os.environ["DLB_OUT"])
    report = json.loads(path.read_text()) if path.exists() else {}
    report[test] = [c._asdict() for c in completions]
    path.write_text(json.dumps(report, indent=1))


def _check_decoded(jobs: list[Job], done: list[Completion]) -> dict[int, Completion]:
    """Completions matched to jobs by id: one per job, status 0, size and bytes right."""
    by_id = {c.job_id: c for c in done}
    assert sorted(by_id) == sorted(j.job_id for j in jobs), \
        f"completion ids {[hex(c.job_id) for c in done]} != job ids {[hex(j.job_id) for j in jobs]}"
    for job in jobs:
        c = by_id[job.job_id]
        height, width = job.expected.shape[:2]
        assert (c.status, c.width, c.height, c.bytes_written) == (0, width, height, job.out_len), \
            f"job {job.job_id:#x}: {c}"
        assert c.lane < LANES and c.clocks > 0 and c.symbols > 0, f"job {job.job_id:#x}: {c}"
    return by_id


@cocotb.test(timeout_time=20, timeout_unit="ms")
async def backpressure_out_of_order(dut):
    """Several jobs on 2 lanes, random pauses on every AXI channel (module docstring)."""
    spec = _job_file()
    tb = Testbench(dut, spec["seed"], pages=4 * len(spec["backpressure"]) + 1)
    jobs = [tb.job(0x8000_0000 | (0x135 * (i + 1)), path) for i, path in enumerate(spec["backpressure"])]
    before = tb.snapshot()
    tb.pause_everything(busy=0.4)
    await tb.reset()
    await tb.configure()
    await tb.start()
    for job in jobs:
        await tb.submit(job)
    done = await tb.collect(len(jobs))
    _report("backpressure_out_of_order", done)
    by_id = _check_decoded(jobs, done)
    assert [c.job_id for c in done] != [j.job_id for j in jobs], "jobs completed in submission order"
    assert {c.lane for c in done} == set(range(LANES)), "not every lane ran a job"
    assert tb.interrupts > 0, "no completion raised the interrupt"
    stalled = {name: tb.monitor.stalls[name] for name in tb.monitor.channels}
    assert all(stalled.values()), f"channels never held by back-pressure: {stalled}"
    tb.check_memory(before, jobs)
    tb.check_traffic(jobs, by_id)
    assert (await tb.read(Reg.BUSY), await tb.read(Reg.DONE_COUNT), await tb.read(Reg.JOB_PUSH)) == (0, 0, JOB_DEPTH)
    tb.check_protocol()


@cocotb.test(timeout_time=20, timeout_unit="ms")
async def reset_mid_job(dut):
    """Reset while a job's output is being written, then the jobs again (module docstring)."""
    spec = _job_file()
    tb = Testbench(dut, spec["seed"] + 1, pages=4 * len(spec["reset"]) + 1)
    jobs = [tb.job(0x100 + i, path) for i, path in enumerate(spec["reset"])]
    tb.pause_everything(busy=0.2)
    await tb.reset()
    await tb.configure()
    await tb.start()
    for job in jobs:
        await tb.submit(job)
    first = jobs[0]

    def inside_burst() -> bool:
        """A burst of the first job's output has sent some but not all of its beats."""
        head = tb.monitor.open_burst()
        return head is not None and 0 < head[1] <= head[0].len and \
            first.out_addr <= head[0].addr < first.out_addr + first.out_len

    for _ in range(WAIT_CLOCKS):
        await RisingEdge(dut.ap_clk)
        if inside_burst():
            break
    assert inside_burst(), "no multi-beat write burst of the first job"
    await tb.reset(clocks=5)
    tb.monitor.clear_records()
    after_reset = tb.snapshot()
    resets = {Reg.AP_CTRL: Ctrl.AP_IDLE, Reg.GIE: 0, Reg.IER: 0, Reg.ISR: 0, Reg.JOB_PUSH: JOB_DEPTH,
              Reg.DONE_COUNT: 0, Reg.BUSY: 0, Reg.WATCHDOG: 1 << 24, Reg.JOB_ID: 0, Reg.JOB_IN_LEN: 0,
              Reg.JOB_OUT_CAP: 0}
    values = {reg: await tb.read(reg) for reg in resets}
    assert values == resets, {Reg(r).name: hex(v) for r, v in values.items() if v != resets[r]}
    assert not int(dut.interrupt.value)
    await tb.start()
    for job in jobs:
        await tb.submit(job)
    done = await tb.collect(len(jobs))
    _report("reset_mid_job", done)
    by_id = _check_decoded(jobs, done)
    tb.check_memory(after_reset, jobs)
    tb.check_traffic(jobs, by_id)
    tb.check_protocol()


@cocotb.test(timeout_time=20, timeout_unit="ms")
async def output_too_small(dut):
    """Capacity one byte short, then exactly enough, in one-shot ap_ctrl_hs mode (module docstring)."""
    spec = _job_file()
    tb = Testbench(dut, spec["seed"] + 2, pages=9)
    short = tb.job(0xBAD, spec["too_small"][0], cap_delta=-1)
    exact = tb.job(0x600D, spec["too_small"][0])
    tb.pause_everything(busy=0.3)
    await tb.reset()
    await tb.configure()
    await tb.write(Reg.GIE, 1)
    await tb.write(Reg.IER, Irq.AP_DONE)
    before = tb.snapshot()

    await tb.submit(short)
    await tb.write(Reg.AP_CTRL, Ctrl.AP_START)
    await tb.wait_interrupt()
    assert await tb.read(Reg.ISR) == Irq.AP_DONE, "ISR set a bit IER does not enable"
    ctrl = await tb.read(Reg.AP_CTRL)
    assert ctrl == Ctrl.AP_DONE | Ctrl.AP_IDLE | Ctrl.AP_READY, hex(ctrl)
    assert await tb.read(Reg.AP_CTRL) == Ctrl.AP_IDLE, "AP_DONE not cleared by the read"
    [c] = await tb.poll()
    height, width = short.expected.shape[:2]
    assert (c.job_id, c.status, c.width, c.height, c.bytes_written) == (
        short.job_id, DeviceStatus.OUTPUT_TOO_SMALL, width, height, 0), c
    assert tb.monitor.writes == [] and tb.monitor.w_beats == 0, "the short job wrote to memory"
    assert tb.monitor.reads, "the short job read nothing"
    tb.check_memory(before, [])

    await tb.write(Reg.ISR, await tb.read(Reg.ISR))
    assert not int(dut.interrupt.value) and await tb.read(Reg.ISR) == 0
    await tb.submit(exact)
    await tb.write(Reg.AP_CTRL, Ctrl.AP_START)
    await tb.wait_interrupt()
    assert await tb.read(Reg.AP_CTRL) & Ctrl.AP_DONE
    done = await tb.poll()
    _report("output_too_small", [c] + done)
    by_id = _check_decoded([exact], done)
    tb.check_memory(before, [exact])
    tb.check_traffic([exact], by_id)
    tb.check_protocol()
