"""The decoder device (hw/device.py) through the real host driver on the simulated device.

Every test drives :class:`dlbooster.device.driver.DecoderDevice` over
:class:`dlbooster.sim.device.SimTransport`: the Verilator build of the exported top with
host memory modelled on its AXI4 master, whose every write is checked against the pages
the host mapped writable (``violations``). Builds: 1 and 4 lanes, 256-pixel line buffers.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image

from dlbooster import jpeg
from dlbooster.device.driver import DecoderDevice, drain
from dlbooster.hw.regs import MAGIC, Ctrl, DeviceStatus, Irq, Reg
from dlbooster.sim.flow import simulator_available
from dlbooster.sim.verify import expectation

from jpegtools import (corpus_rows, drop_huffman, feature_files, feature_subset, gen,
                       hardware_candidates, pillow_rgb)

pytestmark = pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")

WIDTH = 256


def _transport(lanes: int):
    from dlbooster.sim.device import SimTransport

    return SimTransport(lanes=lanes, max_width=WIDTH)


@pytest.fixture(scope="module")
def sim1():
    with _transport(1) as t:
        yield t


@pytest.fixture(scope="module")
def sim4():
    with _transport(4) as t:
        yield t


def _fresh(transport) -> DecoderDevice:
    """The device reset, its memory port well-behaved, started in streaming mode."""
    from dlbooster.sim.device import PortBehaviour

    transport.set_port(PortBehaviour())
    device = DecoderDevice(transport)
    device.reset()
    _baseline[id(transport)] = transport.counters()["violations"]
    return device


_baseline: dict[int, int] = {}


def _violations(transport) -> int:
    """Memory violations since the test's :func:`_fresh`."""
    return transport.counters()["violations"] - _baseline[id(transport)]


def _cap(data: bytes) -> int:
    frame = jpeg.parse(data).frame
    return frame.width * frame.height * 3 if frame is not None and frame.width <= WIDTH else 0


def _check_against_pillow(files: dict[str, bytes], outcomes) -> None:
    for (name, data), outcome in zip(files.items(), outcomes):
        done = outcome.completion
        expect, reason, _, _ = expectation(data, WIDTH)
        if expect == "decode":
            ref, _ = pillow_rgb(data)
            assert done.status == 0, f"{name}: status 0x{done.status:02x} ({done.reason})"
            assert outcome.image.shape == ref.shape and (outcome.image == ref).all(), name
            assert done.bytes_written == ref.size and done.symbols > 0, name
        else:
            assert done.status != 0 and outcome.image is None, f"{name}: expected {expect} {reason}"


def test_registers_identify_the_build(sim1):
    device = _fresh(sim1)
    assert (device.lanes, device.bus_bytes, device.job_depth, device.done_depth, device.max_width) == \
        (1, 16, 16, 16, WIDTH)
    assert device.watchdog == 1 << 24
    device.watchdog = 1234
    assert device.watchdog == 1234
    assert sim1.read32(Reg.JOB_PUSH) == 16 and sim1.read32(Reg.DONE_COUNT) == 0


def test_feature_files_equal_pillow(sim1):
    device = _fresh(sim1)
    files = feature_files(WIDTH)
    before = sim1.counters()
    outcomes = device.decode_batch([(data, _cap(data)) for data in files.values()])
    _check_against_pillow(files, outcomes)
    by_name = dict(zip(files, outcomes))
    # Named here, not taken from the model: the first ten decode on the device.
    stops = ("progressive", "too_wide", "truncated", "no_eoi", "fill_before_stuffing")
    assert [name for name, o in by_name.items() if o.completion.status == 0] == [n for n in files if n not in stops]
    assert len(files) - len(stops) == 10
    assert by_name["progressive"].completion.reason == "progressive"
    assert by_name["too_wide"].completion.reason == "width"
    assert by_name["truncated"].completion.reason == "truncated"
    assert by_name["no_eoi"].completion.reason == "after-scan"
    after = sim1.counters()
    assert _violations(sim1) == 0
    assert after["read_beats"] > before["read_beats"] and after["write_beats"] > before["write_beats"]


def _tiny_last_intervals() -> dict[str, bytes]:
    """Files whose last restart intervals are a few bytes: flat images (or a flat last
    MCU after textured ones) with a restart interval of one MCU."""
    rng = np.random.default_rng(5)
    files = {}
    for mode, ss, (w, h) in (("L", "gray", (16, 8)), ("L", "gray", (24, 8)), ("RGB", 2, (32, 16)),
                             ("RGB", 0, (24, 8))):
        flat = Image.new(mode, (w, h), 128 if mode == "L" else (120, 130, 140))
        textured = flat.copy()
        textured.paste(Image.fromarray(rng.integers(0, 256, (h, w - 8) + (() if mode == "L" else (3,)),
                                                    dtype=np.uint8)), (0, 0))
        for name, image in (("flat", flat), ("flat-last", textured)):
            files[f"{name}-{mode}-{w}x{h}"] = gen(w, h, subsampling=ss, image=image, quality=50,
                                                  restart_blocks=1)
    return files


STANDARD = {(0, 0), (0, 1), (1, 0), (1, 1)}


