"""JPEG structure parser and hardware-profile classifier.

:func:`parse` walks the marker segments of a JPEG byte string (ITU-T T.81 Annex B: SOI,
APPn, COM, DQT, DHT, SOF0..SOF15, DRI, SOS, RSTn, DNL, EOI) and returns a
:class:`JpegInfo`. It locates the entropy-coded segment of every scan and counts its RSTn
markers, but never decodes entropy-coded data. It never raises on any byte string:
structural faults are recorded in :attr:`JpegInfo.error`.

:func:`classify` checks a parsed file against the hardware profile of SPEC.md section 2
and returns ``None`` (hardware-decodable) or a fallback reason code. The checks follow
what libjpeg-turbo (as bundled by Pillow) would do with the same headers, and err on the
side of sending odd files to the CPU path: a fallback costs time, never correctness.

Reason codes returned by :func:`classify` (also as :data:`REASONS`):

``not-jpeg``, ``malformed-header``, ``no-frame``, ``no-scan``, ``hierarchical``,
``lossless``, ``arithmetic``, ``progressive``, ``precision``, ``components``,
``color-transform``, ``sampling``, ``non-interleaved``, ``multi-scan``, ``dnl``,
``missing-table``, ``bad-table``, ``width``, ``too-large``, ``after-scan``, ``mpo`` (an
APP2 MPF segment: Pillow opens the file as a multi-picture object), ``junk`` (bytes
between marker segments: corrupt data that libjpeg-turbo skips with a warning),
``input-size`` (4 GiB of input or more: the device's 32-bit ``JOB_IN_LEN`` register,
docs/device.md, cannot hold its length).
"""

from __future__ import annotations

import functools
import math
import re
import struct
import warnings
from dataclasses import dataclass, field

import numpy as np

from dlbooster.hw.t81 import ZIGZAG

__all__ = [
    "REASONS",
    "ZIGZAG",
    "Component",
    "Frame",
    "Scan",
    "HuffmanTable",
    "JpegInfo",
    "parse",
    "classify",
    "HOST_ONLY_REASONS",
    "host_prescreen",
    "pillow_header_error",
    "DEFAULT_MAX_WIDTH",
    "MAX_SCANS",
    "PILLOW_MAX_PIXELS",
    "pillow_max_pixels",
    "HARDWARE_SAMPLINGS",
    "STANDARD_HUFFMAN",
    "standard_huffman_segment",
    "with_standard_huffman",
]

#: Every reason code :func:`classify` returns (module doc).
REASONS = frozenset({
    "not-jpeg", "malformed-header", "no-frame", "no-scan", "hierarchical", "lossless",
    "arithmetic", "progressive", "precision", "components", "color-transform", "sampling",
    "non-interleaved", "multi-scan", "dnl", "missing-table", "bad-table", "width",
    "too-large", "after-scan", "mpo", "junk", "input-size",
})

#: Default line-buffer width of a decoder lane, in pixels.
DEFAULT_MAX_WIDTH = 8192
#: Scans :func:`parse` records before it stops with an error: each costs about 1.4 kB of
#: tables, and a file of SOS segments alone made 100 bytes of them per input byte.
#: Progressive files have about 10 (jcparam.c's simple progression); what the limit
#: stops goes to the CPU path, where Pillow decides.
MAX_SCANS = 1000

#: Pillow raises ``DecompressionBombError`` above twice ``Image.MAX_IMAGE_PIXELS``
#: (89,478,485 by default in Pillow 13, ``PIL/Image.py``); a decoder must fail there too.
PILLOW_MAX_PIXELS = 2 * 89_478_485


