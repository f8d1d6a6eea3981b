"""``dlbooster.Loader`` on the simulated device (Verilator; its tests skip where it is absent).

The tests drive the 4-lane, 256-pixel build that tests/sim/test_device_sim.py uses (one
instance shared by the module, reset before each test): the accounting of bad inputs on
the cpu and sim backends side by side, every corpus file (``-m corpus``), batches equal
to Pillow's and to the cpu backend's, Motion-JPEG frames, the pre-screen's cached
verdicts, and device faults (stuck lanes, stalled memory, a dispatcher that dies,
device memory exhausted) that end with every image decoded on the CPU; and two
simulated devices at once.
"""

from __future__ import annotations

import io
import os
import struct

import numpy as np
import pytest
import torch

from dlbooster import jpeg
from dlbooster.sim.flow import simulator_available

from jpegtools import corpus_paths, drop_huffman, gen, require_corpus
from loader_helpers import WIDTH, bad_inputs, check_batches, drain, make_loader, pillow_file, write


LANES = 4            # the sim build's lanes; its line width is WIDTH

needs_verilator = pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory):
    return bad_inputs(tmp_path_factory.mktemp("bad"))


@pytest.fixture(scope="module")
def sim_backend():
    from dlbooster.backends import SimBackend

    backend = SimBackend(lanes=LANES, max_width=WIDTH)
    yield backend
    backend.device.transport.close()


@pytest.fixture
def sim(sim_backend):
    """The shared 4-lane sim backend, its memory port well-behaved and the device reset."""
    from dlbooster.sim.device import PortBehaviour

    sim_backend.device.transport.set_port(PortBehaviour())
    sim_backend.device.watchdog = 1 << 24     # the build's; a test's own survives resets
    sim_backend.device.reset()
    return sim_backend


def _backend(request, name):
    return request.getfixturevalue("sim") if name == "sim" else name


@pytest.fixture(scope="module")
def sim_source(tmp_path_factory):
    """Six small JPEGs the device takes, one larger than a 64x64 slot (the device writes
    it to the batch buffer's spill area), one progressive (pre-screened), one missing file."""
    root = tmp_path_factory.mktemp("sim")
    subsamplings = (0, 1, 2, "gray", 2, "440")
    source = [(str(write(root / f"{i}.jpg", gen(48, 40 - 2 * i, subsampling=s, quality=60 + 5 * i))), i % 3)
              for i, s in enumerate(subsamplings)]
    source.append((str(write(root / "oversize.jpg", gen(96, 80, subsampling=2, quality=80))), 0))
    source.append((str(write(root / "progressive.jpg", gen(24, 16, subsampling=2, progressive=True))), 1))
    source.append((str(root / "missing.jpg"), 2))
    return source


def _sim_loader(source, backend, **kw):
    return make_loader(source, 4, backend=backend, slot_pixels=64 * 64, **kw)


# ---------------------------------------------------------------------------------
# Bad inputs on the cpu and sim backends; the whole corpus