def test_a_scan_without_huffman_tables_needs_them_supplied(sim1):
    """The device reads its Huffman tables from the input, as T.81 requires: a file
    without DHT (a Motion-JPEG frame) is declined as ``missing-table``, and the same
    file with libjpeg-turbo's standard tables inserted decodes to Pillow's image of the
    original. The runtime inserts them (dlbooster.jpeg.standard_huffman_segment)."""
    device = _fresh(sim1)
    files = {f"{ss}": drop_huffman(gen(40, 24, subsampling=ss, quality=85), STANDARD) for ss in (0, 1, 2, "gray")}
    raw = device.decode_batch([(data, _cap(data)) for data in files.values()])
    assert [o.completion.reason for o in raw] == ["missing-table"] * len(files)
    fixed = {name: jpeg.with_standard_huffman(data, jpeg.standard_huffman_segment(jpeg.parse(data)))
             for name, data in files.items()}
    outcomes = device.decode_batch([(data, _cap(data)) for data in fixed.values()])
    for (name, data), outcome in zip(files.items(), outcomes):
        ref, _ = pillow_rgb(data)
        assert outcome.completion.status == 0, name
        assert outcome.image.shape == ref.shape and (outcome.image == ref).all(), name
    assert _violations(sim1) == 0


def test_a_tiny_last_restart_interval_decodes(sim1):
    """The header parser cleared its restart interval (DRI) once it had forwarded the
    file's last byte, while the entropy decoder still had restart boundaries ahead: a file
    whose last intervals are only a few bytes stopped with ``unexpected-marker`` or
    ``bad-huffman-code`` (or could decode padding bits as symbols)."""
    files = _tiny_last_intervals()
    for data in files.values():
        scan = jpeg.parse(data).scans[0]
        assert scan.restart_interval == 1 and scan.restarts >= 1
    device = _fresh(sim1)
    outcomes = device.decode_batch([(data, _cap(data)) for data in files.values()])
    _check_against_pillow(files, outcomes)
    assert all(o.completion.status == 0 for o in outcomes)


def test_a_block_outside_the_exact_idct_range_is_declined(sim1):
    """16-bit quantisers times a large coefficient leave the range where libjpeg-turbo's
    C and SIMD IDCTs agree: the lane reports ``idct-range`` (0x30; the IDCT's samples
    for such a block are unspecified) and writes only inside its buffer; the images
    before and after it in the batch are Pillow's."""
    from dlbooster.jpeg import model
    from dlbooster.hw.lane import STATUS_IDCT_RANGE
    from jpegtools import Crafted, reencode

    data = gen(32, 16, subsampling=0, qtables=[[1000] * 64, [1000] * 64])
    info = jpeg.parse(data)
    evil = reencode(data, info, model.decode(data, info=info).coefficients,
                    crafted=[Crafted(0, 0, [("dc", 0), ("ac", 0, 1023), ("eob",)])])
    device = _fresh(sim1)
    good = gen(24, 16, subsampling=2, quality=80)
    outcomes = device.decode_batch([(good, _cap(good)), (evil, _cap(evil)), (good, _cap(good))])
    bad = outcomes[1].completion
    assert (bad.status, bad.reason, outcomes[1].image) == (STATUS_IDCT_RANGE, "idct-range", None)
    assert bad.symbols > 0
    _check_against_pillow({"before": good, "after": good}, [outcomes[0], outcomes[2]])
    assert _violations(sim1) == 0


def test_gaps_latency_and_back_pressure(sim1):
    """Every ready/valid the memory drives offered in 30 % of clocks, 40 clocks of read
    latency: same pixels, nothing written out of bounds."""
    from dlbooster.sim.device import PortBehaviour

    device = _fresh(sim1)
    sim1.set_port(PortBehaviour(ready_percent=30, latency=40, seed=7))
    files = {k: v for k, v in feature_files(WIDTH).items() if k in ("420_q85", "422_q1_odd", "gray_q60_odd",
                                                                    "420_restart_blocks", "no_eoi")}
    _check_against_pillow(files, device.decode_batch([(d, _cap(d)) for d in files.values()]))
    assert _violations(sim1) == 0


def test_four_lanes_busy_out_of_order_and_identical_to_one_lane(sim1, sim4):
    files = {f"img{i}": gen(16 + 24 * (i % 5), 16 + 8 * (i % 3), subsampling=i % 3, quality=60 + 4 * i)
             for i in range(12)}
    items = [(d, _cap(d)) for d in files.values()]
    one = _fresh(sim1).decode_batch(items)
    device = _fresh(sim4)
    # Four jobs queued: every lane takes one.
    bufs = []
    for i, (data, cap) in enumerate(items[:4]):
        src, dst = sim4.allocate(len(data), writable=False), sim4.allocate(cap)
        src.array[:] = np.frombuffer(data, np.uint8)
        bufs += [src, dst]
        assert device.submit(100 + i, src.device_address, len(data), dst.device_address, cap)
    sim4.run(50)
    assert sim4.read32(Reg.BUSY) == 0b1111
    done = []
    while device.in_flight:
        done += device.wait()
    assert sorted(d.job_id for d in done) == [100, 101, 102, 103]
    assert {d.lane for d in done} == {0, 1, 2, 3}
    for b in bufs:
        b.free()
    # With 36 clock gates, no clock's one evaluation read an enable or a master output early.
    sim4.check_gates()
    before = sim4.counters()
    try:
        four = device.decode_batch(items)
    finally:
        sim4.check_gates(False)
    after = sim4.counters()
    assert after["clocks"] > before["clocks"]
    assert after["early_reads"] == before["early_reads"] == 0
    assert after["unfinished"] == before["unfinished"] == 0
    _check_against_pillow(files, four)
    for a, b in zip(one, four):
        assert (a.completion.status, a.completion.width, a.completion.height, a.completion.symbols,
                a.completion.bytes_written) == (b.completion.status, b.completion.width, b.completion.height,
                                                b.completion.symbols, b.completion.bytes_written)
        assert (a.image == b.image).all()
    assert len({o.completion.lane for o in four}) == 4
    assert _violations(sim4) == 0