def pillow_max_pixels() -> int | None:
    """Pillow's current decompression-bomb error limit (None when disabled)."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    return None if limit is None else 2 * int(limit)

#: Luma (h, v) sampling factors the hardware takes, with chroma 1x1 (SPEC.md section 2).
HARDWARE_SAMPLINGS = {(1, 1): "4:4:4", (2, 1): "4:2:2", (1, 2): "4:4:0", (2, 2): "4:2:0"}

# JPEG_MAX_DIMENSION in libjpeg-turbo's jmorecfg.h: larger frames are rejected.
_JPEG_MAX_DIMENSION = 65500

_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_RST_MARKERS = frozenset(range(0xD0, 0xD8))
# In entropy-coded data: a run of two or more 0xFF (fill bytes, T.81 B.1.1.2) with the
# byte after it, if any (a stuffed zero after fill bytes is not valid T.81; anything else
# is a marker), or one 0xFF and a code that is neither 0x00 (stuffing, T.81 F.1.2.3) nor
# 0xFF (a marker). A run is matched whole: started at each of its bytes in turn, the
# search took time quadratic in the run's length.
_MARKER_RE = re.compile(rb"\xff\xff+[\x00-\xfe]?|\xff[\x01-\xfe]")


@dataclass(frozen=True, slots=True)
class Component:
    """One frame component (T.81 B.2.2): identifier, sampling factors, quantiser slot."""

    id: int
    h: int
    v: int
    tq: int


@dataclass(frozen=True, slots=True)
class Frame:
    """Frame header: ``sof`` is the marker's low nibble (0 = SOF0 ... 15 = SOF15)."""

    sof: int
    precision: int
    height: int
    width: int
    components: tuple[Component, ...]

    @property
    def hmax(self) -> int:
        return max(c.h for c in self.components)

    @property
    def vmax(self) -> int:
        return max(c.v for c in self.components)


@dataclass(frozen=True, slots=True)
class HuffmanTable:
    """A DHT table: ``counts[i]`` codes of length ``i + 1`` bits, then the symbols."""

    counts: tuple[int, ...]
    symbols: bytes

    def check(self, is_dc: bool) -> str | None:
        """Return why libjpeg-turbo's ``jpeg_make_d_derived_tbl`` rejects it, or None."""
        return _check_huffman(self.counts, self.symbols, is_dc)


@functools.lru_cache(maxsize=256)  # most files carry the same few tables
def _check_huffman(counts: tuple[int, ...], symbols: bytes, is_dc: bool) -> str | None:
    code = 0
    for length, count in enumerate(counts, start=1):
        code += count
        # "no code is allowed to be all ones": the next free code must fit in l bits.
        if code >= (1 << length):
            return "Huffman code space overflows or uses the all-ones code"
        code <<= 1
    if is_dc and symbols and max(symbols) > 15:
        return "DC symbol above 15"
    return None


@dataclass(slots=True)
class Scan:
    """One scan: SOS parameters, the tables in effect at SOS, and its coded bytes.

    ``components`` holds ``(frame_index, td, ta)`` per scan component. For sequential
    frames libjpeg-turbo ignores ``ss``, ``se``, ``ah`` and ``al`` (it only warns), and so
    does the hardware.
    ``data_start``/``data_end`` delimit the entropy-coded segment, RSTn markers
    included; ``data_end`` is the offset of the first other marker (or the end of the
    input). ``restarts`` counts the RSTn markers in it. ``fill_before_stuffing`` is the
    offset of the first run of fill bytes before a stuffed zero in it (``FF FF.. 00``,
    not valid T.81, B.1.1.2; libjpeg-turbo reads it one way or another depending on how
    much input it has buffered), or -1.
    """

    components: tuple[tuple[int, int, int], ...]
    ss: int
    se: int
    ah: int
    al: int
    restart_interval: int
    qtables: dict[int, np.ndarray]
    dc_tables: dict[int, HuffmanTable]
    ac_tables: dict[int, HuffmanTable]
    data_start: int
    data_end: int = -1
    restarts: int = 0
    fill_before_stuffing: int = -1


