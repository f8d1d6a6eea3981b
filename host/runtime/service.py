"""Decode service: keeps every device lane fed and routes what they decline to the CPU.

One :class:`DecodeService` serves a loader. Each submitted :class:`Task` names an input
(a path) and a destination slot of a :class:`~dlbooster.runtime.pool.BatchBuffer`; the service

1. with a device backend, hands each device's share of a batch (bounded queue) to the
   device's dispatcher thread, which reads and pre-screens each input
   (:func:`dlbooster.jpeg.parse` of the headers, :func:`~dlbooster.jpeg.classify` of
   them, the verdict kept per file across epochs): inputs whose headers put them outside
   the hardware profile (SPEC.md section 2: progressive, CMYK, 12-bit, wider than the
   device, not a JPEG, ...) or that Pillow treats its own way go straight to the CPU
   pool without costing device time; with a CPU backend, each input goes to the CPU
   pool;
2. the dispatcher keeps the device's job FIFO full (jobs in flight up to
   ``job_depth + lanes``), writes each
   decoded image straight into its slot (the slot's device address is the job's output
   buffer when the pool's memory is the transport's), and collects completions out of
   order by job id;
3. sends every job the device declines (a non-zero status) or loses (a device fault,
   after which the device is reset), and every input the device's memory has no room
   for (reason ``device-memory``), to the CPU pool, whose result is identical
   (Pillow's, SPEC.md section 1).

Every task ends in exactly one call of its ``done(task, outcome)`` with an
:class:`Outcome`: ``ok`` (the requested backend decoded it), ``fallback`` (the CPU path
did, with the reason) or ``error`` (nothing can decode it; Pillow fails too), with the
input's path. Bad input never raises out of the service. (The Loader's batches, whose
``done`` is a :class:`BatchDone`, take the tasks a device decoded into their slots
with one ``ok_many(tasks)`` call per group of completions instead: the same end, ``ok``,
without an object and a call per image.)
"""

from __future__ import annotations

import abc
import collections
import contextlib
import logging
import numbers
import operator
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlbooster import jpeg
from dlbooster.backends import CpuBackend, LargeFile, decode_pillow, get_backend, read_file
from dlbooster.errors import DecodeError, FallbackError
from dlbooster.runtime.pool import SpillBuffer

__all__ = ["DecodeService", "Outcome", "ServiceStats", "Task"]

log = logging.getLogger("dlbooster")


@dataclass(slots=True)
class Outcome:
    """What became of one input.

    Attributes:
        index: the dataset index.
        path: the input's path.
        status: ``ok``, ``fallback`` or ``error``.
        backend: the backend whose pixels were delivered (None on error).
        reason: why the requested backend declined it or why it failed (None when ok).
        detail: human-readable detail of ``reason``.
        extra: device figures (``cycles``, ``symbols``, ``lane``) for jobs a device ran.
    """

    index: int
    path: str
    status: str
    backend: str | None
    reason: str | None = None
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        text = f"{self.path}: {self.status}"
        if self.reason:
            text += f" ({self.reason}{': ' + self.detail if self.detail else ''})"
        return text


@dataclass(slots=True)
class Task:
    """One input to decode into slot ``slot`` of ``buffer``; ``done(task, outcome)`` is
    called exactly once, from a service thread (or, for a ``done`` that is a
    :class:`BatchDone`, ``done.ok_many`` with it among its tasks). ``read``, when
    given, returns the input's bytes instead of reading the file ``path`` (which then
    only names the input, e.g. an image of a record file, :mod:`dlbooster.records.pcr`)."""

    index: int
    path: str
    buffer: Any
    slot: int
    done: Callable[[Task, Outcome], None]
    read: Callable[[], bytes] | None = None


class BatchDone(abc.ABC):
    """Base of a ``done`` callable shared by many tasks (the Loader's batches) that also
    takes the tasks a device decoded into their slots in one call, :meth:`ok_many`,
    instead of one ``done(task, outcome)`` call per task: their outcome is ``ok`` with
    the requested backend, and none is made (the dispatcher made one object and one call
    per image for outcomes the Loader only counts). Every other outcome still
    comes through ``done(task, outcome)``. Internal: a consumer of its own passes a plain
    callable."""

    __slots__ = ()

    @abc.abstractmethod
    def __call__(self, task: Task, outcome: Outcome) -> None:
        """One task's outcome."""

    @abc.abstractmethod
    def ok_many(self, tasks: list[Task]) -> None:
        """Tasks the requested backend decoded into their slots (outcome ``ok``)."""


@dataclass
class ServiceStats:
    """Counters of a service since it started (all thread-safe snapshots).

    Attributes:
        outcomes: ``(status, reason)`` -> count.
        lane_clocks: (device, lane) -> device clocks spent on jobs.
        device_clocks: device -> clocks the device ran (simulated devices only).
        jobs: jobs sent to devices.
        device_queue_peak: most batch shares waiting for a device at once.
        oversize: images larger than their slot.
        read_seconds: CPU seconds (thread time, kernel included) spent reading inputs
            (files, or the bytes a ``Task.read`` returns): the storage side of the
            host's work, reported apart by the host-cost benchmark. A
            dispatcher times the reads of each group of inputs it takes as one span and
            adds its reads with each group of completions and when it goes idle (a lock
            per read cost the host about 1,600 instructions per image).
    """

    outcomes: collections.Counter = field(default_factory=collections.Counter)
    lane_clocks: collections.Counter = field(default_factory=collections.Counter)
    device_clocks: dict = field(default_factory=dict)
    jobs: int = 0
    device_queue_peak: int = 0
    oversize: int = 0
    read_seconds: float = 0.0


