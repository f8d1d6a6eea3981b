"""The whole decoder lane in the Amaranth simulator: JPEG bytes in, RGB out, byte for
byte equal to ``PIL.Image.open(f).convert("RGB")``; unsupported and damaged files end
with their status code and the next file decodes normally."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from amaranth.sim import Simulator
from PIL import Image

from dlbooster import jpeg

from dlbooster.jpeg import model
from dlbooster.hw.headers import HeaderStatus
from dlbooster.hw.entropy import Status
from dlbooster.hw.lane import STATUS_ENTROPY, Lane, status_reason

from jpegtools import gen, one_code_tables_jpeg, segment


def run_lane(files: list[bytes], max_width: int = 64, seed: int = 1, ready_percent: int = 100,
             back_to_back: bool = False):
    """Decode files one after another; per file (status, pixels uint8 (N, 3), row ends).

    With ``back_to_back`` the next file's beats are offered as soon as the previous file's
    last beat was taken (the lane must hold them off until ``done``); else only after
    ``done`` and three idle clocks.
    """
    dut = Lane(max_width=max_width, lanes=4)
    rng = random.Random(seed)
    results = []
    beats = [(k, data[i:i + 4], i + 4 >= len(data)) for k, data in enumerate(files)
             for i in range(0, len(data), 4)]
    bound = sum(64 * len(data) + 20000 for data in files)

    async def bench(ctx):
        pixels, row_ends, idle, clocks = [], [], 0, 0
        while len(results) < len(files):
            offer = (bool(beats) and rng.random() < 0.9 and idle == 0
                     and (back_to_back or beats[0][0] == len(results)))
            if offer:
                _, chunk, last = beats[0]
                ctx.set(dut.input.payload, {"data": int.from_bytes(chunk, "little"),
                                            "n": len(chunk), "last": last})
            ctx.set(dut.input.valid, offer)
            ready = rng.random() * 100 < ready_percent
            ctx.set(dut.o.ready, ready)
            if ready and ctx.get(dut.o.valid):
                o = ctx.get(dut.o.payload)
                pixels += [[o.rgb[k][c] for c in range(3)] for k in range(o.n)]
                if o.row_end:
                    row_ends.append(len(pixels))
            done = ctx.get(dut.done)
            status = ctx.get(dut.status)
            took = offer and ctx.get(dut.input.ready)
            await ctx.tick()
            clocks += 1
            idle = max(0, idle - 1)
            if took:
                beats.pop(0)
            if done:
                assert not beats or beats[0][0] > len(results), \
                    "the lane ended an image before taking all of its bytes"
                results.append((status, np.array(pixels, dtype=np.uint8).reshape(-1, 3), row_ends))
                pixels, row_ends = [], []
                idle = 0 if back_to_back else 3
            assert clocks < bound, "lane stuck"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return results


def _pillow(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _assert_pillow(data: bytes, result):
    status, pixels, row_ends = result
    ref = _pillow(data)
    h, w = ref.shape[:2]
    assert status == 0
    assert pixels.shape == (h * w, 3)
    assert np.array_equal(pixels.reshape(h, w, 3), ref)
    assert row_ends == [w * (r + 1) for r in range(h)]


def test_every_sampling_equals_pillow():
    files = [
        gen(16, 16, subsampling=2, quality=85),
        gen(17, 9, subsampling=1, quality=60, optimize=True),
        gen(23, 19, subsampling="gray", quality=90),
        gen(35, 27, subsampling=2, quality=30, restart_blocks=2),
        gen(24, 17, subsampling="440", quality=80),
        gen(33, 17, subsampling=0, quality=100),
        gen(2, 3, subsampling=2, quality=75),
        gen(1, 1, subsampling=1, quality=75),
    ]
    for data, result in zip(files, run_lane(files, ready_percent=70)):
        _assert_pillow(data, result)


def _entropy_fault(data: bytes) -> bytes:
    """Random bytes in place of the entropy-coded data: the model reports a fault."""
    info = jpeg.parse(data)
    scan = info.scans[0]
    rng = random.Random(4)
    body = bytes(rng.choice([0xFF, 0x00, 0xA5, 0x3C]) for _ in range(scan.data_end - scan.data_start))
    return data[:scan.data_start] + body + data[scan.data_end:]


@pytest.mark.parametrize("back_to_back", [False, True], ids=["after_done", "back_to_back"])
def test_stops_and_recovers(back_to_back):
    """Stops of each kind with good files between them; back to back, a 100-byte file
    arrives while the image before it still has a band of rows to put out (slowly)."""
    good = gen(20, 12, subsampling=2, quality=70)
    progressive = gen(16, 16, subsampling=2, progressive=True)
    too_wide = gen(80, 8, subsampling=0, quality=70)
    faulty = _entropy_fault(gen(24, 24, subsampling=0, quality=90))
    files = [progressive, good, too_wide, good, faulty, good]
    if back_to_back:
        files += [gen(64, 32, subsampling=0, quality=95), one_code_tables_jpeg()]
    results = run_lane(files, seed=3, back_to_back=back_to_back, ready_percent=20 if back_to_back else 100)
    assert len(results) == len(files)
    for k in range(6, len(files)):
        _assert_pillow(files[k], results[k])
    assert results[0][0] == HeaderStatus.PROGRESSIVE and len(results[0][1]) == 0
    assert results[2][0] == HeaderStatus.WIDTH
    assert results[4][0] & 0xF0 == STATUS_ENTROPY and results[4][0] != STATUS_ENTROPY
    for k in (1, 3, 5):
        _assert_pillow(good, results[k])


def test_scan_ending():
    """After the last MCU the hardware accepts padding, leftover bytes and RSTn markers up
    to EOI (and anything after EOI), like classify(); any other ending is ``after-scan``."""
    good = gen(20, 12, subsampling=2, quality=70)
    assert good.endswith(b"\xff\xd9")
    body = good[:-2]
    dht = segment(0xC4, bytes([0x00, 1] + [0] * 15 + [0]))
    after_scan = STATUS_ENTROPY | Status.AFTER_SCAN
    endings = {   # name: (file, lane status, classify's reason)
        "rst_then_eoi": (body + b"\xff\xd0\xff\xff\xd9", 0, None),
        "padding_then_eoi": (body + b"\x12\x34\xff\x00\xff\xd9", 0, None),
        "trailing_after_eoi": (good + b"\x00\xff\xc4junk" * 3, 0, None),
        "no_eoi": (body, after_scan, "after-scan"),
        "table_after_scan": (body + dht + b"\xff\xd9", after_scan, "after-scan"),
        "second_sos": (body + segment(0xDA, b"\x01\x01\x00\x00\x3f\x00") + b"\xff\xd9",
                       after_scan, "multi-scan"),
    }
    files = [data for data, _, _ in endings.values()] + [good]
    results = run_lane(files, seed=5)
    for (name, (data, expect, reason)), result in zip(endings.items(), results):
        assert result[0] == expect, name
        assert jpeg.classify(jpeg.parse(data)) == reason, name
        if expect == 0:
            _assert_pillow(data, result)
        else:
            assert status_reason(result[0]) == "after-scan"
    _assert_pillow(good, results[-1])


def test_status_reasons_match_host():
    assert {s.reason for s in Status if s} == set(model.STATUS_REASONS.values()) | {"after-scan"}
    for s in Status:
        if s:
            assert s.reason == model.STATUS_REASONS.get(s, "after-scan")
            assert status_reason(STATUS_ENTROPY | s) == s.reason
    assert status_reason(HeaderStatus.MALFORMED) == "malformed-header"
    assert status_reason(HeaderStatus.NON_INTERLEAVED) == "non-interleaved"
    assert status_reason(0x30) == "idct-range" and status_reason(0) is None
    with pytest.raises(ValueError):
        status_reason(0x17)
