"""``dlbooster.Loader`` delivering to a CUDA device: pinned buffers, the copy stream, its events.

The ``cuda`` tests need a GPU (scripts/gpu_checks.sh runs them with ``-k cuda``): the
GPU's batches equal the cpu loader's while the consumer's stream is busy or the copy
stream is held back, and a failed oversize copy is a MemoryError naming the image. On
any machine: ``device="cuda"`` without CUDA is named at construction; buffers whose
copy to the GPU still runs (a stand-in event) decode ahead once the next batch is
awaited; and the pool's pinning of transport memory (a stand-in CUDA runtime) unpins
and frees what it made when it fails, and falls back to unpinned memory with a warning.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlbooster.runtime.loader import Loader

from loader_helpers import N_SHARD, make_loader, tiny_files


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    return tiny_files(tmp_path_factory.mktemp("tiny"))


# ---------------------------------------------------------------------------------
# Batches on a CUDA device


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_cuda_device_without_cuda_is_named_at_construction():
    """Not a RuntimeError from deep inside torch's pinned allocation."""
    with pytest.raises(ValueError, match="sees no CUDA device .*use device='cpu'"):
        make_loader([("x.jpg", 0)], 1, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batches_equal_the_cpu_batches(tiny_source):
    """Pinned buffers, the side copy stream and its events: every batch on the GPU
    equals the CPU loader's, while the consumer's stream is kept busy so that copies
    and the buffers' reuse overlap its work."""
    with make_loader(tiny_source, 2, backend="cpu", prefetch=2) as cpu:
        want = [(b.images.clone(), b.labels.clone(), b.indices.tolist()) for b in cpu]
    with make_loader(tiny_source, 2, backend="cpu", prefetch=2, device="cuda") as gpu:
        assert gpu.pool.pinned
        busy = torch.randn(2048, 2048, device="cuda")
        for _ in range(2):
            got = []
            for batch in gpu:
                for _ in range(4):                            # the consumer's step
                    busy = busy @ busy / busy.norm()
                got.append((batch.images.cpu(), batch.labels.cpu(), batch.indices.tolist()))
            assert len(got) == len(want)
            for (gi, gl, gx), (wi, wl, wx) in zip(got, want):
                assert gx == wx and torch.equal(gl, wl) and torch.equal(gi, wi)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_copies_held_back_still_deliver_the_cpu_batches(tiny_source, monkeypatch):
    """The copy stream is held back (a GPU sleep queued before each batch's copies) and
    the batches stay on the GPU, unsynchronised, until the epoch ends: a buffer refilled
    before its copy ran, or a consumer reading a batch before it arrived, would differ
    from the CPU loader's batches. Slots of 16 x 16 pixels send the larger images through
    the oversize path's pinned copies too; "cuda" is fixed to the current GPU."""
    with make_loader(tiny_source, 2, backend="cpu", prefetch=2, slot_pixels=16 * 16) as cpu:
        want = [(b.images.clone(), b.labels.clone(), b.indices.tolist()) for b in cpu]
    assemble = Loader._assemble

    def held_back(self, pending, report):
        with torch.cuda.stream(self._copy_stream):
            torch.cuda._sleep(20_000_000)
        return assemble(self, pending, report)
    monkeypatch.setattr(Loader, "_assemble", held_back)
    with make_loader(tiny_source, 2, backend="cpu", prefetch=2, slot_pixels=16 * 16, device="cuda") as gpu:
        assert gpu.device == torch.device("cuda", torch.cuda.current_device())
        assert gpu.stats() is None and gpu.pool.pinned
        for _ in range(2):
            got = [(b.images, b.labels, b.indices.tolist()) for b in gpu]
            assert gpu.stats().oversize > 0
            torch.cuda.synchronize()
            assert len(got) == len(want)
            for (gi, gl, gx), (wi, wl, wx) in zip(got, want):
                assert gx == wx and torch.equal(gl.cpu(), wl) and torch.equal(gi.cpu(), wi)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_a_failed_oversize_copy_names_the_image_and_still_guards_the_buffer(tiny_source, monkeypatch):
    """An oversize image whose pinned copy fails (pinned or GPU memory exhausted) is a
    MemoryError naming it, and the batch's copy already queued on the side stream still
    gets the buffer's event, so the buffer's reuse and the pool's close wait for it."""
    assemble, buffers = Loader._assemble, []

    def remember(self, pending, report):
        buffers.append(pending.buffer)
        return assemble(self, pending, report)

    def exhausted(self, *args, **kwargs):
        # What cudaHostAlloc's failure raises (C10_CUDA_CHECK): not an OutOfMemoryError.
        raise torch.AcceleratorError("CUDA error: out of memory (test)")
    monkeypatch.setattr(Loader, "_assemble", remember)
    with make_loader(tiny_source, 2, backend="cpu", prefetch=2, slot_pixels=16 * 16, device="cuda") as gpu:
        monkeypatch.setattr(torch.Tensor, "pin_memory", exhausted)
        with pytest.raises(MemoryError, match=r"copying .*\.jpg to cuda:\d"):
            for _ in gpu:
                pass
        assert buffers and buffers[-1].copied is not None
        buffers[-1].copied.synchronize()
        assert buffers[-1].copied.query()


# ---------------------------------------------------------------------------------
# Copies still running when a buffer comes back (stand-in events)


class Copy:
    """Stands in for the torch.cuda.Event of a batch's copy to a GPU (the pool's only use
    of it: query and synchronize), so that the pool's and the loader's handling of a
    copy still running is checked on machines without one."""

    def __init__(self, done):
        self.done, self.waited = done, 0

    def query(self):
        return self.done

    def synchronize(self):
        self.waited += 1
        self.done = True


def test_buffers_whose_copies_run_decode_ahead_once_the_next_batch_is_awaited(tiny_source):
    """On a GPU the buffer of the batch just yielded has its copy still running: the
    yield does not wait for it, but the next call, about to wait for its batch anyway,
    waits for that copy and submits the buffer, so every buffer of the pool decodes
    ahead (before, a buffer left at the yield sat idle until its batch was needed)."""
    with make_loader(tiny_source, 2, backend="cpu", prefetch=1) as loader:
        assert loader.pool.depth == 2
        copies = []
        release = loader.pool.release

        def release_with_a_running_copy(buf):
            buf.copied = Copy(False)
            copies.append(buf.copied)
            release(buf)
        loader.pool.release = release_with_a_running_copy
        it = iter(loader)
        assert next(it).indices.tolist() == [0, 1]
        loader.service.drain()
        assert sum(loader.service.stats.outcomes.values()) == 4 and copies[0].waited == 0
        assert next(it).indices.tolist() == [2, 3]
        loader.service.drain()
        assert sum(loader.service.stats.outcomes.values()) == 6 and copies[0].waited == 1
        assert [b.indices.tolist() for b in it] == [list(range(i, min(i + 2, N_SHARD))) for i in range(4, N_SHARD, 2)]


def test_taking_a_buffer_without_waiting_leaves_one_whose_copy_runs():
    from dlbooster.runtime.pool import BatchPool

    pool = BatchPool(2, 30, 1, pin=False)
    buf = pool.acquire()
    buf.copied = running = Copy(False)
    pool.release(buf)
    assert pool.acquire(timeout=0, wait_copy=False) is None
    assert pool.free == 1 and running.waited == 0
    assert pool.acquire(timeout=0) is buf and running.waited == 1 and buf.copied is None
    buf.copied = finished = Copy(True)
    pool.release(buf)
    assert pool.acquire(timeout=0, wait_copy=False) is buf and buf.copied is None and finished.waited == 1


# ---------------------------------------------------------------------------------
# Pinned pool memory


def test_a_pool_that_fails_midway_unregisters_and_frees_what_it_made(monkeypatch):
    """The transport's memory runs out at the third buffer: the two made so far are
    unregistered from CUDA and then freed, in that order, before the MemoryError
    propagates (pinned pages freed while registered leak, and a later registration at
    the same address fails). The CUDA runtime is a stand-in: this machine has no GPU."""
    from dlbooster.runtime.pool import BatchPool

    calls = []

    class Runtime:
        def cudaHostRegister(self, ptr, size, flags):
            calls.append(("register", ptr))
            return 0

        def cudaHostUnregister(self, ptr):
            calls.append(("unregister", ptr))
            return 0

    class Handle:
        made = 0

        def __init__(self, size):
            if Handle.made == 2:
                raise MemoryError("transport memory exhausted")
            Handle.made += 1
            self.device_address, self.array = 1 << 32, np.zeros(size, np.uint8)

        def free(self):
            calls.append(("free", self.array.ctypes.data))

    monkeypatch.setattr(torch.cuda, "cudart", Runtime)
    with pytest.raises(MemoryError, match="exhausted"):
        BatchPool(2, 30, 3, allocate=Handle, pin=True)
    a, b = (ptr for kind, ptr in calls if kind == "register")
    assert calls == [("register", a), ("register", b), ("unregister", a), ("free", a), ("unregister", b), ("free", b)]


def test_a_transport_buffer_cuda_cannot_pin_is_used_unpinned(monkeypatch, caplog):
    """``cudaHostRegister`` fails for the second of two transport buffers (CUDA's
    out-of-memory code, 2): the pool warns with CUDA's message, stays usable and reports
    itself unpinned, and on close unregisters only the buffer that was registered. The
    CUDA runtime here is a stand-in that returns those codes: this machine has no GPU."""
    from dlbooster.runtime.pool import BatchPool

    calls = []

    class Runtime:
        def cudaHostRegister(self, ptr, size, flags):
            calls.append(("register", ptr, size))
            return 0 if len(calls) == 1 else 2

        def cudaHostUnregister(self, ptr):
            calls.append(("unregister", ptr))
            return 0

    class Handle:
        def __init__(self, size):
            self.device_address, self.array, self.freed = 1 << 32, np.zeros(size, np.uint8), False

        def free(self):
            self.freed = True

    monkeypatch.setattr(torch.cuda, "cudart", Runtime)
    with caplog.at_level("WARNING", logger="dlbooster.runtime.pool"):
        pool = BatchPool(2, 30, 2, allocate=Handle, pin=True)
    assert [b.registered for b in pool.buffers] == [True, False]
    assert pool.pinned is False
    assert [r.getMessage() for r in caplog.records] == ["cudaHostRegister failed: out of memory (2)"]
    ptrs = [b.host.data_ptr() for b in pool.buffers]
    handles = [b.handle for b in pool.buffers]
    assert calls == [("register", ptrs[0], 60), ("register", ptrs[1], 60)]
    buf = pool.acquire()
    buf.data[:] = 7
    assert int(buf.host.sum()) == 7 * 60
    pool.release(buf)
    pool.close()
    assert calls[2:] == [("unregister", ptrs[0])]
    assert [h.freed for h in handles] == [True, True]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_failed_cuda_pin_leaves_no_error_behind():
    """Registering memory twice fails (``cudaErrorHostMemoryAlreadyRegistered``); the
    error CUDA keeps for the thread is cleared, so the next kernel launch, which PyTorch
    checks with ``cudaGetLastError``, does not report it as its own."""
    from dlbooster.runtime.pool import _cuda_call

    memory = torch.zeros(1 << 16, dtype=torch.uint8)
    assert _cuda_call("cudaHostRegister", memory.data_ptr(), memory.numel(), 0)
    try:
        assert not _cuda_call("cudaHostRegister", memory.data_ptr(), memory.numel(), 0)
        x = torch.arange(4, device="cuda") + 1
        torch.cuda.synchronize()
        assert x.tolist() == [1, 2, 3, 4]
    finally:
        assert _cuda_call("cudaHostUnregister", memory.data_ptr())
