"""dlbooster.decode / decode_result and the cpu, model and auto backends."""

from __future__ import annotations

import hashlib
import logging
import struct
from pathlib import Path

import dlbooster
import numpy as np
import pytest
from dlbooster import DecodeError, backends, jpeg
from jpegtools import (
    assert_result_matches_pillow,
    corpus_params,
    corpus_paths,
    corpus_rows,
    describe_mismatch,
    feature_subset,
    gen,
    gif_bytes,
    noise_jpeg,
    photo,
    photo_crop,
    pillow_rgb,
    png_bytes,
    require_corpus,
    segment,
    skimage_data_dir,
)
from PIL import Image

BACKEND_NAMES = ("cpu", "model", "auto")


def assert_equals_pillow(image: np.ndarray, data: bytes):
    ref, exc = pillow_rgb(data)
    assert exc is None, f"Pillow raises {exc!r}"
    assert isinstance(image, np.ndarray)
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert np.array_equal(image, ref), describe_mismatch(image, ref)


def skimage_path(name: str) -> Path:
    path = Path(str(skimage_data_dir() / name))
    if not path.is_file():
        pytest.skip(f"scikit-image data file {name} is not a plain file")
    return path


# =================================================================================
# decode(): pixels equal Pillow's


GENERATED = {
    "444": dict(subsampling=0, quality=95),
    "422": dict(subsampling=1, quality=75),
    "420": dict(subsampling=2, quality=50),
    "440": dict(subsampling="440", quality=85),
    "gray": dict(subsampling="gray", quality=90),
    "411": dict(subsampling="411", quality=80),
    "progressive": dict(subsampling=2, progressive=True),
    "cmyk": dict(mode="CMYK", quality=90),
    "restart": dict(subsampling=2, restart_blocks=3),
    "q16": dict(subsampling=0, qtables=[[260] * 64, [3] * 64]),
}


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("kind", GENERATED)
def test_decode_generated(kind, backend, tmp_path):
    data = gen(123, 77, **GENERATED[kind])
    assert_equals_pillow(dlbooster.decode(data, backend=backend), data)
    path = tmp_path / "img.jpg"
    path.write_bytes(data)
    assert_equals_pillow(dlbooster.decode(str(path), backend=backend), data)
    assert_equals_pillow(dlbooster.decode(path, backend=backend), data)
    assert_equals_pillow(dlbooster.decode(bytearray(data), backend=backend), data)
    assert_equals_pillow(dlbooster.decode(memoryview(data), backend=backend), data)
    if backend == "model":
        # The model decodes these itself: a model that declined everything (its CPU
        # fallback gives Pillow's pixels) must not pass as equal to Pillow.
        result = dlbooster.decode_result(data, backend)
        assert (result.status, result.reason, result.backend) == MODEL_OUTCOME.get(kind, ("ok", None, "model"))
        detail = MODEL_DETAIL.get(kind)        # what put the frame outside the profile
        assert result.detail.startswith(detail) if detail else not result.detail


# Outside the hardware profile (SPEC.md section 2): the model hands them to the CPU path.
MODEL_OUTCOME = {"411": ("fallback", "sampling", "cpu"), "progressive": ("fallback", "progressive", "cpu"),
                 "cmyk": ("fallback", "components", "cpu")}
MODEL_DETAIL = {"411": "SOF0 8-bit 123x77, 3 components (1:4x1 2:1x1 3:1x1), ycbcr, 1 scan",
                "progressive": "SOF2 8-bit 123x77, 3 components (1:2x2 2:1x1 3:1x1), ycbcr, ",
                "cmyk": "SOF0 8-bit 123x77, 4 components ("}


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("name", ["rocket.jpg", "retina.jpg", "hubble_deep_field.jpg"])
def test_decode_skimage_jpegs(name, backend):
    path = skimage_path(name)
    data = path.read_bytes()
    assert_equals_pillow(dlbooster.decode(path, backend=backend), data)
    result = dlbooster.decode_result(str(path), backend)
    assert result.path == str(path)
    assert_result_matches_pillow(result, data)
    if backend == "model" and jpeg.classify(jpeg.parse(data)) is None:
        assert result.status == "ok"


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("name", ["astronaut.png", "camera.png", "coffee.png",
                                  "no_time_for_that_tiny.gif"])