@dataclass(slots=True)
class JpegInfo:
    """What :func:`parse` found.

    Attributes:
        size: length of the input in bytes.
        frame: the frame header, or None.
        scans: scans in file order.
        markers: ``(marker, offset)`` of every marker segment outside entropy data.
        jfif: an APP0 JFIF segment was seen (libjpeg-turbo ``examine_app0``).
        adobe_transform: the APP14 Adobe transform flag, or None without one.
        not_jpeg: the input does not start with SOI and a marker.
        headers_only: parsing stopped at the first SOS (see :func:`parse`).
        dnl: a DNL segment before the first scan (one after it is ``after-scan``'s, as
            the decoder's entropy stage reports it).
        dac: a DAC segment (arithmetic conditioning) came before the first scan.
        icc_segments: ICC_PROFILE APP2 bodies seen since the last check (internal).
        eoi: offset of EOI, or -1 if the input ends first.
        junk_bytes: bytes skipped between marker segments (libjpeg-turbo warns, decodes).
        mpf: an APP2 MPF segment was seen (Pillow opens the file as MPO).
        pillow_error: a fault only Pillow's own header parser trips on (see
            :func:`pillow_header_error`), or None.
        pillow_dpi: a JFIF APP0 gave Pillow a dpi (so it skips the EXIF resolution).
        exif: the EXIF data as Pillow collects it from APP1 segments, or None.
        error: first structural fault (marker, length or table syntax), or None.
        error_offset: byte offset of that fault, or -1.
    """

    size: int
    frame: Frame | None = None
    scans: list[Scan] = field(default_factory=list)
    markers: list[tuple[int, int]] = field(default_factory=list)
    jfif: bool = False
    adobe_transform: int | None = None
    eoi: int = -1
    error: str | None = None
    error_offset: int = -1
    not_jpeg: bool = False
    headers_only: bool = False
    junk_bytes: int = 0
    dnl: bool = False
    dac: bool = False
    mpf: bool = False
    pillow_error: str | None = None
    pillow_dpi: bool = False
    exif: bytes | None = None
    icc_segments: list[bytes] = field(default_factory=list)

    @property
    def trailing(self) -> int:
        """Bytes after EOI (0 when there is no EOI)."""
        return self.size - self.eoi - 2 if self.eoi >= 0 else 0

    @property
    def color_space(self) -> str:
        """libjpeg-turbo's guess of the coded colour space (``jdapimin.c``
        ``default_decompress_parms``): gray, ycbcr, rgb, cmyk, ycck or unknown."""
        frame = self.frame
        if frame is None:
            return "unknown"
        n = len(frame.components)
        if n == 1:
            return "gray"
        if n == 3:
            if self.jfif:
                return "ycbcr"
            if self.adobe_transform is not None:
                return "rgb" if self.adobe_transform == 0 else "ycbcr"
            ids = tuple(c.id for c in frame.components)
            return "rgb" if ids == (82, 71, 66) else "ycbcr"
        if n == 4:
            return "ycck" if self.adobe_transform == 2 else "cmyk"
        return "unknown"

    def summary(self) -> str:
        """The frame in a few words, for messages: ``SOF2 8-bit 80x60, 3 components
        (1:2x2 2:1x1 3:1x1), ycbcr, 10 scans``; empty without a frame."""
        frame = self.frame
        if frame is None:
            return ""
        comps = " ".join(f"{c.id}:{c.h}x{c.v}" for c in frame.components)
        scans = f", {len(self.scans)} scan{'s' if len(self.scans) != 1 else ''}" if not self.headers_only else ""
        return (f"SOF{frame.sof} {frame.precision}-bit {frame.width}x{frame.height}, {len(frame.components)} "
                f"component{'s' if len(frame.components) != 1 else ''} ({comps}), {self.color_space}{scans}")

    @property
    def subsampling(self) -> str:
        """``gray``, ``4:4:4``, ``4:2:2``, ``4:4:0``, ``4:2:0`` or ``other``."""
        frame = self.frame
        if frame is None:
            return "other"
        if len(frame.components) == 1:
            return "gray"
        luma, *chroma = frame.components
        if len(frame.components) != 3 or any((c.h, c.v) != (1, 1) for c in chroma):
            return "other"
        return HARDWARE_SAMPLINGS.get((luma.h, luma.v), "other")


def _fail(info: JpegInfo, message: str, offset: int) -> JpegInfo:
    info.error = message
    info.error_offset = offset
    return info


