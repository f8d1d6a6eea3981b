"""``dlbooster.Loader``: the PyTorch data loader fed by the decode service.

The iterating thread walks this rank's shard of the epoch (:class:`~dlbooster.runtime.sampler.ShardSampler`,
index for index the same as ``torch.utils.data.DistributedSampler``): for each free batch
buffer of the pool (:class:`~dlbooster.runtime.pool.BatchPool`; its depth is the back-pressure)
it submits a batch, one task per sample, to the :class:`~dlbooster.runtime.service.DecodeService`,
which decodes straight into the buffer's slots. It takes the filled buffers in order,
applies the outcome policy, moves the images to ``device`` (an asynchronous copy on a
side CUDA stream, the buffer's reuse guarded by an event), runs the optional
device-side transform (:mod:`dlbooster.runtime.transforms`), and submits the next batch into the
buffer it freed before yielding.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import numbers
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from dlbooster.errors import DecodeError
from dlbooster.runtime.pool import BatchPool
from dlbooster.runtime.sampler import ShardSampler
from dlbooster.runtime.service import DecodeService, Outcome, Task, BatchDone, check_count
from dlbooster.runtime.sources import Sample, as_samples

__all__ = ["Batch", "EpochReport", "Loader", "LoaderStats"]

log = logging.getLogger("dlbooster")

POLICIES = ("raise", "skip", "replace")


class Batch(tuple):
    """``(images, labels)``, with more on attributes.

    Attributes:
        images: uint8 (N, 3, H, W) on the loader's device, zero-padded at the bottom and
            right to the batch's largest image; or the transform's output (float32
            (N, 3, S, S)).
        labels: int64 (N,) on the device.
        indices: int64 (N,) CPU tensor of dataset indices.
        sizes: int64 (N, 2) CPU tensor of each image's (height, width) before the transform.
        outcomes: the :class:`~dlbooster.runtime.service.Outcome` of every sample of the batch
            that was not decoded by the requested backend (fallbacks, errors), in order.
    """

    def __new__(cls, images, labels, indices, sizes, outcomes):
        self = super().__new__(cls, (images, labels))
        self.indices, self.sizes, self.outcomes = indices, sizes, outcomes
        return self

    @property
    def images(self):
        return self[0]

    @property
    def labels(self):
        return self[1]


@dataclass
class EpochReport:
    """Every position of an epoch's shard, delivered or reported.

    Attributes:
        epoch: the epoch.
        positions: samples in this rank's shard this epoch (``len`` of the sampler,
            less what ``drop_last`` drops of a final partial batch).
        delivered: samples yielded with their own decoded image.
        replaced: samples whose image came from the ``replace`` function.
        skipped: outcomes of samples left out of their batch (policy ``skip``).
        fallbacks: outcomes of samples the CPU decoded for the requested backend.
    """

    epoch: int
    positions: int = 0
    delivered: int = 0
    replaced: int = 0
    skipped: list[Outcome] = field(default_factory=list)
    fallbacks: list[Outcome] = field(default_factory=list)

    @property
    def accounted(self) -> int:
        """delivered + replaced + skipped; equals ``positions`` after a full epoch."""
        return self.delivered + self.replaced + len(self.skipped)


@dataclass
class LoaderStats:
    """Figures of the last epoch (see :meth:`Loader.stats`)."""

    images: int
    seconds: float
    images_per_s: float
    host_cores: float
    lane_busy: dict[str, float]
    queue_peak: dict[str, int]
    outcomes: dict[str, int]
    oversize: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _own_memory(images, regions: list[np.ndarray]):
    """A transform's output (a tensor, or a list or tuple of them) with every tensor that
    shares memory with one of ``regions`` (a batch buffer's slots and spill chunks)
    copied: the buffer is refilled by a later batch, which would overwrite a batch the
    consumer still holds."""
    import torch

    spans = []                            # made at the first tensor (.ctypes costs microseconds)

    def own(t):
        if isinstance(t, torch.Tensor):
            if not spans:
                spans.extend((r.ctypes.data, r.ctypes.data + r.nbytes) for r in regions)
            storage = t.untyped_storage()
            start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
            if any(start < hi and lo < end for lo, hi in spans):
                return t.clone()
        return t

    if type(images) in (list, tuple):
        return type(images)(map(own, images))
    return own(images)


class _Pending(BatchDone):
    """A batch being filled: outcomes arrive from service threads. It is its tasks'
    ``done``: called with each outcome, or with :meth:`ok_many` for tasks the device
    decoded, whose outcomes stay None (``ok``; the service makes none)."""

    def __init__(self, number: int, buffer, count: int, on_ready: Callable):
        self.number, self.buffer, self.count = number, buffer, count
        self.outcomes: list[Outcome | None] = [None] * count   # None: ok, by the requested backend
        self.all_ok = True                    # no outcome but ``ok`` so far (the assembly's fast path)
        # Outcomes so far, counted without a lock: next() of an itertools.count is atomic
        # (one step under the GIL; an atomic compare-and-swap in free-threaded builds,
        # CPython gh-117657), so exactly one call draws count - 1, after every other call
        # has stored its outcome.
        self._arrived = itertools.count()
        self.on_ready = on_ready

    def __call__(self, task: Task, outcome: Outcome) -> None:
        self.outcomes[task.slot] = outcome
        if outcome.status != "ok":
            self.all_ok = False               # only ever cleared: no lock needed
        if next(self._arrived) == self.count - 1:
            self.on_ready(self)

    def ok_many(self, tasks: list[Task]) -> None:
        # Nothing to store; one draw per task (in one C loop), the last of them the largest.
        if max(itertools.islice(self._arrived, len(tasks)), default=-1) == self.count - 1:
            self.on_ready(self)


class Loader:
    """Batches of decoded images for PyTorch training, from a decode backend.

    Args:
        source: an ImageFolder-style directory (classes indexed as torchvision's
            ``ImageFolder``), a sequence of ``(path, label)``, or Progressive Compressed
            Records (:mod:`dlbooster.records.pcr`: a :class:`~dlbooster.records.pcr.RecordSet` or
            a folder of ``*.pcr`` files), whose samples are named ``FILE#INDEX``.
        fidelity: records only: decode each image from its header and first
            ``fidelity`` scans (1..``RecordSet.scans``; None: every scan, the source's
            exact pixels). Progressive JPEG is outside the hardware's profile, so record
            images take the CPU path (a device backend reports them as ``fallback``,
            reason ``progressive``). Settable between epochs (:attr:`fidelity`).
        batch_size: samples per batch.
        backend: ``auto``, ``cpu``, ``model``, ``sim`` (see :mod:`dlbooster.backends`)
            or a backend instance.
        shuffle, seed, drop_last, rank, world_size: sharding, exactly as
            ``DistributedSampler(shuffle, seed, drop_last, rank, num_replicas)``
            followed by ``DataLoader(drop_last)``: ``drop_last`` also drops a final
            partial batch. ``rank``/``world_size`` default to torchrun's environment.
        device: where batches go (``"cpu"``, ``"cuda"``, a ``torch.device``); ``"cuda"``
            without an index is the GPU current when the Loader is made, on every thread
            that iterates it (:attr:`device` holds the index).
        transform: a callable on a list of (3, h, w) uint8 device tensors returning a
            batch tensor (e.g. :func:`dlbooster.runtime.transforms.train_transform`; on the CPU
            an output tensor that views its inputs, a list or tuple of them included, is
            copied, since their memory is the pool's and a later batch reuses it); None yields
            uint8 padded batches (:func:`dlbooster.runtime.transforms.pad_batch`: a batch whose
            padding would not fit in the memory available raises MemoryError from the
            iteration, naming its tallest and widest inputs; images of very different
            shapes want a transform). Its ``set_epoch`` is called by :meth:`set_epoch`.
        on_error: per-sample policy for inputs nothing can decode: ``raise``
            (:class:`~dlbooster.errors.DecodeError` naming the input and, as ``index``,
            its dataset index), ``skip`` (left out
            of the batch, logged and counted; a batch whose every sample is skipped is
            yielded empty: images the transform's ``empty(device)`` when it has one (a
            :class:`~dlbooster.runtime.transforms.DeviceTransform`: (0, 3, size, size)), else
            ``torch.empty((0, 3, 0, 0), dtype=torch.uint8)``, and empty labels) or ``replace``
            (``replace(index, outcome)`` returns an (h, w, 3) uint8 array that stands in
            for the sample).
        replace: the function for ``on_error="replace"``.
        slot_pixels: pixels per batch slot (larger images take a slower, allocating path).
        prefetch: batches decoded ahead of the consumer (pool depth is ``prefetch + 1``).
        cpu_workers: CPU decode threads (default: all cores).
        progress: a progress bar (tqdm) on rank 0.
        backend_options: for a backend name, e.g. ``{"lanes": 4}`` for ``sim``.
        trace: a :class:`dlbooster.train.trace.Trace` recording device jobs per lane, CPU
            decodes, and each batch's assembly and copy.

    A loader made before a fork (``DataLoader(num_workers > 0)`` forks its workers) is
    usable in the child with a CPU backend (it starts its own decode threads there);
    with a device backend, iterating it in the child raises RuntimeError (the device is
    the parent's: make the loader in the child). A loader cannot be pickled (TypeError).

    Raises:
        ValueError: bad policy (or ``replace`` with another policy), sizes, prefetch,
            seed, rank, world size, fidelity or label, or a CUDA ``device`` where
            PyTorch sees none; TypeError: a batch size, prefetch, slot_pixels, seed,
            rank or world size that is not an integer (bools included), a ``transform``
            or ``replace`` that is not callable, or a bad source; FileNotFoundError: a
            missing source; dlbooster.records.pcr.RecordError: a corrupt record file. Each
            message names the argument (or the environment variable it came from).
            These are found before the backend is made; a failure after that closes
            it again.
    """

    def __init__(self, source, batch_size: int, *, backend: Any = "auto", shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, rank: int | None = None,
                 world_size: int | None = None, device: Any = "cpu", transform: Callable | None = None,
                 on_error: str = "skip", replace: Callable | None = None, slot_pixels: int = 512 * 512,
                 prefetch: int = 2, cpu_workers: int | None = None, progress: bool = False,
                 backend_options: dict | None = None, trace=None, fidelity: int | None = None):
        import torch

        from dlbooster.records.pcr import RecordSet, is_record_dir

        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
            raise TypeError(f"batch_size must be an integer, not {batch_size!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, not {batch_size}")
        if on_error not in POLICIES:
            raise ValueError(f"on_error must be one of {', '.join(POLICIES)}, not {on_error!r}")
        if on_error == "replace" and replace is None:
            raise ValueError("on_error='replace' needs a replace(index, outcome) function")
        # The cheap checks come before the backend is made (a sim build takes minutes).
        if replace is not None and on_error != "replace":
            raise ValueError(f"replace= is used only with on_error='replace', not on_error={on_error!r}")
        for name, value in (("replace", replace), ("transform", transform)):
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be callable or None, not {value!r}")
        check_count("prefetch", prefetch, least=0)
        check_count("slot_pixels", slot_pixels)
        self.records: RecordSet | None = None
        if isinstance(source, RecordSet) or (isinstance(source, (str, os.PathLike)) and is_record_dir(source)):
            self.records = source if isinstance(source, RecordSet) else RecordSet(source)
            self._entries = list(self.records.entries())
            self.samples = [Sample(f"{rf.path}#{i}", rf.labels[i]) for rf, i in self._entries]
        elif isinstance(source, (str, os.PathLike)) and is_record_dir(os.path.join(source, "train")):
            raise ValueError(f"{os.fspath(source)}: a folder of record sets (train/, val/); give one of them")
        else:
            self.samples = as_samples(source)
        # Per sample, for submission: a batch takes its paths by index and its labels in one step.
        self._paths = [sample.path for sample in self.samples]
        self._labels = np.array([sample.label for sample in self.samples], np.int64)
        self.fidelity = fidelity
        self.batch_size, self.drop_last = batch_size, drop_last
        self.sampler = ShardSampler(len(self.samples), seed=seed, shuffle=shuffle, drop_last=drop_last,
                                    rank=rank, world_size=world_size)
        self.device = torch.device(device)
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                # Checked here: otherwise the pinned batch pool fails deep inside torch.
                raise ValueError(f"device={device!r}, but this PyTorch sees no CUDA device (no GPU, or a CPU-only "
                                 f"build): use device='cpu'")
            if self.device.index is None:
                # Fixed now: "cuda" means the GPU current at iteration time on each thread,
                # and the copy stream, the consumer's stream and the batch must agree.
                self.device = torch.device("cuda", torch.cuda.current_device())
            if self.device.index >= torch.cuda.device_count():
                raise ValueError(f"device={device!r}, but this PyTorch sees {torch.cuda.device_count()} CUDA "
                                 f"device(s)")
        self.transform, self.on_error, self.replace = transform, on_error, replace
        self.progress = progress and self.sampler.rank == 0
        self.service = DecodeService(backend, cpu_workers=cpu_workers, **(backend_options or {}))
        self.pool = None
        try:
            self.trace = self.service.trace = trace
            self._copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
            # No batch holds more than a rank's share of an epoch, so a larger batch size (which
            # DataLoader accepts) reserves no slots that no batch can fill. On a GPU the pages
            # are registered with that GPU current (cudaHostRegister works on the current one).
            with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
                self.pool = BatchPool(max(1, min(batch_size, len(self.sampler))), 3 * slot_pixels, prefetch + 1,
                                      allocate=self.service.allocator(),
                                      pin=self.device.type == "cuda")
        except BaseException:
            if self.pool is not None:
                self.pool.close()
            self.service.close()              # its threads and a simulated device would outlive the failure
            raise
        self.report = EpochReport(self.sampler.epoch)
        self._stats: LoaderStats | None = None
        self._end_iteration: Callable | None = None
        self._iterations = threading.Lock()   # guards _end_iteration's swap between threads
        self._closed = False
        # Held while a batch is assembled from a pool buffer: close() waits for it before
        # the pool's memory (perhaps a device's) is freed. Reentrant for a transform that closes.
        self._assembling = threading.RLock()
        self._pid = os.getpid()               # the process whose service threads serve it (_adopt)

    @property
    def fidelity(self) -> int | None:
        """Scans per record image (None: all); see the ``fidelity`` argument."""
        return self._fidelity

    @fidelity.setter
    def fidelity(self, value: int | None) -> None:
        if value is not None:
            if self.records is None:
                raise ValueError("fidelity applies to a records source only")
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= self.records.scans:
                raise ValueError(f"fidelity must be an integer 1..{self.records.scans} for {self.records.root}, "
                                 f"not {value!r}")
            value = int(value)
        self._fidelity = value

    def _reader(self, index: int):
        rf, i = self._entries[index]
        return functools.partial(rf.image, i, self._fidelity)

    def __len__(self) -> int:
        """Batches in a full epoch for this rank (as ``DataLoader``'s ``len``: an epoch
        resumed with ``sampler.skip(start)`` yields the batches of the rest only)."""
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's shuffle (as ``DistributedSampler.set_epoch``) and the
        transform's random stream."""
        self.sampler.set_epoch(epoch)
        if hasattr(self.transform, "set_epoch"):
            self.transform.set_epoch(epoch)

    @property
    def backend_name(self) -> str:
        return self.service.backend_name

    def _adopt(self) -> None:
        """In a child forked from the process that made the loader (``DataLoader``'s
        workers fork), whose service threads the child lacks: new threads, every pool
        buffer free, the parent's iteration forgotten.

        Raises:
            RuntimeError: a device backend (:meth:`~dlbooster.runtime.service.DecodeService.adopt`).
        """
        self.service.adopt()
        self.pool.adopt()
        self._end_iteration = None
        self._iterations, self._assembling = threading.Lock(), threading.RLock()
        self._pid = os.getpid()

    def __reduce__(self):
        raise TypeError("a dlbooster.Loader cannot be pickled (it holds decode threads and batch buffers): "
                        "send its source and arguments, and make the Loader in the process that uses it")

    def __iter__(self):
        if self._closed:
            raise RuntimeError("the loader is closed")
        if self._pid != os.getpid():
            self._adopt()
        pid = self._pid
        ready: dict[int, _Pending] = {}
        cond = threading.Condition()
        stop = threading.Event()
        failure: list[BaseException] = []

        def on_ready(pending: _Pending) -> None:
            with cond:
                ready[pending.number] = pending
                cond.notify_all()

        paths, labels = self._paths, self._labels

        submitted = [0]                       # chunks handed to the service so far, in order
        # Held from a buffer's check against ``stop`` to its submission, and by cleanup():
        # a cleanup on another thread (a newer iteration's) cannot slip between them and
        # miss a batch submitted after its drain (its buffer was lost for good).
        gate = threading.Lock()

        def submit(wait: bool, wait_copy: bool) -> None:
            """Submit the next chunks while the pool has a free buffer (its depth is the
            back-pressure); ``wait``: block for the first buffer; ``wait_copy``: a free
            buffer whose copy to the accelerator still runs is waited for, else left
            for a later call. This runs on the iterating thread, as DataLoader's main
            process queues its indices: a producer thread cost a start per epoch and a
            thread hand-off per batch."""
            while submitted[0] < len(chunks) and not stop.is_set():
                buf = self.pool.acquire(stop=stop) if wait else self.pool.acquire(timeout=0, wait_copy=wait_copy)
                if buf is None:
                    if wait and not stop.is_set():    # the pool closed under us
                        raise RuntimeError("the loader was closed during the epoch")
                    return
                wait = False
                with gate:
                    if stop.is_set():             # ended meanwhile: the buffer goes back
                        self.pool.release(buf)
                        return
                    number = submitted[0]
                    chunk = chunks[number]
                    n = buf.count = len(chunk)
                    pending = _Pending(number, buf, n, on_ready)
                    rows = np.array(chunk, np.int64)  # one conversion of the list, for both arrays
                    buf.indices[:n] = rows
                    buf.labels[:n] = labels[rows]
                    done = pending
                    if self.records is None:          # files: the service reads each path
                        tasks = [Task(index, paths[index], buf, slot, done) for slot, index in enumerate(chunk)]
                    else:
                        reader = self._reader
                        tasks = [Task(index, paths[index], buf, slot, done, reader(index))
                                 for slot, index in enumerate(chunk)]
                    submitted[0] += 1
                    self.service.submit_many(tasks)

        cleaned: list[bool] = []

        def cleanup() -> None:
            """End this iteration (finished, abandoned or superseded): no new batches,
            let the submitted ones finish, give every buffer back. Runs once, from any
            thread."""
            if os.getpid() != pid:            # the parent's iteration in a forked child: its buffers are the parent's
                return
            stop.set()                        # first: wakes a submit() waiting for a buffer
            with gate:
                if cleaned:
                    return
                cleaned.append(True)
                self.service.drain()
                with cond:
                    while ready:              # one at a time: an interrupt loses none
                        self.pool.release(ready.popitem()[1].buffer)
                    failure.append(RuntimeError("this iteration of the loader was ended by a newer one"))

        # Like a DataLoader, a new iteration may start while an old one is suspended: the
        # old one ends (its buffers would otherwise starve the new one). Iterations on
        # several threads at once end each other the same way.
        with self._iterations:
            older, self._end_iteration = self._end_iteration, cleanup
            # The sampler's position (its state_dict) follows the batches yielded, not the
            # ones submitted ahead: a state saved after batch k resumes at batch k + 1.
            indices = self.sampler.take()
        if older is not None:
            older()
        dropped = len(indices) % self.batch_size if self.drop_last else 0
        indices = indices[: len(indices) - dropped]
        chunks = [indices[i:i + self.batch_size] for i in range(0, len(indices), self.batch_size)]
        report = self.report = EpochReport(self.sampler.epoch, positions=len(indices))
        outcomes0, oversize0 = Counter(self.service.stats.outcomes), self.service.stats.oversize
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=len(chunks), unit="batch", desc=f"epoch {self.sampler.epoch}")
        clocks0 = self.service.clock_counts()     # beside the wall clock's start (a board's are wall time)
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        queue_peak: Counter = Counter()
        images = 0
        try:
            for number in range(len(chunks)):
                # About to wait for batch `number`: a buffer whose copy (issued a step
                # ago) still runs is worth its wait, so that every buffer decodes ahead.
                submit(wait=submitted[0] <= number, wait_copy=True)
                with cond:
                    while number not in ready and not failure and not self._closed:
                        cond.wait(0.5)
                        for name, depth in self.service.queue_depths().items():
                            queue_peak[name] = max(queue_peak[name], depth)
                    if self._closed:
                        raise RuntimeError("the loader was closed during the epoch")
                    if failure:
                        raise failure[0]
                    pending = ready.pop(number)
                with self._assembling:
                    if self._closed:              # closed since: the buffer's memory is freed
                        raise RuntimeError("the loader was closed during the epoch")
                    batch = self._finish(pending, report)
                # Its buffer decodes during the consumer's step; on a GPU its copy has
                # only just been issued, and the yield must not wait for it.
                submit(wait=False, wait_copy=False)
                images += len(batch[1])
                if bar is not None:
                    bar.update(1)
                with self._iterations:            # only the current iteration moves the sampler
                    if self._end_iteration is cleanup:
                        self.sampler.advance(len(chunks[number]))
                yield batch
            with self._iterations:                # a finished epoch is at its end, as a DataLoader's
                if self._end_iteration is cleanup:
                    self.sampler.advance(dropped)
        finally:
            wall = time.perf_counter() - start_wall
            cpu = time.process_time() - start_cpu
            cleanup()
            if bar is not None:
                bar.close()
            with self._iterations:
                current = self._end_iteration is cleanup
                if current:
                    self._end_iteration = None
            if current:                           # else superseded: the newer one reports
                self._record_stats(images, wall, cpu, queue_peak, outcomes0, oversize0, clocks0)

    def _record_stats(self, images, wall, cpu, queue_peak, outcomes0, oversize0, clocks0) -> None:
        stats = self.service.stats
        counts = stats.outcomes - outcomes0
        self._stats = LoaderStats(
            images=images, seconds=wall, images_per_s=images / wall if wall else 0.0,
            host_cores=cpu / wall if wall else 0.0, lane_busy=self.service.lane_busy(since=clocks0),
            queue_peak=dict(queue_peak),
            outcomes={f"{s}:{r}" if r else s: n for (s, r), n in sorted(
                counts.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))},
            oversize=stats.oversize - oversize0)

    def _finish(self, pending: _Pending, report: EpochReport) -> Batch:
        """Policy, copy to the device, transform; the buffer goes back to the pool
        whatever happens (on a GPU its reuse waits for the copy's event). The batch's
        samples enter ``report`` only once it is assembled."""
        batch_report = EpochReport(report.epoch)
        try:
            if self.trace is None:
                batch = self._assemble(pending, batch_report)
            else:
                with self.trace.span(f"batch {pending.number}", "batch", thread="loader",
                                     args={"images": pending.count}):
                    batch = self._assemble(pending, batch_report)
        finally:
            self.pool.release(pending.buffer)
        report.delivered += batch_report.delivered
        report.replaced += batch_report.replaced
        report.skipped += batch_report.skipped
        report.fallbacks += batch_report.fallbacks
        return batch

    def _assemble(self, pending: _Pending, report: EpochReport) -> Batch:
        import torch

        buf = pending.buffer
        keep: list[int] = []
        replacements: dict[int, np.ndarray] = {}
        unusual: list[Outcome] = []
        if pending.all_ok:                    # the common case: every slot, nothing to report
            keep = list(range(pending.count))
            report.delivered += pending.count
        for slot, outcome in [] if pending.all_ok else enumerate(pending.outcomes):
            if outcome is None:               # ok, by the requested backend (_Pending.ok_many)
                keep.append(slot)
                report.delivered += 1
                continue
            if outcome.status != "ok":
                unusual.append(outcome)
            if outcome.status == "fallback":
                report.fallbacks.append(outcome)
            if outcome.status != "error":
                keep.append(slot)
                report.delivered += 1
                continue
            if self.on_error == "raise":
                raise DecodeError(outcome.reason, outcome.detail, outcome.path, index=outcome.index)
            if self.on_error == "skip":
                log.warning("skipping %s", outcome)
                report.skipped.append(outcome)
                continue
            image = np.asarray(self.replace(outcome.index, outcome))
            if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or not image.size:
                raise ValueError(f"replace() for {outcome.path} must return a non-empty (h, w, 3) "
                                 f"uint8 array, not {image.dtype} {image.shape}")
            replacements[slot] = image
            buf.sizes[slot] = image.shape[:2]
            keep.append(slot)
            report.replaced += 1
        device = self.device
        start = time.perf_counter()
        special = {**buf.oversize, **replacements}    # slot -> an (h, w, 3) image outside the buffer
        moved = {}                                    # slot -> such an image already on the device

        def host_image(slot):
            return torch.from_numpy(np.require(special[slot], np.uint8, ["C", "W"]))

        if self._copy_stream is not None and buf.host is not None:
            consumer = torch.cuda.current_stream(device)   # taken outside the copy stream's context
            # A blocking event: the pool's wait for it (BatchPool.acquire) sleeps, not spins.
            event = torch.cuda.Event(blocking=True)
            with torch.cuda.stream(self._copy_stream):
                try:
                    staged = buf.host[: buf.count].to(device, non_blocking=True)
                    # Allocated on the copy stream, used on the consumer's: keep its memory
                    # from the next copy until the consumer's work on it is done.
                    staged.record_stream(consumer)
                    for slot in special.keys() & set(keep):
                        # Through pinned memory, so the copy is asynchronous too (a pageable
                        # one would wait for the consumer's stream); the pinned block is held
                        # by PyTorch's host allocator until the copy is done.
                        try:
                            moved[slot] = host_image(slot).pin_memory().to(device, non_blocking=True)
                        except RuntimeError as exc:
                            # Pinned memory exhausted is an AcceleratorError ("CUDA error: out of
                            # memory" from cudaHostAlloc), the GPU's an OutOfMemoryError.
                            if not (isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc)):
                                raise
                            raise MemoryError(f"batch {pending.number}: {exc}; copying "
                                              f"{self._paths[int(buf.indices[slot])]} to {device}") from exc
                        moved[slot].record_stream(consumer)
                finally:
                    # Also when a copy above failed: the buffer goes back to the pool, and
                    # its reuse and the pool's close must wait for the copy already queued
                    # (a device transport's registered memory is not tracked by PyTorch).
                    event.record(self._copy_stream)
                    buf.copied = event
            consumer.wait_event(event)
        elif device.type == "cpu":
            staged = None                     # the views are of the batch buffer itself
        else:
            staged = (buf.host[: buf.count] if buf.host is not None else torch.from_numpy(buf.data[: buf.count])
                      ).to(device)
        if self.trace is not None and device.type != "cpu":
            # On CUDA the span is the copy's enqueue; the copy itself runs on the side stream.
            self.trace.complete(f"copy batch {pending.number}", "copy", start, time.perf_counter(),
                                thread="loader")
        # The (3, h, w) view of each slot's packed HWC pixels is made in one op (slicing,
        # reshaping and permuting cost three, about 16 us per image). On the CPU it is a
        # numpy view: torch.as_strided releases the GIL, and with a dispatcher thread
        # waiting for it each call became a thread switch.
        sizes_hw = buf.sizes.tolist()

        def apart(slot):
            image = moved.get(slot)
            return (host_image(slot).to(device) if image is None else image).permute(2, 0, 1)

        # Each list is made without a Python call per image in the buffer.
        if staged is None:
            data, step = buf.data, buf.data.strides[0]
            from_numpy, ndarray, uint8 = torch.from_numpy, np.ndarray, np.uint8
            if not special and len(keep) == pending.count:    # the common case
                views = [from_numpy(ndarray((3, h, w), uint8, data, slot * step, (1, 3 * w, 3)))
                         for slot, (h, w) in enumerate(sizes_hw[:pending.count])]
            else:
                views = [apart(slot) if slot in special else
                         from_numpy(ndarray((3, h, w), uint8, data, slot * step, (1, 3 * w, 3)))
                         for slot, (h, w) in zip(keep, map(sizes_hw.__getitem__, keep))]
        else:
            row0, row_stride, as_strided = staged.storage_offset(), staged.stride(0), torch.as_strided
            views = [apart(slot) if slot in special else
                     as_strided(staged, (3, h, w), (1, 3 * w, 3), row0 + slot * row_stride)
                     for slot, (h, w) in zip(keep, map(sizes_hw.__getitem__, keep))]
        # Every slot kept (keep is in slot order): a slice; indexing by the list converts each entry.
        rows = slice(0, pending.count) if len(keep) == pending.count else keep
        sizes = torch.from_numpy(buf.sizes[rows].copy())
        indices = torch.from_numpy(buf.indices[rows].copy())
        labels = torch.from_numpy(buf.labels[rows].copy()).to(device, non_blocking=True)
        if not views:
            empty = getattr(self.transform, "empty", None)
            images = empty(device) if empty is not None else torch.empty((0, 3, 0, 0), dtype=torch.uint8,
                                                                          device=device)
        elif self.transform is not None:
            images = self.transform(views)
            if staged is None:
                images = _own_memory(images, [buf.data, *(handle.array for handle, _ in buf.spills)])
        else:
            from dlbooster.runtime.transforms import pad_batch

            try:
                images = pad_batch(views)[0]
            except (MemoryError, torch.OutOfMemoryError) as exc:   # the host's, or a GPU's
                # Name the inputs that set the padded size; the iteration ends here.
                order = range(len(views))     # views[i] is slot keep[i]
                tallest, widest = (self._paths[int(buf.indices[keep[max(order, key=lambda i: views[i].shape[d])]])]
                                   for d in (1, 2))
                raise MemoryError(f"batch {pending.number}: {exc}; the tallest image is {tallest}, the widest "
                                  f"{widest}: give the Loader a transform (a crop or resize) or a smaller "
                                  f"batch") from exc
        return Batch(images, labels, indices, sizes, unusual)

    def stats(self) -> LoaderStats | None:
        """Figures of the last finished (or abandoned) epoch: images/s, host CPU cores
        used (process CPU time over wall time), per-lane busy fraction (a simulated
        device's clocks; a board's fabric clock times the wall time), queue depth
        peaks, outcome counts by status and reason. The outcome counts are of the
        decodes the epoch ran: in an abandoned epoch (a ``break``, a raised error) they
        include the batches decoded ahead and never taken, which :attr:`report` (what
        was delivered or reported) leaves out. The busy fractions are the epoch's
        clocks: a lane's over its device's."""
        return self._stats

    def close(self) -> None:
        """Stop the service and free the pool; iterating afterwards raises RuntimeError.
        From another thread: waits until a batch being assembled is done, and the
        iteration then raises RuntimeError instead of yielding more. In a forked child
        a device backend's loader is only marked closed: its device and memory are the
        parent's."""
        if self._pid != os.getpid():
            if not self.service.forkable:
                self._closed = True
                return
            self._adopt()
        with self._assembling:
            self._closed = True
        self.service.close(backend=False)
        self.pool.close()                     # its memory may be the devices'
        self.service.close_backend()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