_STOP = object()
# A file's identity for its kept pre-screen verdict (DecodeService._screen): device, inode,
# size, modification and status-change times; a C call, no Python frame per file.
_identity = operator.attrgetter("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")
_job_id = operator.itemgetter(0)             # of a job tuple (DecoderDevice.submit_many's)


class _Dispatcher(threading.Thread):
    """Drives one :class:`~dlbooster.device.driver.DecoderDevice`. Takes lists of tasks (a
    batch's share) from its queue, reads and pre-screens each input itself (no thread
    hand-off per image), submits jobs while the job FIFO has room, waits on
    completions and routes declined jobs to the CPU pool.

    Lanes stuck after a watchdog (:attr:`dlbooster.device.driver.DecoderDevice.stuck`) leave the
    queued jobs to the others; once every lane is stuck, the device is reset (its jobs in
    flight go to the CPU), instead of waiting out the driver's wait bound (2^28 clocks,
    minutes in the simulator)."""

    def __init__(self, service: DecodeService, number: int, device, depth: int):
        super().__init__(name=f"dlbooster-device{number}", daemon=True)
        self.service, self.number, self.device = service, number, device
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.limit = device.job_depth + device.lanes
        self.staging: list = []               # spare input staging buffers (transport memory)
        self.outputs: list = []               # spare output buffers (host-memory slots)
        self.spares = self.limit              # the most spare output buffers kept
        self.allocated: dict[int, object] = {}   # id -> every staging/output buffer not freed (for close)
        self.inflight: dict[int, tuple] = {}  # job id -> (task, data, src, dst, the job's output capacity)
        self.next_id = 0
        self.stopping = False
        self.pending: collections.deque = collections.deque()   # tasks taken, not yet read
        self.backlog: collections.deque = collections.deque()   # read, not yet accepted (items)
        self.current: list | None = None      # (task, data, ...) of the jobs being submitted or completed
        self.reading = None                   # the staging buffer the input being read went into
        self._into = self._read_into_staging
        self.started: dict[int, float] = {}   # job id -> submission time (when tracing)
        self.lane_free: dict[int, float] = {} # lane -> its last completion time (when tracing)
        self.clocks0 = self._clocks()
        # A board counts no clocks: its fabric clock times the wall time stands in, as its
        # lanes count each job's clocks at that clock (lane_busy).
        self.wall_hz = getattr(device.transport, "clock_hz", None) if self.clocks0 is None else None
        self.wall0 = time.monotonic()
        self.read_seconds = 0.0               # reads not yet added to the service's stats

    def _clocks(self) -> int | None:
        counters = getattr(self.device.transport, "counters", None)
        return counters()["clocks"] if counters else None

    def _staging(self, size: int):
        """A staging buffer of at least ``size`` bytes: a spare, else a new one whose size
        is a power of two (at least 256 KiB), so spares fit the next inputs instead of
        being reallocated for each larger file.

        Raises:
            MemoryError: the transport's memory is exhausted.
        """
        for i, buf in enumerate(self.staging):
            if buf.size >= size:
                return self.staging.pop(i)
        if self.staging:
            self._free(self.staging.pop())    # grow: one spare (too small) goes
        return self._allocate(max(1 << 18, 1 << (size - 1).bit_length()), writable=False)

    def _allocate(self, size: int, writable: bool = True):
        buf = self.device.transport.allocate(max(size, self.device.bus_bytes), writable=writable)
        self.allocated[id(buf)] = buf
        return buf

    def _free(self, buf) -> None:
        del self.allocated[id(buf)]
        buf.free()

    def _output(self, task: Task, need: int):
        """The output buffer of an image its batch slot cannot take: room in the batch
        buffer's spill area when the slots are device memory (else, or when the spill
        area is at its limit, a buffer of the dispatcher's: a spare, else a new one whose
        size is a power of two, at least 64 KiB).

        Raises:
            MemoryError: the transport's memory is exhausted.
        """
        buf = task.buffer
        if buf.device_address is not None:
            try:
                room = buf.spill(need, self.device.transport.allocate)
            except MemoryError:
                room = None                   # a smaller buffer of the dispatcher's may fit
            if room is not None:
                return room
        for i, spare in enumerate(self.outputs):
            if spare.size >= need:
                return self.outputs.pop(i)
        try:
            return self._allocate(max(1 << 16, 1 << (need - 1).bit_length()))
        except MemoryError:
            # Give the spares back to the device's memory and try once more.
            for spare in self.outputs + self.staging:
                self._free(spare)
            self.outputs.clear()
            self.staging.clear()
            return self._allocate(max(need, 1))

    def _spare_output(self, buf) -> None:
        """Keep an output buffer no job uses now for the next image that needs one (up to
        as many as jobs in flight; the smallest goes beyond that). Room in a batch
        buffer's spill area goes back to it."""
        if isinstance(buf, SpillBuffer):
            buf.free()
            return
        self.outputs.append(buf)
        if len(self.outputs) > self.spares:
            self.outputs.sort(key=lambda b: b.size)
            self._free(self.outputs.pop(0))

    def _read_into_staging(self, size: int):
        """``into`` of :func:`~dlbooster.backends.read_file`: files are read straight
        into a staging buffer (None when the transport's memory is full: bytes then).
        The buffer taken is left in ``self.reading``."""
        try:
            self.reading = self._staging(size)
        except Exception:
            # Full memory, or a transport fault, which is not the file's: it is read into
            # bytes, and staging it for a job (_submit) meets a fault again and takes the
            # device out of service, its tasks to the CPU.
            return None
        return self.reading.array

    def run(self) -> None:
        try:
            self._loop()
            self._add_reads()
        except BaseException as exc:  # a broken device must not lose the tasks it holds
            self._add_reads()
            detail = f"{type(exc).__name__}: {exc}"
            log.error("device %d out of service: %s", self.number, detail)
            self._abandon(detail, escalate=False)
            if self.current is not None:          # the jobs in hand when the fault struck
                for task, data, *_ in self.current:
                    self.service._to_cpu(task, data, "device-fault", detail)
                self.current = None
            for task, data, *_ in self.backlog:
                self.service._to_cpu(task, data, "device-fault", detail)
            self.backlog.clear()                  # close() frees the staging buffers they held
            while self.pending:
                self.service._to_cpu(self.pending.popleft(), None, "device-fault", detail)
            if not self.stopping:
                self._drain_to_cpu(detail)

    def _take(self, room: int) -> list[tuple]:
        """Up to ``room`` items ``(task, data, width, height, src)`` to submit: the
        backlog's first, then inputs read and pre-screened from the tasks taken; waits
        for tasks only when it has no item and no job is in flight. ``src`` is the
        staging buffer the input was read into (``data`` is a view of it; the item owns
        it), or None (``data`` is bytes)."""
        items: list[tuple] = []
        backlog, pending = self.backlog, self.pending
        while backlog and len(items) < room:
            items.append(backlog.popleft())
        while len(items) < room:
            if pending:
                self._read_group(min(room - len(items), len(pending)), items)
                continue
            if self.stopping:
                break
            block = not items and not self.inflight
            if block:
                self._add_reads()             # going idle: the stats are complete
            try:
                got = self.queue.get(block=block)
            except queue.Empty:
                break
            if got is _STOP:
                self.stopping = True
                break
            pending.extend(got)
        return items

    def _read_group(self, n: int, items: list[tuple]) -> None:
        """Read the next ``n`` pending inputs, then pre-screen each; those for the device
        go to ``items``. The reads are timed as one span: a thread-CPU clock read is a
        system call (about 0.4 us on the build machine), and two per input were a
        twentieth of the host's cost per image."""
        service, pending, into = self.service, self.pending, self._into
        read = []
        start = time.thread_time()
        try:
            for _ in range(n):
                task = pending[0]             # popped once read: an exit in the read leaves it pending
                self.reading = None
                try:
                    data, st = service._read_input(task, into)
                except Exception as exc:  # never lose a task to a fault
                    data, st = None, exc
                read.append((pending.popleft(), data, st, self.reading))
        finally:
            self.read_seconds += time.thread_time() - start
        # A kept verdict holds for the Pillow pixel limit it was judged under (too-large).
        limit = jpeg.pillow_max_pixels()
        if limit != service._screens_limit:
            service._screens.clear()
            service._screens_limit = limit
        staging, screens = self.staging, service._screens
        for task, data, st, src in read:
            if data is None:
                if isinstance(st, LargeFile):     # no device takes it: Pillow reads the file
                    service._to_cpu(task, None, st.reason, st.detail)
                else:
                    service._error(task, st, "pre-screen")
                item = None
            elif st is not None and (cached := screens.get(task.path)) is not None and cached[1] is None \
                    and cached[4] is None and cached[0] == _identity(st):
                # A file whose kept verdict is the device's, bytes as read: _screen's
                # common case, without its call.
                items.append((task, data, cached[2], cached[3], src))
                continue
            else:
                item = service._screen(task, data, st, src)
            if item is not None:
                items.append(item)
                if item[4] is not src:        # its bytes rewritten (_screen): staged again to submit
                    staging.append(src)
            elif src is not None:             # gone to the CPU (its bytes copied) or failed
                staging.append(src)

    def _loop(self) -> None:
        from dlbooster.device.driver import DeviceError

        refused = 0                           # submissions refused while nothing was in flight
        while not (self.stopping and not self.inflight and not self.backlog and not self.pending):
            items = self._take(self.limit - len(self.inflight))
            if items:
                rest = self._submit(items)
                self.current = None
                if rest:
                    # Job FIFO full: the rest wait, in order, for a completion.
                    self.backlog.extendleft(reversed(rest))
                    if not self.inflight:
                        refused += 1
                        if refused > 1000:
                            raise DeviceError("the job FIFO stays full with no job in flight")
                        time.sleep(0.001)
                else:
                    refused = 0
            if self.inflight:
                try:
                    completions = self.device.wait()
                except DeviceError as exc:
                    self._abandon(str(exc))
                    continue
                if self.clocks0 is not None:
                    self.service.stats.device_clocks[self.number] = self._clocks() - self.clocks0
                self._complete_many(completions)
                if self.device.all_lanes_stuck:
                    self._abandon("device reset: every lane waits on memory transactions its watchdog gave up")

    def _submit(self, items: list[tuple]) -> list[tuple]:
        """Stage items (:meth:`_take`) and queue their jobs in one register sequence.
        Returns the items the job FIFO did not take (the last ones, in order; they keep
        their staging buffers and go back to the backlog). An item whose output buffer
        finds no room in the device's memory goes to the CPU (reason ``device-memory``).

        Items past the room the job FIFO is known to have (its free count, read when
        fewer than the items are known, as :meth:`DecoderDevice.submit_many` would) are
        not staged: they go back as they came (staging and unstaging them cost the host,
        and a transport its syncs, for nothing)."""
        service, device = self.service, self.device
        self.current = items                  # the fault path's: not yet in flight (task, data, ...)
        room = device.job_room(len(items))
        later = items[room:]                  # for the FIFO's next room (held in self.current meanwhile)
        jobs, held, taken = [], [], []          # per job: its entry, its item
        max_width, next_id = device.max_width, self.next_id
        try:
            for item in items[:room] if later else items:
                task, data, width, height, src = item
                need = 3 * width * height if width <= max_width else 0
                buf = task.buffer
                base, cap = buf.device_address, buf.slot_bytes
                dst = None
                try:
                    if src is None:
                        src = self._staging(len(data))
                        src.array[: len(data)] = np.frombuffer(data, np.uint8)
                    if base is None or need > cap:
                        # Larger than a slot, or the slot is not device memory.
                        dst = self._output(task, need)
                except MemoryError as exc:
                    self.current = [entry for entry in self.current if entry[0] is not task]
                    service._to_cpu(task, data, "device-memory", f"no room in the device's memory: {exc}")
                    if src is not None:
                        self.staging.append(src)      # after _to_cpu copied a view of it
                    continue
                if dst is None:
                    out_addr = base + task.slot * cap
                else:
                    out_addr, cap = dst.device_address, need
                held.append((task, data, src, dst, cap))
                taken.append(item)
                size = len(data)
                src.sync_to_device(size)
                job_id = next_id + len(jobs)
                if job_id >> 32:              # wrapped (a mask costs an allocation on ints of 2^30 or more)
                    job_id &= 0xFFFFFFFF
                jobs.append((job_id, src.device_address, size, out_addr, cap))
        except BaseException:
            # Nothing is queued yet: the buffers go back (spill rooms in reverse, so all
            # of them), the fault path sends the items (self.current) to the CPU.
            for _, _, src, dst, _ in reversed(held):
                self.staging.append(src)
                if dst is not None:
                    self._spare_output(dst)
            raise
        try:
            queued = device.submit_many(jobs)
        except BaseException:
            # Some jobs may be queued: all are held as in flight, so the fault path resets
            # the device before it releases their buffers, and decodes them on the CPU.
            queued = len(jobs)
            raise
        finally:
            self.inflight.update(zip(map(_job_id, jobs[:queued]), held))   # job id -> its entry
            self.next_id = (next_id + queued) & 0xFFFFFFFF
            self.current = held[queued:] + later or None   # (task, data, ...) as items
        for item, (_, _, src, dst, _) in reversed(list(zip(taken[queued:], held[queued:]))):
            if item[4] is None:               # staged from bytes here: the item keeps its bytes
                self.staging.append(src)
            if dst is not None:
                self._spare_output(dst)
        if service.trace is not None:
            now = time.perf_counter()
            for job, *_ in jobs[:queued]:
                self.started[job] = now
        with service._lock:
            service.stats.jobs += queued
        return taken[queued:] + later

    def _complete_many(self, completions) -> None:
        """Handle a batch of completions; the decoded ones are finished together (one
        lock for the counters, one for the outstanding count), even when a later one
        of the batch faults.

        The common completion (decoded into its batch slot, figures consistent, no
        trace) is handled inline; every other goes through :meth:`_complete`."""
        finished: list[tuple[Task, Outcome]] = []
        groups: list[tuple[BatchDone, list[Task]]] = []   # decoded tasks whose done takes them at once
        last, group = None, None              # the last task's done, and its group (None: no ok_many)
        clocks: dict[int, int] = {}           # lane -> clocks; a plain dict: Counter.update costs more per call
        service = self.service
        inflight, staging, number, name = self.inflight, self.staging, self.number, service.backend_name
        plain = service.trace is None
        entry = None
        try:
            for done in completions:
                job_id, status, lane, width, height, nbytes, job_clocks, symbols = done   # one unpack
                entry = inflight.pop(job_id, None)
                if entry is None:
                    continue
                task, _, src, dst, cap = entry
                if status or dst is not None or not plain or nbytes != 3 * width * height or nbytes > cap:
                    # _complete keeps self.current itself: once it has handed the task to
                    # the CPU, a fault there must not send it a second time.
                    held, entry = entry, None
                    item = self._complete(done, held, clocks)
                    if item is not None:
                        finished.append(item)
                    continue
                staging.append(src)
                clocks[lane] = clocks.get(lane, 0) + job_clocks
                words, row = task.buffer.size_words, 2 * task.slot
                words[row] = height
                words[row + 1] = width
                callback = task.done
                if callback is not last:      # a batch's tasks share theirs
                    last = callback
                    group = [] if isinstance(callback, BatchDone) else None
                    if group is not None:
                        groups.append((callback, group))
                if group is not None:
                    group.append(task)
                else:
                    finished.append((task, Outcome(task.index, task.path, "ok", name, None, "",
                                                   {"cycles": job_clocks, "symbols": symbols, "lane": lane})))
                entry = None
        except BaseException:
            if entry is not None:             # struck in the inline path: the fault path sends it to the CPU
                self.current = [entry]
            raise
        finally:
            self._add_reads()
            with service._lock:
                lane_clocks = service.stats.lane_clocks
                for lane, value in clocks.items():
                    lane_clocks[number, lane] += value
            if finished or groups:
                service._finish_many(finished, all_ok=True, groups=groups)   # a declined job went to the CPU instead

    def _complete(self, done, entry: tuple, clocks: dict) -> tuple[Task, Outcome] | None:
        """One completion and its in-flight ``entry``: a declined job goes to the CPU; a
        decoded one returns its ``(task, outcome)`` for the caller to finish. Adds its
        clocks to ``clocks`` (keyed by lane)."""
        job_id, status, lane, width, height, nbytes, job_clocks, symbols = done
        task, data, src, dst, cap = entry
        self.current = [(task, data)]
        self.staging.append(src)
        service = self.service
        extra = {"cycles": job_clocks, "symbols": symbols, "lane": lane}
        clocks[lane] = clocks.get(lane, 0) + job_clocks
        if service.trace is not None:
            # Host-observed: a lane takes its next job no earlier than its last completion.
            now = time.perf_counter()
            start = max(self.started.pop(job_id, now), self.lane_free.get(lane, 0.0))
            self.lane_free[lane] = now
            service.trace.complete(os.path.basename(task.path), "decode", start, now,
                                   process=f"decoder device {self.number}", thread=f"lane {lane}",
                                   args={"cycles": job_clocks, "status": status, "path": task.path})
        if status:
            if dst is not None:
                self._spare_output(dst)
            self.current = None
            service._to_cpu(task, data, done.reason, f"device status 0x{status:02x}", extra)
            return None
        if nbytes != 3 * width * height or nbytes > cap:
            # A completion whose figures disagree: its pixels cannot be trusted.
            if dst is not None:
                self._spare_output(dst)
            self.current = None
            service._to_cpu(task, data, "device-fault", f"completion reports {width}x{height} "
                            f"and {nbytes} bytes written", extra)
            return None
        task.buffer.sizes[task.slot] = (height, width)
        if isinstance(dst, SpillBuffer):
            # In the batch buffer's spill area the image stays where the device wrote it.
            dst.sync_from_device(nbytes)
            service._place(task, dst.array[:nbytes].reshape(height, width, 3))
        elif dst is not None:
            try:
                dst.sync_from_device(nbytes)
                image = dst.array[:nbytes].reshape(height, width, 3)
                service._place(task, image.copy())
            finally:
                self._spare_output(dst)
        self.current = None
        return task, Outcome(task.index, task.path, "ok", service.backend_name, None, "", extra)

    def _add_reads(self) -> None:
        """Add the reads this dispatcher has timed to the service's stats."""
        with self.service._lock:
            self.service.stats.read_seconds += self.read_seconds
        self.read_seconds = 0.0

    def _abandon(self, detail: str, *, escalate: bool = True) -> None:
        """A device fault: reset the device (so it cannot write into buffers about to be
        reused), then decode the jobs it held on the CPU. A reset that fails leaves the
        device able to access those jobs' buffers: none is given back (close frees its
        own), and with ``escalate`` a DeviceError takes the device out of service.

        Raises:
            DeviceError: the reset failed (``escalate`` only).
        """
        held = list(self.inflight.values())
        self.inflight.clear()
        self.started.clear()
        failed = None
        try:
            self.device.reset()
        except Exception as exc:  # the device may be gone entirely
            log.error("device %d reset failed: %s", self.number, exc)
            failed = exc
        for task, data, src, dst, _ in held:
            if failed is None:
                self.staging.append(src)
                if dst is not None:
                    self._spare_output(dst)
            self.service._to_cpu(task, data, "device-fault", detail)
        if failed is not None and escalate:
            from dlbooster.device.driver import DeviceError

            raise DeviceError(f"its reset failed ({type(failed).__name__}: {failed}) after: {detail}") from failed

    def _drain_to_cpu(self, detail: str) -> None:
        """A dead device's queue: everything still sent to it goes to the CPU, until close."""
        while (tasks := self.queue.get()) is not _STOP:
            for task in tasks:
                self.service._to_cpu(task, None, "device-fault", detail)

    def close(self) -> None:
        self.queue.put(_STOP)
        self.join()
        for buf in self.allocated.values():   # spares, and any a fault left with an item
            buf.free()
        self.allocated.clear()
        self.staging.clear()
        self.outputs.clear()


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask where the OS has one (Linux),
    else ``os.cpu_count()``."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def check_count(name: str, value, least: int = 1, note: str = "") -> None:
    """A count argument: an int (a bool is not) of at least ``least``; TypeError or
    ValueError naming it. (A float of workers ran its ceiling of threads, and a queue of
    0 or fewer had no bound.)"""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if value < least:
        raise ValueError(f"{name} must be at least {least}{note}, not {value}")