def _end_of_entropy_data(data: bytes, start: int) -> tuple[int, int, int]:
    """Return (offset of the first non-RST marker at or after ``start``, RSTn count,
    offset of the first fill bytes before a stuffed zero or -1)."""
    restarts = 0
    fill = -1
    for m in _MARKER_RE.finditer(data, start):
        code = data[m.end() - 1]
        if code == 0xFF:                      # fill bytes up to the end of the data
            break
        if code == 0:
            if fill < 0:
                fill = m.start()
            continue
        if code in _RST_MARKERS:
            restarts += 1
            continue
        return m.end() - 2, restarts, fill
    return len(data), restarts, fill


def parse(data: bytes, *, headers_only: bool = False) -> JpegInfo:
    """Parse the marker structure of a JPEG file.

    Args:
        data: the whole file (bytes, bytearray or memoryview).
        headers_only: stop at the first SOS (the runtime's pre-screen: what follows
            the first scan header is checked by the decoder itself). The scan's
            ``data_end`` is then -1.

    Returns:
        JpegInfo. Never raises for any content; faults are in ``info.error``
        (``info.not_jpeg`` when the input does not start with SOI and a marker, which
        is Pillow's own test, ``JpegImagePlugin._accept``).
    """
    data = bytes(data)
    n = len(data)
    info = JpegInfo(size=n)
    if n < 3 or data[0] != 0xFF or data[1] != 0xD8 or data[2] != 0xFF:
        info.not_jpeg = True
        return _fail(info, "no SOI marker", 0)
    qtables: dict[int, np.ndarray] = {}
    dc_tables: dict[int, HuffmanTable] = {}
    ac_tables: dict[int, HuffmanTable] = {}
    restart_interval = 0
    pos = 2
    while True:
        if pos >= n:
            return info
        # Skip junk up to the next marker as libjpeg-turbo's next_marker() and Pillow's
        # parser both do: non-FF bytes, fill bytes (T.81 B.1.1.2) and FF 00 pairs.
        while pos < n:
            if data[pos] != 0xFF:
                info.junk_bytes += 1
                pos += 1
            elif pos + 1 < n and data[pos + 1] == 0xFF:
                pos += 1
            elif pos + 1 < n and data[pos + 1] == 0x00:
                info.junk_bytes += 2
                pos += 2
            else:
                break
        if pos + 1 >= n:
            return info
        marker = data[pos + 1]
        offset = pos
        info.markers.append((marker, offset))
        pos += 2
        if marker == 0xD9:
            info.eoi = offset
            return info
        if marker in _RST_MARKERS or marker == 0xD8 or marker < 0xC0:
            return _fail(info, f"unexpected marker 0xFF{marker:02X}", offset)
        if pos + 2 > n:
            return _fail(info, "truncated marker segment", offset)
        length = (data[pos] << 8) | data[pos + 1]
        if length < 2 or pos + length > n:
            return _fail(info, f"bad length of segment 0xFF{marker:02X}", offset)
        body = data[pos + 2 : pos + length]
        pos += length
        if 0xE0 <= marker <= 0xEF:
            _parse_app(info, marker, body)
        elif marker == 0xFE:
            pass  # COM: a comment, nothing to decode
        elif marker == 0xDB:
            error = _parse_dqt(body, qtables)
            if error:
                return _fail(info, error, offset)
        elif marker == 0xC4:
            error = _parse_dht(body, dc_tables, ac_tables)
            if error:
                return _fail(info, error, offset)
        elif marker == 0xDD:
            if len(body) != 2:
                return _fail(info, "bad DRI length", offset)
            restart_interval = (body[0] << 8) | body[1]
        elif marker in _SOF_MARKERS:
            if info.frame is not None:
                return _fail(info, "second frame header", offset)
            _check_icc(info)
            frame = _parse_sof(marker & 0x0F, body)
            if frame is None:
                return _fail(info, "bad frame header", offset)
            info.frame = frame
        elif marker == 0xDA:
            if info.frame is None:
                return _fail(info, "SOS before SOF", offset)
            if len(info.scans) == MAX_SCANS:
                return _fail(info, f"more than {MAX_SCANS} scans", offset)
            scan = _parse_sos(body, info.frame, restart_interval, qtables, dc_tables, ac_tables, pos)
            if scan is None:
                return _fail(info, "bad scan header", offset)
            info.scans.append(scan)
            if headers_only:
                info.headers_only = True
                return info
            scan.data_end, scan.restarts, scan.fill_before_stuffing = _end_of_entropy_data(data, pos)
            pos = scan.data_end
        elif marker == 0xDC:
            info.dnl = info.dnl or not info.scans
        elif marker == 0xCC:
            # DAC (T.81 B.2.4.3), checked as libjpeg-turbo's get_dac (jdmarker.c) does even
            # in a Huffman-coded file: index pairs, a table index below 32, and a DC
            # table's lower bound L not above its upper bound U.
            if len(body) % 2 or any(t >= 32 or (t < 16 and v & 15 > v >> 4) for t, v in zip(body[::2], body[1::2])):
                return _fail(info, "bad DAC segment", offset)
            info.dac = info.dac or not info.scans
        else:
            return _fail(info, f"unsupported marker 0xFF{marker:02X}", offset)


