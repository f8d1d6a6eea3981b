"""Progressive Compressed Records: multi-fidelity JPEG data sets.

After Kuchnik et al., "Progressive Compressed Records: Taking a Byte out of Deep
Learning Data" (VLDB 2021). Each image is re-encoded losslessly as a progressive JPEG
(its DCT coefficients unchanged, by libjpeg-turbo's ``jpegtran -progressive``); a record
file stores the scans of many images grouped by scan number, so that one contiguous
prefix of the file holds every image of the record at fidelity ``k`` (its first ``k``
scans), and reading fewer scans reads fewer bytes.

Byte layout of a record file (format version 1, all integers little-endian):

====================  ===========================================================
offset                field
====================  ===========================================================
0                     magic ``b"DLBPCR\\r\\n"`` (8 bytes)
8                     u32 format version (1)
12                    u32 N, images in the record
16                    u32 S, scan groups (the most scans any image has)
20                    u32 M, bytes of the metadata block
24                    u64 reserved (0)
32                    metadata: M bytes of UTF-8 JSON (``labels``, ``names``,
                      ``classes``, ``scan_counts``, ``source_bytes``, ``images``,
                      ``scans``, ``format``, ``version``)
32 + M                index: (S + 1) x N u64 piece lengths, group-major (group 0's
                      N lengths, then group 1's, ...)
...                   group table: S + 1 entries of (u64 offset, u64 length, u32
                      CRC-32, u32 reserved 0); offsets are from the file's start
...                   u32 CRC-32 of every byte above (header, metadata, index, table)
group 0               each image's JPEG header (SOI up to its first scan's DHT/SOS)
group 1 .. S          scan ``g`` of each image: the markers that precede it (DHT,
                      DRI, SOS) and its entropy-coded data; empty for an image with
                      fewer than ``g`` scans (grayscale images have 6, colour 10)
====================  ===========================================================

Image ``i`` at fidelity ``k`` is piece ``i`` of groups ``0..k`` followed by EOI
(``FF D9``); fidelity ``S`` (or None) is the full image, whose decode is byte-identical
to the source file's. The CRC-32 is zlib's (ISO-HDLC). Progressive JPEG is outside the
decoder hardware's profile (SPEC.md section 2): record images decode on the CPU path.
"""

from __future__ import annotations

import io
import json
import mmap
import os
import shutil
import struct
import subprocess
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["FORMAT_VERSION", "MAGIC", "RecordError", "RecordFile", "RecordSet", "WriteReport",
           "is_record_dir", "open_records", "rebuild", "split_scans", "transcode", "write_records"]

MAGIC = b"DLBPCR\r\n"
FORMAT_VERSION = 1
SUFFIX = ".pcr"
_HEADER = struct.Struct("<8sIIIIQ")          # magic, version, N, S, M, reserved
_GROUP = struct.Struct("<QQII")              # offset, length, crc32, reserved
_CRC = struct.Struct("<I")
EOI = b"\xff\xd9"


class RecordError(ValueError):
    """A record file is corrupt, truncated or not a record; or an image cannot be
    transcoded. The message names the file (and the image or scan group)."""


# --------------------------------------------------------------------------- JPEG side

def _segment_end(data: bytes, pos: int, path: str) -> int:
    end = pos + 2 + int.from_bytes(data[pos + 2:pos + 4], "big") if pos + 4 <= len(data) else len(data) + 1
    if end > len(data):
        raise RecordError(f"{path}: marker segment at byte {pos} runs past the end")
    return end


def _entropy_end(data: bytes, pos: int) -> int:
    """End of entropy-coded data starting at ``pos``: the first marker that is neither
    a stuffed ``FF 00`` nor RSTn (T.81 B.1.1.5, B.2.1); fill bytes ``FF FF`` belong to
    the marker."""
    n = len(data)
    while True:
        pos = data.find(b"\xff", pos)
        if pos < 0 or pos + 1 >= n:
            return n
        nxt = data[pos + 1]
        if nxt == 0x00 or 0xD0 <= nxt <= 0xD7:
            pos += 2
        elif nxt == 0xFF:
            pos += 1
        else:
            return pos


