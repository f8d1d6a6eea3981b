"""Test-side JPEG tools, independent of the package's decoder.

- Real photo content from scikit-image's bundled images.
- A JPEG generator on top of Pillow (and simplejpeg for 4:4:0 / 4:1:1).
- The reference decode (Pillow, as SPEC.md section 1 defines it).
- A small baseline *entropy encoder* (T.81 Annex C code assignment, F.1.2 coding of
  DC differences and AC run/size pairs, byte stuffing, RSTn) that turns coefficient
  blocks back into entropy-coded bytes. It is used to re-encode what the model decoded
  (which must reproduce libjpeg's bytes exactly) and to craft streams with chosen
  faults (bad Huffman codes, coefficient overflow, extreme values, non-interleaved
  scans), for which Pillow stays the oracle.
"""

from __future__ import annotations

import csv
import functools
import importlib.resources
import io
import os
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def fuzz_examples(n: int) -> int:
    """Hypothesis example count, scaled by DLBOOSTER_FUZZ_SCALE (default 1)."""
    return max(1, int(n * float(os.environ.get("DLBOOSTER_FUZZ_SCALE", "1"))))


# ---------------------------------------------------------------------------------
# Photos


def skimage_data_dir():
    """The folder of images that scikit-image ships (a Traversable)."""
    return importlib.resources.files("skimage") / "data"


@functools.lru_cache(maxsize=None)
def photo(name: str) -> Image.Image:
    """A real photo shipped with scikit-image, fully loaded (cached; do not mutate)."""
    with (skimage_data_dir() / name).open("rb") as f:
        im = Image.open(io.BytesIO(f.read()))
        im.load()
    return im


def photo_bytes(name: str) -> bytes:
    return (skimage_data_dir() / name).read_bytes()


def photo_crop(width: int, height: int, name: str = "astronaut.png", mode: str = "RGB",
               x: int | None = None, y: int | None = None) -> Image.Image:
    """A width x height piece of a real photo (scaled up first when the photo is smaller).

    Without x/y the crop is taken from the middle of the picture, where there is detail.
    """
    im = photo(name).convert(mode)
    if im.width < width or im.height < height:
        scale = max(width / im.width, height / im.height)
        im = im.resize((max(width, round(im.width * scale + 0.5)),
                        max(height, round(im.height * scale + 0.5))), Image.LANCZOS)
    if x is None:
        x = (im.width - width) // 2
    if y is None:
        y = (im.height - height) // 2
    x = min(max(0, x), im.width - width)
    y = min(max(0, y), im.height - height)
    return im.crop((x, y, x + width, y + height))


# ---------------------------------------------------------------------------------
# Generator

#: Pillow's subsampling argument -> (luma h, luma v), with the classify() label.
PIL_SUBSAMPLING = {0: ((1, 1), "4:4:4"), 1: ((2, 1), "4:2:2"), 2: ((2, 2), "4:2:0")}
#: simplejpeg's colorsubsampling argument -> (luma h, luma v), label.
SJ_SUBSAMPLING = {"444": ((1, 1), "4:4:4"), "422": ((2, 1), "4:2:2"), "420": ((2, 2), "4:2:0"),
                  "440": ((1, 2), "4:4:0"), "411": ((4, 1), "other")}

#: The hardware subsamplings as generator arguments (Pillow ints, "440" via simplejpeg,
#: "gray" for one component).
HW_SUBSAMPLINGS = (0, 1, 2, "440", "gray")


class EncoderRefused(Exception):
    """Pillow's encoder raised for this parameter combination (e.g. optimize on tiny)."""