@pytest.mark.parametrize("backend", ["cpu", pytest.param("sim", marks=needs_verilator)])
def test_bad_inputs_outcomes_and_accounting(bad_dir, backend, request):
    source = [(str(path), n) for n, path in enumerate(bad_dir.values())]
    names = list(bad_dir)
    refs = {path: pillow_file(path) for path, _ in source}
    failing = {path for path, (_, exc) in refs.items() if exc is not None}
    # What Pillow does with each input (the oracle; checked here so a Pillow change shows).
    assert {names[label] for path, label in source if path in failing} == \
        {"missing", "empty", "truncated", "precision12", "huge"}
    with make_loader(source, 3, backend=_backend(request, backend), slot_pixels=64 * 64,
                     on_error="skip") as loader:
        batches = drain(loader)
        delivered = check_batches(loader, batches, refs)
        assert sorted(delivered) == sorted(label for path, label in source if path not in failing)
        outcomes = {o.path: o for b in batches for o in b.outcomes}
        for path, label in source:
            name = names[label]
            if path in failing:
                outcome = outcomes[path]
                assert (outcome.status, outcome.index, outcome.backend) == ("error", label, None), name
                if name == "missing":
                    assert outcome.reason == "unreadable" and "FileNotFoundError" in outcome.detail
                else:
                    assert outcome.reason == "undecodable", name
                if name not in ("missing", "empty"):
                    assert type(refs[path][1]).__name__ in outcome.detail, (name, outcome.detail)
                assert path in str(outcome)
            elif backend == "cpu":
                assert path not in outcomes, f"{name}: the cpu backend decodes it itself"
            elif path in outcomes:
                outcome = outcomes[path]
                assert (outcome.status, outcome.backend) == ("fallback", "cpu"), name
                assert outcome.reason, name
        if backend == "sim":
            # Outside the device's profile: decoded by the CPU path. The headers' faults are
            # the pre-screen's, before any device time; the entropy-coded data's the device's.
            expect = {"png": ("not-jpeg", "host pre-screen"), "gif": ("not-jpeg", "host pre-screen"),
                      "cmyk": ("components", "host pre-screen"), "progressive": ("progressive", "host pre-screen")}
            for name, (reason, detail) in expect.items():
                outcome = outcomes[str(bad_dir[name])]
                assert (outcome.status, outcome.reason, outcome.detail, outcome.extra) == \
                    ("fallback", reason, detail, {}), name
            outcome = outcomes[str(bad_dir["truncated_entropy_eoi"])]
            assert (outcome.status, outcome.reason) == ("fallback", "truncated") and outcome.extra["cycles"] > 0
            for name in ("good", "good_odd"):
                assert str(bad_dir[name]) not in outcomes, name
            # Only the inputs whose headers are in the profile cost device jobs.
            assert loader.service.stats.jobs == len(
                {"good", "good_odd", "truncated", "truncated_entropy_eoi", "corrupt_entropy"})
        report = loader.report
        assert report.positions == len(source) and report.accounted == report.positions
        assert report.delivered == len(source) - len(failing) and report.replaced == 0
        assert sorted(o.path for o in report.skipped) == sorted(failing)
        assert report.fallbacks == [o for b in batches for o in b.outcomes if o.status == "fallback"]
        stats = loader.stats()
        assert sum(stats.outcomes.values()) == len(source)
        assert stats.outcomes["error:unreadable"] == 1
        assert stats.outcomes["error:undecodable"] == len(failing) - 1
        assert stats.outcomes.get("ok", 0) + len(report.fallbacks) == report.delivered
        assert loader.pool.free == loader.pool.depth


@pytest.mark.corpus
@needs_verilator
def test_sim_loader_over_the_whole_corpus(sim):
    """Every corpus file through the Loader on the simulated 4-lane device (one image per
    batch: no padding to the corpus's largest frames): each delivered image is Pillow's,
    each skipped one is a file Pillow fails on, every index is accounted for, and the
    pre-screen's fallbacks are the ones whose headers are outside the profile, so every
    device job is a file whose headers the full classification would pass."""
    root = require_corpus()
    paths = [str(root / rel) for rel in corpus_paths()]
    with make_loader([(p, i) for i, p in enumerate(paths)], 1, backend=sim, on_error="skip") as loader:
        for batch in loader:
            for k, index in enumerate(batch.indices.tolist()):
                h, w = batch.sizes[k].tolist()
                want, exc = pillow_file(paths[index])
                assert exc is None and np.array_equal(batch.images[k, :, :h, :w].permute(1, 2, 0).numpy(),
                                                      want), paths[index]
        report = loader.report
        assert report.accounted == report.positions == len(paths)
        for outcome in report.skipped:
            assert pillow_file(outcome.path)[1] is not None, outcome
        # The headers' verdict of each file, as the pre-screen judges it (None: the device's).
        verdicts = {}
        for path in paths:
            with open(path, "rb") as f:
                data = f.read()
            if not data:                      # never parsed: an error before the pre-screen
                continue
            tables = jpeg.standard_huffman_segment(jpeg.parse(data, headers_only=True))
            if tables is not None:            # a Motion-JPEG frame is judged with the tables it gets
                data = jpeg.with_standard_huffman(data, tables)
            verdicts[path] = jpeg.classify(jpeg.parse(data, headers_only=True), max_width=WIDTH)
        for outcome in report.fallbacks:
            if outcome.detail == "host pre-screen":
                assert verdicts[outcome.path] == outcome.reason, outcome
        # Exactly the files whose headers are in the profile cost a device job.
        assert loader.service.stats.jobs == sum(verdict is None for verdict in verdicts.values())