def test_completions_come_out_of_order_matched_by_id(sim4):
    device = _fresh(sim4)
    big = gen(200, 120, subsampling=2, quality=95)
    small = [gen(16, 16, subsampling=0, quality=50 + i) for i in range(3)]
    items = [(big, _cap(big))] + [(s, _cap(s)) for s in small]
    order = []
    bufs = {}
    for i, (data, cap) in enumerate(items):
        src, dst = sim4.allocate(len(data), writable=False), sim4.allocate(cap)
        src.array[:] = np.frombuffer(data, np.uint8)
        bufs[i] = dst
        device.submit(i, src.device_address, len(data), dst.device_address, cap)
    while device.in_flight:
        order += device.wait()
    assert [d.job_id for d in order][-1] == 0, "the big image, submitted first, finishes last"
    for d in order:
        ref, _ = pillow_rgb(items[d.job_id][0])
        assert d.status == 0
        assert (bufs[d.job_id].array[:ref.size].reshape(ref.shape) == ref).all()


def test_output_buffer_too_small_writes_nothing(sim1):
    """Found from the frame header: nothing written, and the rest of the (long) input is
    not read either, before or after the completion."""
    device = _fresh(sim1)
    data = gen(200, 120, subsampling=0, quality=98)
    cap = 200 * 120 * 3 - 1
    src, dst = sim1.allocate(len(data), writable=False), sim1.allocate(cap)
    src.array[:] = np.frombuffer(data, np.uint8)
    dst.array[:] = 0xA5
    writes, reads0 = sim1.counters()["write_beats"], sim1.counters()["read_beats"]
    device.submit(7, src.device_address, len(data), dst.device_address, cap)
    (done,) = device.wait()
    assert (done.job_id, done.status, done.bytes_written) == (7, DeviceStatus.OUTPUT_TOO_SMALL, 0)
    assert done.reason == "output-too-small" and (done.width, done.height) == (200, 120)
    assert (dst.array == 0xA5).all()
    assert sim1.counters()["write_beats"] == writes and _violations(sim1) == 0
    reads = sim1.counters()["read_beats"]
    assert reads - reads0 < len(data) // 16 / 2, "the input past the frame header was read"
    src.free()                       # the host takes the input back: the device must not touch it
    sim1.run(5000)
    assert sim1.counters()["read_beats"] == reads and _violations(sim1) == 0
    assert sim1.read32(Reg.BUSY) == 0
    # The lane goes on: the same input with room decodes.
    (ok,) = device.decode_batch([(data, cap + 1)])
    assert ok.completion.status == 0 and (ok.image == pillow_rgb(data)[0]).all()


def test_bad_jobs_and_memory_errors(sim1):
    device = _fresh(sim1)
    data = gen(16, 16, subsampling=0, quality=75)
    src, dst = sim1.allocate(len(data), writable=False), sim1.allocate(16 * 16 * 3)
    src.array[:] = np.frombuffer(data, np.uint8)
    device.submit(1, src.device_address + 4, len(data) - 4, dst.device_address, 768)   # unaligned
    device.submit(2, src.device_address, 0, dst.device_address, 768)                  # empty
    device.submit(3, sim1.base + (1 << 31), len(data), dst.device_address, 768)        # unmapped input
    device.submit(4, src.device_address, len(data), src.device_address, 768)           # read-only output
    # Buffers at the top of the 64-bit address space: the memory model's bounds checks
    # must not wrap (they once indexed past its page table there and crashed).
    device.submit(5, (1 << 64) - 16, 16, dst.device_address, 768)
    device.submit(6, src.device_address, len(data), (1 << 64) - 768, 768)
    done = {}
    while device.in_flight:
        done.update({d.job_id: d for d in device.wait()})
    assert done[1].status == done[2].status == DeviceStatus.BAD_JOB
    assert done[3].status == done[5].status == DeviceStatus.READ_ERROR
    assert done[4].status == done[6].status == DeviceStatus.WRITE_ERROR
    assert (src.array == np.frombuffer(data, np.uint8)).all(), "the device wrote into its input"
    assert _violations(sim1) > 0
    (ok,) = device.decode_batch([(data, 768)])
    assert ok.completion.status == 0


@pytest.mark.parametrize("stall", ["reads", "writes"])
def test_watchdog_ends_a_stalled_job_and_the_lane_recovers(sim1, stall):
    from dlbooster.sim.device import PortBehaviour

    device = _fresh(sim1)
    device.watchdog = 3000
    data = gen(64, 48, subsampling=2, quality=90)
    src, dst = sim1.allocate(len(data), writable=False), sim1.allocate(_cap(data))
    src.array[:] = np.frombuffer(data, np.uint8)
    sim1.set_port(PortBehaviour(stall_reads=stall == "reads", stall_writes=stall == "writes"))
    device.submit(5, src.device_address, len(data), dst.device_address, _cap(data))
    (done,) = device.wait(max_clocks=200_000)
    assert (done.job_id, done.status, done.reason) == (5, DeviceStatus.WATCHDOG, "watchdog")
    assert 3000 <= done.clocks < 200_000
    # Its memory transactions are still outstanding: the lane takes no job until they end.
    assert sim1.read32(Reg.BUSY) == 1
    sim1.set_port(PortBehaviour())
    sim1.run(2000)
    assert sim1.read32(Reg.BUSY) == 0
    (ok,) = device.decode_batch([(data, _cap(data))])
    assert ok.completion.status == 0 and (ok.image == pillow_rgb(data)[0]).all()
    assert _violations(sim1) == 0


