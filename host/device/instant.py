"""Benchmark instrument: an *instant* decoder device, for measuring the runtime's host cost.

:class:`InstantTransport` answers the decoder device's register protocol
(:mod:`dlbooster.hw.regs`) in Python and completes every queued job by the next time
the host looks for completions (reads ``DONE_*`` or ``ISR``, or waits), from outputs
computed beforehand (:meth:`InstantTransport.learn`). Driven by the real
:class:`~dlbooster.device.driver.DecoderDevice` and :class:`~dlbooster.runtime.service.DecodeService`,
it leaves only the host's own work on the clock: reading, pre-screen, dispatch,
completion handling, batching and copies. What a real device and its DMA would do (the
pixel writes into the output buffer) is timed separately
(:attr:`InstantTransport.device_seconds`, thread CPU time, one pair of clock reads per
group of jobs run together, so the clock reads cost the host little) so benchmarks can
subtract it. Its register
file answers in Python, one call per register access or per block of consecutive
registers (as the pynq transport makes them: an MMIO call, or one slice of its register
array), and that cost stays on the host's side of the account.

Not a decoder and not a test double for one: tests of the device use the Verilator
simulation (:mod:`dlbooster.sim.device`).
"""

from __future__ import annotations

import bisect
import threading
import time
import zlib
from collections import deque

import numpy as np

from dlbooster.hw.regs import DONE_BLOCK_WORDS, MAGIC, Irq, Reg

__all__ = ["InstantBackend", "InstantTransport"]

# Plain ints and tables: the register file should cost the host no more than a store
# or load through a Python MMIO call would (enum members and per-call dicts cost more).
_DONE_FIELDS = {int(Reg.DONE_ID): 0, int(Reg.DONE_STATUS): 1, int(Reg.DONE_SIZE): 2, int(Reg.DONE_BYTES): 3,
                int(Reg.DONE_CLOCKS): 4, int(Reg.DONE_SYMBOLS): 5}
_STAGED = frozenset(range(int(Reg.JOB_IN_ADDR_LO), int(Reg.JOB_ID) + 1, 4))
_JOB_PUSH, _DONE_COUNT, _DONE_POP, _ISR = int(Reg.JOB_PUSH), int(Reg.DONE_COUNT), int(Reg.DONE_POP), int(Reg.ISR)
_COMPLETION = int(Irq.COMPLETION)
_NO_DONE = (0,) * DONE_BLOCK_WORDS


def _key(data) -> tuple[int, int]:
    # A cheap content key: the length and a CRC of the first 4 KiB.
    return len(data), zlib.crc32(bytes(data[:4096]))


class _Buffer:
    def __init__(self, transport: InstantTransport, address: int, size: int):
        self.transport, self.device_address, self.size = transport, address, size
        self.array = np.zeros(size, np.uint8)

    def sync_to_device(self, nbytes: int | None = None, offset: int = 0) -> None:
        """Nothing to do: host memory."""

    def sync_from_device(self, nbytes: int | None = None, offset: int = 0) -> None:
        """Nothing to do: host memory."""

    def free(self) -> None:
        self.transport._free(self)