# ---------------------------------------------------------------------------------
# Pillow's pixels from the device; the pre-screen's cached verdicts


@needs_verilator
def test_sim_loader_equals_pillow_and_cpu(sim, sim_source):
    with _sim_loader(sim_source, sim) as loader:
        assert loader.backend_name == "sim" and loader.service.lanes == LANES
        sim_batches = drain(loader)
        delivered = check_batches(loader, sim_batches)
        assert delivered == list(range(8))
        assert [len(b.indices) for b in sim_batches] == [4, 4, 0]
        assert tuple(sim_batches[-1].images.shape) == (0, 3, 0, 0)
        outcomes = [o for b in sim_batches for o in b.outcomes]
        assert [(o.index, o.status, o.backend, o.reason) for o in outcomes] == \
            [(7, "fallback", "cpu", "progressive"), (8, "error", None, "unreadable")]
        assert outcomes[0].path == sim_source[7][0] and outcomes[1].path == sim_source[8][0]
        # Progressive: the pre-screen's, no device time spent on it.
        assert (outcomes[0].detail, outcomes[0].extra) == ("host pre-screen", {})
        report = loader.report
        assert (report.positions, report.delivered, report.accounted) == (9, 8, 9)
        assert report.fallbacks == [outcomes[0]] and report.skipped == [outcomes[1]]
        stats = loader.stats()
        assert stats.outcomes == {"ok": 7, "fallback:progressive": 1, "error:unreadable": 1}
        assert stats.oversize == 1 and stats.images == 8
        assert sum(len(b.spills) for b in loader.pool.buffers) == 1, "the large image went to a spill area"
        assert stats.lane_busy, "no lane figures"
        assert set(stats.lane_busy) <= {f"device0.lane{k}" for k in range(LANES)}
        assert all(0 < v <= 1 for v in stats.lane_busy.values()), stats.lane_busy
        assert loader.pool.free == loader.pool.depth
    with _sim_loader(sim_source, "cpu") as loader:
        cpu_batches = drain(loader)
        assert [o.index for b in cpu_batches for o in b.outcomes] == [8]
    for s, c in zip(sim_batches, cpu_batches, strict=True):
        assert torch.equal(s.indices, c.indices) and torch.equal(s.sizes, c.sizes)
        assert torch.equal(s.labels, c.labels) and torch.equal(s.images, c.images)


@needs_verilator
def test_sim_loader_decodes_motion_jpeg_frames_on_the_device(sim, tmp_path):
    """Files without DHT (Motion-JPEG frames) reach the device with the standard tables
    inserted, in every epoch (the second from the pre-screen's cached verdict), and come
    back ``ok`` from it with Pillow's pixels; the dispatcher's staging buffers do not
    grow from one epoch to the next (each rewritten input's own buffer is given back)."""
    tables = {(0, 0), (0, 1), (1, 0), (1, 1)}
    source = [(str(write(tmp_path / f"{i}.jpg", drop_huffman(gen(40, 24 + 2 * i, subsampling=ss, quality=85),
                                                             tables))), i % 2)
              for i, ss in enumerate((0, 1, 2, "gray", 2, 0))]
    with _sim_loader(source, sim) as loader:
        held = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            batches = drain(loader)
            assert check_batches(loader, batches) == list(range(6))
            assert all(not b.outcomes for b in batches), "every image ok, none declined"
            assert loader.stats().outcomes == {"ok": 6}
            dispatcher = loader.service._dispatchers[0]
            held.append(len(dispatcher.allocated))
        assert held[0] == held[1]
        assert len(loader.service._screens) == 6 and all(v[4] is not None for v in loader.service._screens.values())


