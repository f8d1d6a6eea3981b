"""Batch buffer pool: preallocated decode destinations with free and full queues.

After DLBooster (SPEC.md section 6): decoders write decoded images straight into a pool
of fixed-size batch buffers; a filled buffer goes to the consumer, is copied to the
accelerator, and returns to the free queue once that copy has finished. Nothing is
allocated per image on this path.

A :class:`BatchBuffer` holds ``batch_size`` *slots* of ``slot_bytes`` bytes each. An
image of h x w pixels is stored packed (h, w, 3) at the head of its slot, so a decoder
(simplejpeg's ``buffer=``, a device's DMA) writes it in place. An image larger than a
slot is decoded into its own array (the ``oversize`` path, counted by the loader); it is
rare by construction of ``slot_bytes``. With device memory, the device writes such an
image into the buffer's *spill* area (:meth:`BatchBuffer.spill`), transport memory kept
with the buffer and reused like its slots, so it costs no allocation and no copy either.

Memory: host tensors are pinned when CUDA is present (so the host-to-device copy is
asynchronous); for a device backend the buffer memory comes from the device's transport
(``allocate``), so the device writes into the slots with no host copy.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["BatchBuffer", "BatchPool", "SpillBuffer"]


@dataclass
class BatchBuffer:
    """One batch's destination memory and bookkeeping.

    Attributes:
        data: (batch_size, slot_bytes) uint8 numpy array; row p is slot p.
        host: the same memory as a uint8 torch tensor (pinned when CUDA is present), or
            None when torch is not in use.
        device_address: device address of ``data[0, 0]`` (transport memory), else None.
        sizes: (batch_size, 2) int64 array of (height, width) per filled slot.
        size_words: ``sizes`` as a flat memoryview of int64: ``size_words[2 * slot]`` is
            the height, ``[2 * slot + 1]`` the width (a store through it costs a tenth
            of a numpy row assignment; the dispatcher makes one per image).
        labels: (batch_size,) int64 array.
        indices: (batch_size,) int64 array of dataset indices.
        oversize: slot -> (h, w, 3) uint8 array, for images larger than a slot.
        count: slots in use (the batch's images are slots ``0..count-1``).
        copied: CUDA event recorded after the last host-to-device copy from ``host``,
            or None; the pool waits on it before the buffer is filled again.
        spills: the spill area's chunks, ``[transport buffer, bytes used]`` each.
        spill_limit: the most bytes of chunks the spill area keeps (16 MiB here;
            :class:`BatchPool` sets an eighth of the buffer's slot memory, at least
            16 MiB): beyond it, :meth:`spill` declines and the image takes the
            allocating path.
        registered: transport memory that ``cudaHostRegister`` pinned (unregistered on
            :meth:`BatchPool.close`).
        slot_bytes: bytes per slot (``data.shape[1]``).
    """

    data: np.ndarray
    host: object = None
    device_address: int | None = None
    handle: object = field(default=None, repr=False)
    sizes: np.ndarray = None
    labels: np.ndarray = None
    indices: np.ndarray = None
    oversize: dict = field(default_factory=dict)
    count: int = 0
    copied: object = None
    spills: list = field(default_factory=list)
    spill_limit: int = 16 << 20
    registered: bool = False

    def __post_init__(self):
        n, self.slot_bytes = self.data.shape     # plain attributes: read for every image
        self.sizes = np.zeros((n, 2), np.int64)
        self.size_words = memoryview(self.sizes).cast("B").cast("q")
        self.labels = np.zeros(n, np.int64)
        self.indices = np.zeros(n, np.int64)

    def spill(self, nbytes: int, allocate) -> SpillBuffer | None:
        """Room for one image larger than a slot, in device memory that stays with this
        buffer until :meth:`clear` (page aligned; when no chunk has room, a new chunk of
        at least 8 MiB, in whole MiB, is allocated with ``allocate`` and kept for later
        batches). None when that chunk would take the area past ``spill_limit``.

        Placement is best fit, the chunk with the least room that fits: a heuristic. It
        keeps a small image out of the one chunk a larger image of the same batch needs
        (first fit declined the second of a 4 MB and an 11 MB image in a buffer holding
        11 and 8 MiB chunks), though an order exists for which first fit packs better
        (5, 7 then 8 MiB into empty 12 and 8 MiB chunks); images arrive one at a time.

        Raises:
            MemoryError: ``allocate`` found no room.
        """
        span = -(-nbytes // _PAGE) * _PAGE
        best = min((chunk for chunk in self.spills if chunk[0].size - chunk[1] >= span),
                   key=lambda chunk: chunk[0].size - chunk[1], default=None)
        if best is not None:
            used = best[1]
            best[1] = used + span
            return SpillBuffer(best, used, nbytes, span)
        size = max(8 << 20, -(-span // (1 << 20)) << 20)
        if sum(handle.size for handle, _ in self.spills) + size > self.spill_limit:
            return None
        self.spills.append([allocate(size), span])
        return SpillBuffer(self.spills[-1], 0, nbytes, span)

    def clear(self) -> None:
        self.count = 0
        self.oversize.clear()
        for chunk in self.spills:
            chunk[1] = 0


_PAGE = 4096


class SpillBuffer:
    """``size`` bytes at ``offset`` of a batch buffer's spill chunk: an output buffer as
    a transport's (``device_address``, ``size``, ``array``, ``sync_from_device()``,
    ``free()``) whose memory belongs to the batch buffer."""

    def __init__(self, chunk: list, offset: int, size: int, span: int):
        self.chunk, self.offset, self.size, self.span = chunk, offset, size, span
        handle = chunk[0]
        self.device_address = handle.device_address + offset
        self.array = handle.array[offset:offset + size]

    def sync_from_device(self, nbytes: int | None = None, offset: int = 0) -> None:
        """Make the device's writes to ``nbytes`` bytes (all) from ``offset`` visible."""
        self.chunk[0].sync_from_device(self.size if nbytes is None else nbytes, self.offset + offset)

    def free(self) -> None:
        """Give the room back when it is the chunk's last (rooms freed in reverse order
        of taking all come back); otherwise it waits for the batch buffer's ``clear``."""
        if self.chunk[1] == self.offset + self.span:
            self.chunk[1] = self.offset