def _parse_app(info: JpegInfo, marker: int, body: bytes) -> None:
    # libjpeg-turbo jdmarker.c examine_app0/examine_app14 decide the colour space;
    # Pillow's JpegImagePlugin.APP reads fixed offsets and fails on short segments.
    # Both only look at segments before the first SOS.
    if info.scans:
        return
    if marker == 0xE0 and body[:4] == b"JFIF":
        info.jfif = info.jfif or (len(body) >= 14 and body[4] == 0)
        if len(body) < 7:
            info.pillow_error = info.pillow_error or "short JFIF APP0"
        elif len(body) >= 12 and body[7] in (1, 2):
            info.pillow_dpi = True
    elif marker == 0xE1 and body[:6] == b"Exif\x00\x00":
        info.exif = body if info.exif is None else info.exif + body[6:]
    elif marker == 0xED and body[:14] == b"Photoshop 3.0\x00":
        if _photoshop_overrun(body):
            info.pillow_error = info.pillow_error or "Photoshop APP13 resource past its end"
    elif marker == 0xEE and body[:5] == b"Adobe":
        if len(body) >= 12:
            info.adobe_transform = body[11]
        if len(body) < 7:
            info.pillow_error = info.pillow_error or "short Adobe APP14"
    elif marker == 0xE2 and body[:12] == b"ICC_PROFILE\x00":
        info.icc_segments.append(body)
    elif marker == 0xE2 and body[:4] == b"MPF\x00":
        info.mpf = True


def _photoshop_overrun(body: bytes) -> bool:
    """Whether Pillow's APP13 "8BIM" resource walk reads a name length past the segment
    (an IndexError that ``JpegImagePlugin.APP`` does not catch; short integer fields
    raise struct.error there, which it does catch)."""
    offset = 14
    while body[offset:offset + 4] == b"8BIM":
        offset += 4
        if offset + 2 > len(body):
            return False
        code = int.from_bytes(body[offset:offset + 2], "big")
        offset += 2
        if offset >= len(body):
            return True
        offset += 1 + body[offset]
        offset += offset & 1
        if offset + 4 > len(body):
            return False
        size = int.from_bytes(body[offset:offset + 4], "big")
        offset += 4
        if code == 0x03ED and len(body[offset:offset + size]) < 14:
            return False  # ResolutionInfo fields read with struct: caught, walk ends
        offset += size
        offset += offset & 1
    return False


def pillow_header_error(info: JpegInfo) -> str | None:
    """Why Pillow's own header parser (``JpegImagePlugin``, Pillow 13) rejects a file
    that libjpeg-turbo would decode, or None.

    Covers the short JFIF/Adobe/ICC segments and Photoshop resources found while
    parsing, and replays ``JpegImageFile._read_dpi_from_exif`` on the EXIF data (it
    runs when no JFIF density gave a dpi, and lets some exceptions escape).
    """
    if info.pillow_error is not None:
        return info.pillow_error
    if info.exif is None or info.pillow_dpi:
        return None

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow warns about corrupt EXIF; we only ask
            exif = Image.Exif()
            exif.load(info.exif)
        resolution_unit = exif[0x0128]
        x_resolution = exif[0x011A]
        try:
            dpi = float(x_resolution[0]) / x_resolution[1]
        except TypeError:
            dpi = x_resolution
        if math.isnan(dpi):
            raise ValueError("DPI is not a number")
        if resolution_unit == 3:
            dpi *= 2.54
    except (struct.error, KeyError, SyntaxError, TypeError, ValueError, ZeroDivisionError):
        return None
    except Exception as exc:  # what escapes Pillow's handler makes Image.open fail
        return f"EXIF resolution: {type(exc).__name__}"
    return None