class DecodeService:
    """Decode inputs into batch slots over a backend's devices and a CPU pool.

    Args:
        backend: a backend name (:data:`dlbooster.backends.BACKENDS`) or instance. A
            backend with a ``device`` attribute (``sim``; the boards) is driven through
            its :class:`~dlbooster.device.driver.DecoderDevice`; others decode on the CPU workers.
        cpu_workers: threads of the CPU pool (CPU decodes and fallbacks; with a CPU
            backend also reading and parsing);
            default: the process's CPU count. Below 1: ``ValueError``; not an integer:
            ``TypeError``.
        device_queue: batch shares (task lists) waiting per device before submitters
            block (back-pressure); at least 1.
        backend_options: passed to :func:`~dlbooster.backends.get_backend` with a name.

    The first ``sim`` use builds the simulated device (minutes; cached).
    """

    def __init__(self, backend: Any = "auto", *, cpu_workers: int | None = None,
                 device_queue: int = 4, **backend_options: Any):
        if cpu_workers is not None:           # 0 was read as "all cores" before
            check_count("cpu_workers", cpu_workers, note=" (None: one per core)")
        check_count("device_queue", device_queue)
        self._owns_backend = isinstance(backend, str)
        self.backend = get_backend(backend, **backend_options) if self._owns_backend else backend
        self.backend_name = self.backend.name
        self.cpu = self.backend if isinstance(self.backend, CpuBackend) else CpuBackend()
        self.max_width = getattr(self.backend, "max_width", jpeg.DEFAULT_MAX_WIDTH)
        self.stats = ServiceStats()
        self._lock = threading.Lock()
        self._idle = threading.Condition()
        self._outstanding = 0                 # submitted tasks whose done() has not run
        self.cpu_workers = cpu_workers or usable_cpus()
        self._cpu_pool = ThreadPoolExecutor(self.cpu_workers, thread_name_prefix="dlbooster-cpu")
        devices = getattr(self.backend, "devices", None) or (
            [self.backend.device] if hasattr(self.backend, "device") else [])
        self._dispatchers = [_Dispatcher(self, n, d, device_queue) for n, d in enumerate(devices)]
        for d in self._dispatchers:
            d.start()
        self._screens: dict[str, tuple] = {}   # path -> (file identity, reason, width, height, tables)
        self._screens_limit = jpeg.pillow_max_pixels()   # the Pillow pixel limit they were judged under
        self._closed = False
        self._pid = os.getpid()               # the process whose threads serve it (see adopt)
        #: a :class:`dlbooster.train.trace.Trace` for device jobs (per lane) and CPU decodes, or None
        self.trace = None

    @property
    def lanes(self) -> int:
        """Decoder lanes over all devices (0 for a CPU backend)."""
        return sum(d.device.lanes for d in self._dispatchers)

    def allocator(self):
        """``allocate(nbytes)`` of the first device's transport, for a
        :class:`~dlbooster.runtime.pool.BatchPool` whose slots the device writes directly; None for
        a CPU backend or several devices (each device writes through staging then)."""
        if len(self._dispatchers) != 1:
            return None
        return self._dispatchers[0].device.transport.allocate

    @property
    def forkable(self) -> bool:
        """Whether a process forked from this one can use the service (:meth:`adopt`):
        a CPU backend's can; a device backend's device is the parent's."""
        return not self._dispatchers

    def adopt(self) -> None:
        """Make the service usable in a child forked from the process that made it (as
        ``DataLoader``'s workers are), whose threads the child lacks: new CPU threads,
        and the parent's tasks in flight forgotten (the parent finishes them). Called by
        :meth:`submit_many`, :meth:`drain` and :meth:`close`; nothing to do in the
        process that made the service.

        Raises:
            RuntimeError: a device backend (not :attr:`forkable`): its device, memory
                and dispatcher threads are the parent's.
        """
        if self._pid == os.getpid():
            return
        if not self.forkable:
            raise RuntimeError(f"this decode service (backend {self.backend_name!r}) was made in process "
                               f"{self._pid} and cannot be used in process {os.getpid()}, forked from it (a "
                               f"DataLoader worker, say): its device and dispatcher threads are the parent's; "
                               f"make the Loader in the child process instead")
        # Locks a parent thread held at the fork would stay held here: new ones.
        self._lock, self._idle = threading.Lock(), threading.Condition()
        self._outstanding = 0
        self._cpu_pool = ThreadPoolExecutor(self.cpu_workers, thread_name_prefix="dlbooster-cpu")
        self._pid = os.getpid()

    def submit(self, task: Task) -> None:
        """Queue one task (see :meth:`submit_many`)."""
        self.submit_many([task])

    def submit_many(self, tasks: list[Task]) -> None:
        """Queue tasks, e.g. a batch. With devices, the list is split across them and each
        dispatcher reads its share (blocks while the devices' queues are full: this is
        the back-pressure); otherwise each task goes to the CPU pool.

        Raises:
            RuntimeError: the service is closed, or a device backend's in a forked
                child (:meth:`adopt`).
        """
        if self._pid != os.getpid():
            self.adopt()
        with self._idle:
            if self._closed:
                raise RuntimeError("the decode service is closed")
            self._outstanding += len(tasks)
        if not self._dispatchers:
            for task in tasks:
                self._cpu_pool.submit(self._prepare, task)
            return
        n = len(self._dispatchers)
        for k, d in enumerate(self._dispatchers):
            share = tasks[k::n]
            if share:
                d.queue.put(share)
                with self._lock:
                    self.stats.device_queue_peak = max(self.stats.device_queue_peak, d.queue.qsize())

    def queue_depths(self) -> dict[str, int]:
        """Tasks waiting now: on the CPU pool and per device."""
        depths = {"cpu": self._cpu_pool._work_queue.qsize()}
        for d in self._dispatchers:
            depths[f"device{d.number}"] = d.queue.qsize()
        return depths

    def _read(self, task: Task) -> tuple[bytes | memoryview, os.stat_result | None]:
        """On a CPU worker: the input's bytes and its file's status (None for a
        ``task.read`` input); the CPU time it takes is added to
        :attr:`ServiceStats.read_seconds` (a dispatcher times its reads itself).

        Raises:
            DecodeError: unreadable (reason ``unreadable``) or empty (``undecodable``).
        """
        start = time.thread_time()
        try:
            return self._read_input(task)
        finally:
            elapsed = time.thread_time() - start
            with self._lock:
                self.stats.read_seconds += elapsed

    def _read_input(self, task: Task, into=None) -> tuple[bytes | memoryview, os.stat_result | None]:
        """The input's bytes and its file's status, as :meth:`_read` (untimed). ``into``
        as for :func:`~dlbooster.backends.read_file` (files only).

        Raises:
            DecodeError: unreadable (reason ``unreadable``) or empty (``undecodable``).
        """
        if task.read is not None:
            try:
                data = task.read()
            except (OSError, ValueError, IndexError) as exc:   # RecordError is a ValueError
                raise DecodeError("unreadable", str(exc), task.path) from exc
            if not data:
                raise DecodeError("undecodable", "empty input", task.path)
            return data, None
        data, st = read_file(task.path, into)
        if not data:
            raise DecodeError("undecodable", "empty file", task.path)
        return data, st

    def _screen(self, task: Task, data: bytes | memoryview, st: os.stat_result | None, src):
        """On a dispatcher: pre-screen one input it has read (``data``, ``st`` as
        :meth:`_read` returns them; ``src``: the staging buffer ``data`` views, or None).
        Returns the item ``(task, data, width, height, src)`` for the device, or None when
        the task went to the CPU or ended.

        The pre-screen's verdict is kept per file, so later epochs skip the header parse.
        It is keyed by the file's identity: device, inode, size, and modification and
        status-change times. The status-change time matters because ``cp -p``,
        ``rsync -t`` or ``tar`` can give new contents the old size and modification time,
        and a stale verdict would send a file Pillow refuses to the device.

        An input whose scan names Huffman tables 0 or 1 that it never defines (a
        Motion-JPEG frame) goes to the device with libjpeg-turbo's standard tables
        inserted (:func:`~dlbooster.jpeg.standard_huffman_segment`), as new bytes (the
        item's ``src`` is then None); the verdict is the rewritten file's.
        """
        try:
            key = _identity(st) if st is not None else None
            cached = self._screens.get(task.path) if key is not None else None
            if cached is None or cached[0] != key:
                # Headers only: the device judges what follows the first scan's header.
                info = jpeg.parse(data, headers_only=True)
                tables = jpeg.standard_huffman_segment(info)
                if tables is not None:
                    info = jpeg.parse(jpeg.with_standard_huffman(data, tables), headers_only=True)
                frame = info.frame
                # Every reason the headers decide (classify's hardware profile, which
                # contains host_prescreen's).
                cached = (key, jpeg.classify(info, max_width=self.max_width),
                          frame.width if frame else 0, frame.height if frame else 0, tables)
                if key is not None:
                    self._screens[task.path] = cached
            _, reason, width, height, tables = cached
            if reason is not None:
                self._to_cpu(task, data, reason, "host pre-screen")
                return None
            if tables is not None:
                return task, jpeg.with_standard_huffman(data, tables), width, height, None
            return task, data, width, height, src
        except Exception as exc:  # never lose a task to a fault
            self._error(task, exc, "pre-screen")
        return None

    def _error(self, task: Task, exc: Exception, stage: str, extra: dict | None = None) -> None:
        """End a task with an ``error`` outcome: a DecodeError's reason, else ``internal``
        (an unexpected fault, logged with its traceback)."""
        if isinstance(exc, DecodeError):
            reason, detail = exc.reason, exc.detail
        else:
            log.error("%s of %s failed", stage, task.path, exc_info=exc)
            reason, detail = "internal", f"{type(exc).__name__}: {exc}"
        self._finish(task, Outcome(task.index, task.path, "error", None, reason, detail, extra or {}))

    def _to_cpu(self, task: Task, data: bytes | memoryview | None, reason: str, detail: str,
                extra: dict | None = None) -> None:
        """Send a task the device path gave up on to the CPU pool (``data`` None: not read
        yet). A view (of a staging buffer the dispatcher will reuse) is copied here."""
        if data is not None and type(data) is not bytes:
            data = bytes(data)
        self._cpu_pool.submit(self._fallback, task, data, None, FallbackError(reason, detail), extra or {})

    def _cpu_span(self, task: Task, kind: str):
        if self.trace is None:
            return contextlib.nullcontext()
        return self.trace.span(os.path.basename(task.path), kind, process="cpu decode pool",
                               args={"path": task.path})

    def _prepare(self, task: Task) -> None:
        """On a CPU worker: read, parse and decode one input with a non-device backend."""
        with self._cpu_span(task, "decode"):
            self._prepare_here(task)

    def _prepare_here(self, task: Task) -> None:
        try:
            try:
                data, _ = self._read(task)
            except LargeFile as large:        # only Pillow takes it, from the file
                self._place(task, decode_pillow(task.path))
                self._finish(task, Outcome(task.index, task.path, "ok", self.cpu.name) if self.backend is self.cpu
                             else Outcome(task.index, task.path, "fallback", self.cpu.name, large.reason,
                                          large.detail, {}))
                return
            self._decode_here(task, data, jpeg.parse(data))
        except Exception as exc:  # never lose a task to a fault
            self._error(task, exc, "decode")

    def _decode_here(self, task: Task, data: bytes, info: jpeg.JpegInfo) -> None:
        """A non-device backend (cpu, model) on this CPU worker."""
        backend = self.backend
        if backend is self.cpu:
            self._place(task, self.cpu.decode_into(data, info, task.buffer.data[task.slot]))
            self._finish(task, Outcome(task.index, task.path, "ok", backend.name))
            return
        try:
            image = backend.decode(data, info)
        except FallbackError as declined:
            self._fallback(task, data, info, declined, {})
            return
        self._place(task, image)
        self._finish(task, Outcome(task.index, task.path, "ok", backend.name))

    def _fallback(self, task: Task, data: bytes | None, info, declined: FallbackError, extra: dict) -> None:
        """The CPU path for an input the requested backend declined (``data`` None: read
        it here; ``info`` None or headers-only: parse it here)."""
        with self._cpu_span(task, "fallback"):
            self._fallback_here(task, data, info, declined, extra)

    def _fallback_here(self, task: Task, data: bytes | None, info, declined: FallbackError, extra: dict) -> None:
        try:
            try:
                if data is None:
                    data, _ = self._read(task)
            except LargeFile:
                self._place(task, decode_pillow(task.path))
            else:
                if info is None or info.headers_only:
                    info = jpeg.parse(data)
                self._place(task, self.cpu.decode_into(data, info, task.buffer.data[task.slot]))
        except Exception as exc:
            self._error(task, exc, "CPU decode", extra)
            return
        self._finish(task, Outcome(task.index, task.path, "fallback", self.cpu.name,
                                   declined.reason, declined.detail, extra))

    def _place(self, task: Task, image: np.ndarray) -> None:
        """Record an image in its slot (already there when it views the slot)."""
        buf, slot = task.buffer, task.slot
        h, w = image.shape[:2]
        buf.sizes[slot] = (h, w)
        row = buf.data[slot]
        if image.size <= row.size:
            if image.ctypes.data != row.ctypes.data:
                row[: image.size] = image.reshape(-1)
        else:
            buf.oversize[slot] = image
            with self._lock:
                self.stats.oversize += 1

    def _finish(self, task: Task, outcome: Outcome) -> None:
        self._finish_many([(task, outcome)])

    def _finish_many(self, finished: list[tuple[Task, Outcome]], all_ok: bool = False,
                     groups: list[tuple[BatchDone, list[Task]]] = ()) -> None:
        """Count the outcomes and call each task's ``done`` exactly once (``all_ok``: the
        caller knows every outcome is ``ok``, counted in one step); ``groups``: tasks
        decoded by the requested backend (``ok``), each group's done called once with
        :meth:`BatchDone.ok_many`."""
        ended = len(finished)
        for _, tasks in groups:
            ended += len(tasks)
        with self._lock:
            outcomes = self.stats.outcomes
            if all_ok:
                outcomes["ok", None] += ended
            else:
                for _, outcome in finished:
                    outcomes[outcome.status, outcome.reason] += 1
                if groups:
                    outcomes["ok", None] += ended - len(finished)
        failure = None
        try:
            for done, tasks in groups:
                try:
                    done.ok_many(tasks)
                except Exception:  # the tasks have their outcome; a consumer's fault must not re-report them
                    log.exception("done callback of %s failed", tasks[0].path)
                except BaseException as exc:  # e.g. SystemExit: the other tasks still get theirs
                    failure = failure or exc
            for task, outcome in finished:
                try:
                    task.done(task, outcome)
                except Exception:  # the task has its outcome; a consumer's fault must not re-report it
                    log.exception("done callback of %s failed", task.path)
                except BaseException as exc:  # e.g. SystemExit: the other tasks still get theirs
                    failure = failure or exc
        finally:
            with self._idle:
                self._outstanding -= ended
                if not self._outstanding:
                    self._idle.notify_all()
        if failure is not None:
            raise failure

    def clock_counts(self) -> tuple[dict, dict]:
        """A snapshot of the busy clocks, ``(lane_clocks, device_clocks)`` as in
        :class:`ServiceStats`, for :meth:`lane_busy`'s ``since``; a board's device clocks
        are its fabric clock times the wall time since its dispatcher started."""
        with self._lock:
            lanes, devices = dict(self.stats.lane_clocks), dict(self.stats.device_clocks)
        now = time.monotonic()
        for d in self._dispatchers:
            if d.wall_hz:
                devices[d.number] = int((now - d.wall0) * d.wall_hz)
        return lanes, devices

    def lane_busy(self, since: tuple[dict, dict] | None = None) -> dict[str, float]:
        """Fraction of device clocks each lane spent on jobs since the service started,
        or since ``since`` (a :meth:`clock_counts` snapshot: the lane's clocks since
        then over the device's), as ``{"device<d>.lane<l>": fraction}`` for the lanes
        that have run a job (the simulated device counts its clocks; a board's are its
        fabric clock times the wall time; the instant instrument has none, so no figures;
        a device that ran no clock since ``since`` has none either)."""
        lanes0, devices0 = since if since is not None else ({}, {})
        lanes, devices = self.clock_counts()
        busy = {}
        for (dev, lane), clocks in sorted(lanes.items()):
            total = devices.get(dev, 0) - devices0.get(dev, 0)
            if total > 0:
                busy[f"device{dev}.lane{lane}"] = (clocks - lanes0.get((dev, lane), 0)) / total
        return busy

    def close(self, backend: bool = True) -> None:
        """Finish submitted work (every task gets its outcome), then stop the dispatchers
        and the CPU pool, and with ``backend`` :meth:`close_backend`. In a forked child
        a device backend's service is only marked closed: its device is the parent's."""
        if self._pid != os.getpid():
            if not self.forkable:
                self._closed = True
                return
            self.adopt()
        with self._idle:
            if self._closed:
                return
            self._closed = True
        self.drain()
        for d in self._dispatchers:
            d.close()
        self._cpu_pool.shutdown(wait=True)
        if backend:
            self.close_backend()

    def close_backend(self) -> None:
        """End a backend this service made by name (its simulated devices); one passed in
        is the caller's to close, and a forked child leaves it to the parent."""
        if self._owns_backend and hasattr(self.backend, "close") and self._pid == os.getpid():
            self.backend.close()

    def drain(self) -> None:
        """Block until every submitted task has had its ``done`` call (in a forked
        child, those submitted there: :meth:`adopt`)."""
        if self._pid != os.getpid():
            self.adopt()
        with self._idle:
            self._idle.wait_for(lambda: not self._outstanding)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