@needs_verilator
def test_a_file_replaced_with_its_old_size_and_mtime_is_screened_again(sim, tmp_path):
    """New contents given the old size and modification time (``cp -p``, ``rsync -t``):
    the pre-screen's cached verdict must not send them to the device. Here the new file's
    JFIF APP0 is cut short, which the device's header parser skips but Pillow refuses.
    Without the status-change time in the cache key, epoch 1 delivered it as ``ok``."""
    good = gen(37, 53, subsampling=0, quality=90)
    assert good[2:4] == b"\xff\xe0"
    rest = good[4 + struct.unpack(">H", good[4:6])[0]:]
    pad = len(good) - len(rest) - 15
    bad = good[:2] + b"\xff\xe0\x00\x07JFIF\x00" + b"\xff\xfe" + struct.pack(">H", pad + 2) + b"x" * pad + rest
    assert len(bad) == len(good)
    assert pillow_file(io.BytesIO(bad))[1] is not None and pillow_file(io.BytesIO(good))[1] is None
    path = write(tmp_path / "c" / "img.jpg", good)
    st = path.stat()
    with _sim_loader([(str(path), 0)], sim, on_error="skip") as loader:
        drain(loader)
        assert loader.report.delivered == 1 and not loader.report.skipped
        path.write_bytes(bad)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
        loader.set_epoch(1)
        batches = drain(loader)
        assert [len(b.indices) for b in batches] == [0]
        (skipped,) = loader.report.skipped
        assert (skipped.status, skipped.reason, skipped.path) == ("error", "undecodable", str(path))


# ---------------------------------------------------------------------------------
# Device faults: stuck lanes, stalled memory, a dead dispatcher, memory exhausted


@needs_verilator
def test_sim_lanes_stuck_one_at_a_time_end_in_a_reset(sim, tmp_path):
    """Single tasks on a 4-lane device whose memory stopped answering reads: each job's
    lane is freed by the watchdog but stays stuck on its dead transactions, so each
    next job goes to another lane; once all four are stuck the dispatcher resets the
    device, and the fifth job runs on the reset device. No job waits out the driver's
    wait bound (2**28 clocks; before, the fifth did), and every input comes from the CPU."""
    from dlbooster.runtime.pool import BatchPool
    from dlbooster.runtime.service import DecodeService, Task
    from dlbooster.sim.device import PortBehaviour

    paths = [str(write(tmp_path / f"{i}.jpg", gen(48, 40, subsampling=2, quality=85))) for i in range(5)]
    device = sim.device
    resets, task = [], [None]
    real_reset = device.reset
    device.reset = lambda: (resets.append(task[0]), real_reset())
    outcomes = []
    service = DecodeService(sim, cpu_workers=1)
    try:
        device.watchdog = 2000
        device.transport.set_port(PortBehaviour(stall_reads=True))
        pool = BatchPool(1, 64 * 64 * 3, depth=1, allocate=service.allocator())
        clocks0 = device.transport.counters()["clocks"]
        for i, path in enumerate(paths):
            task[0] = i
            buf = pool.acquire()
            buf.count = 1
            service.submit(Task(i, path, buf, 0, lambda task, outcome: outcomes.append(outcome)))
            service.drain()
            pool.release(buf)
        clocks = device.transport.counters()["clocks"] - clocks0
    finally:
        service.close(backend=False)
        del device.reset
    assert [(o.index, o.status, o.reason, o.backend) for o in outcomes] == [
        (i, "fallback", "watchdog", "cpu") for i in range(5)]
    assert sorted(o.extra["lane"] for o in outcomes[:LANES]) == list(range(LANES))
    assert resets == [LANES - 1], "one reset, during the task that left every lane stuck"
    # About 10,000: far under the driver's wait bound (2**28 clocks), which nothing waited out.
    assert clocks < 1 << 20, clocks