def split_scans(data: bytes, path: str = "<bytes>") -> list[bytes]:
    """Cut a JPEG into ``[header, scan 1, ..., scan S]``.

    ``header`` is SOI through the last marker segment before the first scan's own
    tables; piece ``g`` is everything after piece ``g - 1`` up to the end of scan
    ``g``'s entropy-coded data (its DHT/DRI segments, its SOS and its data). EOI and
    anything after the last scan are dropped. ``b"".join(pieces) + EOI`` is a valid
    JPEG; so is ``b"".join(pieces[:k + 1]) + EOI`` for a progressive JPEG.

    Raises:
        RecordError: no SOI, a marker segment past the end, or no scan.
    """
    if data[:2] != b"\xff\xd8":
        raise RecordError(f"{path}: not a JPEG (no SOI)")
    pos, ends = 2, []           # ends: where each scan's entropy-coded data ends
    while pos + 1 < len(data):
        if data[pos] != 0xFF:
            raise RecordError(f"{path}: expected a marker at byte {pos}")
        marker = data[pos + 1]
        if marker == 0xFF:      # fill byte
            pos += 1
            continue
        if marker == 0xD9:
            break
        pos = _segment_end(data, pos, path)
        if marker == 0xDA:
            pos = _entropy_end(data, pos)
            ends.append(pos)
    if not ends:
        raise RecordError(f"{path}: no scan")
    bounds = [0, _first_scan_tables(data, ends[0], path)] + ends
    return [data[bounds[j]:bounds[j + 1]] for j in range(len(bounds) - 1)]


def _first_scan_tables(data: bytes, first_scan_end: int, path: str) -> int:
    """Start of the run of DHT/DRI segments directly before the first SOS (or of the SOS
    itself): those tables belong to scan 1, the rest is the header every fidelity needs."""
    pos, start = 2, None
    while pos < first_scan_end:
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker in (0xC4, 0xDD):
            start = pos if start is None else start
        elif marker == 0xDA:
            return pos if start is None else start
        else:
            start = None
        pos = _segment_end(data, pos, path)
    raise RecordError(f"{path}: no scan")


def rebuild(pieces: list[bytes] | tuple[bytes, ...]) -> bytes:
    """A JPEG from a header and its first scans: ``b"".join(pieces) + EOI``."""
    return b"".join(pieces) + EOI


def _jpegtran(tool: str | None) -> str:
    """The jpegtran to run: ``tool``, else the one on PATH.

    Raises:
        RecordError: none on PATH.
    """
    found = tool or shutil.which("jpegtran")
    if found is None:
        raise RecordError("jpegtran not found: install libjpeg-turbo's tools "
                          "(Debian: apt-get install libjpeg-turbo-progs)")
    return found


def transcode(data: bytes, path: str = "<bytes>", jpegtran: str | None = None) -> bytes:
    """``data`` losslessly re-encoded as a progressive JPEG by ``jpegtran -copy none
    -progressive`` (libjpeg-turbo's simple progression: 10 scans for colour, 6 for
    grayscale, Huffman tables optimised per scan).

    ``-copy none`` drops APPn/COM markers other than the JFIF/Adobe ones jpegtran writes
    itself, so colour interpretation is kept (the decode is checked by
    :func:`write_records`).

    Raises:
        RecordError: jpegtran is missing, fails, or warns (e.g. corrupt data).
    """
    run = subprocess.run([_jpegtran(jpegtran), "-copy", "none", "-progressive"], input=data, capture_output=True)
    if run.returncode != 0 or not run.stdout:
        message = run.stderr.decode(errors="replace").strip() or f"exit status {run.returncode}"
        raise RecordError(f"{path}: jpegtran failed: {message}")
    return run.stdout


