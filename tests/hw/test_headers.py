"""Amaranth-simulator tests of the header parser core against the host parser, and of
its components (marker scanner, APPn, DQT, DHT, SOF and DRI/SOS parsers) on crafted
segments.

Files: Pillow/simplejpeg encodes of a real photo in every supported sampling, restart
intervals, optimised tables, 16-bit DQT; crafted ones for every stop code (progressive,
RGB, CMYK, 4:1:1, too wide, missing and bad tables, EOI before SOS, height 0, truncated,
not a JPEG); and a feature-covering corpus subset when the corpus is present. For a
hardware-decodable file the parser must load exactly the scan's Huffman tables, the
components' quantisation tables in natural order, the :data:`ScanConfig` of
:func:`dlbooster.hw.entropy.scan_program`, and forward every byte after the SOS header;
otherwise it must stop with the code for the host's reason and drain the whole file.
Each component is driven through its own ports: the scanner by a file's bytes with
stand-in parsers on its segment ports, each parser by a stand-in scanner that plays
one segment's bytes.
"""

from __future__ import annotations

import io
import random

import pytest
from amaranth.sim import Simulator
from PIL import Image

from dlbooster import jpeg
from dlbooster.hw.app import AppParser
from dlbooster.hw.dht import DhtParser
from dlbooster.hw.dqt import DqtParser
from dlbooster.hw.entropy import scan_program
from dlbooster.hw.headers import HeaderParser, HeaderStatus
from dlbooster.hw.markers import APP0, APP14, MarkerScanner
from dlbooster.hw.sof import SofParser
from dlbooster.hw.sos import ScanParser
from dlbooster.hw.t81 import ZIGZAG, Marker

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


# ---------------------------------------------------------------------------------
# Components