@pytest.mark.parametrize("lanes", [1, 4])
def test_every_lane_stuck_on_a_dead_memory_ends_the_batch_at_once(sim1, sim4, lanes):
    """Reads stop being answered: each job's watchdog frees its lane, which stays stuck
    on its dead transactions. Once every lane is, ``decode_batch`` raises (the device
    reset) instead of waiting out its 2**28-clock wait bound, and a device backend
    hands the call's inputs to the CPU (``device-fault``); the device then works again."""
    from dlbooster.backends import DeviceBackend, decode_results
    from dlbooster.device.driver import DeviceError
    from dlbooster.sim.device import PortBehaviour

    sim = sim1 if lanes == 1 else sim4
    device = _fresh(sim)
    device.watchdog = 3000
    files = [gen(40 + 8 * i, 24, subsampling=i % 3, quality=85) for i in range(lanes + 2)]
    sim.set_port(PortBehaviour(stall_reads=True))
    clocks = sim.counters()["clocks"]
    with pytest.raises(DeviceError, match="every lane waits on memory transactions its watchdog gave up"):
        device.decode_batch([(d, _cap(d)) for d in files])
    assert sim.counters()["clocks"] - clocks < 100_000
    assert device.stuck == set(), "the reset clears the stuck lanes"
    backend = DeviceBackend()
    backend.devices, backend.device, backend.max_width = [device], device, WIDTH
    results = decode_results(files, backend)
    assert [(r.status, r.backend, r.reason) for r in results] == [("fallback", "cpu", "device-fault")] * len(files)
    assert all((r.image == pillow_rgb(d)[0]).all() for r, d in zip(results, files))
    sim.set_port(PortBehaviour())
    outcomes = device.decode_batch([(d, _cap(d)) for d in files])
    assert all(o.completion.status == 0 and (o.image == pillow_rgb(d)[0]).all() for o, d in zip(outcomes, files))
    assert device.watchdog == 3000 and _violations(sim) == 0


def test_reset_while_busy_leaves_the_device_usable(sim4):
    device = _fresh(sim4)
    data = gen(120, 80, subsampling=2, quality=90)
    for i in range(6):
        src, dst = sim4.allocate(len(data), writable=False), sim4.allocate(_cap(data))
        src.array[:] = np.frombuffer(data, np.uint8)
        device.submit(i, src.device_address, len(data), dst.device_address, _cap(data))
    sim4.run(3000)
    assert sim4.read32(Reg.BUSY) == 0b1111
    default = device.watchdog
    device.watchdog = 12345
    device.reset()
    assert sim4.read32(Reg.BUSY) == 0 and sim4.read32(Reg.DONE_COUNT) == 0 and sim4.read32(Reg.JOB_PUSH) == 16
    # The register's reset value is the build's; the driver writes the one it was given again.
    assert device.watchdog == 12345 and default == 1 << 24
    sim4.reset()
    assert sim4.read32(Reg.WATCHDOG) == default
    device.reset()
    assert device.watchdog == 12345
    files = {f"f{i}": gen(24 + 8 * i, 16, subsampling=i % 3, quality=80) for i in range(5)}
    _check_against_pillow(files, device.decode_batch([(d, _cap(d)) for d in files.values()]))


def test_ap_ctrl_hs_and_interrupt(sim1):
    """Without AUTO_RESTART a start runs the queued jobs, then sets ap_done (clear on
    read) and ap_idle; the interrupt follows GIE, IER and the toggle-on-write ISR, whose
    bits are set only for events IER enables (Xilinx's convention)."""
    device = _fresh(sim1)
    sim1.reset()
    data = gen(16, 16, subsampling=2, quality=75)
    src, dst = sim1.allocate(len(data), writable=False), sim1.allocate(768)
    src.array[:] = np.frombuffer(data, np.uint8)
    assert sim1.read32(Reg.AP_CTRL) & (Ctrl.AP_START | Ctrl.AP_IDLE) == Ctrl.AP_IDLE
    device.submit(9, src.device_address, len(data), dst.device_address, 768)
    sim1.run(2000)
    assert sim1.read32(Reg.DONE_COUNT) == 0, "not started: the job waits"
    sim1.write32(Reg.GIE, 1)
    sim1.write32(Reg.IER, Irq.AP_DONE)
    sim1.write32(Reg.AP_CTRL, Ctrl.AP_START)
    assert sim1.read32(Reg.AP_CTRL) & Ctrl.AP_START
    assert sim1.wait(100_000)
    assert sim1.read32(Reg.ISR) == Irq.AP_DONE, "a completion IER does not enable sets no ISR bit"
    ctrl = sim1.read32(Reg.AP_CTRL)
    assert ctrl & (Ctrl.AP_DONE | Ctrl.AP_IDLE | Ctrl.AP_READY) == Ctrl.AP_DONE | Ctrl.AP_IDLE | Ctrl.AP_READY
    assert not ctrl & Ctrl.AP_START
    assert not sim1.read32(Reg.AP_CTRL) & Ctrl.AP_DONE, "ap_done clears on read"
    sim1.write32(Reg.ISR, Irq.AP_DONE)
    assert sim1.read32(Reg.ISR) == 0
    sim1.run(10)
    assert not sim1.wait(10), "IER masks the completion bit"
    (done,) = device.poll()
    assert done.job_id == 9 and done.status == 0


def _one_shot(transport, what: str) -> None:
    """``AP_START`` alone, then wait for ap_done (at most 200,000 clocks)."""
    transport.write32(Reg.AP_CTRL, Ctrl.AP_START)
    for _ in range(1000):
        if transport.read32(Reg.AP_CTRL) & Ctrl.AP_DONE:
            return
        transport.run(200)
    raise AssertionError(f"{what}: no ap_done")