def make_jpeg(width: int, height: int, *, subsampling=2, quality: int = 75,
              name: str | None = None, image: Image.Image | None = None,
              optimize: bool = False, progressive: bool = False,
              restart_blocks: int | None = None, restart_rows: int | None = None,
              qtables=None, mode: str | None = None, **save_args) -> bytes:
    """Encode a real-photo crop as JPEG.

    Args:
        subsampling: 0/1/2 (Pillow 4:4:4, 4:2:2, 4:2:0), "440"/"411"/"444"/"422"/"420"
            (simplejpeg), or "gray" (one component, Pillow).
        name: the scikit-image photo; default astronaut (colour) or camera (gray).
        image: use this image instead of a photo crop.
        qtables: Pillow ``qtables`` (natural order); values > 255 give 16-bit DQT.
        mode: Pillow image mode (e.g. "CMYK"); default RGB, or L for gray.

    Raises:
        EncoderRefused: Pillow's encoder raised OSError (happens with optimize=True on
            some tiny images).
    """
    gray = subsampling == "gray"
    if image is None:
        default_name = "camera.png" if gray else "astronaut.png"
        image = photo_crop(width, height, name or default_name, "L" if gray else "RGB")
    if mode is None:
        mode = "L" if gray else "RGB"
    image = image.convert(mode)
    if isinstance(subsampling, str) and not gray:
        if optimize or progressive or restart_blocks or restart_rows or qtables or save_args:
            raise ValueError("simplejpeg path takes quality only")
        arr = np.ascontiguousarray(np.asarray(image.convert("RGB")))
        return simplejpeg_encode(arr, quality, subsampling)
    kwargs = dict(save_args)
    if qtables is not None:
        kwargs["qtables"] = qtables
    else:
        kwargs["quality"] = quality
    if not gray and mode == "RGB":
        kwargs["subsampling"] = subsampling
    if optimize:
        kwargs["optimize"] = True
    if progressive:
        kwargs["progressive"] = True
    if restart_blocks:
        kwargs["restart_marker_blocks"] = restart_blocks
    if restart_rows:
        kwargs["restart_marker_rows"] = restart_rows
    buf = io.BytesIO()
    try:
        image.save(buf, "JPEG", **kwargs)
    except OSError as exc:
        raise EncoderRefused(str(exc)) from exc
    return buf.getvalue()


def simplejpeg_encode(arr: np.ndarray, quality: int, colorsubsampling: str) -> bytes:
    import simplejpeg

    return simplejpeg.encode_jpeg(arr, quality=quality, colorspace="RGB",
                                  colorsubsampling=colorsubsampling)


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def gif_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "GIF")
    return buf.getvalue()


# ---------------------------------------------------------------------------------
# The reference


