"""Amaranth-simulator tests of the header parser core against the host parser.

Files: Pillow/simplejpeg encodes of a real photo in every supported sampling, restart
intervals, optimised tables, 16-bit DQT; crafted ones for every stop code (progressive,
RGB, CMYK, 4:1:1, too wide, missing and bad tables, EOI before SOS, height 0, truncated,
not a JPEG); and a feature-covering corpus subset when the corpus is present. For a
hardware-decodable file the parser must load exactly the scan's Huffman tables, the
components' quantisation tables in natural order, the :data:`ScanConfig` of
:func:`dlbooster.hw.entropy.scan_program`, and forward every byte after the SOS header;
otherwise it must stop with the code for the host's reason and drain the whole file.
"""

from __future__ import annotations

import io
import random

import pytest
from amaranth.sim import Simulator
from PIL import Image

from dlbooster import jpeg
from dlbooster.hw.entropy import scan_program
from dlbooster.hw.headers import HeaderParser, HeaderStatus

from jpegtools import CORPUS_DIR, corpus_rows, feature_subset, gen, photo_crop, segment

#: classify() reason -> the parser's stop code.
REASONS = {s.reason: s for s in HeaderStatus if s not in (HeaderStatus.OK, HeaderStatus.MALFORMED)}


def test_stop_codes_name_classify_reasons():
    assert set(REASONS) | {HeaderStatus.MALFORMED.reason} <= jpeg.REASONS
    assert len(REASONS) == len(HeaderStatus) - 2


def parse_in_hardware(files: list[bytes], max_width: int = 8192, seed: int = 1):
    """Feed files back to back (4-byte beats, random gaps and back-pressure); returns per
    file a dict of status, info, table writes, quant writes, scan config, forwarded bytes."""
    dut = HeaderParser(max_width)
    rng = random.Random(seed)
    results = []

    async def bench(ctx):
        for data in files:
            beats = [data[i:i + 4] for i in range(0, len(data), 4)]
            res = {"tables": [], "quant": [], "entropy": bytearray(), "status": None}
            pending = list(beats)
            clocks = 0
            started = False
            while pending or res["status"] is None or (started and not res.get("ended")):
                offer = bool(pending) and rng.random() < 0.85
                if offer:
                    chunk = pending[0]
                    ctx.set(dut.input.payload, {"data": int.from_bytes(chunk, "little"),
                                                "n": len(chunk), "last": len(pending) == 1})
                ctx.set(dut.input.valid, offer)
                for port in (dut.tables, dut.quant, dut.entropy):
                    ctx.set(port.ready, rng.random() < 0.8)
                if ctx.get(dut.tables.valid) and ctx.get(dut.tables.ready):
                    w = ctx.get(dut.tables.payload)
                    res["tables"].append((w.table, w.index, w.byte))
                if ctx.get(dut.quant.valid) and ctx.get(dut.quant.ready):
                    q = ctx.get(dut.quant.payload)
                    res["quant"].append((q.comp, q.index, q.value))
                if ctx.get(dut.entropy.valid) and ctx.get(dut.entropy.ready):
                    e = ctx.get(dut.entropy.payload)
                    res["entropy"] += e.data.to_bytes(4, "little")[:e.n]
                    if e.last:
                        res["ended"] = True
                if ctx.get(dut.done):
                    assert res["status"] is None, "done pulsed twice"
                    res["status"] = HeaderStatus(ctx.get(dut.status))
                    started = bool(ctx.get(dut.start))
                    assert started == (res["status"] == HeaderStatus.OK)
                    info = ctx.get(dut.info)
                    res["info"] = (info.width, info.height)
                    scan = ctx.get(dut.scan)
                    res["scan"] = {"ncomp": scan.ncomp, "mcux": scan.mcux, "mcuy": scan.mcuy,
                                   "restart": scan.restart,
                                   "comp": [{"h": c.h, "v": c.v, "dc": c.dc, "ac": c.ac}
                                            for c in scan.comp]}
                took = offer and ctx.get(dut.input.ready)
                await ctx.tick()
                clocks += 1
                if took:
                    pending.pop(0)
                assert clocks < 4 * len(data) + 2000, f"parser stuck after {clocks} clocks"
            results.append(res)
            ctx.set(dut.input.valid, 0)
            for _ in range(3):   # back to idle before the next file
                assert not ctx.get(dut.done)
                await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return results


