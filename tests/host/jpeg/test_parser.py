"""dlbooster.jpeg: parse() structure and classify() against the hardware profile."""

from __future__ import annotations

import dataclasses
import io
import struct
import warnings

import numpy as np
import pytest
from dlbooster import DecodeError, backends, jpeg
from dlbooster.jpeg import model
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from jpegtools import (
    PIL_SUBSAMPLING,
    SJ_SUBSAMPLING,
    assert_result_matches_pillow,
    corpus_paths,
    corpus_rows,
    drop_huffman,
    find_rst,
    fuzz_examples,
    gen,
    gif_bytes,
    make_jpeg,
    photo_crop,
    pillow_rgb,
    png_bytes,
    rescan,
    segment,
    segment_span,
)
from PIL import Image


def ss_id(s):
    return {0: "444", 1: "422", 2: "420"}.get(s, str(s))


def expected_factors(ss):
    """Luma (h, v) and label for a generator subsampling argument."""
    if ss == "gray":
        return None, "gray"
    return (PIL_SUBSAMPLING if isinstance(ss, int) else SJ_SUBSAMPLING)[ss]


def pillow_header(data: bytes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Image.open(io.BytesIO(data))


def offsets(info, marker):
    return [off for m, off in info.markers if m == marker]


def assert_fallback_consistent(data: bytes, reason: str):
    """classify() gives ``reason``; the model backend declines with it and the result
    equals Pillow (or is an error exactly where Pillow raises)."""
    info = jpeg.parse(data)
    assert jpeg.classify(info) == reason
    result = backends.decode_result(data, "model")
    if result.status == "fallback":
        assert result.reason == reason
    else:
        assert result.status == "error", result.status
    assert_result_matches_pillow(result, data, allow_status=("fallback",))
    return result


# =================================================================================
# parse(): structure of generated files

STRUCT_CASES = [(w, h, ss) for ss in (0, 1, 2, "440", "411", "gray")
                for w, h in [(1, 1), (17, 9), (640, 480)]]


@pytest.mark.parametrize("w,h,ss", STRUCT_CASES,
                         ids=[f"{w}x{h}-{ss_id(s)}" for w, h, s in STRUCT_CASES])
def test_parse_structure(w, h, ss):
    data = gen(w, h, subsampling=ss, quality=80)
    info = jpeg.parse(data)
    im = pillow_header(data)
    assert info.error is None and not info.not_jpeg
    assert info.size == len(data)
    frame = info.frame
    assert (frame.width, frame.height) == (w, h) == im.size
    assert frame.sof == 0 and frame.precision == 8
    factors, label = expected_factors(ss)
    assert info.subsampling == label
    if ss == "gray":
        assert len(frame.components) == 1
        assert info.color_space == "gray"
    else:
        assert len(frame.components) == 3
        assert (frame.components[0].h, frame.components[0].v) == factors
        assert all((c.h, c.v) == (1, 1) for c in frame.components[1:])
        assert (frame.hmax, frame.vmax) == factors
        assert info.color_space == "ycbcr"
    # Pillow's own view of the frame: (id, h, v, tq) per component.
    assert [(c.id, c.h, c.v, c.tq) for c in frame.components] == [tuple(t) for t in im.layer]
    # One interleaved scan over every component, tables present.
    assert len(info.scans) == 1
    scan = info.scans[0]
    assert [index for index, _, _ in scan.components] == list(range(len(frame.components)))
    for _index, td, ta in scan.components:
        assert td in scan.dc_tables and ta in scan.ac_tables
        assert scan.dc_tables[td].check(True) is None
        assert scan.ac_tables[ta].check(False) is None
        assert sum(scan.dc_tables[td].counts) == len(scan.dc_tables[td].symbols)
    assert scan.restart_interval == 0 and scan.restarts == 0
    # Quantisation tables in natural order, as Pillow reports them.
    assert set(scan.qtables) == set(im.quantization)
    for k, table in scan.qtables.items():
        assert table.shape == (64,)
        assert table.tolist() == list(im.quantization[k])
    # Entropy-coded segment: right after the SOS header, up to EOI.
    sos = offsets(info, 0xDA)
    assert len(sos) == 1
    assert scan.data_start == segment_span(data, sos[0])[1]
    assert scan.data_end == info.eoi == len(data) - 2
    assert data[info.eoi:] == b"\xff\xd9"
    assert info.trailing == 0 and info.junk_bytes == 0
    assert info.markers[-1] == (0xD9, len(data) - 2)
    assert info.markers[0][1] == 2
    assert info.jfif
    kinds = [m for m, _ in info.markers]
    assert 0xDB in kinds and 0xC4 in kinds and kinds.index(0xC0) < kinds.index(0xDA)
    assert jpeg.classify(info) == (None if label != "other" else "sampling")


def test_qtables_natural_order_against_pillow_zigzag():
    # A ramp in natural order must come back as the same ramp (Pillow writes the DQT in
    # zigzag order; parse() must undo it).
    ramp = [1 + i for i in range(64)]
    data = gen(16, 16, subsampling=0, qtables=[ramp, ramp[::-1]])
    info = jpeg.parse(data)
    assert info.scans[0].qtables[0].tolist() == ramp
    assert info.scans[0].qtables[1].tolist() == ramp[::-1]
    dqt = offsets(info, 0xDB)[0]
    assert list(data[dqt + 5: dqt + 5 + 64]) == [ramp[k] for k in jpeg.ZIGZAG]


@pytest.mark.parametrize("ss", (0, 2, "gray"), ids=ss_id)
def test_parse_16bit_qtables(ss):
    tables = [[300 + i for i in range(64)], [1000] * 63 + [32767]]
    data = gen(24, 24, subsampling=ss, qtables=tables[:1] if ss == "gray" else tables)
    info = jpeg.parse(data)
    im = pillow_header(data)
    for k, table in info.scans[0].qtables.items():
        assert table.tolist() == list(im.quantization[k]) == tables[k]
    assert jpeg.classify(info) is None


@pytest.mark.parametrize("ss", (0, 1, 2, "gray"), ids=ss_id)
@pytest.mark.parametrize("w,h,kw", [
    (100, 40, dict(restart_blocks=1)), (100, 40, dict(restart_blocks=3)),
    (100, 40, dict(restart_blocks=1000)), (77, 61, dict(restart_rows=1)),
    (77, 61, dict(restart_rows=2)),
], ids=["b1", "b3", "b1000", "r1", "r2"])
def test_parse_restart_intervals(ss, w, h, kw):
    data = gen(w, h, subsampling=ss, quality=70, **kw)
    info = jpeg.parse(data)
    frame = info.frame
    if ss == "gray":
        mcux, mcuy = -(-w // 8), -(-h // 8)
    else:
        mcux, mcuy = -(-w // (8 * frame.hmax)), -(-h // (8 * frame.vmax))
    interval = kw.get("restart_blocks") or kw["restart_rows"] * mcux
    scan = info.scans[0]
    assert scan.restart_interval == interval
    expected = -(-(mcux * mcuy) // interval) - 1
    assert scan.restarts == expected
    rst = find_rst(data, scan.data_start, scan.data_end)
    assert len(rst) == expected
    assert [data[o + 1] for o in rst] == [0xD0 + (i & 7) for i in range(expected)]
    assert scan.data_end == info.eoi
    assert jpeg.classify(info) is None


@pytest.mark.timeout(120)       # a hang guard: 2 MB of fill bytes took about 40 minutes
@pytest.mark.parametrize("backend", ["cpu", "model"])
def test_long_runs_of_fill_bytes_in_the_entropy_data(backend):
    """Fill bytes (T.81 B.1.1.2) before the EOI, before an RSTn, and at the very end of
    a file: the entropy data ends at the run's last 0xFF, and each image equals Pillow's
    (a run was once searched from each of its bytes, in time quadratic in its length)."""
    data = gen(53, 37, subsampling=2, quality=80, restart_blocks=2)
    scan = jpeg.parse(data).scans[0]
    run = b"\xff" * 2_000_000
    rst = find_rst(data, scan.data_start, scan.data_end)[0]
    before_eoi = data[:-2] + run + data[-2:]
    before_rst = data[:rst] + run + data[rst:]
    for padded in (before_eoi, before_rst):
        info = jpeg.parse(padded)
        assert info.error is None and info.scans[0].data_end == len(padded) - 2 == info.eoi
        assert info.scans[0].restarts == scan.restarts and info.scans[0].fill_before_stuffing == -1
        assert_result_matches_pillow(backends.decode_result(padded, backend), padded)
    cut = data[:-2] + run                   # no EOI: the data runs to the end of the file
    info = jpeg.parse(cut)
    assert info.scans[0].data_end == len(cut) and info.eoi == -1
    assert_result_matches_pillow(backends.decode_result(cut, backend), cut)


@pytest.mark.parametrize("backend", ["cpu", "model"])
def test_a_flood_of_scan_headers_stops_the_parse_at_max_scans(backend):
    """A file followed by 100,000 copies of its SOS segment (about 1.4 MB): the parse
    records MAX_SCANS scans and stops (each scan held its tables: 100 bytes of memory
    per input byte), and the outcome is Pillow's."""
    data = gen(24, 16, subsampling=2, quality=80)
    scan = jpeg.parse(data).scans[0]
    sos = data.index(b"\xff\xda")
    flood = data[:-2] + data[sos:scan.data_start] * 100_000 + data[-2:]
    info = jpeg.parse(flood)
    assert len(info.scans) == jpeg.MAX_SCANS and info.error == f"more than {jpeg.MAX_SCANS} scans"
    assert jpeg.classify(info) == "malformed-header"
    assert_result_matches_pillow(backends.decode_result(flood, backend), flood)


def test_a_dnl_after_the_scan_and_a_quantiser_slot_over_3_are_named_as_the_device_names_them():
    """A DNL segment after the scan of a frame with a height is ``after-scan`` (the
    device's entropy stage finds it there), not ``dnl`` (a height 0 or a DNL before the
    scan); a component's Tq of 4 is ``malformed-header`` (T.81 B.2.2: 0-3; the device's
    header parser checks the field), not ``missing-table``."""
    data = gen(24, 16, subsampling=2, quality=80)
    after = data[:-2] + segment(0xDC, struct.pack(">H", 16)) + data[-2:]
    assert jpeg.classify(jpeg.parse(after)) == "after-scan"
    sof = data.index(b"\xff\xc0")
    before = data[:sof] + segment(0xDC, struct.pack(">H", 16)) + data[sof:]
    assert jpeg.classify(jpeg.parse(before)) == "dnl"
    tq4 = bytearray(data)
    tq4[sof + 12] = 4                        # the first component's Tq
    assert jpeg.parse(bytes(tq4)).frame.components[0].tq == 4
    assert jpeg.classify(jpeg.parse(bytes(tq4))) == "malformed-header"


def test_parse_trailing_bytes():
    data = gen(33, 17, subsampling=2)
    for extra in (b"x", b"\x00" * 100, b"\xff\xd8\xff\xe0junk"):
        info = jpeg.parse(data + extra)
        assert info.eoi == len(data) - 2
        assert info.trailing == len(extra)
        assert jpeg.classify(info) is None
        result = backends.decode_result(data + extra, "model")
        assert result.status == "ok"
        assert_result_matches_pillow(result, data + extra)


def test_parse_app_and_com_segments_are_skipped():
    # APPn segments of every size (incl. >= 256 bytes) and COM do not disturb the frame.
    base = gen(40, 24, subsampling=2)
    extra = (segment(0xE1, b"Exif\x00\x00" + bytes(300)) + segment(0xFE, b"hello")
             + segment(0xE5, bytes(range(256)) * 4) + segment(0xED, b""))
    data = base[:2] + extra + base[2:]
    info = jpeg.parse(data)
    assert info.error is None
    kinds = [m for m, _ in info.markers]
    assert kinds[:4] == [0xE1, 0xFE, 0xE5, 0xED]
    assert jpeg.classify(info) is None
    result = backends.decode_result(data, "model")
    assert result.status == "ok"
    assert_result_matches_pillow(result, data)


# =================================================================================
# classify(): accepted files


@pytest.mark.parametrize("kw", [
    dict(subsampling=0), dict(subsampling=1), dict(subsampling=2), dict(subsampling="440"),
    dict(subsampling="gray"), dict(subsampling=2, restart_blocks=4),
    dict(subsampling=1, optimize=True), dict(subsampling=0, qtables=[[400] * 64, [2] * 64]),
    dict(subsampling="444"), dict(subsampling="422"), dict(subsampling="420"),
], ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items())[:40])
def test_classify_accepts_hardware_profile(kw):
    data = gen(50, 30, **kw)
    info = jpeg.parse(data)
    assert jpeg.classify(info) is None
    assert jpeg.classify(info, max_width=50) is None
    assert jpeg.classify(info, max_pixels=1500) is None
    result = backends.decode_result(data, "model")
    assert result.status == "ok"
    assert_result_matches_pillow(result, data)


def test_classify_width_and_size_limits():
    data = gen(50, 30, subsampling=2)
    info = jpeg.parse(data)
    assert jpeg.classify(info, max_width=49) == "width"
    assert jpeg.classify(info, max_pixels=1499) == "too-large"
    # An input of 4 GiB or more (here: the header of one that long) cannot be a device job.
    for size, want in [((1 << 32) - 1, None), (1 << 32, "input-size")]:
        huge = dataclasses.replace(jpeg.parse(data, headers_only=True), size=size)
        assert jpeg.classify(huge) == jpeg.host_prescreen(huge) == want
    result = backends.decode_result(data, backends.ModelBackend(max_width=49))
    assert result.status == "fallback" and result.reason == "width"
    assert_result_matches_pillow(result, data)


def test_classify_default_max_width():
    # Headers only: a 3-component baseline frame just over the default width.
    data = bytearray(gen(16, 8, subsampling=0))
    info = jpeg.parse(bytes(data))
    sof = offsets(info, 0xC0)[0]
    for width, want in [(jpeg.DEFAULT_MAX_WIDTH, None), (jpeg.DEFAULT_MAX_WIDTH + 1, "width")]:
        data[sof + 7: sof + 9] = struct.pack(">H", width)
        assert jpeg.classify(jpeg.parse(bytes(data))) == want


# =================================================================================
# classify(): reasons


@pytest.mark.parametrize("ss", (0, 2, "gray"), ids=ss_id)
def test_classify_progressive(ss):
    data = gen(40, 30, subsampling=ss, progressive=True)
    info = jpeg.parse(data)
    assert info.frame.sof == 2
    assert len(info.scans) > 1
    assert_fallback_consistent(data, "progressive")


def test_classify_411_is_sampling():
    data = gen(40, 30, subsampling="411")
    info = jpeg.parse(data)
    assert (info.frame.components[0].h, info.frame.components[0].v) == (4, 1)
    assert info.subsampling == "other"
    assert_fallback_consistent(data, "sampling")


def test_classify_cmyk_is_components():
    data = gen(40, 30, mode="CMYK", quality=90)
    info = jpeg.parse(data)
    assert len(info.frame.components) == 4
    assert info.color_space in ("cmyk", "ycck")
    assert_fallback_consistent(data, "components")


@pytest.mark.parametrize("kind", ["png", "gif", "empty", "soi-only", "ff", "text", "bmp"])
def test_classify_not_jpeg(kind):
    img = photo_crop(20, 10)
    data = {
        "png": png_bytes(img), "gif": gif_bytes(img), "empty": b"", "soi-only": b"\xff\xd8",
        "ff": b"\xff", "text": b"not a jpeg at all",
        "bmp": (lambda b: (img.save(b, "BMP"), b.getvalue())[1])(io.BytesIO()),
    }[kind]
    info = jpeg.parse(data)
    assert info.not_jpeg
    assert info.frame is None
    assert jpeg.classify(info) == "not-jpeg"
    assert_fallback_consistent(data, "not-jpeg")


@pytest.mark.parametrize("groups", [[[0], [1], [2]], [[0, 1], [2]], [[0], [1, 2]]],
                         ids=["1-1-1", "2-1", "1-2"])
@pytest.mark.parametrize("ss", (0, 1, 2, "440"), ids=ss_id)
def test_classify_non_interleaved(ss, groups):
    base = gen(45, 37, subsampling=ss, quality=85)
    info = jpeg.parse(base)
    out = model.decode(base, info=info)
    data = rescan(base, info, out.coefficients, groups)
    info2 = jpeg.parse(data)
    assert len(info2.scans) == len(groups)
    assert [[i for i, _, _ in s.components] for s in info2.scans] == groups
    result = assert_fallback_consistent(data, "non-interleaved")
    # The same coefficients in another scan layout decode to the same picture.
    assert np.array_equal(result.image, out.rgb)


def test_classify_multi_scan():
    base = gen(45, 37, subsampling=2, quality=85)
    info = jpeg.parse(base)
    out = model.decode(base, info=info)
    data = rescan(base, info, out.coefficients, [[0, 1, 2], [0, 1, 2]])
    assert len(jpeg.parse(data).scans) == 2
    assert_fallback_consistent(data, "multi-scan")


@pytest.mark.parametrize("sof,reason", [
    (0xC2, "progressive"), (0xC3, "lossless"), (0xC5, "hierarchical"), (0xC6, "hierarchical"),
    (0xC7, "hierarchical"), (0xC9, "arithmetic"), (0xCA, "arithmetic"), (0xCB, "lossless"),
    (0xCD, "hierarchical"), (0xCE, "hierarchical"), (0xCF, "hierarchical"), (0xC1, None),
])
def test_classify_frame_types(sof, reason):
    data = bytearray(gen(24, 16, subsampling=2))
    off = offsets(jpeg.parse(bytes(data)), 0xC0)[0]
    data[off + 1] = sof
    data = bytes(data)
    info = jpeg.parse(data)
    assert info.frame.sof == sof & 0x0F
    if reason is None:
        assert jpeg.classify(info) is None
        assert_result_matches_pillow(backends.decode_result(data, "model"), data)
    else:
        assert_fallback_consistent(data, reason)


@pytest.mark.parametrize("precision", [12, 16, 7])
def test_classify_precision(precision):
    data = bytearray(gen(24, 16, subsampling="gray"))
    off = offsets(jpeg.parse(bytes(data)), 0xC0)[0]
    data[off + 4] = precision
    assert_fallback_consistent(bytes(data), "precision")


@pytest.mark.parametrize("body, want", [
    (b"\x00\x10\x10\x05", "arithmetic"),       # DC table 0 L=0 U=1, AC table 0 K=5
    (b"\x0f\xff\x1f\x00", "arithmetic"),       # DC L=U=15, AC K=0: get_dac checks no AC value
    (b"\x20\x00", "malformed-header"),           # table index 32
    (b"\x00\x01", "malformed-header"),           # DC L=1 above U=0
    (b"\x00\x10\x00", "malformed-header"),      # an odd length
], ids=("valid", "valid-edges", "index", "dc-bounds", "odd-length"))
def test_classify_dac_segment(body, want):
    """A DAC segment in a Huffman-coded file: libjpeg-turbo checks it (get_dac) and
    otherwise ignores it; the decoder declines it as arithmetic coding. The model took
    every DAC for nothing and returned ``ok``, also where Pillow fails."""
    good = gen(16, 16, subsampling=2)
    data = good[:2] + segment(0xCC, body) + good[2:]
    assert_fallback_consistent(data, want)
    _, exc = pillow_rgb(data)
    assert (exc is None) == (want == "arithmetic")


def test_classify_dnl_height_zero():
    data = bytearray(gen(24, 16, subsampling=0))
    off = offsets(jpeg.parse(bytes(data)), 0xC0)[0]
    data[off + 5: off + 7] = b"\x00\x00"
    assert_fallback_consistent(bytes(data), "dnl")


def _replace_app0(data: bytes, new: bytes) -> bytes:
    info = jpeg.parse(data)
    start, end = segment_span(data, offsets(info, 0xE0)[0])
    return data[:start] + new + data[end:]


ADOBE = b"Adobe" + b"\x00\x64" + b"\x00\x00" + b"\x00\x00"


@pytest.mark.parametrize("ss", (0, 2), ids=ss_id)
def test_classify_adobe_rgb_is_color_transform(ss):
    data = _replace_app0(gen(24, 16, subsampling=ss), segment(0xEE, ADOBE + b"\x00"))
    info = jpeg.parse(data)
    assert not info.jfif and info.adobe_transform == 0
    assert info.color_space == "rgb"
    assert_fallback_consistent(data, "color-transform")


def test_classify_adobe_ycbcr_is_accepted():
    data = _replace_app0(gen(24, 16, subsampling=2), segment(0xEE, ADOBE + b"\x01"))
    info = jpeg.parse(data)
    assert info.color_space == "ycbcr"
    assert jpeg.classify(info) is None
    result = backends.decode_result(data, "model")
    assert result.status == "ok"
    assert_result_matches_pillow(result, data)


def test_classify_rgb_component_ids_without_jfif():
    data = bytearray(_replace_app0(gen(24, 16, subsampling=0), b""))
    info = jpeg.parse(bytes(data))
    sof = offsets(info, 0xC0)[0]
    sos = offsets(info, 0xDA)[0]
    for k, cid in enumerate(b"RGB"):
        data[sof + 10 + 3 * k] = cid
        data[sos + 5 + 2 * k] = cid
    data = bytes(data)
    assert jpeg.parse(data).color_space == "rgb"
    assert_fallback_consistent(data, "color-transform")
    # With a JFIF marker the same ids mean YCbCr (libjpeg-turbo: JFIF wins).
    jfif = gen(24, 16, subsampling=0)
    app0 = segment_span(jfif, 2)
    with_jfif = data[:2] + jfif[app0[0]: app0[1]] + data[2:]
    assert jpeg.parse(with_jfif).color_space == "ycbcr"
    assert jpeg.classify(jpeg.parse(with_jfif)) is None
    assert_result_matches_pillow(backends.decode_result(with_jfif, "model"), with_jfif)


def _without(data: bytes, marker: int) -> bytes:
    info = jpeg.parse(data)
    for start, end in reversed([segment_span(data, off) for off in offsets(info, marker)]):
        data = data[:start] + data[end:]
    return data


def test_classify_missing_quantisation_tables():
    assert_fallback_consistent(_without(gen(24, 16, subsampling=2), 0xDB), "missing-table")


def test_standard_huffman_tables_are_the_ones_libjpeg_writes():
    """Pillow's encoder (libjpeg-turbo, not optimised) writes T.81's suggested tables:
    the constants must be those, byte for byte."""
    scan = jpeg.parse(gen(16, 16, subsampling=2)).scans[0]
    assert set(jpeg.STANDARD_HUFFMAN) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    for (tc, th), (counts, symbols) in jpeg.STANDARD_HUFFMAN.items():
        table = (scan.dc_tables if tc == 0 else scan.ac_tables)[th]
        assert (table.counts, table.symbols) == (counts, symbols), (tc, th)
        assert len(symbols) == sum(counts) and table.check(tc == 0) is None


DROPS = [{(0, 0), (0, 1), (1, 0), (1, 1)}, {(1, 1)}, {(0, 0)}, {(0, 1), (1, 0)}]


@pytest.mark.parametrize("optimize", [False, True], ids=["standard", "optimised"])
@pytest.mark.parametrize("ss", [0, 1, 2, "gray"], ids=ss_id)
@pytest.mark.parametrize("drop", DROPS, ids=lambda d: "-".join(f"{'da'[c]}{i}" for c, i in sorted(d)))
def test_a_scan_without_its_huffman_tables_decodes_with_the_standard_ones(drop, ss, optimize):
    """Motion-JPEG frames carry no DHT; libjpeg-turbo decodes a scan whose tables 0 and 1
    are undefined with T.81's suggested tables. The inserted segment must give exactly
    Pillow's result on the original: its image (from an optimised file, decoded with the
    wrong tables, whatever Pillow makes of it), or an error where Pillow raises one; and
    the model backend decodes it (as the device does) instead of declining it."""
    data = drop_huffman(gen(40, 24, subsampling=ss, quality=80, optimize=optimize), drop)
    info = jpeg.parse(data)
    dht = jpeg.standard_huffman_segment(info)
    if ss == "gray" and drop == {(1, 1)}:
        assert dht is None and jpeg.classify(info) is None, "a gray scan names tables 0 only"
        return
    assert jpeg.classify(info) == "missing-table"
    patched = jpeg.with_standard_huffman(data, dht)
    fixed = jpeg.parse(patched)
    assert patched[:2] == b"\xff\xd8" and patched[2:2 + len(dht)] == dht
    assert patched[2 + len(dht):] == data[2:]
    assert (0xC4, 2) in fixed.markers and jpeg.classify(fixed) is None
    assert jpeg.standard_huffman_segment(fixed) is None
    ref, err = pillow_rgb(data)
    got, got_err = pillow_rgb(patched)
    if err is None:
        assert got_err is None and got.shape == ref.shape and (got == ref).all()
    else:
        assert got_err is not None and str(got_err) == str(err)
    result = backends.decode_result(data, "model")
    # Wrong tables make corrupt data, which the hardware hands to the CPU path.
    assert_result_matches_pillow(result, data, allow_status=("ok", "fallback") if optimize else ("ok",))
    if not optimize:
        assert result.backend == "model"


def test_a_missing_huffman_table_other_than_0_and_1_is_not_supplied():
    """libjpeg-turbo has standard tables for 0 and 1 only: a scan naming an undefined
    table 2 fails in Pillow, and stays declined (missing-table) here."""
    data = bytearray(gen(24, 16, subsampling=2))
    sos = offsets(jpeg.parse(bytes(data)), 0xDA)[0]
    data[sos + 6] = 0x22                         # component 1: DC and AC table 2
    data = bytes(data)
    assert jpeg.standard_huffman_segment(jpeg.parse(data)) is None
    assert pillow_rgb(data)[1] is not None
    assert_fallback_consistent(data, "missing-table")


def test_nothing_to_supply():
    data = gen(24, 16, subsampling=2)
    assert jpeg.standard_huffman_segment(jpeg.parse(data)) is None
    progressive = drop_huffman(gen(24, 16, subsampling=2, progressive=True), DROPS[0])
    assert jpeg.standard_huffman_segment(jpeg.parse(progressive)) is None
    assert jpeg.standard_huffman_segment(jpeg.parse(b"not a jpeg")) is None


def test_classify_bad_tables():
    data = gen(24, 16, subsampling=0, qtables=[[300] * 64, [300] * 64])
    info = jpeg.parse(data)
    off = offsets(info, 0xDB)[0]
    assert data[off + 4] >> 4 == 1
    too_big = data[:off + 5] + struct.pack(">H", 40000) + data[off + 7:]
    assert jpeg.parse(too_big).scans[0].qtables[0][0] == 40000
    assert_fallback_consistent(too_big, "bad-table")
    # A DHT whose code counts overflow the code space.
    data = gen(24, 16, subsampling=0)
    info = jpeg.parse(data)
    dht = offsets(info, 0xC4)[0]
    counts = bytearray(data[dht + 5: dht + 21])
    need = 3 - counts[0]
    counts[0] = 3  # three 1-bit codes, taken from the longest lengths: same symbol count
    for i in range(15, 0, -1):
        take = min(need, counts[i])
        counts[i] -= take
        need -= take
    assert need == 0
    bad = data[:dht + 5] + bytes(counts) + data[dht + 21:]
    assert jpeg.parse(bad).error is None
    assert_fallback_consistent(bad, "bad-table")


def test_classify_all_ones_huffman_code():
    """libjpeg-turbo rejects a table whose codes fill the code space (the all-ones code
    is reserved, jdhuff.c jpeg_make_d_derived_tbl); Pillow then raises."""
    data = bytearray(gen(16, 16, subsampling=0))
    dht = offsets(jpeg.parse(bytes(data)), 0xC4)[0]
    counts = data[dht + 5:dht + 21]
    last = max(i for i in range(16) if counts[i])
    code = 0
    for i in range(last + 1):
        code = (code << 1) + counts[i]
    free = (1 << (last + 1)) - code  # codes of the longest length still free
    assert free >= 1
    counts[last] += free
    n_symbols = sum(data[dht + 5:dht + 21])
    body_end = dht + 21 + n_symbols
    full = (bytes(data[:dht + 2]) + struct.pack(">H", 2 + 1 + 16 + n_symbols + free)
            + bytes(data[dht + 4:dht + 5]) + bytes(counts) + bytes(data[dht + 21:body_end])
            + bytes(range(free)) + bytes(data[body_end:]))
    assert jpeg.parse(full).error is None
    assert_fallback_consistent(full, "bad-table")


def test_classify_dc_symbol_above_15():
    data = bytearray(gen(24, 16, subsampling="gray"))
    info = jpeg.parse(bytes(data))
    dht = [off for off in offsets(info, 0xC4) if data[off + 4] >> 4 == 0][0]
    n = sum(data[dht + 5: dht + 21])
    data[dht + 21 + n - 1] = 16
    assert_fallback_consistent(bytes(data), "bad-table")


def test_classify_after_scan():
    data = gen(24, 16, subsampling=2)
    assert_fallback_consistent(data[:-2], "after-scan")
    with_com = data[:-2] + segment(0xFE, b"trailer") + b"\xff\xd9"
    assert_fallback_consistent(with_com, "after-scan")


def test_classify_junk_between_segments():
    data = gen(24, 16, subsampling=2)
    info = jpeg.parse(data)
    sof = offsets(info, 0xC0)[0]
    junky = data[:sof] + b"\x12\x34" + data[sof:]
    info = jpeg.parse(junky)
    assert info.junk_bytes == 2
    assert_fallback_consistent(junky, "junk")


def test_classify_mpo():
    a = photo_crop(32, 24, "astronaut.png")
    b = photo_crop(32, 24, "coffee.png")
    buf = io.BytesIO()
    a.save(buf, "MPO", save_all=True, append_images=[b])
    data = buf.getvalue()
    assert jpeg.parse(data).mpf
    assert_fallback_consistent(data, "mpo")


def test_classify_no_frame_no_scan():
    data = gen(24, 16, subsampling=2)
    info = jpeg.parse(data)
    assert jpeg.classify(jpeg.parse(b"\xff\xd8\xff\xd9")) == "no-frame"
    sos = offsets(info, 0xDA)[0]
    assert_fallback_consistent(data[:sos] + b"\xff\xd9", "no-scan")


def test_classify_short_jfif_is_malformed_for_pillow():
    # Pillow's APP0 handler reads a 16-bit version at offset 5; a shorter JFIF segment
    # makes Pillow fail, so the file must not be decoded by the hardware either.
    data = _replace_app0(gen(24, 16, subsampling=2), segment(0xE0, b"JFIF\x00"))
    info = jpeg.parse(data)
    assert info.pillow_error is not None
    ref, exc = pillow_rgb(data)
    assert exc is not None
    assert_fallback_consistent(data, "malformed-header")


@pytest.mark.parametrize("ss", (0, 2, "gray"), ids=ss_id)
def test_classify_truncated_headers(ss):
    data = gen(24, 16, subsampling=ss, restart_blocks=2)
    info = jpeg.parse(data)
    header_end = info.scans[0].data_start
    spans = [segment_span(data, off) for m, off in info.markers if m != 0xD9]
    sof_end = segment_span(data, offsets(info, 0xC0)[0])[1]
    for k in range(0, header_end):
        cut = data[:k]
        cut_info = jpeg.parse(cut)
        reason = jpeg.classify(cut_info)
        if k < 3:
            want = "not-jpeg"
        elif any(start + 2 <= k < end for start, end in spans):
            want = "malformed-header"
        elif k < sof_end:
            want = "no-frame"
        else:
            want = "no-scan"
        assert reason == want, (k, reason, cut_info.error)
        if k % 7 == 0 or want == "no-scan":
            ref, exc = pillow_rgb(cut)
            assert exc is not None
            result = backends.decode_result(cut, "model")
            assert result.status == "error"


def test_classify_unexpected_marker_in_header():
    data = gen(24, 16, subsampling=2)
    info = jpeg.parse(data)
    sof = offsets(info, 0xC0)[0]
    for marker in (0xD0, 0x01, 0x02, 0xD8):
        bad = data[:sof] + bytes([0xFF, marker]) + data[sof:]
        info = jpeg.parse(bad)
        assert info.error is not None and info.error_offset == sof
        assert jpeg.classify(info) == "malformed-header"
        assert_result_matches_pillow(backends.decode_result(bad, "model"), bad,
                                     allow_status=("fallback",))


@pytest.mark.parametrize("marker", (0xD0, 0x01), ids=("rst0", "tem"))
def test_prescreen_keeps_every_header_fault_from_the_device(marker):
    """A TEM or an RSTn between header segments: the decoder skips it (as libjpeg-turbo
    does), Pillow's parser refuses a TEM, and the host parser's fault there hid the
    Pillow-only checks of the other segments (here a short JFIF APP0), so the device
    returned ``ok`` where Pillow fails. Every structural fault before the scan's data
    now goes to the CPU path; a fault inside the entropy-coded data is still the
    device's to find."""
    good = gen(24, 16, subsampling=2)
    for data in (good, _replace_app0(good, segment(0xE0, b"JFIF\x00"))):
        sos = offsets(jpeg.parse(data), 0xDA)[0]
        bad = data[:sos] + bytes([0xFF, marker]) + data[sos:]
        for info in (jpeg.parse(bad), jpeg.parse(bad, headers_only=True)):
            assert info.error is not None and jpeg.host_prescreen(info) == "malformed-header"
        assert_result_matches_pillow(backends.decode_result(bad, "model"), bad, allow_status=("fallback",))
    info = jpeg.parse(good)
    cut = good[:info.scans[0].data_start + 20]
    assert jpeg.classify(jpeg.parse(cut)) is not None and jpeg.host_prescreen(jpeg.parse(cut)) is None


# =================================================================================
# Corpus: parse + classify never raise; headers agree with Pillow's parser


def test_corpus_parse_classify_never_raise(corpus_dir):
    root = corpus_dir
    paths = corpus_paths()
    assert paths
    checked = agreed = 0
    reasons = {}
    for rel in paths:
        data = (root / rel).read_bytes()
        info = jpeg.parse(data)
        reason = jpeg.classify(info)
        assert reason is None or reason in jpeg.REASONS, (rel, reason)
        reasons[reason] = reasons.get(reason, 0) + 1
        assert info.not_jpeg == (data[:3] != b"\xff\xd8\xff"), rel
        assert jpeg.classify(info, max_width=1) in (reason, "width", "too-large")
        if reason is not None:
            continue
        # Accepted files: Pillow's header parser must see the same frame and tables.
        checked += 1
        try:
            im = pillow_header(data)
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"{rel}: classify() accepts it, Pillow cannot open it: {exc!r}")
        frame = info.frame
        assert im.format == "JPEG", rel
        assert im.size == (frame.width, frame.height), rel
        assert [tuple(t) for t in im.layer] == [(c.id, c.h, c.v, c.tq) for c in frame.components]
        assert im.mode == ("L" if len(frame.components) == 1 else "RGB"), rel
        for k, table in info.scans[0].qtables.items():
            assert table.tolist() == list(im.quantization[k]), (rel, k)
        agreed += 1
    assert checked == agreed
    assert sum(reasons.values()) == len(paths)


def test_corpus_12bit_files(corpus_dir):
    root = corpus_dir
    rows = [r for r in corpus_rows() if r["precision"] == "12" and r["sof"] in ("SOF0", "SOF1")]
    if not rows:
        pytest.skip("no 12-bit sequential files in the corpus")
    for r in rows:
        data = (root / r["path"]).read_bytes()
        info = jpeg.parse(data)
        assert info.frame is not None and info.frame.precision == 12
        assert jpeg.classify(info) == "precision", r["path"]
        result = backends.decode_result(data, "model")
        assert result.status in ("fallback", "error")
        assert_result_matches_pillow(result, data, allow_status=("fallback",))


# =================================================================================
# Fuzzing


@settings(max_examples=fuzz_examples(300))
@given(st.binary(max_size=2000))
def test_fuzz_arbitrary_bytes(data):
    info = jpeg.parse(data)
    reason = jpeg.classify(info)
    assert reason is None or isinstance(reason, str)
    if data[:3] != b"\xff\xd8\xff":
        assert reason == "not-jpeg"
        assert info.not_jpeg


_MARKERISH = st.sampled_from([b"\xff\xd8", b"\xff\xd9", b"\xff\xc0", b"\xff\xc4", b"\xff\xdb",
                              b"\xff\xda", b"\xff\xdd", b"\xff\xe0", b"\xff\xd0", b"\xff\x00",
                              b"\xff\xff", b"\x00\x02", b"\x00\x11", b"\xff\xc2", b"\x00"])


@settings(max_examples=fuzz_examples(300))
@given(st.lists(st.one_of(st.binary(max_size=40), _MARKERISH), max_size=30))
def test_fuzz_bytes_after_soi(parts):
    """Random bytes and markers after SOI: the parser never raises, and classify names a
    fallback reason (a whole decodable file almost never arises this way; mutations of
    real files, below, reach the decoders)."""
    data = b"\xff\xd8\xff" + b"".join(parts)
    info = jpeg.parse(data)
    reason = jpeg.classify(info)
    assert not info.not_jpeg
    assert reason in jpeg.REASONS and reason != "not-jpeg"


def _seed_files() -> list[bytes]:
    from PIL.TiffImagePlugin import IFDRational

    exif = Image.Exif()
    exif[0x0128] = 2
    exif[0x011A] = IFDRational(300, 1)
    exif[0x010F] = "dlbooster"
    seeds = [make_jpeg(24, 16, subsampling=ss, quality=q)
             for ss, q in [(0, 90), (1, 50), (2, 75), ("440", 85), ("gray", 60)]]
    seeds += [
        make_jpeg(24, 16, subsampling=2, restart_blocks=1),
        make_jpeg(20, 12, subsampling=0, restart_rows=1, optimize=True),
        make_jpeg(24, 16, subsampling=2, progressive=True),
        make_jpeg(17, 9, subsampling=0, qtables=[[300] * 64, [2] * 64]),
        make_jpeg(24, 16, subsampling=1, exif=exif.tobytes()),
        make_jpeg(24, 16, subsampling=2, icc_profile=b"\x00" * 200),
    ]
    # APP segments that Pillow's Python parser reads field by field (Photoshop IRB,
    # Adobe, JFIF with density), to fuzz the places where Pillow itself may refuse.
    base = make_jpeg(24, 16, subsampling=0, quality=80)
    irb = (b"Photoshop 3.0\x00" + b"8BIM\x03\xed\x00\x00" + struct.pack(">I", 16)
           + struct.pack(">IHHIHH", 72 << 16, 1, 1, 72 << 16, 1, 1)
           + b"8BIM\x04\x04\x00\x00" + struct.pack(">I", 3) + b"abc\x00")
    adobe = b"Adobe\x00\x64\x00\x00\x00\x00\x01"
    seeds.append(base[:2] + segment(0xED, irb) + segment(0xEE, adobe) + base[2:])
    return seeds


SEEDS = _seed_files()


@st.composite
def mutated_jpeg(draw):
    seed = draw(st.sampled_from(SEEDS))
    data = bytearray(seed)
    scan = jpeg.parse(seed).scans[0]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "flip", "truncate", "insert", "delete",
                                     "overwrite", "marker"]))
        if draw(st.booleans()) and scan.data_end <= len(data):
            # Aim at the entropy-coded data half of the time.
            pos = draw(st.integers(scan.data_start, scan.data_end - 1))
        else:
            pos = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[pos: pos + draw(st.integers(1, 8))]
        elif kind == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=4))
            data[pos: pos + len(chunk)] = chunk
        else:
            data[pos:pos] = bytes([0xFF, draw(st.sampled_from(
                [0xD0, 0xD3, 0xD7, 0xD9, 0xD8, 0xC4, 0xDA, 0xE0, 0xFE, 0x00, 0xFF]))])
        if not data:
            break
    return bytes(data)


@settings(max_examples=fuzz_examples(400))
@given(mutated_jpeg())
def test_fuzz_mutated_files(data):
    info = jpeg.parse(data)
    reason = jpeg.classify(info)
    assert reason is None or isinstance(reason, str)
    frame = info.frame
    assume(frame is None or frame.width * frame.height <= 4_000_000)
    result = backends.decode_result(data, "model")
    if result.status == "ok":
        # The model decodes with the standard tables inserted for a Huffman table 0 or 1
        # the scan names and the file never defines, as libjpeg-turbo and the runtime do.
        tables = jpeg.standard_huffman_segment(info)
        assert jpeg.classify(jpeg.parse(jpeg.with_standard_huffman(data, tables)) if tables else info) is None
    assert_result_matches_pillow(result, data)
    # The CPU path alone (simplejpeg fast path or Pillow) is the reference too.
    ref, exc = pillow_rgb(data)
    try:
        image = backends.CpuBackend().decode(data)
    except DecodeError:
        assert exc is not None, "CPU path raises where Pillow decodes"
    else:
        assert exc is None, f"CPU path decodes where Pillow raises {exc!r}"
        assert np.array_equal(image, ref)