def simulate(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


async def new_file(ctx, seg):
    """The scanner's ``first`` pulse: a file begins."""
    ctx.set(seg.first, 1)
    await ctx.tick()
    ctx.set(seg.first, 0)


async def feed_segment(ctx, seg, marker: int, payload: bytes, after: bytes = b"\xff\xd9",
                       each_clock=None, length: int | None = None):
    """Play the marker scanner's side of a SegmentBytes port for one segment of
    ``length`` bytes (default: the payload's) whose payload is followed by ``after`` and
    then the end of the file; ``each_clock(ctx)`` runs before each clock edge. Returns
    ("done" or the HeaderStatus of the fault, the (index, byte) of each byte taken)."""
    file = payload + after
    length = len(payload) if length is None else length
    pos = index = 0
    taken = []
    ctx.set(seg.marker, marker)
    ctx.set(seg.active, 1)
    for _ in range(20 * len(file) + 20):
        ctx.set(seg.valid, pos < len(file))
        ctx.set(seg.end, pos >= len(file))
        ctx.set(seg.byte, file[pos] if pos < len(file) else 0)
        ctx.set(seg.more, pos < length)
        ctx.set(seg.remaining, max(length - pos, 0))
        ctx.set(seg.index, index)
        if each_clock:
            each_clock(ctx)
        take, rewind = ctx.get(seg.take), ctx.get(seg.rewind)
        assert not take or (pos < length and pos < len(file)), "took a byte it was not given"
        outcome = None
        if ctx.get(seg.fail):
            outcome = HeaderStatus(ctx.get(seg.status))
        elif ctx.get(seg.done):
            assert pos == length
            outcome = "done"
        await ctx.tick()
        if take:
            taken.append((index, file[pos]))
            pos += 1
            index = 0 if rewind else min(index + 1, 511)
        if outcome is not None:
            ctx.set(seg.active, 0)
            return outcome, taken
    raise AssertionError("the segment never ended")


class StandIns:
    """Stand-in parsers on every segment port of a MarkerScanner: each takes its
    segment's bytes, logging (port, marker, index, remaining, byte), and is done at its
    end; ``faults`` maps (port, byte) to the status a parser fails with on that byte."""

    PORTS = ("app", "dqt", "dht", "sof", "dri", "sos")

    def __init__(self, dut, faults=None):
        self.dut, self.faults, self.log = dut, faults or {}, []

    def drive(self, ctx):
        for name in self.PORTS:
            seg = getattr(self.dut, name)
            for member in (seg.take, seg.done, seg.fail, seg.status):
                ctx.set(member, 0)
            if not ctx.get(seg.active):
                continue
            valid, more, byte = ctx.get(seg.valid), ctx.get(seg.more), ctx.get(seg.byte)
            if valid and more and (name, byte) in self.faults:
                ctx.set(seg.fail, 1)
                ctx.set(seg.status, self.faults[name, byte])
            elif valid and more:
                ctx.set(seg.take, 1)
                self.log.append((name, ctx.get(seg.marker), ctx.get(seg.index),
                                 ctx.get(seg.remaining), byte))
            elif not more:
                ctx.set(seg.done, 1)


def scan_markers(files: list[bytes], frame: bool = False, faults=None):
    """Run a MarkerScanner over files back to back (``start`` after each outcome);
    per file its outcome ("done" or a HeaderStatus), the stand-ins' log, the clocks of
    ``first`` and the bytes taken."""
    dut = MarkerScanner()
    results = []

    async def bench(ctx):
        ctx.set(dut.frame, frame)
        for data in files:
            stand_ins = StandIns(dut, faults)
            pos, firsts, outcome = 0, [], None
            for clock in range(20 * len(data) + 20):
                ctx.set(dut.bytes.valid, pos < len(data))
                ctx.set(dut.bytes.end, pos >= len(data))
                ctx.set(dut.bytes.byte, data[pos] if pos < len(data) else 0)
                stand_ins.drive(ctx)
                if ctx.get(dut.app.first):
                    firsts.append(clock)
                assert ctx.get(dut.busy) == (pos < len(data) or clock > 0)
                if ctx.get(dut.fail):
                    outcome = HeaderStatus(ctx.get(dut.status))
                elif ctx.get(dut.done):
                    outcome = "done"
                take = ctx.get(dut.bytes.take)
                await ctx.tick()
                pos += take
                if outcome is not None:
                    break
            # Stopped: nothing is taken, nothing is busy, until start.
            stand_ins.drive(ctx)
            assert not ctx.get(dut.bytes.take) and not ctx.get(dut.busy)
            await ctx.tick()
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            results.append((outcome, stand_ins.log, firsts, pos))

    simulate(dut, bench)
    return results


def test_marker_scanner_hands_each_segment_to_its_parser():
    data = bytes.fromhex("ffd8"              # SOI
                         "ffffe10004aabb"    # a fill byte, APP1 with 2 payload bytes
                         "ffd0"              # RST0: no segment
                         "ffdb0003cc"        # DQT, 1 byte
                         "ffdd00040010"      # DRI
                         "ffc0000308"        # SOF0, 1 byte
                         "ffda0002")         # SOS, empty
    (outcome, log, firsts, taken), = scan_markers([data])
    assert outcome == "done" and firsts == [0] and taken == len(data)
    assert log == [("app", 0xE1, 0, 2, 0xAA), ("app", 0xE1, 1, 1, 0xBB),
                   ("dqt", Marker.DQT, 0, 1, 0xCC),
                   ("dri", Marker.DRI, 0, 2, 0x00), ("dri", Marker.DRI, 1, 1, 0x10),
                   ("sof", Marker.SOF0, 0, 1, 0x08)]


def test_marker_scanner_stop_codes_and_restart():
    soi = b"\xff\xd8"
    cases = [
        (b"\x00\xd8", HeaderStatus.NOT_JPEG, 1),
        (b"\xff\xd9", HeaderStatus.NOT_JPEG, 2),
        (b"\xff", HeaderStatus.NOT_JPEG, 1),                  # the file ends in SOI
        (soi + b"\xff\xc2", HeaderStatus.PROGRESSIVE, 4),
        (soi + b"\xff\xcb", HeaderStatus.LOSSLESS, 4),
        (soi + b"\xff\xc5", HeaderStatus.HIERARCHICAL, 4),
        (soi + b"\xff\xcc", HeaderStatus.ARITHMETIC, 4),      # DAC
        (soi + b"\xff\xdc", HeaderStatus.DNL, 4),
        (soi + b"\xff\xd9", HeaderStatus.NO_SCAN, 4),
        (soi + b"\xff\xc8", HeaderStatus.MALFORMED, 4),       # JPG: reserved
        (soi + b"\x12", HeaderStatus.MALFORMED, 3),            # junk between segments
        (soi + b"\xff\xe0\x00\x01", HeaderStatus.MALFORMED, 6),  # length below 2
        (soi + b"\xff\xdd\x00\x05", HeaderStatus.MALFORMED, 6),  # DRI not 4 bytes long
        (soi + b"\xff\xe0\x00", HeaderStatus.MALFORMED, 5),       # the file ends in a length
    ]
    files = [data for data, _, _ in cases] + [soi + b"\xff\xda\x00\x02"]
    results = scan_markers(files)
    for (data, status, taken), (outcome, log, firsts, pos) in zip(cases, results):
        assert (outcome, pos, firsts) == (status, taken, [0]), data.hex()
    assert results[-1][0] == "done"      # the scanner reads again after start


def test_marker_scanner_second_frame_and_parser_faults():
    sof = b"\xff\xd8\xff\xc1\x00\x03\x08"
    (outcome, log, _, pos), = scan_markers([sof], frame=True)
    assert (outcome, log, pos) == (HeaderStatus.MALFORMED, [], 6)    # at its length
    dqt = b"\xff\xd8\xff\xdb\x00\x04\x11\xee\x22"
    (outcome, log, _, pos), = scan_markers([dqt], faults={("dqt", 0xEE): HeaderStatus.BAD_TABLE})
    assert (outcome, log, pos) == (HeaderStatus.BAD_TABLE, [("dqt", Marker.DQT, 0, 2, 0x11)], 7)


def test_app_parser_notes_jfif_and_adobe():
    jfif = b"JFIF\0\x01\x02\x00\x00\x01\x00\x01\x00\x00"          # 14 bytes
    adobe = b"Adobe\x00\x64\x00\x00\x00\x00\x01"                       # transform 1
    dut = AppParser()
    seen = []

    async def bench(ctx):
        for marker, payload in [(APP0, jfif), (APP0, jfif[:13]), (Marker.COM, jfif),
                                (APP14, adobe), (APP14, adobe[:11] + b"\x00more")]:
            await new_file(ctx, dut.segment)
            outcome, taken = await feed_segment(ctx, dut.segment, marker, payload)
            assert (outcome, taken) == ("done", list(enumerate(payload)))
            seen.append((ctx.get(dut.jfif), ctx.get(dut.adobe), ctx.get(dut.untransformed)))
        # The file ends inside the segment.
        outcome, taken = await feed_segment(ctx, dut.segment, APP0, jfif[:6], after=b"", length=14)
        seen.append((outcome, len(taken)))

    simulate(dut, bench)
    assert seen[:5] == [(1, 0, 0), (0, 0, 0), (0, 0, 0), (0, 1, 0), (0, 1, 1)]
    assert seen[5] == (HeaderStatus.MALFORMED, 6)


async def read_quant(ctx, dut, tq: int) -> list[int]:
    """Table ``tq`` of a DqtParser's memory, in natural order, through its read port."""
    values = []
    for n in range(64):
        ctx.set(dut.read_addr, (tq << 6) | n)
        ctx.set(dut.read_en, 1)
        await ctx.tick()
        values.append(ctx.get(dut.read_data))
    ctx.set(dut.read_en, 0)
    return values


def test_dqt_parser_loads_tables_in_natural_order():
    eight = bytes(range(1, 65))                              # zigzag entry k holds k + 1
    sixteen = [300 + 2 * k for k in range(64)]
    sixteen[5] = 40000                                       # above 32767: a bad table
    payload = (b"\x00" + eight + b"\x13"
               + b"".join(v.to_bytes(2, "big") for v in sixteen))
    dut = DqtParser()
    got = {}

    async def bench(ctx):
        await new_file(ctx, dut.segment)
        outcome, taken = await feed_segment(ctx, dut.segment, Marker.DQT, payload)
        assert (outcome, len(taken)) == ("done", len(payload))
        assert [i for i, _ in taken[:3]] == [0, 0, 1]        # each table's byte rewinds
        got["flags"] = (ctx.get(dut.defined), ctx.get(dut.bad))
        got[0] = await read_quant(ctx, dut, 0)
        got[3] = await read_quant(ctx, dut, 3)
        # A good load of table 3 clears its bad bit; a new file clears every flag.
        outcome, _ = await feed_segment(ctx, dut.segment, Marker.DQT, b"\x03" + eight)
        got["reload"] = (outcome, ctx.get(dut.defined), ctx.get(dut.bad))
        await new_file(ctx, dut.segment)
        got["cleared"] = (ctx.get(dut.defined), ctx.get(dut.bad))

    simulate(dut, bench)
    assert got["flags"] == (0b1001, 0b1000)
    assert got[0][:3] == [1, 2, 6] and got[0][8] == 3 and got[0][63] == 64
    assert [got[0][ZIGZAG[k]] for k in range(64)] == list(eight)
    assert [got[3][ZIGZAG[k]] for k in range(64)] == sixteen
    assert got[3][ZIGZAG[5]] == 40000
    assert got["reload"] == ("done", 0b1001, 0) and got["cleared"] == (0, 0)


def test_dqt_parser_faults():
    dut = DqtParser()
    outcomes = []

    async def bench(ctx):
        for payload, after in [(b"\x20" + bytes(64), b"\xff\xd9"),    # Pq 2
                               (b"\x04" + bytes(64), b"\xff\xd9"),    # Tq 4
                               (b"\x00" + bytes(10), b"\xff\xd9"),    # ends inside a table
                               (b"\x00" + bytes(10), b"")]:            # so does the file
            outcome, taken = await feed_segment(ctx, dut.segment, Marker.DQT, payload, after)
            outcomes.append((outcome, len(taken)))
        outcome, taken = await feed_segment(ctx, dut.segment, Marker.DQT, b"\x00" + bytes(10), b"",
                                            length=65)                  # the file ends first
        outcomes.append((outcome, len(taken)))
        outcome, taken = await feed_segment(ctx, dut.segment, Marker.DQT, b"\x11" + bytes(128))
        outcomes.append((outcome, len(taken)))   # back at a table's first byte after faults

    simulate(dut, bench)
    malformed = HeaderStatus.MALFORMED
    assert outcomes == [(malformed, 1), (malformed, 1), (malformed, 11), (malformed, 11),
                        (malformed, 11), ("done", 129)]


def dht_table(tc: int, th: int, counts: list[int], symbols: list[int]) -> bytes:
    return bytes([tc << 4 | th, *counts, *symbols])


def test_dht_parser_streams_tables_and_checks_them():
    good = dht_table(0, 1, [0, 1, 2] + [0] * 13, [5, 6, 7])
    full = dht_table(1, 0, [2] + [0] * 15, [0x01, 0x02])      # "1" is all ones: bad
    big_dc = dht_table(0, 2, [1] + [0] * 15, [16])            # a DC symbol above 15: bad
    empty = dht_table(1, 3, [0] * 16, [])
    deep = dht_table(1, 1, [1] * 16, list(range(16)))                # one code of each length
    deep_full = dht_table(1, 2, [1] * 15 + [2], list(range(17)))     # the 16-bit ones: bad
    dut = DhtParser()
    rng = random.Random(3)
    writes, got = [], {}

    def tables(ctx):
        ctx.set(dut.tables.ready, rng.random() < 0.6)
        if ctx.get(dut.tables.valid) and ctx.get(dut.tables.ready):
            w = ctx.get(dut.tables.payload)
            writes.append((w.table, w.index, w.byte))

    async def bench(ctx):
        await new_file(ctx, dut.segment)
        outcome, taken = await feed_segment(ctx, dut.segment, Marker.DHT, good + full, each_clock=tables)
        got["first"] = (outcome, len(taken), ctx.get(dut.defined), ctx.get(dut.bad))
        outcome, taken = await feed_segment(ctx, dut.segment, Marker.DHT, big_dc + empty, each_clock=tables)
        got["second"] = (outcome, len(taken), ctx.get(dut.defined), ctx.get(dut.bad))
        outcome, taken = await feed_segment(ctx, dut.segment, Marker.DHT, deep + deep_full, each_clock=tables)
        got["third"] = (outcome, len(taken), ctx.get(dut.defined), ctx.get(dut.bad))

    simulate(dut, bench)
    assert got["first"] == ("done", 39, 0b0001_0010, 0b0001_0000)
    assert got["second"] == ("done", 35, 0b1001_0110, 0b0001_0100)
    assert got["third"] == ("done", 33 + 34, 0b1111_0110, 0b0101_0100)
    expected = [(1, i, b) for i, b in enumerate(good[1:])] + [(4, i, b) for i, b in enumerate(full[1:])]
    expected += [(2, i, b) for i, b in enumerate(big_dc[1:])] + [(7, i, 0) for i in range(16)]
    expected += [(5, i, b) for i, b in enumerate(deep[1:])] + [(6, i, b) for i, b in enumerate(deep_full[1:])]
    assert writes == expected


def test_dht_parser_faults():
    dut = DhtParser()
    outcomes = []

    async def bench(ctx):
        ctx.set(dut.tables.ready, 1)
        for payload in [dht_table(2, 0, [0] * 16, []),                 # Tc 2
                        dht_table(0, 4, [0] * 16, []),                 # Th 4
                        dht_table(1, 0, [17] * 16, []),                # 272 symbols
                        dht_table(1, 0, [3] + [0] * 15, [1, 2])]:      # ends inside the symbols
            outcome, taken = await feed_segment(ctx, dut.segment, Marker.DHT, payload)
            outcomes.append((outcome, len(taken)))
        outcome, taken = await feed_segment(ctx, dut.segment, Marker.DHT, dht_table(0, 0, [1] + [0] * 15, [0]))
        outcomes.append((outcome, len(taken), ctx.get(dut.defined)))

    simulate(dut, bench)
    malformed = HeaderStatus.MALFORMED
    assert outcomes == [(malformed, 1), (malformed, 1), (malformed, 17), (malformed, 19),
                        ("done", 18, 0b1)]


def sof_payload(precision=8, height=0x0123, width=0x0456, comps=((1, 0x22, 0), (2, 0x11, 1), (3, 0x11, 1)),
                nf=None) -> bytes:
    nf = len(comps) if nf is None else nf
    return bytes([precision, height >> 8, height & 255, width >> 8, width & 255, nf,
                  *(b for comp in comps for b in comp)])


def test_sof_parser_reads_the_frame():
    dut = SofParser()
    got = []

    def frame(ctx):
        f = dut.frame
        return (ctx.get(f.valid), ctx.get(f.width), ctx.get(f.height), ctx.get(f.nf),
                [ctx.get(x) for x in f.id], [ctx.get(x) for x in f.h], [ctx.get(x) for x in f.v],
                [ctx.get(x) for x in f.tq])

    async def bench(ctx):
        await new_file(ctx, dut.segment)
        got.append(await feed_segment(ctx, dut.segment, Marker.SOF0, sof_payload()))
        got.append(frame(ctx))
        await new_file(ctx, dut.segment)
        got.append(frame(ctx)[0])
        got.append(await feed_segment(ctx, dut.segment, Marker.SOF1,
                                      sof_payload(height=16, width=8, comps=((9, 0x13, 2),))))
        got.append(frame(ctx))

    simulate(dut, bench)
    assert got[0][0] == "done" and [i for i, _ in got[0][1]] == list(range(15))
    assert got[1] == (1, 0x0456, 0x0123, 3, [1, 2, 3], [2, 1, 1], [2, 1, 1], [0, 1, 1])
    assert got[2] == 0
    assert got[3][0] == "done"
    assert got[4][:4] == (1, 8, 16, 1) and got[4][4][0] == 9 and got[4][5][0] == 1
    assert got[4][6][0] == 3 and got[4][7][0] == 2


def test_sof_parser_faults():
    dut = SofParser()
    outcomes = []
    four = ((1, 0x11, 0), (2, 0x11, 0), (3, 0x11, 0), (4, 0x11, 0))

    async def bench(ctx):
        for payload in [sof_payload(precision=12),
                        sof_payload(comps=four),
                        sof_payload(nf=1),                                # length not 6 + 3 Nf
                        sof_payload(comps=((1, 0x11, 4),)),               # Tq 4
                        sof_payload()[:5]]:                               # no Nf
            outcome, taken = await feed_segment(ctx, dut.segment, Marker.SOF0, payload)
            outcomes.append((outcome, len(taken)))

    simulate(dut, bench)
    assert outcomes == [(HeaderStatus.PRECISION, 6), (HeaderStatus.COMPONENTS, 6),
                        (HeaderStatus.MALFORMED, 6), (HeaderStatus.MALFORMED, 9),
                        (HeaderStatus.MALFORMED, 5)]


def test_scan_parser_reads_restart_interval_and_scan_tables():
    dut = ScanParser()
    got = []

    async def bench(ctx):
        ctx.set(dut.frame.valid, 1)
        ctx.set(dut.frame.nf, 3)
        for c, ident in enumerate([1, 2, 3]):
            ctx.set(dut.frame.id[c], ident)
        await new_file(ctx, dut.dri)
        got.append(await feed_segment(ctx, dut.dri, Marker.DRI, b"\x01\x20"))
        got.append(ctx.get(dut.restart))
        got.append(await feed_segment(ctx, dut.sos, Marker.SOS, bytes([3, 1, 0x00, 2, 0x13, 3, 0x21, 0, 63, 0])))
        got.append(([ctx.get(x) for x in dut.dc], [ctx.get(x) for x in dut.ac]))
        await new_file(ctx, dut.dri)
        got.append(ctx.get(dut.restart))

    simulate(dut, bench)
    assert got[0] == ("done", [(0, 0x01), (1, 0x20)]) and got[1] == 0x0120
    assert got[2][0] == "done" and len(got[2][1]) == 10
    assert got[3] == ([0, 1, 2], [0, 3, 1]) and got[4] == 0


def test_scan_parser_faults():
    dut = ScanParser()
    outcomes = []

    async def bench(ctx):
        ctx.set(dut.frame.nf, 3)
        for c, ident in enumerate([1, 2, 3]):
            ctx.set(dut.frame.id[c], ident)
        outcomes.append(await feed_segment(ctx, dut.sos, Marker.SOS, bytes([3, 1, 0, 2, 0, 3, 0, 0, 63, 0])))
        ctx.set(dut.frame.valid, 1)
        for payload in [bytes([1, 1, 0x00, 0, 63, 0]),                     # one component of 3
                        bytes([3, 2, 0x00, 1, 0x00, 3, 0x00, 0, 63, 0]),   # not the frame's order
                        bytes([3, 1, 0x40, 2, 0x00, 3, 0x00, 0, 63, 0]),   # Td 4
                        bytes([3, 1, 0x00, 2, 0x00, 3, 0x00, 0, 63])]:     # length not 6 + 2 Ns
            outcome, taken = await feed_segment(ctx, dut.sos, Marker.SOS, payload)
            outcomes.append((outcome, len(taken)))
        outcome, taken = await feed_segment(ctx, dut.dri, Marker.DRI, b"\x00", after=b"", length=2)
        outcomes.append((outcome, len(taken)))                          # the file ends first
        outcome, taken = await feed_segment(ctx, dut.sos, Marker.SOS, bytes([3, 1, 0x00]), after=b"",
                                            length=10)
        outcomes.append((outcome, len(taken)))                          # the file ends first

    simulate(dut, bench)
    malformed = HeaderStatus.MALFORMED
    assert outcomes == [(malformed, []), (HeaderStatus.NON_INTERLEAVED, 1), (malformed, 2),
                        (malformed, 3), (malformed, 1), (malformed, 1), (malformed, 3)]