def _cuda_call(name: str, *args) -> bool:
    """Call the CUDA runtime's ``name``; False, with a warning naming CUDA's error, if
    it fails (a host buffer that cannot be pinned or unpinned is still usable)."""
    import torch

    rc = getattr(torch.cuda.cudart(), name)(*args)
    try:
        torch.cuda.check_error(rc)
    except torch.cuda.CudaError as exc:
        log.warning("%s failed: %s", name, exc)
        _clear_cuda_error()
        return False
    return True


def _clear_cuda_error() -> None:
    """Reset the CUDA runtime's last error on this thread (``cudaGetLastError``).

    A failed runtime call leaves it set, and PyTorch's check after its next kernel
    launch would report it as that launch's error. PyTorch binds no
    ``cudaGetLastError``, so it is called in the ``libcudart`` PyTorch loaded: the one in
    ``/proc/self/maps`` of PyTorch's CUDA major version (``libcudart.so.13`` for CUDA
    13.x); nothing is done where there is none, since another library's runtime holds
    another error state.
    """
    import ctypes

    import torch

    major = (torch.version.cuda or "").split(".")[0]
    if not major:
        return
    try:
        with open("/proc/self/maps") as maps:
            path = next((line.split()[-1] for line in maps if f"/libcudart.so.{major}" in line), None)
    except OSError:
        return
    if path is not None:
        ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY).cudaGetLastError()


