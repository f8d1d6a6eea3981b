"""The decode service and its device dispatcher, driven by the instant device.

The instant device (the benchmark instrument) runs under the real driver and service:
its batches equal Pillow's and ``bench host`` accounts every image. Dispatcher faults
(bus errors, a failing reset, a fault mid-completion, a failing CPU pool, a done
callback that raises), completions it must not trust (inconsistent figures, an unknown
status, more than the output capacity, a watchdog naming no lane) and device memory
that runs out each end with every task given exactly one outcome, the image decoded
on the CPU (``fallback``, reason ``device-fault`` or ``device-memory``). Also: images
larger than a slot go to the batch buffer's spill area, whose rooms come back in
reverse order and on clear.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from jpegtools import gen
from loader_helpers import check_batches, drain, make_loader, pillow_file, tiny_files, write


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    return tiny_files(tmp_path_factory.mktemp("tiny"))


# ---------------------------------------------------------------------------------
# The instant device (benchmark instrument) under the real runtime, and bench host


def test_instant_device_batches_equal_pillow_and_bench_host_accounts(tiny_source, monkeypatch):
    """The host-cost benchmark's instrument must deliver Pillow's pixels through the real
    driver and service (else the benchmark would time a broken path), and the benchmark
    must account every image, the time its files took to read and the instrument's work,
    alternate the instrument's pixel writes by epoch as its rows say, and give both
    epochs of a round the same batches."""
    from dlbooster.bench.runtime import JUDGED_ON, bench_host
    from dlbooster.hw.regs import Reg
    from dlbooster.device.instant import InstantBackend, InstantTransport

    transport = InstantTransport(lanes=2, job_depth=4)
    files = [(path, Path(path).read_bytes()) for path, _ in tiny_source]
    for path, data in files:
        transport.learn(data, pillow_file(path)[0])
    with make_loader(tiny_source, 5, backend=InstantBackend(transport), slot_pixels=32 * 32) as loader:
        batches = drain(loader)
        assert check_batches(loader, batches) == list(range(len(tiny_source)))
        assert loader.stats().outcomes == {"ok": len(tiny_source)}
        assert loader.service.stats.read_seconds > 0
        assert loader.service.stats.jobs == len(tiny_source)
    assert transport.device_seconds > 0

    jobs = []                                  # (pixels, input length) of every job the instrument runs
    run_job = InstantTransport._run_job

    def recorded(self, staged):
        jobs.append((self.pixels, staged[Reg.JOB_IN_LEN]))
        run_job(self, staged)
    monkeypatch.setattr(InstantTransport, "_run_job", recorded)
    result = bench_host(files, batch_size=4, epochs=2, lanes=2)
    # A warm-up epoch of each kind, then two rounds, each a control epoch and one with pixel
    # writes, alternating in order.
    n = len(files)
    assert result["images"] == n and [(r["round"], r["pixels"]) for r in result["epochs"]] == \
        [(1, False), (1, True), (2, True), (2, False)]
    assert result["rounds"] == 2 and result["timed_epochs"] == 4 and result["judged_on"] == JUDGED_ON
    epochs = [jobs[e * n:(e + 1) * n] for e in range(6)]       # the warm-ups, then the timed epochs
    assert len(jobs) == 6 * n
    assert [{pixels for pixels, _ in epoch} for epoch in epochs] == [{True}, {False}, {False}, {True}, {True},
                                                                     {False}]
    order = [[length for _, length in epoch] for epoch in epochs]
    assert order[2] == order[3] and order[4] == order[5]      # a round's two epochs: the same shuffle
    assert result["outcomes"] == {"ok": len(files)}         # the last epoch's
    for row in result["epochs"]:
        assert row["images"] == len(files)
        assert row["read_s"] > 0 and row["instrument_s"] > 0
        # CPU time less the instrument's, less the reads': identities, not speeds.
        per_image = 1e6 / row["images"]
        assert row["with_reads_us_per_image"] == pytest.approx((row["cpu_s"] - row["instrument_s"]) * per_image)
        assert row["host_us_per_image"] == pytest.approx(row["with_reads_us_per_image"] - row["read_s"] * per_image)
        threads = row["thread_cpu_us_per_image"]
        assert threads["MainThread"] > 0 and threads["dlbooster-device0"] > 0
    control = [r for r in result["epochs"] if not r["pixels"]]
    written = [r for r in result["epochs"] if r["pixels"]]
    assert result["host_us_per_image"] == pytest.approx(sum(r["host_us_per_image"] for r in control) / 2)   # medians of two
    assert result["with_pixel_writes_us_per_image"] == pytest.approx(sum(r["host_us_per_image"] for r in written) / 2)
    assert result["with_pixel_writes_and_reads_us_per_image"] == \
        pytest.approx(sum(r["with_reads_us_per_image"] for r in written) / 2)
    assert result["thread_cpu_us_per_image"]["control"]["MainThread"] == \
        pytest.approx(sum(r["thread_cpu_us_per_image"]["MainThread"] for r in control) / 2)
    assert result["goal_met"] == (result["host_us_per_image"] <= 20.0)
    assert result["goal_met_with_pixel_writes"] == (result["with_pixel_writes_us_per_image"] <= 20.0)
    # Each row counts its threads' context switches (Linux /proc): the iterating thread waits for batches.
    assert all(r["context_switches_per_image"]["MainThread"] >= 0 for r in result["epochs"])
    assert sum(r["context_switches_per_image"]["MainThread"] for r in result["epochs"]) > 0
    assert result["context_switches_per_image"]["control"]["MainThread"] == \
        pytest.approx(sum(r["context_switches_per_image"]["MainThread"] for r in control) / 2)
    with pytest.raises(ValueError, match="epochs must be at least 1"):
        bench_host(files, epochs=0)


def test_the_control_instrument_completes_alike_and_writes_no_pixels(tiny_source):
    """``pixels=False`` (``bench host``'s control epochs) gives the same completions, sizes
    and outcomes and leaves every batch slot as it was (zero: the pool's fresh memory);
    switched back on between epochs, the instrument writes Pillow's pixels again."""
    from dlbooster.device.instant import InstantBackend, InstantTransport

    transport = InstantTransport(lanes=2, job_depth=4, pixels=False)
    files = [(path, Path(path).read_bytes()) for path, _ in tiny_source]
    for path, data in files:
        transport.learn(data, pillow_file(path)[0])
    with make_loader(tiny_source, 5, backend=InstantBackend(transport), slot_pixels=32 * 32) as loader:
        batches = drain(loader)
        assert loader.stats().outcomes == {"ok": len(tiny_source)}
        assert [tuple(hw) for batch in batches for hw in batch.sizes.tolist()] == \
            [pillow_file(path)[0].shape[:2] for path, _ in tiny_source]
        assert all(not batch.images.any() for batch in batches)
        transport.pixels = True
        loader.set_epoch(1)
        assert check_batches(loader, drain(loader)) == list(range(len(tiny_source)))


# ---------------------------------------------------------------------------------
# The decode service and its dispatcher: faults, completions, device memory


def test_a_raising_done_callback_is_called_once(tiny_source):
    from dlbooster.runtime.pool import BatchPool
    from dlbooster.runtime.service import DecodeService, Task

    calls = []

    def done(task, outcome):
        calls.append((task.index, outcome.status))
        raise ValueError("consumer bug")

    pool = BatchPool(3, 3 * 32 * 32, 1)
    buf = pool.acquire()
    with DecodeService("cpu", cpu_workers=2) as service:
        service.submit_many([Task(i, tiny_source[i][0], buf, i, done) for i in range(3)])
        service.drain()
        assert sorted(calls) == [(0, "ok"), (1, "ok"), (2, "ok")]
        assert service._outstanding == 0


def _instant_service(tmp_path, n: int, size: int, slot_pixels: int, job_depth: int = 4, device_memory: bool = True):
    """n generated JPEGs of size x size, an instant device that knows their pixels, a
    service over it and a one-buffer pool in the device's memory (else host memory)."""
    from dlbooster.device.instant import InstantBackend, InstantTransport
    from dlbooster.runtime.pool import BatchPool
    from dlbooster.runtime.service import DecodeService

    paths = [str(write(tmp_path / f"{i}.jpg", gen(size, size, subsampling=i % 3, quality=70 + i))) for i in range(n)]
    transport = InstantTransport(lanes=2, job_depth=job_depth)
    for p in paths:
        transport.learn(Path(p).read_bytes(), pillow_file(p)[0])
    service = DecodeService(InstantBackend(transport), cpu_workers=1)
    pool = BatchPool(n, 3 * slot_pixels, 1, allocate=service.allocator() if device_memory else None, pin=False)
    return paths, transport, service, pool


def _run_once_each(paths, service, pool, hook=None) -> dict:
    """Submit every path as one batch; return index -> (status, reason), asserting each
    task's done ran exactly once and the pixels delivered are Pillow's."""
    import collections
    import threading

    from dlbooster.runtime.service import Task

    calls, outcomes, lock = collections.Counter(), {}, threading.Lock()
    buf = pool.acquire()

    def done(task, outcome):
        with lock:
            calls[task.index] += 1
            outcomes[task.index] = (outcome.status, outcome.reason)
        if hook is not None:
            hook(task, outcome)

    service.submit_many([Task(i, p, buf, i, done) for i, p in enumerate(paths)])
    drained = threading.Thread(target=service.drain, daemon=True)
    drained.start()
    drained.join(30)
    assert not drained.is_alive(), "drain hung"
    assert dict(calls) == {i: 1 for i in range(len(paths))}
    for i, p in enumerate(paths):
        if outcomes[i][0] != "error":
            h, w = buf.sizes[i]
            image = buf.oversize.get(i)
            image = image if image is not None else buf.data[i, : h * w * 3].reshape(h, w, 3)
            assert (image == pillow_file(p)[0]).all(), p
    return outcomes


def test_instant_faults_mid_batch_lose_nothing_and_reset_before_freeing(tmp_path, monkeypatch):
    """Review findings on the batched dispatcher: a bus error on the second JOB_PUSH of a
    batch resets the device before the output room of any queued job is given back; a
    failing free of a refused job's buffer reports nothing twice; a done callback that
    raises SystemExit does not cost the other tasks theirs."""
    from dlbooster.hw.regs import Reg
    from dlbooster.runtime.pool import SpillBuffer

    # Images larger than a slot: every job gets its own room in the batch buffer's spill area.
    paths, t, service, pool = _instant_service(tmp_path, 8, 32, 16 * 16)
    events, write32, reset = [], t.write32, t.reset
    pushes = []
    give_back = SpillBuffer.free
    monkeypatch.setattr(SpillBuffer, "free", lambda room: (events.append(("free", room.device_address)),
                                                           give_back(room))[1])

    def faulty_write(offset, value):
        if offset == Reg.JOB_PUSH:
            pushes.append(t._staged[int(Reg.JOB_OUT_ADDR_LO)] | t._staged[int(Reg.JOB_OUT_ADDR_HI)] << 32)
            if len(pushes) == 2:
                raise OSError("bus error")
        write32(offset, value)

    t.write32 = faulty_write
    t.reset = lambda *a: (events.append(("reset",)), reset(*a))[1]
    outcomes = _run_once_each(paths, service, pool)
    assert set(outcomes.values()) == {("fallback", "device-fault")}
    assert events.index(("free", pushes[0])) > events.index(("reset",))
    service.close()
    (buf,) = pool.buffers
    assert set(t._buffers) == {buf.handle.device_address} | {h.device_address for h, _ in buf.spills}, \
        "the dead dispatcher's staging buffers are freed on close"
    pool.close()

    # Host memory slots: each job larger than a slot gets an output buffer of the dispatcher's.
    paths, t, service, pool = _instant_service(tmp_path / "b", 8, 32, 16 * 16, device_memory=False)
    read32, free = t.read32, t._free
    t.read32 = lambda offset: 1 if offset == Reg.JOB_PUSH else read32(offset)   # room for one job
    failed = []

    def faulty_free(buf):
        if buf.size >= 3 * 32 * 32 and not failed:
            failed.append(buf)
            raise OSError("free failed")
        free(buf)

    t._free = faulty_free
    service._dispatchers[0].spares = 0        # no spare output buffers: each refused job's is freed
    assert set(_run_once_each(paths, service, pool).values()) == {("fallback", "device-fault")}
    assert failed
    service.close()
    pool.close()

    paths, t, service, pool = _instant_service(tmp_path / "c", 8, 16, 16 * 16)
    exits = []

    def hook(task, outcome):
        if not exits:
            exits.append(task.index)
            raise SystemExit("consumer exits")

    outcomes = _run_once_each(paths, service, pool, hook)
    assert exits and all(status in ("ok", "fallback") for status, _ in outcomes.values())
    service.close()
    pool.close()


def test_a_device_whose_reset_fails_keeps_its_jobs_buffers_and_leaves_service(tmp_path, monkeypatch):
    """A device that stops completing and then fails its reset (an XRT card that does
    not come to rest) may still read and write the buffers of the jobs it held: they
    were handed to the next jobs as if the reset had worked, and the device stayed in
    use. Now they are not given back, and the device leaves service: every task is
    decoded on the CPU (``device-fault``), exactly once."""
    from dlbooster.hw.regs import Reg
    from dlbooster.runtime.pool import SpillBuffer

    paths, t, service, pool = _instant_service(tmp_path, 8, 32, 16 * 16)
    events, write32 = [], t.write32
    give_back = SpillBuffer.free
    monkeypatch.setattr(SpillBuffer, "free", lambda room: (events.append(("free", room.device_address)),
                                                           give_back(room))[1])
    rooms = []

    def write(offset, value):
        if offset == Reg.JOB_PUSH:
            rooms.append(t._staged[int(Reg.JOB_OUT_ADDR_LO)] | t._staged[int(Reg.JOB_OUT_ADDR_HI)] << 32)
            events.append(("push",))
        write32(offset, value)

    def reset(clocks=0):
        events.append(("reset",))
        raise OSError("the card did not come to rest")

    t.write32, t.reset = write, reset
    t._run_queued = lambda: None                 # the device never completes a job
    outcomes = _run_once_each(paths, service, pool)
    assert set(outcomes.values()) == {("fallback", "device-fault")}
    failed = events.index(("reset",))
    assert rooms and ("push",) not in events[failed:], "the device stayed in service"
    assert not {("free", room) for room in rooms} & set(events[failed:]), "a held job's room was given back"
    service.close()
    pool.close()


def test_a_fault_while_completing_a_decoded_job_loses_no_image(tmp_path):
    """A fault in the middle of the common completion path (here: recording an image's
    size raises once) takes the device out of service; the image being completed and
    every job still held are decoded on the CPU (reason ``device-fault``), the images
    completed before it stay ``ok``, and each task gets exactly one outcome."""
    paths, t, service, pool = _instant_service(tmp_path, 6, 16, 16 * 16)
    (buf,) = pool.buffers
    words, faults = buf.size_words, []

    class Words:
        def __setitem__(self, index, value):
            if index == 2 * 2 and not faults:
                faults.append(index)
                raise MemoryError("no room")
            words[index] = value

    buf.size_words = Words()
    outcomes = _run_once_each(paths, service, pool)
    assert faults == [4]
    assert outcomes[2] == ("fallback", "device-fault")
    assert outcomes[0] == outcomes[1] == ("ok", None)
    assert set(outcomes.values()) == {("ok", None), ("fallback", "device-fault")}
    service.close()
    pool.close()


def test_a_fault_after_a_declined_job_went_to_the_cpu_does_not_send_it_twice(tmp_path):
    """The CPU pool may raise after it has queued a declined job's fallback (its submit
    queues the work, then fails to start a worker thread): that job still gets exactly
    one outcome, and the device's other jobs go to the CPU once each."""
    import threading

    from dlbooster.device.instant import _key

    paths, t, service, pool = _instant_service(tmp_path, 4, 16, 16 * 16)
    del t.outputs[_key(Path(paths[3]).read_bytes())]   # never learned: the device declines it
    adjust, fired = service._cpu_pool._adjust_thread_count, []

    def adjust_then_fail():
        adjust()
        if threading.current_thread().name.startswith("dlbooster-device") and not fired:
            fired.append(True)
            raise RuntimeError("can't start new thread")

    service._cpu_pool._adjust_thread_count = adjust_then_fail
    outcomes = _run_once_each(paths, service, pool)      # asserts one done() per task
    assert fired
    assert outcomes[3] == ("fallback", "bad-job")
    assert service.stats.outcomes["fallback", "device-fault"] + service.stats.outcomes["ok", None] == 3
    service.close()
    pool.close()


def test_reads_of_inputs_that_never_reach_the_device_are_counted(tmp_path, monkeypatch):
    """A dispatcher adds its read time to the service's stats with its completions and
    when it stops: inputs the pre-screen sends to the CPU (no completion follows) are
    counted too."""
    from dlbooster import jpeg

    paths, t, service, pool = _instant_service(tmp_path, 3, 16, 16 * 16)
    monkeypatch.setattr(jpeg, "classify", lambda info, max_width: "junk")   # every input declined
    outcomes = _run_once_each(paths, service, pool)
    assert set(outcomes.values()) == {("fallback", "junk")}
    assert service.stats.jobs == 0
    service.close()
    assert service.stats.read_seconds > 0
    pool.close()


def test_instant_completion_with_inconsistent_figures_goes_to_the_cpu(tmp_path):
    """A completion whose size and byte count disagree (a device fault) is not trusted:
    the image is decoded on the CPU, reason ``device-fault``."""
    paths, t, service, pool = _instant_service(tmp_path, 4, 16, 16 * 16)
    run_job = t._run_job

    def lying(staged):
        run_job(staged)
        job, status, size, written, clocks, symbols = t._done[-1]
        if job % 2 == 0:
            t._done[-1] = (job, status, size, written - 3, clocks, symbols)

    t._run_job = lying
    outcomes = _run_once_each(paths, service, pool)
    assert sorted(outcomes.values()) == [("fallback", "device-fault")] * 2 + [("ok", None)] * 2
    service.close()
    pool.close()


def test_instant_completion_with_an_unknown_status_goes_to_the_cpu(tmp_path):
    """A status the driver does not know (here 0x17, which no lane reports, and 0x7F) is
    a per-job ``device-fault``: those images are decoded on the CPU and the device stays
    in service for the others."""
    paths, t, service, pool = _instant_service(tmp_path, 6, 16, 16 * 16)
    run_job = t._run_job

    def unknown(staged):
        run_job(staged)
        job, status, *rest = t._done[-1]
        if job in (1, 4):
            t._done[-1] = (job, (status & ~0xFF) | (0x17 if job == 1 else 0x7F), *rest)

    t._run_job = unknown
    outcomes = _run_once_each(paths, service, pool)
    assert [outcomes[i] for i in range(6)] == [("ok", None), ("fallback", "device-fault"), ("ok", None),
                                             ("ok", None), ("fallback", "device-fault"), ("ok", None)]
    assert service.stats.jobs == 6
    service.close()
    pool.close()


def test_a_watchdog_completion_naming_no_lane_of_the_build_is_not_a_stuck_lane():
    """The driver counts a lane as stuck from its watchdog completion; a completion that
    names a lane the build does not have (a fault) must not count towards "every lane
    stuck", which resets the device."""
    from dlbooster.device.driver import Completion, DecoderDevice
    from dlbooster.hw.regs import DeviceStatus
    from dlbooster.device.instant import InstantTransport

    device = DecoderDevice(InstantTransport(lanes=2))
    watchdog = [Completion(1, DeviceStatus.WATCHDOG, lane, 0, 0, 0, 0, 0) for lane in (5, 7)]
    device._track_stuck(watchdog)
    assert device.stuck == set() and not device.all_lanes_stuck
    device._track_stuck([Completion(2, DeviceStatus.WATCHDOG, lane, 0, 0, 0, 0, 0) for lane in (0, 1)])
    assert device.stuck == {0, 1} and device.all_lanes_stuck


@pytest.mark.parametrize("device_memory", [True, False], ids=["spill", "host_slots"])
def test_instant_completion_claiming_more_than_the_output_capacity_goes_to_the_cpu(tmp_path, device_memory):
    """A completion whose size and byte count agree but exceed the capacity the job was
    given (its output buffer may be larger: a spare, a spill chunk) is a device fault."""
    paths, t, service, pool = _instant_service(tmp_path, 4, 32, 16 * 16, device_memory=device_memory)
    run_job = t._run_job

    def one_row_more(staged):
        run_job(staged)
        job, status, size, written, clocks, symbols = t._done[-1]
        w, h = size & 0xFFFF, size >> 16
        t._done[-1] = (job, status, w | (h + 1) << 16, written + 3 * w, clocks, symbols)

    t._run_job = one_row_more
    try:
        assert set(_run_once_each(paths, service, pool).values()) == {("fallback", "device-fault")}
    finally:
        service.close()
        pool.close()


@pytest.mark.parametrize("failure, reason", [(MemoryError("device memory full"), "device-memory"),
                                             (RuntimeError("Allocate failed: -12"), "device-fault")],
                         ids=["full", "transport_fault"])
def test_a_failed_input_staging_allocation_is_not_the_files_error(tmp_path, failure, reason):
    """The dispatcher reads each input into a staging buffer of device memory. When that
    allocation fails, the file is not at fault: a full memory (MemoryError) sends each
    input to the CPU as ``device-memory``; any other failure (pynq raises RuntimeError
    "Allocate failed") is a device fault, and its inputs are decoded on the CPU too."""
    paths, t, service, pool = _instant_service(tmp_path, 6, 40, 16 * 16)
    allocate = t.allocate

    def no_staging(size, *, writable=True):
        if not writable:                  # the input buffers: the device only reads them
            raise failure
        return allocate(size, writable=writable)

    t.allocate = no_staging
    try:
        assert set(_run_once_each(paths, service, pool).values()) == {("fallback", reason)}
    finally:
        service.close()
        pool.close()


@pytest.mark.parametrize("device_memory", [True, False], ids=["spill", "host_slots"])
def test_no_device_memory_for_an_output_sends_that_image_to_the_cpu(tmp_path, device_memory):
    """When the device's memory has no room for an image's output buffer, that image is
    decoded on the CPU (reason ``device-memory``) and the device stays in service."""
    paths, t, service, pool = _instant_service(tmp_path, 6, 40, 16 * 16, device_memory=device_memory)
    allocate, full = t.allocate, [True]

    def allocate_outputs_when_room(size, *, writable=True):
        if writable and full[0]:
            raise MemoryError("device memory full")
        return allocate(size, writable=writable)

    t.allocate = allocate_outputs_when_room
    try:
        assert set(_run_once_each(paths, service, pool).values()) == {("fallback", "device-memory")}
        pool.release(pool.buffers[0])
        full[0] = False
        assert set(_run_once_each(paths, service, pool).values()) == {("ok", None)}
    finally:
        service.close()
        pool.close()


# ---------------------------------------------------------------------------------
# The batch buffer's spill area


def test_images_larger_than_a_slot_go_to_the_spill_area_without_allocating(tmp_path):
    """With device memory, images larger than a slot are written by the device into the
    batch buffer's spill area and delivered from there: equal to Pillow's, no copy, and
    after the first batch no transport allocation at all ."""
    paths, t, service, pool = _instant_service(tmp_path, 6, 40, 16 * 16)
    allocate = t.allocate
    sizes = []
    t.allocate = lambda size, **kw: (sizes.append(size), allocate(size, **kw))[1]
    try:
        for round_ in range(3):
            assert set(_run_once_each(paths, service, pool).values()) == {("ok", None)}
            (buf,) = pool.buffers
            # Six page-aligned rooms of 4,800 bytes (two pages): the two jobs the job FIFO
            # refuses each time give theirs back, so none is taken twice.
            assert len(buf.spills) == 1 and buf.spills[0][1] == 6 * 8192
            for i in range(6):                 # views of the spill chunk, not copies
                assert np.shares_memory(buf.oversize[i], buf.spills[0][0].array)
            if round_ == 0:
                # The spill chunk, and the staging buffers the inputs are read into.
                assert sorted(sizes) == [1 << 18] * (len(sizes) - 1) + [8 << 20], sizes
                sizes.clear()
            pool.release(buf)
        assert sizes == [], "no allocation after the first batch"
    finally:
        service.close()
        pool.close()


def test_spill_rooms_come_back_in_reverse_order_and_on_clear():
    from dlbooster.runtime.pool import BatchBuffer, BatchPool

    # The pool's default limit: an eighth of a buffer's slot memory, at least 16 MiB.
    assert [b.spill_limit for b in BatchPool(64, 3 << 20, 2, pin=False).buffers] == [24 << 20] * 2
    assert BatchPool(4, 300, 1, pin=False).buffers[0].spill_limit == 16 << 20
    assert BatchPool(4, 300, 1, pin=False, spill_limit=5).buffers[0].spill_limit == 5

    class Handle:
        def __init__(self, size):
            self.size, self.device_address, self.array = size, 1 << 32, np.zeros(size, np.uint8)

    buf = BatchBuffer(np.zeros((2, 12), np.uint8))
    assert buf.spill_limit == 16 << 20
    buf.spill_limit = 64 << 20
    a = buf.spill(5000, Handle)                # two pages
    b = buf.spill(100, Handle)
    assert (a.device_address, b.device_address, a.size, b.size) == (1 << 32, (1 << 32) + 8192, 5000, 100)
    assert len(buf.spills) == 1 and buf.spills[0][0].size == 8 << 20 and buf.spills[0][1] == 3 * 4096
    a.free()                                   # not the last room: kept until clear
    assert buf.spills[0][1] == 3 * 4096
    b.free()
    a.free()
    assert buf.spills[0][1] == 0
    big = buf.spill((9 << 20) - 1000, Handle)  # larger than the chunk: a second one, in whole MiB
    assert len(buf.spills) == 2 and buf.spills[1][0].size == 9 << 20 and big.array.size == (9 << 20) - 1000
    buf.clear()
    assert [used for _, used in buf.spills] == [0, 0]
    buf.spill_limit = 20 << 20                 # 17 MiB held: a third chunk of 8 MiB would pass it
    assert buf.spill(8 << 20, Handle).offset == 0 and buf.spills[0][1] == 8 << 20
    assert buf.spill(9 << 20, Handle).offset == 0 and len(buf.spills) == 2
    assert buf.spill(4 << 20, Handle) is None and len(buf.spills) == 2
    # The smallest chunk that fits: a small image first must not take the room a larger
    # one of the same batch needs (first fit put it in the 9 MiB chunk and declined the 9 MiB image).
    buf.clear()
    buf.spills.reverse()                       # [9 MiB, 8 MiB]
    small = buf.spill(3 << 20, Handle)
    assert small.chunk is buf.spills[1] and buf.spill(9 << 20, Handle).chunk is buf.spills[0]
