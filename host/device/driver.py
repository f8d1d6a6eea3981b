"""Host driver of the decoder device: register programming, job submission, completions.

:class:`DecoderDevice` is the one driver for every kind of device; only its *transport*
differs: the simulated device (:class:`dlbooster.sim.device.SimTransport`) and the
boards' pynq/XRT transports. A transport provides

- ``read32(offset)`` / ``write32(offset, value)``: 32-bit register access (MMIO);
- optionally ``read_block(offset, count)`` / ``write_block(offset, values)``: ``count``
  consecutive registers from ``offset``, each read once with a 32-bit access (a sequence
  of ints), and consecutive side-effect-free registers written in any order, each
  transport's one call where it has one (pynq's MMIO array and bytes write, the instant
  device). With them a job costs one block write and ``JOB_PUSH``, a completion one
  block read and ``DONE_POP`` ; without them the driver makes one call per
  register;
- ``allocate(size, writable=True)``: a buffer with ``device_address``, ``size``, a uint8
  numpy ``array`` view and ``sync_to_device(nbytes=None, offset=0)`` /
  ``sync_from_device(nbytes=None, offset=0)`` (the whole buffer, or ``nbytes`` from
  ``offset``) / ``free()``; ``MemoryError`` when the device's memory has no room (the
  runtime then decodes that input on the CPU; any other exception is a device fault);
- ``wait(max_clocks)``: block until the device's interrupt is raised (True) or give up
  (False); ``reset()``.

The register map and statuses are :mod:`dlbooster.hw.regs`.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from dlbooster.hw.regs import DONE_BLOCK_WORDS, MAGIC, Ctrl, DeviceStatus, Irq, Reg, device_reason

__all__ = ["Completion", "DecoderDevice", "DeviceError", "JobOutcome", "drain"]

# Register offsets as plain ints (enum members cost more per access): the job's staging
# registers in write order, then the completion registers in read order.
_JOB_FIELDS = tuple(int(r) for r in (Reg.JOB_IN_ADDR_LO, Reg.JOB_IN_ADDR_HI, Reg.JOB_IN_LEN, Reg.JOB_OUT_ADDR_LO,
                                     Reg.JOB_OUT_ADDR_HI, Reg.JOB_OUT_CAP, Reg.JOB_ID))
_JOB_PUSH, _DONE_COUNT, _DONE_POP = int(Reg.JOB_PUSH), int(Reg.DONE_COUNT), int(Reg.DONE_POP)
_DONE_STATUS, _DONE_SIZE, _DONE_ID = int(Reg.DONE_STATUS), int(Reg.DONE_SIZE), int(Reg.DONE_ID)
_DONE_BYTES, _DONE_CLOCKS, _DONE_SYMBOLS = int(Reg.DONE_BYTES), int(Reg.DONE_CLOCKS), int(Reg.DONE_SYMBOLS)
_JOB_BLOCK = _JOB_FIELDS[0]
_WATCHDOG = int(DeviceStatus.WATCHDOG)
_job_id = operator.itemgetter(0)             # of a job tuple


class DeviceError(RuntimeError):
    """The device is absent, not a dlbooster decoder, or stopped answering."""


def drain(transport, timeout_s: float = 5.0) -> None:
    """Bring a device to rest through its registers alone, for a transport that cannot
    reset it (XRT gives user code no reset of a kernel): started in streaming mode
    (``AP_START | AUTO_RESTART``: a one-shot start would also queue a job that an
    interrupted submit left half staged), the jobs already queued run out and none is
    added; completions are dropped as they come, until no lane holds a job and the job
    FIFO is empty. Then no job is left that could read or write buffers the caller
    releases next (the watchdog ends a job stuck on memory).

    Args:
        transport: the device's register interface (``read32``/``write32``).
        timeout_s: wall-clock limit, seconds.

    Raises:
        DeviceError: the device did not come to rest within ``timeout_s`` (its buffers
            must not be reused: it may still access them).
    """
    t = transport
    t.write32(Reg.AP_CTRL, Ctrl.AP_START | Ctrl.AUTO_RESTART)
    depth = (t.read32(Reg.CONFIG) >> 16) & 0xFF
    deadline = time.monotonic() + timeout_s
    while True:
        while t.read32(Reg.DONE_COUNT):
            t.write32(Reg.DONE_POP, 1)
        if not t.read32(Reg.BUSY) and t.read32(Reg.JOB_PUSH) == depth:
            while t.read32(Reg.DONE_COUNT):      # the last job's completion
                t.write32(Reg.DONE_POP, 1)
            return
        if time.monotonic() > deadline:
            raise DeviceError(f"the device did not come to rest in {timeout_s:g} s (lanes busy "
                              f"0x{t.read32(Reg.BUSY):x}, {depth - t.read32(Reg.JOB_PUSH)} jobs queued)")
        time.sleep(20e-6)


class Completion(NamedTuple):
    """One completion as the device reports it (a named tuple: one is made per job).

    Attributes:
        job_id: the id given at submission.
        status: 0 (decoded), a lane status (< 0x40) or a :class:`~dlbooster.hw.regs.DeviceStatus`.
        lane: the lane that ran the job.
        width, height: the frame's size in pixels (0 when the header was not reached).
        bytes_written: bytes written to the output buffer.
        clocks: device clocks from taking the job to completing it.
        symbols: Huffman symbols decoded.
    """

    job_id: int
    status: int
    lane: int
    width: int
    height: int
    bytes_written: int
    clocks: int
    symbols: int

    @property
    def reason(self) -> str | None:
        """The status's reason code (None for 0), as :func:`dlbooster.hw.regs.device_reason`;
        ``device-fault`` for a status this driver does not know (a bitstream of another
        version, a fault): the job's output is not trusted, and its input goes to the CPU
        like any declined job's, instead of the ValueError taking the device out of
        service."""
        try:
            return device_reason(self.status)
        except ValueError:
            return "device-fault"


# A named tuple's generated __new__ is a Python function of eight arguments, and its
# _make a Python function around tuple.__new__: the driver calls tuple.__new__ itself
# (no Python frame; once per completion).
_new_tuple = tuple.__new__


@dataclass
class JobOutcome:
    """One input of :meth:`DecoderDevice.decode_batch`: its completion and, when the status
    is 0, the (H, W, 3) uint8 image (a copy, owned by the caller)."""

    completion: Completion
    image: np.ndarray | None = field(default=None, repr=False)


class DecoderDevice:
    """Drives one decoder device through a transport (see the module docstring). A
    transport has one driver: it remembers what it last wrote to the job staging
    registers and writes only what changes.

    Raises:
        DeviceError: the ID register does not hold :data:`~dlbooster.hw.regs.MAGIC`.
    """

    def __init__(self, transport):
        self.transport = transport
        self._blocks = hasattr(transport, "read_block") and hasattr(transport, "write_block")
        self._watchdog: int | None = None     # set through the property: kept across resets
        self._configure()

    def _configure(self) -> None:
        t = self.transport
        # The JOB_* staging registers keep their values after JOB_PUSH (plain registers,
        # cleared by reset), so a job writes only the fields that differ from the last
        # job's: the address high words and often the capacity repeat. Hence
        # one DecoderDevice per transport.
        self._staged = [None] * len(_JOB_FIELDS)
        ident = t.read32(Reg.ID)
        if ident != MAGIC:
            raise DeviceError(f"not a dlbooster decoder (ID register 0x{ident:08x})")
        config = t.read32(Reg.CONFIG)
        self.lanes = config & 0xFF
        self.bus_bytes = (config >> 8) & 0xFF
        self.job_depth = (config >> 16) & 0xFF
        self.done_depth = (config >> 24) & 0xFF
        self.max_width = t.read32(Reg.MAX_WIDTH)
        self._free_slots = 0
        self.in_flight: set[int] = set()
        #: Lanes whose job ended with status WATCHDOG and that no later completion has
        #: named: such a lane takes no job until its memory transactions end, which a
        #: memory that stopped answering never allows (docs/device.md). Kept by
        #: :meth:`poll`, cleared by :meth:`reset`.
        self.stuck: set[int] = set()
        self._next_id = getattr(self, "_next_id", 0)   # job ids never repeat across batches

    def start(self) -> None:
        """Streaming mode: lanes take jobs as they are queued (``AP_START | AUTO_RESTART``),
        and a completion raises the interrupt (``GIE``, ``IER = COMPLETION``)."""
        t = self.transport
        t.write32(Reg.GIE, 1)
        t.write32(Reg.IER, Irq.COMPLETION)
        t.write32(Reg.AP_CTRL, Ctrl.AP_START | Ctrl.AUTO_RESTART)

    def reset(self) -> None:
        """Reset the device (the transport's reset; jobs in flight are lost) and start it
        again, with the watchdog set through :attr:`watchdog` if it was."""
        self.transport.reset()
        self._configure()
        if self._watchdog is not None:
            self.transport.write32(Reg.WATCHDOG, self._watchdog)
        self.start()

    @property
    def watchdog(self) -> int:
        """Clocks without movement before a job is abandoned (0: never). A value set here
        is written again after :meth:`reset` (the register's reset value is the build's)."""
        return self.transport.read32(Reg.WATCHDOG)

    @watchdog.setter
    def watchdog(self, clocks: int) -> None:
        self.transport.write32(Reg.WATCHDOG, clocks)
        self._watchdog = clocks

    def free_slots(self) -> int:
        """Free entries in the job FIFO (one register read)."""
        self._free_slots = self.transport.read32(Reg.JOB_PUSH)
        return self._free_slots

    def job_room(self, wanted: int) -> int:
        """Free entries in the job FIFO as far as known: the count of the last read less
        the jobs queued since (it only falls between reads), read again (one register
        read) when that is fewer than ``wanted``, as :meth:`submit_many` does. The room
        for the next ``submit_many``, which then reads nothing for up to this many jobs."""
        if self._free_slots < wanted:
            self.free_slots()
        return self._free_slots

    def submit(self, job_id: int, in_addr: int, in_len: int, out_addr: int, out_cap: int) -> bool:
        """Queue a job; False (nothing queued) when the job FIFO is full.

        Args:
            job_id: 32-bit id, echoed in its completion.
            in_addr, in_len: the JPEG's device address (aligned to the bus word) and length, bytes.
            out_addr, out_cap: the output buffer's device address (aligned) and size, bytes.

        Raises:
            ValueError: a length does not fit 32 bits (the device itself completes a job
                with ``in_len`` 0 or an unaligned address as BAD_JOB).
        """
        return self.submit_many([(job_id, in_addr, in_len, out_addr, out_cap)]) == 1

    def submit_many(self, jobs: Sequence[tuple[int, int, int, int, int]]) -> int:
        """Queue jobs in order while the job FIFO has room (one read of its free count at
        most, then the jobs' register writes).

        Args:
            jobs: ``(job_id, in_addr, in_len, out_addr, out_cap)`` per job, as :meth:`submit`.

        Returns:
            How many of the first jobs were queued (the rest were not touched).

        Raises:
            ValueError: a length does not fit 32 bits (nothing is queued).
        """
        for job_id, _, in_len, _, out_cap in jobs:
            if (in_len | out_cap) >> 32:      # either one negative, or of 2^32 or more
                raise ValueError(f"job {job_id}: lengths must fit the 32-bit registers ({in_len}, {out_cap})")
        if self._free_slots < len(jobs):
            self.free_slots()                 # one read: the cached count only falls
        queued = jobs[: self._free_slots]
        if not queued:
            return 0
        write, staged = self.transport.write32, self._staged
        block = self.transport.write_block if self._blocks else None
        for job_id, in_addr, in_len, out_addr, out_cap in queued:
            in_hi, out_hi = in_addr >> 32, out_addr >> 32
            if (in_hi | out_hi | job_id) >> 32:   # one negative, or of 2^32 or more: its low 32 bits
                in_hi, out_hi, job_id = in_hi & 0xFFFFFFFF, out_hi & 0xFFFFFFFF, job_id & 0xFFFFFFFF
            # (A mask costs an allocation on ints of 2^30 or more: only where it changes one.)
            values = (in_addr & 0xFFFFFFFF, in_hi, in_len, out_addr & 0xFFFFFFFF, out_hi, out_cap, job_id)
            if block is not None:
                block(_JOB_BLOCK, values)     # one call costs less than the changed fields' writes
            else:
                for i, value in enumerate(values):
                    if staged[i] != value:
                        staged[i] = None      # unknown if the write raises
                        write(_JOB_FIELDS[i], value)
                        staged[i] = value
            write(_JOB_PUSH, 1)
        self._free_slots -= len(queued)
        self.in_flight.update(map(_job_id, queued))
        return len(queued)

    def poll(self) -> list[Completion]:
        """Read and pop every waiting completion (never blocks): the count, then per
        completion its six registers and DONE_POP; with block access, per completion one
        block read of the count and the head, and DONE_POP, then one more block read
        that finds the count 0 (at most the FIFO's depth per call, so a device that never
        empties cannot hold the host here)."""
        t = self.transport
        read, write = t.read32, t.write32
        out = []
        if self._blocks:
            # :meth:`_track_stuck`'s bookkeeping is inline here, per completion popped.
            block, discard, append, stuck = t.read_block, self.in_flight.discard, out.append, self.stuck
            for _ in range(max(self.done_depth, 1)):
                count, _pop, job_id, status, size, nbytes, clocks, symbols = block(_DONE_COUNT, DONE_BLOCK_WORDS)
                if not count:
                    break
                lane = (status >> 8) & 0xFF
                status &= 0xFF
                append(_new_tuple(Completion, (job_id, status, lane, size & 0xFFFF, size >> 16, nbytes, clocks,
                                               symbols)))
                write(_DONE_POP, 1)
                discard(job_id)
                if status == _WATCHDOG:
                    if lane < self.lanes:     # a lane number past the build's is a fault, not a lane
                        stuck.add(lane)
                elif stuck:
                    stuck.discard(lane)
            return out
        count = read(_DONE_COUNT)
        for _ in range(count):
            status, size = read(_DONE_STATUS), read(_DONE_SIZE)
            job_id = read(_DONE_ID)
            done = Completion(job_id, status & 0xFF, (status >> 8) & 0xFF, size & 0xFFFF, size >> 16,
                              read(_DONE_BYTES), read(_DONE_CLOCKS), read(_DONE_SYMBOLS))
            write(_DONE_POP, 1)
            self.in_flight.discard(job_id)
            out.append(done)
        self._track_stuck(out)
        return out

    def _track_stuck(self, completions: list[Completion]) -> None:
        stuck = self.stuck
        for done in completions:
            if done.status == _WATCHDOG:
                if done.lane < self.lanes:    # a lane number past the build's is a fault, not a lane
                    stuck.add(done.lane)
            elif stuck:
                stuck.discard(done.lane)

    @property
    def all_lanes_stuck(self) -> bool:
        """Every lane is stuck (:attr:`stuck`): no queued job can run until a reset."""
        return len(self.stuck) >= self.lanes

    def wait(self, max_clocks: int = 1 << 28) -> list[Completion]:
        """Completions, blocking on the interrupt until at least one arrives.

        Raises:
            DeviceError: jobs are in flight and nothing completes (the device's watchdog
                should have ended them).
        """
        while True:
            done = self.poll()
            if done or not self.in_flight:
                return done
            t = self.transport
            pending = t.read32(Reg.ISR)
            if pending:
                t.write32(Reg.ISR, pending)     # toggle-on-write clears the bits read
            done = self.poll()                   # one may have arrived before the clear
            if done:
                return done
            if not t.wait(max_clocks):
                raise DeviceError(f"no completion for jobs {sorted(self.in_flight)[:8]}")

    def decode_batch(self, items: Sequence[tuple[bytes, int]]) -> list[JobOutcome]:
        """Decode many files, keeping the job FIFO full; results in input order.

        Args:
            items: ``(jpeg_bytes, output_capacity)`` per input (non-empty bytes); the
                capacity (bytes) is normally ``width * height * 3`` from the frame header.

        Returns:
            One :class:`JobOutcome` per item.

        Raises:
            MemoryError: one input's buffers do not fit the device memory even with
                nothing else in flight.
            DeviceError: the device stopped answering, or every lane is stuck
                (:attr:`stuck`) while jobs wait (with nothing in flight the device is
                reset and the batch goes on); the device is reset before the buffers are
                released, so it cannot write into them afterwards.
        """
        t = self.transport
        word = self.bus_bytes
        buffers: dict[int, tuple] = {}          # job id -> (item index, src, dst)
        outcomes: list[JobOutcome | None] = [None] * len(items)
        next_item = 0
        try:
            while next_item < len(items) or buffers:
                while next_item < len(items):
                    if self._free_slots == 0 and self.free_slots() == 0:
                        break
                    data, cap = items[next_item]
                    try:
                        src = t.allocate(max(len(data), word), writable=False)
                    except MemoryError:
                        if buffers:
                            break                 # room comes back as jobs complete
                        raise
                    try:
                        dst = t.allocate(max(cap, word))
                    except MemoryError:
                        src.free()
                        if buffers:
                            break
                        raise
                    src.array[:len(data)] = np.frombuffer(data, np.uint8)
                    src.sync_to_device()
                    job_id = self._next_id
                    self._next_id = (self._next_id + 1) & 0xFFFFFFFF
                    buffers[job_id] = (next_item, src, dst)
                    self.submit(job_id, src.device_address, len(data), dst.device_address, cap)
                    next_item += 1
                for done in self.wait():
                    if done.job_id not in buffers:
                        continue                  # not this batch's (an earlier, abandoned call)
                    index, src, dst = buffers.pop(done.job_id)
                    image = None
                    if done.status == 0:
                        dst.sync_from_device()
                        n = done.width * done.height * 3
                        image = dst.array[:n].reshape(done.height, done.width, 3).copy()
                    outcomes[index] = JobOutcome(done, image)
                    src.free()
                    dst.free()
                if self.all_lanes_stuck:
                    if buffers:
                        raise DeviceError(f"every lane waits on memory transactions its watchdog gave up; jobs "
                                          f"{sorted(buffers)[:8]} cannot run")
                    self.reset()                  # nothing in flight: a fresh device takes the rest
        except BaseException:
            if buffers:
                self.reset()                      # no device access to buffers about to be freed
            raise
        finally:
            for _, src, dst in buffers.values():
                src.free()
                dst.free()
        return outcomes