class BatchPool:
    """``depth`` batch buffers behind a free queue.

    Args:
        batch_size: slots per buffer.
        slot_bytes: bytes per slot (an image of h x w fits when ``3 * h * w <= slot_bytes``).
        depth: buffers in the pool (2 or more lets filling overlap consumption).
        allocate: ``allocate(nbytes)`` returning a transport buffer (``array``,
            ``device_address``, ``free()``) for device-visible memory; None for host memory.
        pin: pin host memory (default: when CUDA is available).
        spill_limit: bytes each buffer's spill area may keep (device memory only; see
            :meth:`BatchBuffer.spill`); default: an eighth of the buffer's slot memory,
            at least 16 MiB.

    Raises:
        ValueError: non-positive sizes.
    """

    def __init__(self, batch_size: int, slot_bytes: int, depth: int = 3, *, allocate=None,
                 pin: bool | None = None, spill_limit: int | None = None):
        if batch_size < 1 or slot_bytes < 3 or depth < 1:
            raise ValueError(f"bad pool geometry: batch_size={batch_size}, slot_bytes={slot_bytes}, depth={depth}")
        self.batch_size, self.slot_bytes, self.depth = batch_size, slot_bytes, depth
        try:
            import torch
        except ImportError:
            torch = None
        if pin is None:
            pin = torch is not None and torch.cuda.is_available()
        self.pinned = bool(pin)
        self.buffers: list[BatchBuffer] = []
        self._free: queue.Queue[BatchBuffer] = queue.Queue()
        self._closed = threading.Event()
        try:
            for _ in range(depth):
                nbytes = batch_size * slot_bytes
                if allocate is not None:
                    handle = allocate(nbytes)
                    data = handle.array[:nbytes].reshape(batch_size, slot_bytes)
                    host = torch.from_numpy(data) if torch is not None else None
                    buf = BatchBuffer(data, host, handle.device_address, handle)
                    self.buffers.append(buf)      # from here close() gives its memory back
                    if host is not None and pin:
                        buf.registered = _cuda_call("cudaHostRegister", host.data_ptr(), nbytes, 0)
                        # Unpinned, its copies are synchronous: slower, still correct.
                        self.pinned = self.pinned and buf.registered
                else:
                    if torch is not None:
                        host = torch.empty((batch_size, slot_bytes), dtype=torch.uint8, pin_memory=self.pinned)
                        buf = BatchBuffer(host.numpy(), host)
                    else:
                        buf = BatchBuffer(np.empty((batch_size, slot_bytes), np.uint8))
                    self.buffers.append(buf)
                buf.spill_limit = max(16 << 20, nbytes // 8) if spill_limit is None else spill_limit
        except BaseException:
            # The buffers made so far: registered pages unregistered before their memory goes.
            self.close()
            raise
        for buf in self.buffers:
            self._free.put(buf)

    def acquire(self, timeout: float | None = None, stop: threading.Event | None = None,
                wait_copy: bool = True) -> BatchBuffer | None:
        """A free buffer, cleared; waits for one (None after ``timeout`` seconds, once
        ``stop`` is set, or on close). A buffer whose last copy to the accelerator is
        still running is waited for; with ``wait_copy=False`` it stays in the free queue
        and the call returns None instead (the caller must not block on the copy)."""
        while not self._closed.is_set() and not (stop is not None and stop.is_set()):
            try:
                buf = self._free.get(timeout=0.1 if timeout is None else timeout)
            except queue.Empty:
                if timeout is not None:
                    return None
                continue
            if buf.copied is not None:
                if not wait_copy and not buf.copied.query():
                    self._free.put(buf)
                    return None
                buf.copied.synchronize()
                buf.copied = None
            buf.clear()
            return buf
        return None

    def adopt(self) -> None:
        """In a child forked from the process that made the pool: every buffer free (the
        parent's batches in flight are the parent's) in a new free queue (a parent
        thread may have held the old one's lock at the fork). Host memory only: device
        memory is the parent's device's."""
        self._free = queue.Queue()
        for buf in self.buffers:
            buf.copied = None
            self._free.put(buf)

    def release(self, buf: BatchBuffer) -> None:
        """Return a buffer to the free queue (after its copy was issued, if any)."""
        self._free.put(buf)

    @property
    def free(self) -> int:
        """Buffers in the free queue now."""
        return self._free.qsize()

    def close(self) -> None:
        """Wake waiters and release transport memory (unregistering pinned pages)."""
        self._closed.set()
        for buf in self.buffers:
            if buf.copied is not None:
                buf.copied.synchronize()
            if buf.handle is not None:
                if buf.registered:
                    _cuda_call("cudaHostUnregister", buf.host.data_ptr())
                    buf.registered = False
                buf.handle.free()
                buf.handle = None
            for handle, _ in buf.spills:
                handle.free()
            buf.spills.clear()