def _check_icc(info: JpegInfo) -> None:
    # Pillow's SOF handler reads byte 13 of the first ICC segment (sorted) seen so far.
    if info.icc_segments and len(min(info.icc_segments)) < 14:
        info.pillow_error = info.pillow_error or "short ICC_PROFILE APP2"
    info.icc_segments = []


def _parse_dqt(body: bytes, qtables: dict[int, np.ndarray]) -> str | None:
    i = 0
    while i < len(body):
        pq, tq = body[i] >> 4, body[i] & 0x0F
        if pq > 1 or tq > 3:
            return "bad DQT precision or index"
        size = 64 * (pq + 1)
        if i + 1 + size > len(body):
            return "truncated DQT"
        raw = np.frombuffer(body, dtype=">u2" if pq else np.uint8, count=64, offset=i + 1)
        table = np.empty(64, dtype=np.int64)
        table[ZIGZAG] = raw
        qtables[tq] = table
        i += 1 + size
    return None


def _parse_dht(body: bytes, dc: dict[int, HuffmanTable], ac: dict[int, HuffmanTable]) -> str | None:
    i = 0
    while i < len(body):
        tc, th = body[i] >> 4, body[i] & 0x0F
        if tc > 1 or th > 3 or i + 17 > len(body):
            return "bad DHT class, index or length"
        counts = tuple(body[i + 1 : i + 17])
        total = sum(counts)
        if total > 256 or i + 17 + total > len(body):
            return "bad DHT symbol count"
        table = HuffmanTable(counts, bytes(body[i + 17 : i + 17 + total]))
        (ac if tc else dc)[th] = table
        i += 17 + total
    return None


def _parse_sof(sof: int, body: bytes) -> Frame | None:
    if len(body) < 6:
        return None
    nf = body[5]
    if nf == 0 or len(body) != 6 + 3 * nf:
        return None
    comps = tuple(
        Component(body[6 + 3 * k], body[7 + 3 * k] >> 4, body[7 + 3 * k] & 0x0F, body[8 + 3 * k])
        for k in range(nf)
    )
    height = (body[1] << 8) | body[2]
    width = (body[3] << 8) | body[4]
    return Frame(sof, body[0], height, width, comps)


def _parse_sos(body, frame, restart_interval, qtables, dc_tables, ac_tables, data_start) -> Scan | None:
    if not body:
        return None
    ns = body[0]
    if ns < 1 or ns > 4 or len(body) != 4 + 2 * ns:
        return None
    ids = [c.id for c in frame.components]
    comps = []
    for k in range(ns):
        cs, tables = body[1 + 2 * k], body[2 + 2 * k]
        if cs not in ids:
            return None
        index = ids.index(cs)
        if any(index == c[0] for c in comps):
            return None
        comps.append((index, tables >> 4, tables & 0x0F))
    ss, se, a = body[1 + 2 * ns], body[2 + 2 * ns], body[3 + 2 * ns]
    return Scan(
        tuple(comps), ss, se, a >> 4, a & 0x0F, restart_interval,
        dict(qtables), dict(dc_tables), dict(ac_tables), data_start,
    )