def test_decode_non_jpeg_files_via_cpu(name, backend):
    path = skimage_path(name)
    data = path.read_bytes()
    assert_equals_pillow(dlbooster.decode(path, backend=backend), data)
    result = dlbooster.decode_result(path, backend)
    if backend == "model":
        assert (result.status, result.reason, result.backend) == ("fallback", "not-jpeg", "cpu")
    else:
        assert (result.status, result.reason, result.backend) == ("ok", None, "cpu")
    assert_result_matches_pillow(result, data)


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("fmt", ["png", "gif", "png-gray", "png-rgba", "gif-gray"])
def test_decode_png_gif_bytes(fmt, backend):
    img = photo_crop(37, 21, "chelsea.png")
    if fmt == "png-gray":
        data = png_bytes(img.convert("L"))
    elif fmt == "png-rgba":
        rgba = img.convert("RGBA")
        rgba.putalpha(128)
        data = png_bytes(rgba)
    elif fmt == "gif-gray":
        data = gif_bytes(img.convert("L"))
    else:
        data = {"png": png_bytes, "gif": gif_bytes}[fmt](img)
    assert_equals_pillow(dlbooster.decode(data, backend=backend), data)


def test_decode_whole_skimage_photos_reencoded():
    # Every real photo scikit-image ships, re-encoded, through the model and cpu paths.
    for name in ["astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "camera.png",
                 "moon.png", "motorcycle_left.png", "coins.png"]:
        im = photo(name)
        for ss in ((0, 1, 2) if im.mode != "L" else ("gray",)):
            data = gen(0, 0, image=im.convert("L" if ss == "gray" else "RGB"), subsampling=ss,
                       quality=87)
            for backend in ("model", "cpu"):
                result = dlbooster.decode_result(data, backend)
                assert result.status == "ok", (name, ss, backend, result.reason)
                assert_result_matches_pillow(result, data)


def test_exif_orientation_is_not_applied():
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW on display
    data = gen(40, 24, subsampling=2, exif=exif.tobytes())
    for backend in BACKEND_NAMES:
        image = dlbooster.decode(data, backend=backend)
        assert image.shape == (24, 40, 3)
        assert_equals_pillow(image, data)
    assert dlbooster.decode_result(data, "model").status == "ok"   # APP1 skipped, not declined


# =================================================================================
# Errors name the input


BAD_INPUTS = {
    "empty": b"",
    "random": bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)),
    "soi-random": b"\xff\xd8\xff" + bytes(np.random.default_rng(1).integers(
        0, 256, 3000, dtype=np.uint8)),
    "text": b"hello, this is not an image\n",
}