class InstantTransport:
    """A device transport whose jobs complete at once from learned outputs.

    Args:
        lanes: lanes the device reports (completions name them round-robin).
        job_depth: job FIFO entries.
        max_width: the widest image it accepts, pixels.
        pixels: write each image's pixels into its output buffer. False makes a control
            instrument: completions are the same (size, bytes written), the output
            buffers are left as they are. A real device's DMA writes without the CPU;
            the instrument's copy (about 600 KB read and 600 KB written per ImageNet
            photo) can also evict the host's own data from the CPU caches, which the
            control separates from the host's cost (docs/benchmarks.md). The
            host's own work is the same either way, copies of unwritten buffers
            included. The attribute may be changed between jobs (``bench host``
            alternates it by epoch).
    """

    name = "instant"

    def __init__(self, lanes: int = 4, job_depth: int = 16, max_width: int = 8192, pixels: bool = True):
        self.lanes, self.job_depth, self.max_width, self.pixels = lanes, job_depth, max_width, pixels
        self.outputs: dict[tuple[int, int], np.ndarray] = {}
        self.device_seconds = 0.0
        self._lock = threading.Lock()
        self._bases: list[int] = []
        self._buffers: dict[int, _Buffer] = {}
        self._next = 1 << 32
        self._staged = dict.fromkeys(_STAGED, 0)   # the JOB_* registers, 0 after reset as in the gateware
        self._queued: list[dict[int, int]] = []   # pushed jobs' staged fields, not yet run
        self._done: deque = deque()
        self._isr = 0
        self._lane = 0

    def learn(self, data: bytes, image: np.ndarray) -> None:
        """Remember the (H, W, 3) uint8 output of one input's bytes."""
        self.outputs[_key(data)] = np.ascontiguousarray(image, np.uint8)

    def allocate(self, size: int, *, writable: bool = True) -> _Buffer:
        with self._lock:
            buf = _Buffer(self, self._next, size)
            self._next += (size + 4095) // 4096 * 4096 + 4096
            bisect.insort(self._bases, buf.device_address)
            self._buffers[buf.device_address] = buf
            return buf

    def _free(self, buf: _Buffer) -> None:
        with self._lock:
            self._bases.remove(buf.device_address)
            del self._buffers[buf.device_address]

    def _view(self, address: int, size: int) -> np.ndarray:
        base = self._bases[bisect.bisect_right(self._bases, address) - 1]
        buf = self._buffers[base]
        offset = address - base
        if offset + size > buf.size:
            raise IndexError(f"access past buffer 0x{base:x}")
        return buf.array[offset:offset + size]

    def read32(self, offset: int) -> int:
        if self._queued and (offset in _DONE_FIELDS or offset == _DONE_COUNT or offset == _ISR):
            self._run_queued()
        field = _DONE_FIELDS.get(offset)
        if field is not None:
            return self._done[0][field] if self._done else 0
        if offset == _DONE_COUNT:
            return len(self._done)
        if offset == _JOB_PUSH:
            return self.job_depth - len(self._queued)
        if offset == _ISR:
            return self._isr
        if offset == Reg.ID:
            return MAGIC
        if offset == Reg.CONFIG:
            return self.lanes | 16 << 8 | self.job_depth << 16 | 16 << 24
        if offset == Reg.MAX_WIDTH:
            return self.max_width
        return 0

    def read_block(self, offset: int, count: int) -> list[int]:
        """``count`` consecutive registers from ``offset`` (no register has a read side
        effect, so this equals ``count`` :meth:`read32` calls)."""
        if offset == _DONE_COUNT and count == DONE_BLOCK_WORDS:
            # The driver's completion read, in one step.
            if self._queued:
                self._run_queued()
            done = self._done
            return [len(done), 0, *done[0]] if done else _NO_DONE
        return [self.read32(offset + 4 * i) for i in range(count)]

    def write_block(self, offset: int, values) -> None:
        """Consecutive registers from ``offset``, as :meth:`write32` calls in order."""
        staged = self._staged
        for value in values:
            if offset in staged:
                staged[offset] = value
            else:
                self.write32(offset, value)
            offset += 4

    def write32(self, offset: int, value: int) -> None:
        if offset in _STAGED:
            self._staged[offset] = value
        elif offset == _JOB_PUSH:
            if len(self._queued) < self.job_depth:   # a full FIFO drops the job, as the gateware's does
                self._queued.append(dict(self._staged))
        elif offset == _DONE_POP:
            if self._done:
                self._done.popleft()
        elif offset == _ISR:
            self._isr &= ~value

    def _run_queued(self) -> None:
        start = time.thread_time()
        queued, self._queued = self._queued, []
        for staged in queued:
            self._run_job(staged)
        self.device_seconds += time.thread_time() - start

    def _run_job(self, s: dict[int, int]) -> None:
        in_addr = s[Reg.JOB_IN_ADDR_LO] | s[Reg.JOB_IN_ADDR_HI] << 32
        out_addr = s[Reg.JOB_OUT_ADDR_LO] | s[Reg.JOB_OUT_ADDR_HI] << 32
        in_len, cap, job = s[Reg.JOB_IN_LEN], s[Reg.JOB_OUT_CAP], s[Reg.JOB_ID]
        image = self.outputs.get(_key(self._view(in_addr, in_len)))
        lane = self._lane
        self._lane = (self._lane + 1) % self.lanes
        if image is None:
            done = (job, 0x40 | lane << 8, 0, 0, 1, 0)            # BAD_JOB: never learned
        elif image.size > cap:
            done = (job, 0x41 | lane << 8, 0, 0, 1, 0)            # OUTPUT_TOO_SMALL
        else:
            h, w = image.shape[:2]
            out = self._view(out_addr, image.size)        # bounds checked either way
            if self.pixels:
                out[:] = image.reshape(-1)                # the device's DMA
            done = (job, lane << 8, w | h << 16, image.size, 1, 0)
        self._done.append(done)
        self._isr |= _COMPLETION

    def wait(self, max_clocks: int = 0) -> bool:
        if self._queued:
            self._run_queued()
        return bool(self._isr)

    def reset(self, clocks: int = 0) -> None:
        self._queued.clear()
        self._staged = dict.fromkeys(_STAGED, 0)
        self._done.clear()
        self._isr = 0


class InstantBackend:
    """A device backend over :class:`InstantTransport` (benchmark instrument).

    Args:
        transport: the instant transport, with its outputs learned.
    """

    name = "instant"

    def __init__(self, transport: InstantTransport):
        from dlbooster.device.driver import DecoderDevice

        self.transport = transport
        self.max_width = transport.max_width
        self.device = DecoderDevice(transport)
        self.device.start()