def classify(
    info: JpegInfo,
    *,
    max_width: int = DEFAULT_MAX_WIDTH,
    max_pixels: int | None = -1,
) -> str | None:
    """Check a parsed file against the hardware profile (SPEC.md section 2).

    Args:
        info: the result of :func:`parse`.
        max_width: widest frame the decoder lane takes, in pixels.
        max_pixels: frames with more pixels go to the CPU path (which raises there,
            like Pillow); -1 (default) reads Pillow's current limit, None means none.

    Returns:
        None when the file is hardware-decodable, else a reason code (module doc).
    """
    if info.not_jpeg:
        return "not-jpeg"
    frame = info.frame
    if frame is not None:
        # The frame type decides even if later segments are damaged.
        sof = frame.sof
        if sof in (5, 6, 7, 13, 14, 15):
            return "hierarchical"
        if sof in (3, 11):
            return "lossless"
        if sof >= 9:
            return "arithmetic"
        if sof == 2:
            return "progressive"
    if info.error is not None or info.pillow_error is not None:
        return "malformed-header"
    if info.dac:
        # The decoder declines a DAC segment as arithmetic coding; libjpeg-turbo ignores
        # a valid one in a Huffman-coded file.
        return "arithmetic"
    if info.mpf:
        return "mpo"
    if info.junk_bytes:
        # libjpeg-turbo warns "Corrupt JPEG data: extraneous bytes before marker".
        return "junk"
    if frame is None:
        return "no-frame"
    if frame.precision != 8:
        return "precision"
    ncomp = len(frame.components)
    if ncomp not in (1, 3):
        return "components"
    if info.color_space not in ("gray", "ycbcr"):
        return "color-transform"
    if any(not (1 <= c.h <= 4 and 1 <= c.v <= 4) or c.tq > 3 for c in frame.components):
        return "malformed-header"             # T.81 B.2.2: H and V 1-4, Tq 0-3
    if len({c.id for c in frame.components}) != ncomp:
        return "malformed-header"
    if ncomp == 3 and info.subsampling == "other":
        return "sampling"
    if frame.height == 0 or info.dnl:
        return "dnl"
    if frame.width == 0 or frame.width > _JPEG_MAX_DIMENSION or frame.height > _JPEG_MAX_DIMENSION:
        return "malformed-header"
    if not info.scans:
        return "no-scan"
    scan = info.scans[0]
    if len(scan.components) != ncomp:
        return "non-interleaved"
    if len(info.scans) > 1:
        return "multi-scan"
    if [index for index, _, _ in scan.components] != list(range(ncomp)):
        # libjpeg-turbo rejects scans that list components out of frame order.
        return "malformed-header"
    for index, td, ta in scan.components:
        tq = frame.components[index].tq
        if tq not in scan.qtables or td not in scan.dc_tables or ta not in scan.ac_tables:
            return "missing-table"
        if scan.dc_tables[td].check(True) or scan.ac_tables[ta].check(False):
            return "bad-table"
        if int(scan.qtables[tq].max()) > 32767:
            # libjpeg-turbo keeps quantisers in a 16-bit signed MULTIPLIER when built with SIMD.
            return "bad-table"
    if not info.headers_only and (
            info.eoi < 0 or info.markers[-1][0] != 0xD9 or info.markers[-2][0] != 0xDA):
        return "after-scan"
    if frame.width > max_width:
        return "width"
    if info.size >> 32:
        return "input-size"
    if max_pixels == -1:
        max_pixels = pillow_max_pixels()
    if max_pixels is not None and frame.width * frame.height > max_pixels:
        return "too-large"
    if pillow_header_error(info) is not None:
        return "malformed-header"
    return None


#: The Huffman tables T.81 Annex K.3 suggests (Tables K.3-K.6), by (class, id): class 0 is
#: DC and 1 is AC, id 0 is luminance and 1 chrominance; each as (counts of codes of
#: lengths 1-16, symbols). libjpeg-turbo's decoder assumes them for a table a scan names
#: and the file never defines (``jdhuff.c``, ``jpeg_make_d_derived_tbl`` calls
#: ``jpeg_std_huff_table`` of ``jstdhuff.c``): Motion-JPEG frames (AVI1) carry no DHT.
STANDARD_HUFFMAN: dict[tuple[int, int], tuple[tuple[int, ...], bytes]] = {
    (0, 0): ((0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0), bytes(range(12))),
    (0, 1): ((0, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0), bytes(range(12))),
    (1, 0): ((0, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 125), bytes.fromhex(
        "01020300041105122131410613516107227114328191a1082342b1c11552d1f024336272"
        "82090a161718191a25262728292a3435363738393a434445464748494a53545556575859"
        "5a636465666768696a737475767778797a838485868788898a92939495969798999aa2a3"
        "a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2"
        "e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9fa")),
    (1, 1): ((0, 2, 1, 2, 4, 4, 3, 4, 7, 5, 4, 4, 0, 1, 2, 119), bytes.fromhex(
        "000102031104052131061241510761711322328108144291a1b1c109233352f0156272d1"
        "0a162434e125f11718191a262728292a35363738393a434445464748494a535455565758"
        "595a636465666768696a737475767778797a82838485868788898a92939495969798999a"
        "a2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9da"
        "e2e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8f9fa")),
}