def _decode_rgb(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


# ------------------------------------------------------------------------------ writer

@dataclass
class WriteReport:
    """What :func:`write_records` did.

    Attributes:
        records: paths of the record files written, in order.
        images: images stored.
        scans: the most scans any stored image has.
        source_bytes: bytes of the stored images' source files.
        record_bytes: bytes of the record files.
        skipped: ``(path, reason)`` of each source file not stored.
    """

    records: list[str] = field(default_factory=list)
    images: int = 0
    scans: int = 0
    source_bytes: int = 0
    record_bytes: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"records": self.records, "images": self.images, "scans": self.scans,
                "source_bytes": self.source_bytes, "record_bytes": self.record_bytes,
                "skipped": [{"path": p, "reason": r} for p, r in self.skipped]}


def _prepare(path: str, verify: bool, jpegtran: str | None) -> list[bytes]:
    with open(path, "rb") as f:
        data = f.read()
    progressive = transcode(data, path, jpegtran)
    pieces = split_scans(progressive, path)
    if verify:
        try:
            source = _decode_rgb(data)
        except Exception as exc:
            raise RecordError(f"{path}: Pillow cannot decode the source: {exc}") from None
        if not np.array_equal(source, _decode_rgb(rebuild(pieces))):
            raise RecordError(f"{path}: the progressive re-encoding does not decode to the source's pixels")
    return pieces


def write_records(src: str | os.PathLike, out_dir: str | os.PathLike, *, images_per_record: int = 256,
                  verify: bool = True, workers: int | None = None, jpegtran: str | None = None,
                  progress: Callable[[int, int], None] | None = None) -> WriteReport:
    """Write the ImageFolder ``src`` as records ``out_dir/records-00000.pcr``, ...

    Images are taken in ImageFolder order (:func:`dlbooster.sources.image_folder`: the
    same labels as torchvision's ``ImageFolder``), ``images_per_record`` to a file.
    Each is transcoded by :func:`transcode`; with ``verify``, its full-fidelity decode
    is checked equal to the source's (``PIL.Image.open(f).convert("RGB")``, byte for
    byte) before it is stored. A source file that cannot be transcoded or verified is
    left out and listed in the report's ``skipped`` with the reason.

    Raises:
        FileNotFoundError: ``src`` is no ImageFolder.
        FileExistsError: ``out_dir`` already holds record files.
        RecordError: jpegtran is missing.
        ValueError: ``images_per_record`` below 1.
    """
    from .sources import image_folder

    if images_per_record < 1:
        raise ValueError(f"images_per_record must be at least 1, not {images_per_record}")
    samples, classes, _ = image_folder(src)
    jpegtran = _jpegtran(jpegtran)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("*" + SUFFIX)):
        raise FileExistsError(f"{out}: already holds record files")
    root = os.path.abspath(src)
    report = WriteReport()
    stored: list[tuple[str, int, int, list[bytes]]] = []
    lock = threading.Lock()
    done = [0]

    def one(sample):
        try:
            pieces = _prepare(sample.path, verify, jpegtran)
        except (RecordError, OSError) as exc:
            pieces = exc
        with lock:
            done[0] += 1
            if progress is not None:
                progress(done[0], len(samples))
        return pieces

    number = 0

    def flush():
        nonlocal number
        if not stored:
            return
        path = out / f"records-{number:05d}{SUFFIX}"
        _write_file(path, stored, classes)
        report.records.append(str(path))
        report.record_bytes += path.stat().st_size
        number += 1
        stored.clear()

    with ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
        # map keeps ImageFolder order; jpegtran runs in subprocesses, so threads overlap.
        for sample, pieces in zip(samples, pool.map(one, samples)):
            if isinstance(pieces, Exception):
                reason = str(pieces) if isinstance(pieces, RecordError) else f"{sample.path}: {pieces}"
                report.skipped.append((sample.path, reason))
                continue
            size = os.path.getsize(sample.path)
            stored.append((os.path.relpath(sample.path, root), sample.label, size, pieces))
            report.images += 1
            report.scans = max(report.scans, len(pieces) - 1)
            report.source_bytes += size
            if len(stored) == images_per_record:
                flush()
    flush()
    return report