def _check(data: bytes, res: dict, max_width: int = 8192, full: bytes | None = None):
    """Compare with the host parser; ``full`` is the whole file when ``data`` is only its
    headers and the first scan bytes (the host then parses headers only)."""
    info = jpeg.parse(full, headers_only=True) if full is not None else jpeg.parse(data)
    reason = jpeg.classify(info, max_width=max_width, max_pixels=None)
    if reason is None:
        assert res["status"] == HeaderStatus.OK, res["status"]
        config, writes, start, end = scan_program(info)
        for c in range(config["ncomp"], 3):
            config["comp"][c] = res["scan"]["comp"][c]     # unused slots
        assert res["scan"] == config
        loaded = {}
        for table, index, byte in res["tables"]:
            if index == 0:
                loaded[table] = []
            loaded[table].append(byte)
        for w in writes:
            assert loaded[w["table"]][w["index"]] == w["byte"]
        for w in writes:
            n = sum(1 for x in writes if x["table"] == w["table"])
            assert len(loaded[w["table"]]) == n
        scan = info.scans[0]
        for c, comp in enumerate(info.frame.components):
            got = [v for cc, i, v in sorted(res["quant"]) if cc == c]
            assert got == [int(x) for x in scan.qtables[comp.tq]], f"component {c} quantiser"
        assert bytes(res["entropy"]) == data[scan.data_start:]
        assert res["info"] == (info.frame.width, info.frame.height)
    elif reason in REASONS and full is None:
        # Damage the host also saw (junk between segments, a bad segment) may stop the
        # parser before the frame that decides the host's reason.
        allowed = {REASONS[reason]} | ({HeaderStatus.MALFORMED} if info.error or info.junk_bytes else set())
        assert res["status"] in allowed, (reason, res["status"])
    elif reason in REASONS:
        # Corpus files: the parser reports the first problem it meets, the host its own
        # priority; what matters is that the lane does not decode the file.
        assert res["status"] != HeaderStatus.OK, reason
    # Other reasons are Pillow's header quirks, which the host's pre-screen decides.


def _strip(data: bytes, marker: int) -> bytes:
    info = jpeg.parse(data)
    for code, offset in info.markers:
        if code == marker:
            length = int.from_bytes(data[offset + 2:offset + 4], "big")
            return data[:offset] + data[offset + 2 + length:]
    raise AssertionError(f"no marker {marker:#x}")


def _supported_files() -> list[bytes]:
    return [
        gen(1, 1, subsampling=2, quality=75),
        gen(23, 19, subsampling="gray", quality=60),
        gen(33, 17, subsampling=0, quality=100, restart_blocks=2),
        gen(35, 27, subsampling=1, quality=90, optimize=True),
        gen(40, 24, subsampling=2, quality=5, restart_rows=1),
        gen(24, 16, subsampling="440", quality=80),
        gen(16, 16, subsampling=0, qtables=[[300 + i for i in range(64)]] * 2),
    ]


def test_supported_files_load_like_scan_program():
    files = _supported_files()
    for data, res in zip(files, parse_in_hardware(files)):
        _check(data, res)


def _big_quantisers() -> bytes:
    """16-bit DQT entries of 40000 (Pillow clamps to 32767, so patch the bytes)."""
    data = gen(16, 16, subsampling=0, qtables=[[32767] * 64] * 2)
    info = jpeg.parse(data)
    dqt = next(off for code, off in info.markers if code == 0xDB)
    end = dqt + 2 + int.from_bytes(data[dqt + 2:dqt + 4], "big")
    patched = data[:dqt] + data[dqt:end].replace(b"\x7f\xff", b"\x9c\x40") + data[end:]
    assert jpeg.classify(jpeg.parse(patched)) == "bad-table"
    return patched