@needs_verilator
def test_sim_stalled_memory_falls_back_to_cpu(sim, sim_source):
    """The device's memory stops answering reads: the watchdog ends the jobs the lanes
    hold, and the lanes stay busy on their dead transactions. The dispatcher resets the
    device at the first watchdog completion and sends the jobs still in flight to the
    CPU (``device-fault``); it does not wait out the driver's wait bound (2**28 clocks,
    minutes in the simulator). Every image still arrives, from the CPU.

    A hook the Loader does not expose, reached through
    ``loader.service._dispatchers[0].device``: the watchdog register (default 2**24
    clocks, also minutes in the simulator)."""
    from dlbooster.sim.device import PortBehaviour

    with _sim_loader(sim_source, sim) as loader:
        device = loader.service._dispatchers[0].device
        assert device is sim.device
        device.watchdog = 2000
        device.transport.set_port(PortBehaviour(stall_reads=True))
        clocks0 = device.transport.counters()["clocks"]
        batches = drain(loader)
        clocks = device.transport.counters()["clocks"] - clocks0
        assert check_batches(loader, batches) == list(range(8))
        outcomes = [o for b in batches for o in b.outcomes]
        assert outcomes[-1].index == 8 and outcomes[-1].status == "error"
        fallbacks = outcomes[:-1]
        assert sorted(o.index for o in fallbacks) == list(range(8)), "every image came from the CPU"
        assert all(o.status == "fallback" and o.backend == "cpu" for o in fallbacks)
        reasons = {o.index: o.reason for o in fallbacks}
        assert reasons.pop(7) == "progressive"          # the pre-screen's: it never reached the device
        assert "watchdog" in reasons.values() and set(reasons.values()) <= {"watchdog", "device-fault"}, reasons
        assert loader.report.accounted == loader.report.positions == 9
        assert loader.report.fallbacks == fallbacks
        stats = loader.stats().outcomes
        assert stats["fallback:watchdog"] + stats["fallback:device-fault"] == 7
        # About one watchdog period (2,000 clocks), not the driver's bound (2**28).
        assert clocks < 1 << 20, f"{clocks} clocks: the dispatcher waited for the driver's bound"
    # The device works again once the memory answers.
    device.transport.set_port(PortBehaviour())
    device.reset()
    with _sim_loader(sim_source[:2], sim) as loader:
        batches = drain(loader)
        assert check_batches(loader, batches) == [0, 1] and batches[0].outcomes == []


@needs_verilator
def test_sim_dispatcher_death_loses_nothing(sim, sim_source, monkeypatch):
    """A bus error on queuing a job: the dispatcher dies with jobs in hand; they and
    every later one are decoded on the CPU."""
    from dlbooster.hw.regs import Reg

    with _sim_loader(sim_source, sim) as loader:
        write32 = sim.device.transport.write32

        def bus_error_on_push(offset, value):
            if offset == Reg.JOB_PUSH:
                raise OSError("bus error")
            write32(offset, value)

        monkeypatch.setattr(sim.device.transport, "write32", bus_error_on_push)
        batches = drain(loader)
        assert check_batches(loader, batches) == list(range(8))
        fallbacks = [o for b in batches for o in b.outcomes if o.status == "fallback"]
        assert {o.index: o.reason for o in fallbacks} == {**{i: "device-fault" for i in range(7)}, 7: "progressive"}
        assert loader.report.accounted == loader.report.positions == 9
        assert loader.service._outstanding == 0


@needs_verilator
def test_sim_device_memory_exhausted_sends_images_to_the_cpu(sim, sim_source, monkeypatch):
    """Device memory runs out (the transport's allocate raises): each image the device
    would take is decoded on the CPU, reason ``device-memory``; the device stays up."""
    with _sim_loader(sim_source, sim) as loader:
        def exhausted(size, writable=True):
            raise MemoryError("device memory exhausted")

        monkeypatch.setattr(sim.device.transport, "allocate", exhausted)
        batches = drain(loader)
        assert check_batches(loader, batches) == list(range(8))
        fallbacks = {o.index: o.reason for b in batches for o in b.outcomes if o.status == "fallback"}
        # The progressive one is the pre-screen's, before any device memory is asked for.
        assert fallbacks == {**{i: "device-memory" for i in range(7)}, 7: "progressive"}
        assert loader.report.accounted == loader.report.positions == 9
        assert all(d.is_alive() for d in loader.service._dispatchers)


# ---------------------------------------------------------------------------------
# Two devices


@needs_verilator
def test_sim_two_devices_at_once(sim_source):
    """Two simulated devices (each its own simulation, run from its own dispatcher thread
    at the same time): every image equal to Pillow's, both devices busy."""
    from dlbooster.backends import SimBackend

    backend = SimBackend(lanes=1, max_width=256, devices=2)
    try:
        with _sim_loader(sim_source, backend) as loader:
            assert loader.service.lanes == 2
            batches = drain(loader)
            assert check_batches(loader, batches) == list(range(8))
            busy = loader.stats().lane_busy
            assert set(busy) == {"device0.lane0", "device1.lane0"}
            assert all(0 < v <= 1 for v in busy.values())
            reasons = sorted((o.index, o.reason) for b in batches for o in b.outcomes)
            assert reasons == [(7, "progressive"), (8, "unreadable")]
    finally:
        backend.close()