def _write_file(path: Path, images: list[tuple[str, int, int, list[bytes]]], classes: list[str]) -> None:
    n = len(images)
    s = max(len(p) - 1 for *_, p in images)
    meta = json.dumps({
        "format": "dlbooster-pcr", "version": FORMAT_VERSION, "images": n, "scans": s,
        "classes": classes, "labels": [label for _, label, _, _ in images],
        "names": [name for name, *_ in images], "source_bytes": [size for _, _, size, _ in images],
        "scan_counts": [len(p) - 1 for *_, p in images],
    }, separators=(",", ":")).encode()
    lengths = np.zeros((s + 1, n), dtype="<u8")
    for i, (*_, pieces) in enumerate(images):
        for g, piece in enumerate(pieces):
            lengths[g, i] = len(piece)
    groups = [b"".join(p[g] if g < len(p) else b"" for *_, p in images) for g in range(s + 1)]
    head_size = _HEADER.size + len(meta) + lengths.nbytes + (s + 1) * _GROUP.size + _CRC.size
    table, offset = [], head_size
    for g in groups:
        table.append(_GROUP.pack(offset, len(g), zlib.crc32(g), 0))
        offset += len(g)
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, n, s, len(meta), 0) + meta + lengths.tobytes() + b"".join(table)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(head + _CRC.pack(zlib.crc32(head)))
        for g in groups:
            f.write(g)
    os.replace(tmp, path)          # a reader never sees a half-written record


# ------------------------------------------------------------------------------ reader