def _truncated_jpeg():
    data = gen(64, 48, subsampling=2)
    return data[: len(data) // 2]


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("kind", list(BAD_INPUTS) + ["truncated"])
def test_undecodable_inputs_raise_decode_error(kind, backend, tmp_path):
    data = _truncated_jpeg() if kind == "truncated" else BAD_INPUTS[kind]
    ref, exc = pillow_rgb(data)
    assert exc is not None, "the input must be undecodable for Pillow too"
    path = tmp_path / f"bad-{kind}.jpg"
    path.write_bytes(data)
    with pytest.raises(DecodeError) as excinfo:
        dlbooster.decode(str(path), backend=backend)
    err = excinfo.value
    assert str(path) in str(err)
    assert err.source == str(path)
    assert err.reason == "undecodable"
    assert isinstance(err, dlbooster.DlboosterError)
    with pytest.raises(DecodeError) as excinfo:
        dlbooster.decode(data, backend=backend)
    assert "<bytes>" in str(excinfo.value)
    result = dlbooster.decode_result(path, backend)
    assert (result.status, result.backend, result.image) == ("error", None, None)
    assert result.path == str(path)
    assert result.reason == "undecodable"
    if kind == "empty":                      # as the Loader's service says it
        assert result.detail == "empty file" and excinfo.value.detail == "empty input"
    js = result.to_json()
    assert js["status"] == "error" and js["sha256"] is None and js["width"] is None


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_missing_file_raises_decode_error(backend, tmp_path):
    path = tmp_path / "does-not-exist.jpg"
    with pytest.raises(DecodeError) as excinfo:
        dlbooster.decode(path, backend=backend)
    assert str(path) in str(excinfo.value)
    assert excinfo.value.reason == "unreadable"
    result = dlbooster.decode_result(str(path), backend)
    assert (result.status, result.reason, result.path) == ("error", "unreadable", str(path))


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_path_with_a_nul_byte_is_unreadable(backend):
    path = "a\x00b.jpg"
    with pytest.raises(DecodeError) as excinfo:
        dlbooster.decode(path, backend=backend)
    assert excinfo.value.reason == "unreadable" and "null byte" in excinfo.value.detail
    result = dlbooster.decode_result(path, backend)
    assert (result.status, result.reason, result.path) == ("error", "unreadable", path)


def test_cpu_path_gives_fill_before_stuffing_to_pillow():
    """Fill bytes before a stuffed zero (FF FF 00) in a file over 64 KiB: libjpeg-turbo
    decodes them by whether its fast Huffman path runs, which depends on the input it
    has buffered (Pillow feeds 64 KiB blocks, simplejpeg the whole file), so the CPU path
    leaves such files to Pillow. One fill byte before each stuffed zero around the first
    64 KiB boundary in turn: every variant equals Pillow (the second attack review found
    simplejpeg's pixels in 38 of 897 such variants of one image)."""
    data = noise_jpeg(640, 480, quality=95, subsampling=2)
    scan = jpeg.parse(data).scans[0]
    assert len(data) > 1 << 17 and scan.fill_before_stuffing == -1
    stuffed = [p for p in range(60_000, 70_000) if data[p:p + 2] == b"\xff\x00"]
    assert len(stuffed) >= 10
    for p in stuffed:
        evil = data[:p] + b"\xff" + data[p:]
        assert jpeg.parse(evil).scans[0].fill_before_stuffing == p
        result = dlbooster.decode_result(evil, "cpu")
        assert result.status == "ok"
        assert_result_matches_pillow(result, evil)
    # Fill bytes before a marker are valid (T.81 B.1.1.2) and not flagged.
    restarts = gen(48, 32, subsampling=2, quality=90, restart_blocks=2)
    rst = restarts.find(b"\xff\xd0")
    assert jpeg.parse(restarts[:rst] + b"\xff\xff" + restarts[rst:]).scans[0].fill_before_stuffing == -1


def test_pillows_error_detail_has_no_object_address():
    """The detail of bytes Pillow cannot identify is the same on every run (Pillow's
    message names the in-memory file by its repr, with an address)."""
    result = dlbooster.decode_result(b"not an image at all", "cpu")
    assert (result.status, result.reason) == ("error", "undecodable")
    assert result.detail == "Pillow: UnidentifiedImageError: cannot identify image file"


def test_directory_raises_decode_error(tmp_path):
    with pytest.raises(DecodeError) as excinfo:
        dlbooster.decode(tmp_path)
    assert str(tmp_path) in str(excinfo.value)


def test_decompression_bomb_is_an_error():
    # A frame over twice Pillow's MAX_IMAGE_PIXELS: Pillow refuses it, so must we.
    data = bytearray(gen(16, 16, subsampling=0))
    sof = [off for m, off in jpeg.parse(bytes(data)).markers if m == 0xC0][0]
    data[sof + 5: sof + 9] = struct.pack(">HH", 15000, 15000)
    data = bytes(data)
    assert 15000 * 15000 > 2 * Image.MAX_IMAGE_PIXELS
    for backend in BACKEND_NAMES:
        with pytest.raises(DecodeError):
            dlbooster.decode(data, backend=backend)


# =================================================================================
# Files whose headers Pillow's own (Python) parser rejects: the reference raises, so
# every backend must report an error, even though libjpeg-turbo would decode them.


def _tiff_ifd(entries) -> bytes:
    """Big-endian TIFF header + one IFD; entries (tag, type, count, 4-byte value field)."""
    ifd = struct.pack(">H", len(entries))
    for tag, typ, count, value in entries:
        ifd += struct.pack(">HHI", tag, typ, count) + value
    return b"MM\x00\x2a" + struct.pack(">I", 8) + ifd + struct.pack(">I", 0)


def _with_app(marker: int, body: bytes) -> bytes:
    base = gen(24, 16, subsampling=2)
    return base[:2] + segment(marker, body) + base[2:]


PILLOW_REJECTS = {
    # XResolution of type UNDEFINED, count 1: Pillow's _read_dpi_from_exif indexes
    # x_resolution[1] and raises IndexError, which Image.open turns into
    # UnidentifiedImageError.
    "exif-xresolution-undefined": lambda: _with_app(0xE1, b"Exif\x00\x00" + _tiff_ifd([
        (0x011A, 7, 1, b"\x4a\x00\x00\x00"), (0x0128, 3, 1, b"\x00\x02\x00\x00")])),
    "exif-xresolution-empty-ascii": lambda: _with_app(0xE1, b"Exif\x00\x00" + _tiff_ifd([
        (0x011A, 2, 1, b"\x00\x00\x00\x00"), (0x0128, 3, 1, b"\x00\x02\x00\x00")])),
    # A Photoshop APP13 image resource block that ends right after its resource code:
    # Pillow reads the name length byte past the end (IndexError, not caught there).
    "photoshop-truncated-resource": lambda: _with_app(
        0xED, b"Photoshop 3.0\x00" + b"8BIM" + b"\x03\xed"),
}

PILLOW_ACCEPTS = {
    "exif-dpi": lambda: _with_app(0xE1, b"Exif\x00\x00" + _tiff_ifd([
        (0x011A, 5, 1, struct.pack(">I", 0x26)), (0x0128, 3, 1, b"\x00\x02\x00\x00")])
        + struct.pack(">II", 300, 1)),
    "photoshop-resolution": lambda: _with_app(
        0xED, b"Photoshop 3.0\x00" + b"8BIM" + b"\x03\xed" + b"\x00\x00"
        + struct.pack(">I", 16) + struct.pack(">IHHIHH", 72 << 16, 1, 1, 72 << 16, 1, 1)),
    "photoshop-short-data": lambda: _with_app(
        0xED, b"Photoshop 3.0\x00" + b"8BIM" + b"\x03\xed\x00"),
}


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("kind", PILLOW_REJECTS)
def test_files_pillow_rejects_are_errors(kind, backend):
    data = PILLOW_REJECTS[kind]()
    ref, exc = pillow_rgb(data)
    assert exc is not None, "precondition: Pillow refuses this file"
    result = dlbooster.decode_result(data, backend)
    assert result.status == "error", (
        f"Pillow raises {exc!r} but backend {backend} gives status {result.status!r} "
        f"(backend {result.backend})")
    with pytest.raises(DecodeError):
        dlbooster.decode(data, backend=backend)


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("kind", PILLOW_ACCEPTS)
def test_app_segments_pillow_accepts(kind, backend):
    data = PILLOW_ACCEPTS[kind]()
    result = dlbooster.decode_result(data, backend)
    assert_result_matches_pillow(result, data)
    assert result.status == "ok"


def test_cpu_path_on_files_pillow_rejects():
    for kind, make in PILLOW_REJECTS.items():
        assert _cpu_check(make()) is None, kind


# =================================================================================
# decode_result: statuses, reasons, JSON


def test_decode_result_ok_model():
    data = gen(50, 30, subsampling=2)
    result = dlbooster.decode_result(data, "model")
    assert (result.status, result.backend, result.reason) == ("ok", "model", None)
    assert result.path == "<bytes>"
    assert result.extra["symbols"] > 0
    assert (result.width, result.height) == (50, 30)
    assert_result_matches_pillow(result, data)
    js = result.to_json()
    assert js["symbols"] == result.extra["symbols"]
    assert js["status"] == "ok" and js["backend"] == "model" and js["reason"] is None
    assert (js["width"], js["height"]) == (50, 30)
    # The printed result is a summary line, not 4,500 pixel values.
    assert repr(result).startswith("DecodeResult(path='<bytes>', status='ok'") and "image" not in repr(result)


def test_decode_result_ok_cpu():
    data = gen(50, 30, subsampling=1)
    for backend in ("cpu", "auto"):
        result = dlbooster.decode_result(data, backend)
        assert (result.status, result.backend, result.reason) == ("ok", "cpu", None)
        assert_result_matches_pillow(result, data)


@pytest.mark.parametrize("kind,reason", [
    ("progressive", "progressive"), ("cmyk", "components"), ("411", "sampling"),
    ("png", "not-jpeg"), ("gif", "not-jpeg"),
])
def test_decode_result_fallback_reasons(kind, reason):
    if kind == "png":
        data = png_bytes(photo_crop(30, 20))
    elif kind == "gif":
        data = gif_bytes(photo_crop(30, 20))
    else:
        data = gen(30, 20, **GENERATED[kind])
    result = dlbooster.decode_result(data, "model")
    assert (result.status, result.backend, result.reason) == ("fallback", "cpu", reason)
    assert_result_matches_pillow(result, data)
    assert result.to_json()["reason"] == reason
    # The CPU backend takes them directly.
    direct = dlbooster.decode_result(data, "cpu")
    assert (direct.status, direct.reason) == ("ok", None)
    assert np.array_equal(direct.image, result.image)


def test_decode_result_error_for_truncated_file():
    data = _truncated_jpeg()
    for backend in BACKEND_NAMES:
        result = dlbooster.decode_result(data, backend)
        assert (result.status, result.reason) == ("error", "undecodable")
        assert "Pillow" in result.detail


@pytest.mark.parametrize("kind", ["420", "gray", "progressive", "png"])
def test_to_json_sha256(kind):
    data = png_bytes(photo_crop(31, 17)) if kind == "png" else gen(31, 17, **GENERATED[kind])
    ref, _ = pillow_rgb(data)
    for backend in ("model", "cpu"):
        result = dlbooster.decode_result(data, backend)
        js = result.to_json()
        assert js["sha256"] == hashlib.sha256(ref.tobytes()).hexdigest()
        assert js["sha256"] == hashlib.sha256(
            np.ascontiguousarray(result.image).tobytes()).hexdigest()
        assert (js["width"], js["height"]) == (31, 17)
        assert js["path"] == "<bytes>"


def test_decode_result_uses_given_cpu_backend():
    calls = []

    class CountingCpu(backends.CpuBackend):
        name = "counting-cpu"

        def decode(self, data, info=None):
            calls.append(len(data))
            return super().decode(data, info)

    data = gen(30, 20, subsampling=2, progressive=True)
    result = dlbooster.decode_result(data, "model", cpu=CountingCpu())
    assert calls == [len(data)]
    assert (result.status, result.backend) == ("fallback", "counting-cpu")
    assert_result_matches_pillow(result, data)


def test_decode_result_accepts_backend_instances():
    data = gen(40, 20, subsampling=0)
    narrow = backends.ModelBackend(max_width=39)
    result = dlbooster.decode_result(data, narrow)
    assert (result.status, result.reason) == ("fallback", "width")
    assert_result_matches_pillow(result, data)
    wide = backends.ModelBackend(max_width=40)
    assert dlbooster.decode_result(data, wide).status == "ok"


def test_get_backend():
    assert dlbooster.BACKENDS == ("auto", "cpu", "model", "sim", "pynq", "xrt")
    assert isinstance(dlbooster.get_backend("cpu"), backends.CpuBackend)
    assert isinstance(dlbooster.get_backend("auto"), backends.CpuBackend)
    model_backend = dlbooster.get_backend("model", max_width=64)
    assert isinstance(model_backend, backends.ModelBackend)
    assert model_backend.max_width == 64
    with pytest.raises(ValueError, match="nope"):
        dlbooster.get_backend("nope")
    with pytest.raises(ValueError):
        dlbooster.decode(gen(8, 8), backend="nope")


def test_auto_logs_its_choice_once(caplog, monkeypatch):
    monkeypatch.setattr(backends, "_logged_auto", [])
    monkeypatch.delenv("DLBOOSTER_BOARD", raising=False)
    with caplog.at_level(logging.INFO, logger="dlbooster"):
        dlbooster.get_backend("auto")
        dlbooster.get_backend("auto")
    assert [rec.getMessage() for rec in caplog.records
            if "auto" in rec.getMessage()] == [
        "backend auto: no decoder board configured (DLBOOSTER_BOARD, DLBOOSTER_BINARY), using cpu"]


def test_model_backend_stages():
    data = gen(21, 13, subsampling=1)
    out = backends.ModelBackend().decode_stages(data)
    assert_equals_pillow(out.rgb, data)
    assert np.array_equal(backends.ModelBackend().decode(data), out.rgb)
    assert [plane.shape for plane in out.upsampled] == [(13, 21)] * 3
    with pytest.raises(dlbooster.Unsupported) as excinfo:
        backends.ModelBackend().decode(gen(21, 13, subsampling=2, progressive=True))
    assert excinfo.value.reason == "progressive"
    assert isinstance(excinfo.value, dlbooster.FallbackError)


# =================================================================================
# CPU path identity with Pillow (the simplejpeg fast path included)


def _cpu_check(data: bytes) -> str | None:
    """None when CpuBackend agrees with Pillow, else what differs."""
    ref, exc = pillow_rgb(data)
    try:
        image = backends.CpuBackend().decode(data)
    except DecodeError as err:
        return None if exc is not None else f"CPU path raises {err} where Pillow decodes"
    if exc is not None:
        return f"CPU path decodes where Pillow raises {exc!r}"
    if image.dtype != np.uint8 or not np.array_equal(image, ref):
        return describe_mismatch(image, ref)
    return None


def test_cpu_path_generated_files():
    cases = [gen(61, 45, **kw) for kw in GENERATED.values()]
    cases.append(gen(61, 45, subsampling=2)[:-2])  # no EOI
    cases.append(gen(61, 45, subsampling=0, icc_profile=b"\x01" * 300))
    for data in cases:
        assert _cpu_check(data) is None


def _cpu_subset():
    rows = [r for r in corpus_rows() if not r["dup_of"]]
    groups = {}
    for r in rows:
        groups.setdefault((r["sof"], r["subsampling"], r["pil_ok"], r["magic"]), []).append(r)
    # One file per (frame type, subsampling, Pillow ok, magic) group, plus the feature
    # subset of the source folders; capped.
    picked = [g[0] for _, g in sorted(groups.items())]
    picked += [r for r in feature_subset(rows, cap=40) if r not in picked]
    return [r["path"] for r in picked[:80]]


@pytest.mark.parametrize("rel", corpus_params(_cpu_subset()))
def test_cpu_path_corpus_subset(rel):
    root = require_corpus()
    data = (root / rel).read_bytes()
    assert _cpu_check(data) is None, rel


@pytest.mark.corpus
@pytest.mark.parametrize("rel", corpus_params(corpus_paths()))
def test_cpu_path_every_corpus_file(rel):
    root = require_corpus()
    data = (root / rel).read_bytes()
    problem = _cpu_check(data)
    assert problem is None, f"{rel}: {problem}"


def test_read_file_into_a_callers_buffer(tmp_path):
    """``read_file(path, into)`` reads a file straight into the buffer ``into`` gives (a
    device's staging buffer): the same bytes as a plain read, no copy; a
    declined or empty buffer request reads into bytes; special files stay unreadable."""
    data = gen(64, 48, subsampling=2)
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    plain, st = backends.read_file(str(path))
    assert plain == data and st.st_size == len(data)
    target = np.full(len(data) + 100, 7, np.uint8)
    asked = []
    got, st2 = backends.read_file(str(path), lambda n: (asked.append(n), target)[1])
    assert asked == [len(data)] and isinstance(got, memoryview) and bytes(got) == data
    assert np.shares_memory(np.frombuffer(got, np.uint8), target)
    assert (target[len(data):] == 7).all(), "nothing written past the file's bytes"
    got, _ = backends.read_file(str(path), lambda n: None)
    assert type(got) is bytes and got == data
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    assert backends.read_file(str(empty), lambda n: pytest.fail("asked for a 0-byte buffer"))[0] == b""
    with pytest.raises(DecodeError, match="not a regular file"):
        backends.read_file(str(tmp_path), lambda n: target)