def test_an_xrt_kernel_call_decodes_its_arguments(sim1):
    """XRT's own kernel call (``run = kernel(in, in_len, out, out_cap, id); run.wait()``)
    writes the arguments at kernel.xml's offsets (the staging registers) and sets
    AP_START alone. The device ran the jobs queued by JOB_PUSH, none, and reported
    ap_done with nothing decoded; a one-shot start now queues the staged job first. A
    start after JOB_PUSH queues nothing more."""
    from dlbooster.hw.build.boards import KERNEL_ARGS

    _fresh(sim1)
    sim1.reset()
    data = gen(24, 16, subsampling=1, quality=85)
    ref, _ = pillow_rgb(data)
    src, dst = sim1.allocate(len(data), writable=False), sim1.allocate(ref.size)
    src.array[:] = np.frombuffer(data, np.uint8)
    args = {"in_addr": src.device_address, "in_len": len(data), "out_addr": dst.device_address,
            "out_cap": ref.size, "job_id": 77}
    for name, offset, size, _ in KERNEL_ARGS:
        for word in range(size // 4):
            sim1.write32(offset + 4 * word, (args[name] >> (32 * word)) & 0xFFFFFFFF)
    _one_shot(sim1, "the kernel call")
    assert (dst.array[:ref.size].reshape(ref.shape) == ref).all()
    assert sim1.read32(Reg.DONE_COUNT) == 1 and sim1.read32(Reg.DONE_ID) == 77
    sim1.write32(Reg.DONE_POP, 1)
    sim1.write32(Reg.JOB_PUSH, 1)                  # the same staged job, pushed explicitly
    _one_shot(sim1, "the pushed job")
    assert sim1.read32(Reg.DONE_COUNT) == 1, "a start after JOB_PUSH queues no second job"
    # XRT's calls never pop their completions: past the FIFO's depth, one-shot mode
    # drops the oldest instead of stalling the lane.
    depth = (sim1.read32(Reg.CONFIG) >> 24) & 0xFF
    for job_id in range(100, 100 + depth + 2):
        sim1.write32(Reg.JOB_ID, job_id)
        _one_shot(sim1, f"call {job_id}")
    assert sim1.read32(Reg.DONE_COUNT) == depth and sim1.read32(Reg.DONE_ID) == 100 + 2
    assert _violations(sim1) == 0
    for buf in (src, dst):
        buf.free()


def test_submit_many_fills_the_job_fifo_and_queues_no_more(sim1):
    """``submit_many`` queues jobs in order while the job FIFO has room and touches none
    of the rest; completions collected a batch at a time equal Pillow's."""
    _fresh(sim1)
    sim1.reset()                                   # stopped: queued jobs wait
    device = DecoderDevice(sim1)
    depth = device.job_depth
    files = [gen(16 + 8 * (i % 3), 16, subsampling=i % 3, quality=50 + i) for i in range(depth + 3)]
    bufs, srcs, jobs = [], [], []
    for i, data in enumerate(files):
        src, dst = sim1.allocate(len(data), writable=False), sim1.allocate(_cap(data))
        src.array[:] = np.frombuffer(data, np.uint8)
        bufs.append(dst)
        srcs.append(src)
        jobs.append((1000 + i, src.device_address, len(data), dst.device_address, _cap(data)))
    with pytest.raises(ValueError, match="32-bit"):
        device.submit_many([jobs[0], (1, 0, 1 << 32, 0, 0)])
    assert sim1.read32(Reg.JOB_PUSH) == depth, "a refused batch queues nothing"
    assert device.submit_many(jobs) == depth
    assert sim1.read32(Reg.JOB_PUSH) == 0 and device.in_flight == {j[0] for j in jobs[:depth]}
    assert device.submit_many(jobs[depth:]) == 0
    device.start()
    done = []
    while device.in_flight:
        done += device.wait()
    assert device.submit_many(jobs[depth:]) == 3
    while device.in_flight:
        done += device.wait()
    assert sorted(d.job_id for d in done) == [j[0] for j in jobs]
    for d in done:
        i = d.job_id - 1000
        ref, _ = pillow_rgb(files[i])
        assert d.status == 0 and d.bytes_written == ref.size
        assert (bufs[i].array[:ref.size].reshape(ref.shape) == ref).all()
    assert _violations(sim1) == 0
    for buf in bufs + srcs:
        buf.free()


def test_drain_brings_the_device_to_rest_through_its_registers(sim1):
    """XRT's reset of the device (``XrtTransport.reset`` is :func:`dlbooster.device.driver.drain`,
    run here against the simulated device). It cleared ``AP_START`` and popped the
    completions; the queued jobs went on reading and writing buffers the driver released
    after the reset. A drain runs them out: then no lane holds a job, none is queued, no
    completion waits, the memory sees no more transfers, and the device starts again."""
    device = _fresh(sim1)
    depth = device.job_depth
    files = [gen(24 + 8 * (i % 3), 16, subsampling=i % 3, quality=60 + i) for i in range(depth + 2)]
    bufs, jobs = [], []
    for i, data in enumerate(files):
        src, dst = sim1.allocate(len(data), writable=False), sim1.allocate(_cap(data))
        src.array[:] = np.frombuffer(data, np.uint8)
        bufs += [src, dst]
        jobs.append((i, src.device_address, len(data), dst.device_address, _cap(data)))
    assert device.submit_many(jobs) == depth
    assert sim1.read32(Reg.BUSY) != 0
    # An interrupted submit: the next job staged, never pushed; the drain must not run it.
    _, in_addr, in_len, out_addr, cap = jobs[depth]
    bufs[2 * depth + 1].array[:] = 0                 # memory an earlier test may have written
    for offset, value in ((Reg.JOB_IN_ADDR_LO, in_addr), (Reg.JOB_IN_ADDR_HI, in_addr >> 32),
                          (Reg.JOB_IN_LEN, in_len), (Reg.JOB_OUT_ADDR_LO, out_addr),
                          (Reg.JOB_OUT_ADDR_HI, out_addr >> 32), (Reg.JOB_OUT_CAP, cap), (Reg.JOB_ID, 99)):
        sim1.write32(offset, value & 0xFFFFFFFF)
    drain(sim1)
    assert (sim1.read32(Reg.BUSY), sim1.read32(Reg.JOB_PUSH), sim1.read32(Reg.DONE_COUNT)) == (0, depth, 0)
    at_rest = sim1.counters()
    for _ in range(300):
        sim1.read32(Reg.ID)
    now = sim1.counters()
    assert now["clocks"] > at_rest["clocks"]
    assert (now["read_beats"], now["write_beats"]) == (at_rest["read_beats"], at_rest["write_beats"])
    assert not bufs[2 * depth + 1].array.any(), "the half-staged job ran"
    for buf in bufs:
        buf.free()
    device.reset()
    outcomes = device.decode_batch([(data, _cap(data)) for data in files[:2]])
    _check_against_pillow(dict(zip("ab", files[:2])), outcomes)
    assert _violations(sim1) == 0


class _BlockAccess:
    """The simulated device's transport with block register access made of single
    AXI4-Lite accesses in address order (as pynq's MMIO makes them), so that the driver's
    block path runs against the gateware."""

    def __init__(self, transport):
        self._transport = transport

    def __getattr__(self, name):
        return getattr(self._transport, name)

    def read_block(self, offset: int, count: int) -> list[int]:
        return [self._transport.read32(offset + 4 * i) for i in range(count)]

    def write_block(self, offset: int, values) -> None:
        for i, value in enumerate(values):
            self._transport.write32(offset + 4 * i, value)


def test_block_register_access_equals_one_register_at_a_time(sim1):
    """A job as one block write of its staging registers and JOB_PUSH, a completion as one
    block read from DONE_COUNT (DONE_POP reads 0) and DONE_POP: the same completions
    as the driver's one-register-at-a-time path."""
    _fresh(sim1)
    files = {k: v for k, v in feature_files(WIDTH).items()
             if k in ("420_q85", "422_q1_odd", "gray_q60_odd", "progressive", "truncated")}
    items = [(d, _cap(d)) for d in files.values()]
    single = DecoderDevice(sim1).decode_batch(items)
    device = DecoderDevice(_BlockAccess(sim1))
    assert device._blocks
    assert device.transport.read_block(Reg.DONE_COUNT, 8)[:2] == [0, 0]   # none waiting; DONE_POP reads 0
    blocks = device.decode_batch(items)
    _check_against_pillow(files, blocks)
    for a, b in zip(single, blocks):
        assert a.completion._replace(job_id=0) == b.completion._replace(job_id=0)
    assert sim1.read32(Reg.DONE_COUNT) == 0 and sim1.read32(Reg.DONE_POP) == 0
    assert _violations(sim1) == 0


def test_cli_decode_backend_sim(tmp_path, capsys):
    from dlbooster.cli import main

    a = gen(24, 16, subsampling=2, quality=80)
    sos = a.index(b"\xff\xda")
    # d.jpg: a TEM between segments, which the decoder skips and Pillow refuses.
    # e.jpg: no DHT, as a Motion-JPEG frame: the runtime supplies the standard tables.
    # g.jpg: a DNL after the scan; h.jpg: a quantiser slot of 4 (the device and the
    # model name both as the host's classify does).
    sof = a.index(b"\xff\xc0")
    files = {"a.jpg": a, "b.jpg": gen(16, 16, progressive=True), "c.jpg": b"not a jpeg at all",
             "d.jpg": a[:sos] + b"\xff\x01" + a[sos:], "e.jpg": drop_huffman(a, STANDARD),
             "g.jpg": a[:-2] + b"\xff\xdc\x00\x04\x00\x10" + a[-2:],
             "h.jpg": a[:sof + 12] + b"\x04" + a[sof + 13:]}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    # f.jpg: a.jpg followed by zeros to 4 GiB (sparse): Pillow decodes it from the file.
    from dlbooster.backends import LARGE_FILE, decode_result

    (tmp_path / "f.jpg").write_bytes(a)
    os.truncate(tmp_path / "f.jpg", LARGE_FILE)
    code = main(["decode", "--backend", "sim", "--max-width", str(WIDTH), "--lanes", "4", "--json", "--verify",
                 str(tmp_path)])
    out = json.loads(capsys.readouterr().out)
    assert code == 1, "c.jpg is an error, as it is for Pillow"
    by_name = {r["path"].rsplit("/", 1)[1]: r for r in out["results"]}
    assert by_name["a.jpg"]["status"] == "ok" and by_name["a.jpg"]["backend"] == "sim"
    assert by_name["a.jpg"]["cycles"] > 0 and by_name["a.jpg"]["symbols"] > 0
    assert by_name["b.jpg"]["status"] == "fallback" and by_name["b.jpg"]["reason"] == "progressive"
    assert by_name["b.jpg"]["cycles"] > 0
    assert by_name["c.jpg"]["status"] == "error"
    assert by_name["d.jpg"]["status"] == "error" and by_name["d.jpg"]["declined"] == "malformed-header"
    assert "cycles" not in by_name["d.jpg"], "the host pre-screen keeps it from the device"
    assert (by_name["e.jpg"]["status"], by_name["e.jpg"]["backend"]) == ("ok", "sim")
    assert by_name["e.jpg"]["sha256"] == by_name["a.jpg"]["sha256"] and by_name["e.jpg"]["cycles"] > 0
    f = by_name["f.jpg"]
    assert (f["status"], f["backend"], f["reason"], f["sha256"]) == ("fallback", "cpu", "input-size",
                                                                     by_name["a.jpg"]["sha256"])
    assert f["matches_pillow"] and "cycles" not in f
    g, h = by_name["g.jpg"], by_name["h.jpg"]
    assert (g["status"], g["reason"], g["matches_pillow"]) == ("fallback", "after-scan", True)
    assert (h["status"], h["declined"], h["matches_pillow"]) == ("error", "malformed-header", True)
    for name, record in (("g.jpg", g), ("h.jpg", h)):
        model = decode_result(str(tmp_path / name), "model")
        assert (model.status, model.reason, model.extra.get("declined")) == (
            record["status"], record["reason"], record.get("declined")), name
    assert out["summary"]["pillow_mismatches"] == 0


def _corrupted(data: bytes, seed: int, flips: int = 3) -> bytes:
    """``data`` with bytes of its entropy-coded segment replaced (entropy faults and
    aborted pixel paths, or an image that still decodes)."""
    start = jpeg.parse(data).scans[0].data_start
    rng = np.random.default_rng(seed)
    out = bytearray(data)
    for at in rng.integers(start, len(data) - 2, size=flips):
        out[at] = int(rng.integers(0, 255))
    return bytes(out)


def _assert_same_outcomes(names, first, second) -> None:
    """The two builds' outcomes of the same jobs agree: every completion field (status,
    size, bytes, symbols, clocks) and the image, or its absence."""
    for name, a, b in zip(names, first, second, strict=True):
        ca, cb = a.completion, b.completion
        assert (ca.status, ca.width, ca.height, ca.bytes_written, ca.symbols, ca.clocks) == \
            (cb.status, cb.width, cb.height, cb.bytes_written, cb.symbols, cb.clocks), name
        assert (a.image is None) == (b.image is None) and (a.image is None or (a.image == b.image).all()), name


def test_clock_gating_changes_no_result_and_no_clock(sim1):
    """The simulation builds clock-gate idle blocks (dlbooster.hw.gating); the build of
    the boards' design, without the gates, gives the same completions (status, size,
    bytes, symbols and clocks of every job) and the same pixels, under memory gaps and
    latency, for decodable, corrupted, truncated, too-wide and unsupported inputs. Both
    builds simulate a clock with one evaluation (dlbooster.sim.netlist.one_evaluation_per_clock),
    and in no clock did that evaluation read a gate's enable or a master handshake
    output that the clock's memory-side inputs would have changed."""
    from dlbooster.sim.device import PortBehaviour, SimTransport

    files = dict(feature_files(WIDTH))
    files.update(_tiny_last_intervals())
    photo = gen(64, 48, subsampling=2, quality=90)
    files.update({f"corrupt{seed}": _corrupted(photo, seed) for seed in range(6)})
    items = [(d, _cap(d) or 3 * 64 * 64) for d in files.values()]
    port = PortBehaviour(ready_percent=70, latency=9, seed=3)
    results = []
    with SimTransport(lanes=1, max_width=WIDTH, clock_gating=False) as plain:
        for transport in (sim1, plain):
            device = _fresh(transport)
            transport.set_port(port)
            transport.check_gates()
            before = transport.counters()
            try:
                outcomes = device.decode_batch(items)
            finally:
                transport.check_gates(False)
            after = transport.counters()
            results.append((outcomes, after["clocks"] - before["clocks"]))
            assert _violations(transport) == 0
            assert after["early_reads"] == before["early_reads"] == 0
            assert after["unfinished"] == before["unfinished"] == 0
    (gated, gated_clocks), (ungated, ungated_clocks) = results
    assert gated_clocks == ungated_clocks
    assert len(gated) == len(ungated) == len(files)
    _assert_same_outcomes(files, gated, ungated)
    statuses = {o.completion.status for o in gated}
    assert 0 in statuses and len(statuses) >= 4, statuses


def test_the_boards_design_and_the_simulation_build_agree_on_corpus_files(sim1, corpus_dir):
    """The same comparison on real files: a feature-covering subset of the corpus's
    hardware-decodable files that fit the build's width, and the same files with their
    entropy data damaged. Every completion (status, size, bytes, symbols, clocks) and
    every image of the boards' design (no clock gates, signed arithmetic) equals the
    simulation build's, and the decoded images equal Pillow's."""
    from dlbooster.sim.device import SimTransport

    rows = [r for r in hardware_candidates(corpus_rows()) if 0 < int(r["width"] or 0) <= WIDTH]
    groups: dict[tuple[str, bool], list[dict]] = {}       # by subsampling and restart markers
    for r in feature_subset(rows, cap=len(rows)):
        groups.setdefault((r["subsampling"], int(r["restart_interval"] or 0) > 0), []).append(r)
    picked = [r for group in groups.values() for r in group[:2]]
    assert len({sub for sub, _ in groups}) >= 4 and any(restart for _, restart in groups), sorted(groups)
    files = {r["path"]: (corpus_dir / r["path"]).read_bytes() for r in picked}
    files.update({f"{name} (damaged)": _corrupted(data, n) for n, (name, data) in enumerate(list(files.items())[:4])})
    items = [(d, _cap(d) or 3 * WIDTH * WIDTH) for d in files.values()]
    results = []
    with SimTransport(lanes=1, max_width=WIDTH, clock_gating=False) as plain:
        for transport in (sim1, plain):
            results.append(_fresh(transport).decode_batch(items))
    gated, ungated = results
    _assert_same_outcomes(files, gated, ungated)
    for name, a in zip(files, gated):
        if a.completion.status == 0 and not name.endswith("(damaged)"):
            expected, _ = pillow_rgb(files[name])
            assert np.array_equal(a.image, expected), name
    assert sum(o.completion.status == 0 for o in gated) >= len(picked) // 2


def test_the_gate_check_counts_a_clock_that_reads_an_output_early(sim1):
    """``SimTransport.check_gates`` counts a clock whose one evaluation read a master
    output that the clock's inputs change: here ap_rst_n driven low without the settling
    evaluation (a test instrument) while a read request waits for ARREADY, so ARVALID,
    which the reset forces low, was read high. A sound clock counts nothing."""
    from dlbooster.sim.device import PortBehaviour

    device = _fresh(sim1)
    data = gen(40, 24, subsampling=2, quality=85)
    src, dst = sim1.allocate(len(data), writable=False), sim1.allocate(_cap(data))
    src.array[:] = np.frombuffer(data, np.uint8)
    sim1.set_port(PortBehaviour(stall_reads=True))
    assert device.submit(7, src.device_address, len(data), dst.device_address, _cap(data))
    sim1.run(100)
    sim1.check_gates()
    try:
        early = sim1.counters()["early_reads"]
        sim1.run(20)
        assert sim1.counters()["early_reads"] == early
        sim1._lib.dlb_test_unsettled_reset(sim1._h, 0)
        sim1.run(1)
        assert sim1.counters()["early_reads"] == early + 1
        sim1.run(5)
        assert sim1.counters()["early_reads"] == early + 1
    finally:
        sim1.check_gates(False)
        sim1.set_port(PortBehaviour())
        sim1.reset()
        src.free()
        dst.free()


def test_the_gate_check_counts_a_clock_that_leaves_work_to_a_second_evaluation(sim1):
    """The harness runs each of Verilator's scheduler regions once per clock;
    ``SimTransport.check_gates`` counts a clock after which a second round of them would
    find work: here an edge of ap_clk left unevaluated (a test instrument). Sound clocks
    count nothing."""
    device = _fresh(sim1)
    data = gen(40, 24, subsampling=2, quality=85)
    src, dst = sim1.allocate(len(data), writable=False), sim1.allocate(_cap(data))
    src.array[:] = np.frombuffer(data, np.uint8)
    assert device.submit(8, src.device_address, len(data), dst.device_address, _cap(data))

    def counts():
        c = sim1.counters()
        return c["unfinished"], c["early_reads"]

    sim1.check_gates()
    try:
        start = counts()
        sim1.run(30)
        assert counts() == start
        sim1._lib.dlb_test_unevaluated_edge(sim1._h)
        sim1.run(1)
        assert counts() == (start[0] + 1, start[1])
        sim1.run(5)
        assert counts() == (start[0] + 1, start[1])
    finally:
        sim1.check_gates(False)
        sim1.reset()
        src.free()
        dst.free()


def test_a_register_access_the_device_does_not_answer_is_withdrawn(sim1):
    """A register write or read the slave does not answer (the device held in reset:
    ap_rst_n driven low by the test instrument, then clocks run) raises, and the host's
    master withdraws it: the write does not land once the device is out of reset, and the
    read does not leave a response behind that would stop the slave from taking another."""
    _fresh(sim1)
    default = sim1.read32(Reg.WATCHDOG)
    try:
        for access in (lambda: sim1.write32(Reg.WATCHDOG, 1234), lambda: sim1.read32(Reg.ID)):
            sim1._lib.dlb_test_unsettled_reset(sim1._h, 0)
            sim1.run(3)
            with pytest.raises(RuntimeError, match="no answer"):
                access()
            sim1.reset()
            sim1.run(10)
            assert sim1.read32(Reg.WATCHDOG) == default
            sim1.write32(Reg.WATCHDOG, 99)
            assert sim1.read32(Reg.WATCHDOG) == 99
            assert sim1.read32(Reg.ID) == MAGIC
            sim1.reset()
    finally:
        sim1.reset()


def test_cli_bench_device_with_and_without_clock_gating(tmp_path, capsys):
    """``dlbooster bench device`` runs the gated simulation build by default and the
    boards' design with ``--no-clock-gating``: the same device clocks, no image differing
    from Pillow's, and the choice recorded in the JSON."""
    from dlbooster.cli import main

    for i, (w, h, sub) in enumerate(((48, 32, 2), (40, 24, 1), (33, 17, 0))):
        (tmp_path / f"{i}.jpg").write_bytes(gen(w, h, subsampling=sub, quality=85))
    results = []
    for flag in ([], ["--no-clock-gating"]):
        out = tmp_path / f"bench{len(flag)}.json"
        assert main(["bench", "device", "--lanes", "1", "--max-width", str(WIDTH), *flag, "--json", str(out),
                     str(tmp_path)]) == 0
        results.append(json.loads(out.read_text()))
    assert "M clocks/s" in capsys.readouterr().out
    gated, plain = results
    assert (gated["clock_gating"], plain["clock_gating"]) == (True, False)
    (a,), (b,) = gated["configs"], plain["configs"]
    assert a["images"] == b["images"] == 3
    assert a["device_clocks"] == b["device_clocks"] > 0
    assert a["differ_from_pillow"] == b["differ_from_pillow"] == 0