class RecordFile:
    """One record file, memory-mapped: only the scan groups read are paged in.

    Attributes:
        path: the file (str).
        images: N; scans: S (fidelities are 1..S).
        labels, names, source_bytes, scan_counts: per image (lists).
        classes: class names (list of str).
        group_offsets, group_lengths: (S + 1,) int64 byte offsets and lengths of the
            header group 0 and scan groups 1..S.

    Raises (on open):
        RecordError: not a record, another format version, a header or metadata CRC
            mismatch, an inconsistent index, or a file shorter than its header says.
        OSError: the file cannot be opened.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._file = open(self.path, "rb")
        try:
            self._open()
        except BaseException:
            self._file.close()
            raise

    def _open(self) -> None:
        f, path = self._file, self.path
        size = os.fstat(f.fileno()).st_size
        head = f.read(_HEADER.size)
        if len(head) < _HEADER.size or head[:8] != MAGIC:
            raise RecordError(f"{path}: not a dlbooster record (bad magic)")
        _, version, n, s, m, _ = _HEADER.unpack(head)
        if version != FORMAT_VERSION:
            raise RecordError(f"{path}: record format version {version}; this reader reads {FORMAT_VERSION}")
        rest = m + 8 * n * (s + 1) + _GROUP.size * (s + 1) + _CRC.size
        body = f.read(rest)
        if len(body) < rest:
            raise RecordError(f"{path}: truncated record: its header needs {_HEADER.size + rest} bytes, "
                              f"the file has {size}")
        (crc,) = _CRC.unpack(body[-_CRC.size:])
        if zlib.crc32(head + body[:-_CRC.size]) != crc:
            raise RecordError(f"{path}: corrupt record: header CRC mismatch")
        try:
            meta = json.loads(body[:m])
        except ValueError as exc:
            raise RecordError(f"{path}: corrupt record metadata: {exc}") from None
        self.images, self.scans, self.meta = n, s, meta
        self.labels = [int(x) for x in meta["labels"]]
        self.names, self.classes = list(meta["names"]), list(meta["classes"])
        self.source_bytes = [int(x) for x in meta["source_bytes"]]
        self.scan_counts = [int(x) for x in meta["scan_counts"]]
        self.lengths = np.frombuffer(body, dtype="<u8", count=n * (s + 1), offset=m).reshape(s + 1, n).astype(np.int64)
        table = np.frombuffer(body, dtype=np.dtype([("offset", "<u8"), ("length", "<u8"), ("crc", "<u4"), ("pad", "<u4")]),
                              count=s + 1, offset=m + 8 * n * (s + 1))
        self.group_offsets = table["offset"].astype(np.int64)
        self.group_lengths = table["length"].astype(np.int64)
        self._crcs = [int(c) for c in table["crc"]]
        expected = _HEADER.size + rest + np.concatenate(([0], np.cumsum(self.group_lengths)[:-1]))
        if (len(self.labels) != n or len(self.scan_counts) != n or not np.array_equal(self.group_offsets, expected)
                or not np.array_equal(self.lengths.sum(axis=1), self.group_lengths)):
            raise RecordError(f"{path}: corrupt record: inconsistent index")
        # Start of each image's piece within its group.
        self.starts = np.concatenate((np.zeros((s + 1, 1), np.int64), np.cumsum(self.lengths, axis=1)[:, :-1]), axis=1)
        self.file_bytes = size
        self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self._checked = [False] * (s + 1)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.images

    def prefix_bytes(self, fidelity: int | None = None) -> int:
        """Bytes of the file's prefix that holds every image at ``fidelity`` (None: full)."""
        k = self._fidelity(fidelity)
        return int(self.group_offsets[k] + self.group_lengths[k])

    def _fidelity(self, fidelity: int | None) -> int:
        if fidelity is None:
            return self.scans
        if not 1 <= fidelity:
            raise ValueError(f"fidelity must be at least 1, not {fidelity}")
        return min(int(fidelity), self.scans)

    def _group(self, g: int) -> memoryview:
        """Group ``g``'s bytes, its CRC checked on first use.

        Raises:
            RecordError: the file ends inside the group, or its CRC does not match.
        """
        start, length = int(self.group_offsets[g]), int(self.group_lengths[g])
        if start + length > self.file_bytes:
            raise RecordError(f"{self.path}: truncated record: scan group {g} needs bytes up to "
                              f"{start + length}, the file has {self.file_bytes}")
        view = memoryview(self._map)[start:start + length] if length else memoryview(b"")
        if not self._checked[g]:
            with self._lock:
                if not self._checked[g]:
                    if zlib.crc32(view) != self._crcs[g]:
                        raise RecordError(f"{self.path}: corrupt record: scan group {g} CRC mismatch")
                    self._checked[g] = True
        return view

    def pieces(self, index: int, fidelity: int | None = None) -> list[bytes]:
        """Header and first ``fidelity`` scans of image ``index`` (fewer when it has fewer).

        Raises:
            IndexError: no such image; RecordError: as :meth:`_group`.
        """
        if not 0 <= index < self.images:
            raise IndexError(f"{self.path}: image {index} out of range 0..{self.images - 1}")
        k = min(self._fidelity(fidelity), self.scan_counts[index])
        out = []
        for g in range(k + 1):
            start, length = int(self.starts[g, index]), int(self.lengths[g, index])
            out.append(bytes(self._group(g)[start:start + length]))
        return out

    def image(self, index: int, fidelity: int | None = None) -> bytes:
        """Image ``index`` as a JPEG of its header and first ``fidelity`` scans + EOI."""
        return rebuild(self.pieces(index, fidelity))

    def read_prefix(self, fidelity: int | None = None) -> list[bytes]:
        """Every image at ``fidelity`` from one contiguous read of the file's prefix
        (``os.pread``, not the memory map: what a reader streaming records does)."""
        k = self._fidelity(fidelity)
        end = self.prefix_bytes(k)
        data = os.pread(self._file.fileno(), end, 0)
        if len(data) < end:
            raise RecordError(f"{self.path}: truncated record: fidelity {k} needs {end} bytes, "
                              f"the file has {len(data)}")
        view = memoryview(data)
        for g in range(k + 1):
            group = view[int(self.group_offsets[g]):int(self.group_offsets[g] + self.group_lengths[g])]
            if zlib.crc32(group) != self._crcs[g]:
                raise RecordError(f"{self.path}: corrupt record: scan group {g} CRC mismatch")
        images = []
        for i in range(self.images):
            kk = min(k, self.scan_counts[i])
            images.append(b"".join(view[int(self.group_offsets[g] + self.starts[g, i]):
                                        int(self.group_offsets[g] + self.starts[g, i] + self.lengths[g, i])]
                                   for g in range(kk + 1)) + EOI)
        return images

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:      # a memoryview still exported: the GC closes it later
                pass
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RecordSet:
    """The record files of a folder (``*.pcr``, in name order) as one data set.

    Attributes:
        root: the folder; files: the :class:`RecordFile` objects.
        classes: class names; scans: the most scans of any image (fidelities 1..scans).
        images: total images.

    Raises:
        FileNotFoundError: no record file in ``root``.
        RecordError: as :class:`RecordFile`, or records with different classes.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = os.fspath(root)
        paths = sorted(Path(self.root).glob("*" + SUFFIX))
        if not paths:
            raise FileNotFoundError(f"{self.root}: no record files (*{SUFFIX})")
        self.files: list[RecordFile] = []
        try:
            for p in paths:
                self.files.append(RecordFile(p))
        except BaseException:
            self.close()
            raise
        self.classes = self.files[0].classes
        for rf in self.files[1:]:
            if rf.classes != self.classes:
                raise RecordError(f"{rf.path}: classes differ from {self.files[0].path}'s")
        self.scans = max(rf.scans for rf in self.files)
        self.images = sum(rf.images for rf in self.files)

    def __len__(self) -> int:
        return self.images

    def entries(self) -> Iterator[tuple[RecordFile, int]]:
        """``(record, index in record)`` of every image, in data-set order."""
        for rf in self.files:
            for i in range(rf.images):
                yield rf, i

    def labels(self) -> list[int]:
        return [label for rf in self.files for label in rf.labels]

    def prefix_bytes(self, fidelity: int | None = None) -> int:
        """Bytes one epoch reads at ``fidelity``: the prefixes of all files."""
        return sum(rf.prefix_bytes(fidelity) for rf in self.files)

    def source_bytes(self) -> int:
        """Bytes of the source JPEG files the records were written from."""
        return sum(sum(rf.source_bytes) for rf in self.files)

    def close(self) -> None:
        for rf in self.files:
            rf.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def is_record_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding record files."""
    p = Path(path)
    return p.is_dir() and any(p.glob("*" + SUFFIX))