def _crafted() -> list[tuple[bytes, HeaderStatus]]:
    base = gen(24, 16, subsampling=2, quality=75)
    rgb = io.BytesIO()
    photo_crop(16, 16).save(rgb, "JPEG", keep_rgb=True)
    cmyk = gen(16, 16, subsampling=0, quality=75, mode="CMYK")
    info = jpeg.parse(base)
    sof = next(off for code, off in info.markers if code == 0xC0)
    zero_height = base[:sof + 5] + b"\x00\x00" + base[sof + 7:]
    png = io.BytesIO()
    Image.new("RGB", (4, 4)).save(png, "PNG")
    return [
        (gen(24, 16, subsampling=2, progressive=True), HeaderStatus.PROGRESSIVE),
        (rgb.getvalue(), HeaderStatus.COLOR_TRANSFORM),
        (cmyk, HeaderStatus.COMPONENTS),
        (gen(32, 16, subsampling="411", quality=80), HeaderStatus.SAMPLING),
        (_strip(base, 0xC4), HeaderStatus.MISSING_TABLE),
        (_big_quantisers(), HeaderStatus.BAD_TABLE),
        (b"\xff\xd8" + segment(0xDB, b"\x00" + bytes(range(1, 65))) + b"\xff\xd9", HeaderStatus.NO_SCAN),
        (zero_height, HeaderStatus.DNL),
        (base[:sof + 6], HeaderStatus.MALFORMED),
        (png.getvalue(), HeaderStatus.NOT_JPEG),
    ]


def test_stop_codes_and_recovery():
    """Every unsupported file stops with its code and is drained; the next file (a good
    one after each) parses normally."""
    crafted = _crafted()
    good = gen(17, 9, subsampling=1, quality=70)
    files = [f for data, _ in crafted for f in (data, good)]
    results = parse_in_hardware(files, seed=5)
    for (data, code), res, res_good in zip(crafted, results[0::2], results[1::2]):
        assert res["status"] == code, (code, res["status"])
        assert not res["tables"] or code != HeaderStatus.NOT_JPEG
        _check(good, res_good)


def test_width_limit():
    data = gen(100, 8, subsampling=0, quality=75)
    res = parse_in_hardware([data], max_width=64)[0]
    assert res["status"] == HeaderStatus.WIDTH
    _check(data, parse_in_hardware([data], max_width=100)[0], max_width=100)


def test_corpus_subset():
    rows = [r for r in feature_subset(list(corpus_rows()), per_group=1, cap=40)
            if int(r["size"]) < 12000]
    if not rows:
        pytest.skip(f"corpus not present at {CORPUS_DIR}")
    files = [(CORPUS_DIR / r["path"]).read_bytes() for r in rows]
    for data, res in zip(files, parse_in_hardware(files, seed=9)):
        _check(data, res)


@pytest.mark.corpus
def test_corpus_all_headers():
    """Every corpus file's headers (and its first 64 scan bytes): same decision as the
    host's pre-screen, same tables and scan configuration when decodable."""
    rows = list(corpus_rows())
    if not rows:
        pytest.skip(f"corpus not present at {CORPUS_DIR}")
    cut, full = [], []
    for r in rows:
        data = (CORPUS_DIR / r["path"]).read_bytes()
        if not data:   # the runtime never sends an empty buffer to a lane
            continue
        info = jpeg.parse(data, headers_only=True)
        end = info.scans[0].data_start + 64 if info.scans else len(data)
        cut.append(data[:min(end, len(data), 200_000)])
        full.append(data)
    for start in range(0, len(cut), 200):
        for piece, whole, res in zip(cut[start:start + 200], full[start:start + 200],
                                     parse_in_hardware(cut[start:start + 200], seed=start)):
            _check(piece, res, full=whole)