def standard_huffman_segment(info: JpegInfo) -> bytes | None:
    """The DHT segment (marker included) of the :data:`STANDARD_HUFFMAN` tables that the
    first scan names but the file does not define before it; None when the scan has all
    its tables, names a missing table other than 0 and 1 (libjpeg-turbo fails there:
    "Huffman table 0x02 was not defined"), or the file has no sequential frame and scan.

    ``info``: :func:`parse` of the input (headers only suffices). The segment is 2 + 2 +
    17 per table + the symbols' bytes long: 33 to 420 bytes.
    """
    if info.not_jpeg or info.frame is None or not info.scans or info.frame.sof not in (0, 1):
        return None
    scan = info.scans[0]
    missing = sorted({(0, td) for _, td, _ in scan.components if td not in scan.dc_tables}
                     | {(1, ta) for _, _, ta in scan.components if ta not in scan.ac_tables})
    if not missing or any(key not in STANDARD_HUFFMAN for key in missing):
        return None
    body = b"".join(bytes([tc << 4 | th, *STANDARD_HUFFMAN[tc, th][0]]) + STANDARD_HUFFMAN[tc, th][1]
                    for tc, th in missing)
    return b"\xff\xc4" + (len(body) + 2).to_bytes(2, "big") + body


def with_standard_huffman(data: bytes | memoryview, segment: bytes) -> bytes:
    """``data`` (a JPEG: SOI first) with ``segment`` (:func:`standard_huffman_segment`)
    inserted right after SOI.

    The decoder reads its tables from the input, as T.81 requires, and the result decodes
    as libjpeg-turbo decodes the original: the segment defines only tables the file
    leaves undefined up to its scan, so no definition of the file's is overridden.
    ffmpeg's ``mjpeg2jpeg`` filter turns Motion-JPEG frames into files the same way.
    """
    return b"\xff\xd8" + segment + bytes(data[2:])


#: :func:`classify` reasons the gateware does not look for: Pillow's behaviour, not the
#: format's (MPO files, junk between segments, Pillow's pixel limit), or that no job can
#: carry (an input length beyond the 32-bit register).
HOST_ONLY_REASONS = frozenset({"mpo", "junk", "too-large", "input-size"})


def host_prescreen(info: JpegInfo, *, max_width: int = DEFAULT_MAX_WIDTH) -> str | None:
    """The least pre-screen: the :func:`classify` reason of a file that must go to the
    CPU path before any device sees it, because the decoder's own header checks could let
    it through while Pillow treats it differently. ``dlbooster decode --backend sim`` (the
    device's verification path) screens with this alone, so the gateware judges every
    other header itself; the runtime's decode service screens with the whole of
    :func:`classify` on the headers. The reasons: :data:`HOST_ONLY_REASONS`, a header
    only Pillow's parser rejects, or a structural fault before the first scan's
    entropy-coded data (``malformed-header``: the decoder, like libjpeg-turbo, skips a
    TEM or an RSTn between segments, which Pillow's parser may refuse, and a fault there
    hides the segments after it from :func:`pillow_header_error`). None for every other
    file, including those whose entropy-coded data the device itself stops on.
    """
    reason = classify(info, max_width=max_width)
    if reason in HOST_ONLY_REASONS:
        return reason
    if reason == "malformed-header":
        if info.error is None:
            return reason if pillow_header_error(info) is not None else None
        if not info.scans or info.error_offset < info.scans[0].data_start:
            return reason
    return None