def open_records(path: str | os.PathLike) -> RecordSet:
    """:class:`RecordSet` of the folder ``path``."""
    return RecordSet(path)


# -------------------------------------------------------------------------------- info

def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 images, dB (``inf`` when equal):
    ``10 log10(255^2 / MSE)`` over every sample."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10.0 * float(np.log10(255.0 ** 2 / mse))


def info(records: RecordSet, *, sample: int = 16) -> dict:
    """Bytes and quality per fidelity.

    Returns:
        ``images``, ``records``, ``scans``, ``source_bytes`` (the source JPEG files) and
        ``fidelities``: one dict per fidelity k = 1..S with ``bytes`` (what an epoch
        reads: every file's prefix), ``of_source`` and ``of_full`` (fractions),
        ``psnr_mean_db`` and ``psnr_min_db`` (Pillow's decode at k against the full
        decode, over the first ``sample`` images; None at full fidelity, where the
        images are equal), ``sample`` (images measured).
    """
    entries = list(records.entries())[:sample]
    full = [_decode_rgb(rf.image(i)) for rf, i in entries]
    rows = []
    total = records.prefix_bytes(None)
    source = records.source_bytes()
    for k in range(1, records.scans + 1):
        values = [psnr(_decode_rgb(rf.image(i, k)), ref) for (rf, i), ref in zip(entries, full)]
        finite = [v for v in values if v != float("inf")]
        nbytes = records.prefix_bytes(k)
        rows.append({"fidelity": k, "bytes": nbytes, "of_source": nbytes / source if source else None,
                     "of_full": nbytes / total if total else None,
                     "psnr_mean_db": float(np.mean(finite)) if finite else None,
                     "psnr_min_db": min(finite) if finite else None,
                     "identical": len(values) - len(finite)})
    return {"root": records.root, "images": records.images, "records": len(records.files),
            "scans": records.scans, "source_bytes": source, "sample": len(entries), "fidelities": rows}