def pillow_rgb(data: bytes) -> tuple[np.ndarray | None, BaseException | None]:
    """``np.asarray(PIL.Image.open(f).convert("RGB"))`` or the exception Pillow raised."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as im:
                return np.asarray(im.convert("RGB")), None
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types
        return None, exc


def assert_result_matches_pillow(result, data: bytes, *, allow_status=("ok", "fallback")):
    """A DecodeResult agrees with Pillow: same pixels, or 'error' exactly where Pillow fails."""
    ref, exc = pillow_rgb(data)
    if exc is not None:
        assert result.status == "error", (
            f"Pillow raises {type(exc).__name__}: {exc}, but status is {result.status!r} "
            f"(reason {result.reason!r})")
        assert result.image is None
        return
    assert result.status in allow_status, (
        f"Pillow decodes it, but status is {result.status!r} ({result.reason}: {result.detail})")
    assert result.image is not None
    assert result.image.dtype == np.uint8
    assert result.image.shape == ref.shape, (result.image.shape, ref.shape)
    assert np.array_equal(result.image, ref), describe_mismatch(result.image, ref)


def describe_mismatch(got: np.ndarray, ref: np.ndarray) -> str:
    if got.shape != ref.shape:
        return f"shape {got.shape} != {ref.shape}"
    diff = got.astype(np.int32) - ref.astype(np.int32)
    where = np.argwhere(diff != 0)
    return (f"{len(where)} of {diff.size} samples differ, max |diff| {np.abs(diff).max()}, "
            f"first at {tuple(where[0]) if len(where) else None}")


# ---------------------------------------------------------------------------------
# Byte-level editing


def segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


def one_code_tables_jpeg() -> bytes:
    """8x8 gray JPEG (about 100 bytes) whose DC and AC tables each hold a single 1-bit
    code (DC size 0, EOB): a flat 128 image. The shortest header a lane meets; loading its
    last table ends with a long lookahead fill."""
    one_code = bytes([1] + [0] * 15)
    return (b"\xff\xd8" + segment(0xDB, b"\x00" + bytes([1] * 64))
            + segment(0xC0, b"\x08\x00\x08\x00\x08\x01\x01\x11\x00")
            + segment(0xC4, b"\x00" + one_code + b"\x00" + b"\x10" + one_code + b"\x00")
            + segment(0xDA, b"\x01\x01\x00\x00\x3f\x00") + b"\x3f" + b"\xff\xd9")


def drop_huffman(data: bytes, drop) -> bytes:
    """``data`` with the Huffman tables ``drop`` ((class, id) pairs: class 0 DC, 1 AC)
    taken out of its DHT segments before the first SOS; an emptied segment goes. Dropping
    all four of a Pillow file gives what a Motion-JPEG (AVI1) frame looks like."""
    out, i = bytearray(data[:2]), 2
    while data[i + 1] != 0xDA:
        end = i + 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
        if data[i + 1] != 0xC4:
            out += data[i:end]
        else:
            kept, j = b"", i + 4
            while j < end:
                n = 17 + sum(data[j + 1:j + 17])
                if (data[j] >> 4, data[j] & 15) not in drop:
                    kept += data[j:j + n]
                j += n
            if kept:
                out += segment(0xC4, kept)
        i = end
    return bytes(out + data[i:])


def sos_segment(components, ss=0, se=63, ah=0, al=0) -> bytes:
    """SOS for ``components`` = [(component id, td, ta), ...]."""
    body = bytes([len(components)])
    for cid, td, ta in components:
        body += bytes([cid, (td << 4) | ta])
    return segment(0xDA, body + bytes([ss, se, (ah << 4) | al]))


def marker_offsets(info, marker: int) -> list[int]:
    return [off for m, off in info.markers if m == marker]


def segment_span(data: bytes, offset: int) -> tuple[int, int]:
    """(start, end) byte span of the marker segment at ``offset`` (marker included)."""
    length = (data[offset + 2] << 8) | data[offset + 3]
    return offset, offset + 2 + length


def find_rst(data: bytes, start: int, end: int) -> list[int]:
    """Offsets of the RSTn markers (FF D0..D7) in data[start:end]."""
    out = []
    i = start
    while i < end - 1:
        if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7:
            out.append(i)
            i += 2
        else:
            i += 1
    return out


# ---------------------------------------------------------------------------------
# Entropy encoder (independent of dlbooster.jpeg.model)

#: Zigzag index k -> natural (row-major) position, written out from T.81 Figure A.6.
ZIGZAG_TO_NATURAL = [
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5,
    12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6, 7, 14, 21, 28,
    35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
    58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
]


def huffman_codes(counts, symbols) -> dict[int, tuple[int, int]]:
    """symbol -> (code, length), T.81 Annex C (Figures C.1 to C.3)."""
    codes = {}
    code = 0
    k = 0
    for length in range(1, 17):
        for _ in range(counts[length - 1]):
            codes[symbols[k]] = (code, length)
            code += 1
            k += 1
        code <<= 1
    return codes


def magnitude(value: int) -> tuple[int, int, int]:
    """(size category, appended bits, their count) for a DC difference or AC value."""
    s = abs(int(value)).bit_length()
    bits = value if value >= 0 else value + (1 << s) - 1
    return s, bits & ((1 << s) - 1) if s else 0, s


class BitWriter:
    def __init__(self):
        self.out = bytearray()
        self.acc = 0
        self.n = 0

    def put(self, value: int, count: int):
        for i in range(count - 1, -1, -1):
            self.acc = (self.acc << 1) | ((value >> i) & 1)
            self.n += 1
            if self.n == 8:
                self.out.append(self.acc)
                if self.acc == 0xFF:
                    self.out.append(0x00)  # T.81 F.1.2.3 byte stuffing
                self.acc = 0
                self.n = 0

    def put_bits(self, bitstring: str):
        for ch in bitstring:
            self.put(int(ch), 1)

    def flush(self):
        """Pad the last byte with 1-bits (T.81 F.1.2.3), as libjpeg does."""
        if self.n:
            self.put((1 << (8 - self.n)) - 1, 8 - self.n)

    def marker(self, code: int):
        self.flush()
        self.out += bytes([0xFF, code])


def block_tokens(block, pred: int) -> tuple[list[tuple], int]:
    """Tokens for one block of quantised coefficients (natural order, 64 values).

    Tokens: ("dc", diff), ("ac", run, value), ("zrl",), ("eob",), ("raw", "0101..."),
    and for crafting ("sym", ac_symbol) (the symbol's code alone).
    """
    zz = [int(block[ZIGZAG_TO_NATURAL[k]]) for k in range(64)]
    tokens = [("dc", zz[0] - pred)]
    run = 0
    for k in range(1, 64):
        if zz[k] == 0:
            run += 1
            continue
        while run > 15:
            tokens.append(("zrl",))
            run -= 16
        tokens.append(("ac", run, zz[k]))
        run = 0
    if run:
        tokens.append(("eob",))
    return tokens, zz[0]


@dataclass
class Crafted:
    """Replace the tokens of one block: the ``index``-th data unit of component ``comp``
    in scan order. ``tokens`` start with a ("dc", diff) token or a ("raw", bits) one."""

    comp: int
    index: int
    tokens: list


def encode_units(units, tables, restart_interval: int = 0, crafted=()) -> bytes:
    """Entropy-code MCUs.

    Args:
        units: list of MCUs; each MCU a list of (component, block) with block a sequence
            of 64 quantised coefficients in natural order.
        tables: component -> (dc codes, ac codes) from :func:`huffman_codes`.
        restart_interval: MCUs per restart interval (0: none).
        crafted: :class:`Crafted` replacements.
    """
    w = BitWriter()
    preds: dict[int, int] = {}
    seen: dict[int, int] = {}
    replace = {(c.comp, c.index): c.tokens for c in crafted}
    rst = 0
    for m, mcu in enumerate(units):
        if restart_interval and m and m % restart_interval == 0:
            w.marker(0xD0 + rst)
            rst = (rst + 1) & 7
            preds = {}
        for comp, block in mcu:
            index = seen.get(comp, 0)
            seen[comp] = index + 1
            pred = preds.get(comp, 0)
            tokens = replace.get((comp, index))
            if tokens is None:
                tokens, preds[comp] = block_tokens(block, pred)
            else:
                for t in tokens:
                    if t[0] == "dc":
                        preds[comp] = pred + t[1]
            dc, ac = tables[comp]
            for t in tokens:
                if t[0] == "raw":
                    w.put_bits(t[1])
                    continue
                if t[0] == "dc":
                    s, bits, n = magnitude(t[1])
                    code, length = dc[s]
                elif t[0] == "ac":
                    s, bits, n = magnitude(t[2])
                    code, length = ac[(t[1] << 4) | s]
                elif t[0] == "zrl":
                    (code, length), n = ac[0xF0], 0
                elif t[0] == "eob":
                    (code, length), n = ac[0x00], 0
                elif t[0] == "sym":  # an AC symbol written verbatim, no extra bits
                    (code, length), n = ac[t[1]], 0
                else:
                    raise ValueError(t)
                w.put(code, length)
                if n:
                    w.put(bits, n)
    w.flush()
    return bytes(w.out)


def interleaved_units(grids, factors, mcux: int, mcuy: int):
    """MCUs of an interleaved scan. grids[c]: (rows, cols, 64); factors[c]: (h, v)."""
    units = []
    for my in range(mcuy):
        for mx in range(mcux):
            mcu = []
            for c, (grid, (h, v)) in enumerate(zip(grids, factors, strict=True)):
                for by in range(v):
                    for bx in range(h):
                        mcu.append((c, grid[my * v + by, mx * h + bx]))
            units.append(mcu)
    return units


def single_component_units(grid, comp: int, rows: int, cols: int):
    """MCUs (one block each) of a non-interleaved scan over the first rows x cols blocks."""
    return [[(comp, grid[r, c])] for r in range(rows) for c in range(cols)]


def scan_tables(info, scan_index: int = 0):
    """component index -> (dc codes, ac codes) of a parsed scan."""
    scan = info.scans[scan_index]
    out = {}
    for index, td, ta in scan.components:
        dc = scan.dc_tables[td]
        ac = scan.ac_tables[ta]
        out[index] = (huffman_codes(dc.counts, dc.symbols), huffman_codes(ac.counts, ac.symbols))
    return out


def mcu_geometry(info):
    """(mcux, mcuy, factors) of the interleaved scan of a parsed 3-component frame."""
    frame = info.frame
    hmax, vmax = frame.hmax, frame.vmax
    mcux = -(-frame.width // (8 * hmax))
    mcuy = -(-frame.height // (8 * vmax))
    return mcux, mcuy, [(c.h, c.v) for c in frame.components]


def reencode(data: bytes, info, grids, crafted=(), restart_interval=None) -> bytes:
    """Replace the entropy-coded data of the (single, interleaved) scan of ``data``.

    ``grids`` are per-component (rows, cols, 64) coefficient grids in the MCU-padded
    block layout of the scan (1 component: ceil(H/8) x ceil(W/8)).
    """
    scan = info.scans[0]
    ri = scan.restart_interval if restart_interval is None else restart_interval
    tables = scan_tables(info)
    if len(info.frame.components) == 1:
        g = grids[0]
        units = single_component_units(g, 0, g.shape[0], g.shape[1])
    else:
        mcux, mcuy, factors = mcu_geometry(info)
        units = interleaved_units(grids, factors, mcux, mcuy)
    entropy = encode_units(units, tables, ri, crafted)
    return data[: scan.data_start] + entropy + data[scan.data_end:]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def rescan(data: bytes, info, coefficients, groups, restart_interval: int = 0) -> bytes:
    """Rewrite a single-scan sequential file as several scans.

    Args:
        data, info: the original file and its parse.
        coefficients: per-component MCU-padded grids (as dlbooster.jpeg.model decodes them).
        groups: component indices per scan, e.g. [[0], [1], [2]] (non-interleaved) or
            [[0, 1], [2]]. A one-component scan codes just that component's blocks
            (T.81 A.2.2); a multi-component scan is interleaved over the frame's MCUs.
        restart_interval: DRI value in effect (must match the header's DRI).
    """
    frame = info.frame
    tables = scan_tables(info)
    td_ta = {index: (td, ta) for index, td, ta in info.scans[0].components}
    sos = [off for m, off in info.markers if m == 0xDA][0]
    out = bytearray(data[:sos])
    hmax, vmax = frame.hmax, frame.vmax
    for group in groups:
        comps = [(frame.components[c].id, *td_ta[c]) for c in group]
        out += sos_segment(comps)
        if len(group) == 1:
            c = group[0]
            comp = frame.components[c]
            rows = ceil_div(ceil_div(frame.height * comp.v, vmax), 8)
            cols = ceil_div(ceil_div(frame.width * comp.h, hmax), 8)
            units = single_component_units(coefficients[c], c, rows, cols)
        else:
            mcux, mcuy, factors = mcu_geometry(info)
            units = []
            for my in range(mcuy):
                for mx in range(mcux):
                    mcu = []
                    for c in group:
                        h, v = factors[c]
                        for by in range(v):
                            for bx in range(h):
                                mcu.append((c, coefficients[c][my * v + by, mx * h + bx]))
                    units.append(mcu)
        out += encode_units(units, tables, restart_interval)
    out += b"\xff\xd9"
    return bytes(out)


# ---------------------------------------------------------------------------------
# Corpus (read in place from $DLBOOSTER_CORPUS, else ../shared/corpus beside the checkout, as
# the command line finds it; never copied into the repository)

CORPUS_DIR = Path(os.environ.get("DLBOOSTER_CORPUS") or Path(__file__).resolve().parents[2] / "shared" / "corpus")


def corpus_available() -> bool:
    return (CORPUS_DIR / "classify.tsv").is_file()


@functools.lru_cache(maxsize=None)
def corpus_rows() -> tuple[dict, ...]:
    """Rows of classify.tsv (empty when the corpus is absent)."""
    if not corpus_available():
        return ()
    with open(CORPUS_DIR / "classify.tsv", newline="") as f:
        return tuple(csv.DictReader(f, delimiter="\t"))


def corpus_paths() -> list[str]:
    """Relative paths of every corpus file (one classify.tsv row per file)."""
    return [r["path"] for r in corpus_rows()]


def corpus_params(paths):
    """pytest parameters for corpus paths (one skipped entry when there is no corpus)."""
    if not paths:
        reason = (f"corpus not present at {CORPUS_DIR}" if not corpus_available()
                  else "no corpus file has the features this test needs")
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason))]
    return [pytest.param(p, id=p) for p in paths]


def require_corpus() -> Path:
    if not corpus_available():
        pytest.skip(f"corpus not present at {CORPUS_DIR}")
    return CORPUS_DIR


def _int(text: str, default: int = 0) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


HW_SUBSAMPLING_LABELS = ("gray", "4:4:4", "4:2:2", "4:4:0", "4:2:0")


def hardware_candidates(rows) -> list[dict]:
    """Rows whose headers (per classify.tsv) look hardware-decodable and Pillow-readable."""
    return [r for r in rows
            if r["sof"] in ("SOF0", "SOF1") and r["precision"] == "8"
            and r["subsampling"] in HW_SUBSAMPLING_LABELS and r["n_scans"] == "1"
            and r["pil_ok"] == "1" and not r["dup_of"]]


# Clean-looking files (per ``looks_clean``) that a decoder lane still declines, with the
# reason, which classify.tsv's columns do not show.
CLEAN_BUT_DECLINED = {
    "lepton/images/androidtrail.jpg": "after-scan",               # an APP1 segment between the scan and EOI
    "pillow/Tests/images/hopper_bad_exif.jpg": "coefficient-overflow",
    "pillow/Tests/images/jpeg_ff00_header.jpg": "junk",           # bytes between segments
    "zune-image/test-images/jpeg/weid_sampling_factors.jpg": "sampling",   # every component 1x2
}


def looks_clean(row: dict) -> bool:
    """A hardware candidate (:func:`hardware_candidates`) that classify.tsv shows no
    reason to decline: a plain JPEG (not MPO), no Adobe RGB transform, no garbage, no
    trailing bytes, an EOI, not a fuzzing input, at most 8192 pixels wide. Judged from
    the TSV alone, so that tests of the decoders do not take their expectation from
    the decoders' own pre-screen."""
    return (row["pil_format"] == "JPEG" and row["adobe_transform"] != "0" and "garbage" not in row["note"]
            and row["trailing"] in ("0", "") and row["has_eoi"] == "1" and "fuzz" not in row["path"]
            and _int(row["width"]) <= 8192)


def feature_subset(rows, per_group: int = 1, cap: int = 40) -> list[dict]:
    """A small feature-covering pick: the first ``per_group`` rows of every
    (subsampling, restart interval > 0, source) group, then capped round-robin."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["subsampling"], _int(r["restart_interval"]) > 0, r["source"])
        if len(groups.setdefault(key, [])) < per_group:
            groups[key].append(r)
    picked: list[dict] = []
    rounds = [list(g) for _, g in sorted(groups.items())]
    while len(picked) < cap and any(rounds):
        for g in rounds:
            if g and len(picked) < cap:
                picked.append(g.pop(0))
    return picked


def gen(*args, **kwargs) -> bytes:
    """make_jpeg, skipping the test where Pillow's encoder refuses the combination."""
    try:
        return make_jpeg(*args, **kwargs)
    except EncoderRefused as exc:
        pytest.skip(f"Pillow's encoder refuses {args} {kwargs}: {exc}")


def truncated_entropy(data: bytes) -> bytes:
    """The entropy-coded data cut in half, EOI kept: the model says ``truncated``."""
    from dlbooster import jpeg

    scan = jpeg.parse(data).scans[0]
    return data[:(scan.data_start + scan.data_end) // 2] + data[scan.data_end:]


def noise_jpeg(width: int, height: int, **options) -> bytes:
    """Pillow's JPEG (``options`` as ``Image.save``) of seeded noise: many FF bytes in the
    entropy-coded data, so many stuffed zeros (FF 00)."""
    rng = np.random.default_rng(width * 7919 + height)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(out, "JPEG", **options)
    return out.getvalue()


def fill_before_stuffing(data: bytes) -> bytes:
    """An FF fill byte inserted before the first stuffed zero (FF 00) in the first half of
    the entropy-coded data (T.81 B.1.1.2 allows fill bytes only before markers, and
    libjpeg-turbo reads the sequence two ways): the model says ``fill-before-stuffing``."""
    from dlbooster import jpeg

    scan = jpeg.parse(data).scans[0]
    at = data.find(b"\xff\x00", scan.data_start, (scan.data_start + scan.data_end) // 2)
    assert at >= 0, "no stuffed zero in the first half of the entropy-coded data"
    return data[:at] + b"\xff" + data[at:]


def feature_files(max_width: int) -> dict[str, bytes]:
    """Generated files covering every feature the decoder takes (every sampling, odd
    sizes, quality 1..100, restart intervals, optimised and 16-bit tables), then five it
    must stop on (progressive, wider than ``max_width``, truncated entropy data, no EOI,
    a fill byte before a stuffed zero)."""
    files = {
        "420_q85": gen(40, 24, subsampling=2, quality=85),
        "422_q1_odd": gen(17, 9, subsampling=1, quality=1),
        "444_q100": gen(33, 17, subsampling=0, quality=100),
        "440_q80": gen(24, 33, subsampling="440", quality=80),
        "gray_q60_odd": gen(23, 19, subsampling="gray", quality=60),
        "420_restart_blocks": gen(35, 27, subsampling=2, quality=30, restart_blocks=2),
        "444_restart_rows_optimised": gen(32, 24, subsampling=0, quality=70, restart_rows=1, optimize=True),
        "420_16bit_dqt": gen(24, 24, subsampling=2, qtables=[[300 + (i % 7) for i in range(64)]] * 2),
        "420_1x1": gen(1, 1, subsampling=2, quality=75),
        "422_narrow": gen(2, 12, subsampling=1, quality=90),
        "progressive": gen(16, 16, subsampling=2, progressive=True),
        "too_wide": gen(max_width + 8, 8, subsampling=0, quality=50),
        "truncated": truncated_entropy(gen(24, 24, subsampling=0, quality=90)),
        "no_eoi": gen(16, 8, subsampling=2, quality=70)[:-2],
        "fill_before_stuffing": fill_before_stuffing(gen(40, 24, subsampling=2, quality=100)),
    }
    return files
