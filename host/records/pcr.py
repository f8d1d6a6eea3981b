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
                      fewer than ``g`` scans (YCbCr images have 10, grayscale 6)
====================  ===========================================================

Image ``i`` at fidelity ``k`` is piece ``i`` of groups ``0..k`` followed by EOI
(``FF D9``); fidelity ``S`` (or None) is the full image, whose decode is byte-identical
to the source file's (checked as each image is written, unless ``verify=False``). The
CRC-32 is zlib's (ISO-HDLC). Progressive JPEG is outside the
decoder hardware's profile (SPEC.md section 2): record images decode on the CPU path.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import numbers
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlbooster.runtime.sources import image_folder

__all__ = ["FORMAT_VERSION", "HEADER", "MAGIC", "RecordError", "RecordFile", "RecordSet", "WriteReport",
           "exclusive_lock", "is_record_dir", "rebuild", "source_classes", "split_scans", "transcode", "write_records"]

log = logging.getLogger(__name__)

MAGIC = b"DLBPCR\r\n"
FORMAT_VERSION = 1
SUFFIX = ".pcr"
HEADER = struct.Struct("<8sIIIIQ")          # magic, version, N, S, M, reserved
_GROUP = struct.Struct("<QQII")              # offset, length, crc32, reserved
_CRC = struct.Struct("<I")
# One pread moves at most 0x7ffff000 bytes on Linux (read(2)), so longer spans are read in
# pieces; a scan group's CRC is taken piece by piece, so checking one holds no more
# than a piece in memory.
_PIECE = 1 << 26
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
    header_end = tables = None  # tables: start of the DHT/DRI run just before a scan
    while pos + 1 < len(data):
        if data[pos] != 0xFF:
            raise RecordError(f"{path}: expected a marker at byte {pos}")
        marker = data[pos + 1]
        if marker == 0xFF:      # fill byte
            pos += 1
            continue
        if marker == 0xD9:
            break
        if marker in (0xC4, 0xDD):
            tables = pos if tables is None else tables
        elif marker == 0xDA and header_end is None:
            header_end = pos if tables is None else tables
        else:
            tables = None
        pos = _segment_end(data, pos, path)
        if marker == 0xDA:
            pos, tables = _entropy_end(data, pos), None
            ends.append(pos)
    if not ends:
        raise RecordError(f"{path}: no scan")
    bounds = [0, header_end] + ends
    return [data[bounds[j]:bounds[j + 1]] for j in range(len(bounds) - 1)]


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


def transcode(data: bytes, path: str = "<bytes>", jpegtran: str | None = None, *,
              max_memory_mb: int = 1024, timeout: float = 300.0) -> bytes:
    """``data`` losslessly re-encoded as a progressive JPEG by ``jpegtran -copy none
    -progressive`` (libjpeg-turbo's simple progression, ``jcparam.c``: 10 scans for
    YCbCr, 2 + 4 x components otherwise: 6 for grayscale, 14 for RGB, 18 for CMYK;
    Huffman tables optimised per scan).

    ``-copy none`` drops APPn/COM markers (EXIF, ICC profiles, comments) other than the
    JFIF or Adobe marker jpegtran writes itself, which carries the colour transform;
    ``PIL.Image.open(f).convert("RGB")`` ignores the dropped ones, so the pixels are
    unchanged (:func:`write_records` checks each image). jpegtran holds the whole image's
    coefficients: ``max_memory_mb`` caps that (a small file declaring 65500 x 65500
    pixels would take gigabytes) and ``timeout`` bounds its run.

    Raises:
        RecordError: jpegtran is missing, fails, warns (e.g. corrupt data), needs more
            than ``max_memory_mb`` or runs past ``timeout`` seconds.
    """
    try:
        run = subprocess.run([_jpegtran(jpegtran), "-maxmemory", f"{max_memory_mb}m", "-copy", "none",
                              "-progressive"], input=data, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RecordError(f"{path}: jpegtran ran past {timeout:g} s") from None
    if run.returncode != 0 or not run.stdout:
        # One line: jpegtran ends each warning with a newline.
        message = "; ".join(line.strip() for line in run.stderr.decode(errors="replace").splitlines()
                            if line.strip()) or f"exit status {run.returncode}"
        if "Backing store not supported" in message:   # libjpeg-turbo's words for -maxmemory exceeded
            raise RecordError(f"{path}: too large to transcode: jpegtran needs more than {max_memory_mb} MB "
                              f"for its coefficients ({message})")
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


def _prepare(path: str, verify: bool, jpegtran: str) -> tuple[list[bytes], int]:
    """``(pieces, source bytes)`` of one source file (see :func:`write_records`)."""
    if not stat.S_ISREG(os.stat(path).st_mode):     # a FIFO would block open()
        raise RecordError(f"{path}: not a regular file")
    with open(path, "rb") as f:
        data = f.read()
    progressive = transcode(data, path, jpegtran)
    pieces = split_scans(progressive, path)
    if verify:
        try:
            source = _decode_rgb(data)
        except Exception as exc:  # noqa: BLE001 - Pillow raises many types
            raise RecordError(f"{path}: Pillow cannot decode the source: {exc}") from None
        try:
            same = np.array_equal(source, _decode_rgb(rebuild(pieces)))
        except Exception as exc:  # noqa: BLE001
            raise RecordError(f"{path}: Pillow cannot decode the progressive re-encoding: {exc}") from None
        if not same:
            raise RecordError(f"{path}: the progressive re-encoding does not decode to the source's pixels")
    return pieces, len(data)


def write_records(src: str | os.PathLike, out_dir: str | os.PathLike, *, images_per_record: int = 256,
                  verify: bool = True, workers: int | None = None, jpegtran: str | None = None,
                  progress: Callable[[int, int], None] | None = None,
                  listing: tuple[list, list[str]] | None = None) -> WriteReport:
    """Write the ImageFolder ``src`` as records ``out_dir/records-00000.pcr``, ...

    Images are taken in ImageFolder order (:func:`dlbooster.runtime.sources.image_folder`: the
    same labels as torchvision's ``ImageFolder``), ``images_per_record`` to a file.
    Each is transcoded by :func:`transcode`; with ``verify``, its full-fidelity decode
    is checked equal to the source's (``PIL.Image.open(f).convert("RGB")``, byte for
    byte) before it is stored. A source file that cannot be transcoded or verified is
    left out and listed in the report's ``skipped`` with the reason (jpegtran refuses
    files it only warns about, e.g. extraneous bytes, which Pillow may still decode).

    The files are written into a hidden folder inside ``out_dir`` and renamed into place
    once every one is written; a failed or interrupted write (an exception, Ctrl-C)
    leaves no record file, and removes the folders it made for ``out_dir``. Only the
    renames are not one step: a reader listing the folder during them sees part of the
    set, and a writer killed outright during them (SIGKILL, power loss) leaves part of
    it; one killed before them leaves its hidden folder, which the next write removes.
    One write at a time may fill ``out_dir`` (an ``flock`` on its hidden lock file,
    released when the writer ends however it ends). ``listing``: ``src``'s
    ``(samples, classes)`` where the caller has listed it already
    (:func:`source_classes`), so that a large folder is not walked twice.

    Raises:
        FileNotFoundError: ``src`` is no ImageFolder (the message names ``src``).
        FileExistsError: ``out_dir`` already holds record files, or another write is
            filling it.
        RecordError: jpegtran is missing, or no image of ``src`` could be stored
            (every one skipped; the message gives the first reason).
        ValueError: ``images_per_record`` below 1, or ``out_dir`` inside ``src``.
        OSError: a record file cannot be written (named in the error; nothing of the
            set is left).
    """
    if images_per_record < 1:
        raise ValueError(f"images_per_record must be at least 1, not {images_per_record}")
    if Path(os.path.realpath(out_dir)).is_relative_to(os.path.realpath(src)):
        # Inside SRC the new folder would become a class of SRC's ImageFolder.
        raise ValueError(f"{out_dir}: inside the source folder {src}")
    samples, classes = listing if listing is not None else source_classes(src)
    jpegtran = _jpegtran(jpegtran)
    out = Path(out_dir)
    made = make_folders(out)
    moved: list[Path] = []
    try:
        out.mkdir(parents=True, exist_ok=True)      # OUT a file: FileExistsError, as mkdir -p fails
        with exclusive_lock(out):
            if record_paths(out):
                raise FileExistsError(f"{out}: already holds record files")
            for stale in out.glob(_STAGING + "*"):   # a killed write's (none runs: we hold the lock)
                shutil.rmtree(stale, ignore_errors=True)
            stage = Path(tempfile.mkdtemp(prefix=_STAGING, dir=out))
            try:
                report = _write_set(samples, classes, os.path.abspath(src), out, stage, images_per_record,
                                    verify, workers, jpegtran, progress)
                if not report.images:
                    path, reason = report.skipped[0]
                    reason = reason if reason.startswith(f"{path}: ") else f"{path}: {reason}"
                    raise RecordError(f"{src}: no image could be stored, all {len(report.skipped)} were skipped "
                                      f"(the first: {reason})")
                for name in sorted(os.listdir(stage)):
                    moved.append(out / name)             # listed first: an interrupt after the rename finds it
                    os.replace(stage / name, out / name)
            finally:
                with signals_held():
                    shutil.rmtree(stage, ignore_errors=True)
        return report
    except BaseException:
        # Also an interrupt while the lock is released: a part of the set is no set.
        with signals_held():
            for path in moved:
                path.unlink(missing_ok=True)
            remove_empty_folders(made)
        raise


def make_folders(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing parents, one ``mkdir`` at a time on the path as
    given (so ``..`` resolves as every later call resolves it). Unlike ``mkdir -p``, a
    ``folder`` that exists as a file or a dangling link is no error here: the caller's
    next use of it fails.

    Returns:
        The folders this call made, deepest first (not those that existed, nor those
        another process made meanwhile): what :func:`remove_empty_folders` may remove.

    Raises:
        OSError: a part cannot be made (a file in the way of a deeper part, no
            permission); what this call made before is removed again.
    """
    made: list[Path] = []
    try:
        for part in reversed([folder, *folder.parents]):       # outermost first
            try:
                os.mkdir(part)
            except FileExistsError:
                continue
            except OSError:
                if part.is_dir():       # e.g. EACCES or EROFS for a folder that exists
                    continue
                raise
            made.append(part)
    except BaseException:
        with signals_held():
            remove_empty_folders(made[::-1])
        raise
    return made[::-1]


@contextlib.contextmanager
def signals_held():
    """Hold SIGINT and SIGTERM off for the block, a cleanup that a second Ctrl-C or
    ``kill`` must not cut short; one that arrives meanwhile is raised again as the block
    ends, under the handler it would have met (so Ctrl-C still ends the command).
    Python runs signal handlers in the main thread only: elsewhere there is nothing to
    hold."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {}
    try:
        for number in (signal.SIGINT, signal.SIGTERM):
            previous[number] = signal.signal(number, lambda signum, frame: arrived.append(signum))
        yield
    finally:
        for number, handler in previous.items():
            # None: a handler not set from Python, which cannot be put back; the default then.
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
        if arrived:
            signal.raise_signal(arrived[0])


def remove_empty_folders(folders: list[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is empty: what a failed write
    made and left nothing in. A folder another process has filled since stays."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


#: Prefix of the hidden folder a write fills before its files move into place.
_STAGING = ".records-writing-"


#: The lock file a write holds in its folder (removed when the write ends).
_LOCK = ".records-write.lock"


@contextlib.contextmanager
def exclusive_lock(out: Path):
    """Hold an exclusive ``flock`` on ``out``'s lock file (released when the writer ends,
    also when the process dies). The lock is on a file opened for writing, not on the
    folder: NFS turns ``flock`` into a byte-range lock, which needs write access. On a
    file system without locks the write goes on unguarded, with a warning.

    Raises:
        FileExistsError: another process or thread holds it.
    """
    lock = out / _LOCK
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            raise FileExistsError(f"{out}: another records write is filling it") from None
        except OSError as exc:                          # ENOLCK, EOPNOTSUPP
            log.warning("%s: cannot lock %s (%s); a second writer would not be refused", out, _LOCK, exc)
            locked = False
        if locked:
            # A writer that ended between our open and our lock removed the file we
            # locked; a third may hold a new one: the folder is not ours.
            try:
                st = os.stat(lock)
            except FileNotFoundError:
                st = None
            if st is None or (st.st_dev, st.st_ino) != (os.fstat(fd).st_dev, os.fstat(fd).st_ino):
                raise FileExistsError(f"{out}: another records write is filling it")
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)
    finally:
        os.close(fd)


def source_classes(src: str | os.PathLike) -> tuple[list, list[str]]:
    """``(samples, classes)`` of the ImageFolder ``src``, as :func:`write_records`
    takes them (:func:`dlbooster.runtime.sources.image_folder`).

    Raises:
        FileNotFoundError: ``src`` is no ImageFolder; the message names ``src``.
    """
    try:
        samples, classes, _ = image_folder(src)
    except FileNotFoundError as exc:
        # torchvision's messages name the class folders, not the folder that holds them.
        raise FileNotFoundError(str(exc) if os.fspath(src) in str(exc) else f"{os.fspath(src)}: {exc}") from None
    return samples, classes


def _write_set(samples, classes, root, out, stage, images_per_record, verify, workers, jpegtran,
               progress) -> WriteReport:
    """Transcode ``samples`` into record files in ``stage``, reported under ``out``."""
    report = WriteReport()
    stored: list[tuple[str, int, int, list[bytes]]] = []
    lock = threading.Lock()
    done = [0]

    def one(sample):
        try:
            result = _prepare(sample.path, verify, jpegtran)
        except (RecordError, OSError) as exc:
            result = exc
        with lock:
            done[0] += 1
            if progress is not None:
                progress(done[0], len(samples))
        return result

    number = 0

    def flush():
        nonlocal number
        if not stored:
            return
        name = f"records-{number:05d}{SUFFIX}"
        _write_file(stage / name, out / name, stored, classes)
        report.records.append(str(out / name))
        report.record_bytes += (stage / name).stat().st_size
        number += 1
        stored.clear()

    threads = workers or os.cpu_count() or 1
    window = 8 * threads             # images in flight: memory stays bounded on any data set
    with ThreadPoolExecutor(threads) as pool:
        for first in range(0, len(samples), window):
            chunk = samples[first:first + window]
            # map keeps ImageFolder order; jpegtran runs in subprocesses, so threads overlap.
            for sample, result in zip(chunk, pool.map(one, chunk)):
                if isinstance(result, Exception):
                    reason = str(result) if isinstance(result, RecordError) else f"{sample.path}: {result}"
                    report.skipped.append((sample.path, reason))
                    continue
                pieces, size = result
                stored.append((os.path.relpath(sample.path, root), sample.label, size, pieces))
                report.images += 1
                report.scans = max(report.scans, len(pieces) - 1)
                report.source_bytes += size
                if len(stored) == images_per_record:
                    flush()
    flush()
    return report


def _write_file(path: Path, final: Path, images: list[tuple[str, int, int, list[bytes]]],
                classes: list[str]) -> None:
    """Write one record file at ``path``; an error names ``final``, where it goes."""
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
    head_size = HEADER.size + len(meta) + lengths.nbytes + (s + 1) * _GROUP.size + _CRC.size
    table, offset = [], head_size
    for g in groups:
        table.append(_GROUP.pack(offset, len(g), zlib.crc32(g), 0))
        offset += len(g)
    head = HEADER.pack(MAGIC, FORMAT_VERSION, n, s, len(meta), 0) + meta + lengths.tobytes() + b"".join(table)
    try:
        with open(path, "wb") as f:
            f.write(head + _CRC.pack(zlib.crc32(head)))
            for g in groups:
                f.write(g)
    except OSError as exc:
        # A failed write (ENOSPC, EFBIG) names no file; the staging path would mislead.
        raise OSError(exc.errno, f"{exc.strerror or exc}: writing record file", str(final)) from exc


# ------------------------------------------------------------------------------ reader

class RecordFile:
    """One record file. Opening reads and checks its header; images are read with
    ``os.pread`` of exactly the pieces a fidelity needs, so an epoch at fidelity ``k``
    reads the files' prefixes, and no file descriptor is held between reads (a data set
    of thousands of records stays under the descriptor limit). Each read checks that the
    path still names the file opened (device, inode, modification time): one rewritten,
    replaced or truncated since would be read with a stale index and stale CRC verdicts,
    and is a RecordError instead.

    Attributes:
        path: the file (str).
        images: N; scans: S (fidelities are 1..S; a larger one reads every scan).
        labels, names, source_bytes, scan_counts: per image (lists).
        classes: class names (list of str).
        group_offsets, group_lengths: (S + 1,) int64 byte offsets and lengths of the
            header group 0 and scan groups 1..S.

    Raises (on open):
        RecordError: not a regular file, not a record, another format version, a
            header or metadata CRC mismatch, metadata or an index that contradicts the
            header, or a file shorter than its header says.
        OSError: the file cannot be read.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._lock = threading.Lock()           # held through a scan group's CRC check
        self._state = threading.Lock()          # the identity and its verdicts, briefly
        self._identity: tuple[int, ...] | None = None
        self._verdicts: list[str | None] = []
        f, _ = self._open()
        with f:
            self._read_header(f)

    def _open(self):
        """``(file, verdicts)``: the file, opened for reading (regular files only: a FIFO would block, and
        opening one would release its writer; ``O_NONBLOCK`` covers a swap after the
        check, as :func:`dlbooster.backends.read_file` does).

        The file is taken as the one this object opened while its device, inode, size,
        and modification and status-change times are unchanged (``cp -p``, ``rsync -t
        --inplace`` or ``tar`` can give new contents the old inode and modification
        time; the change time tells them apart). When any of them changed (also by a
        ``chmod``, a hard link, a ``touch``, or the same bytes copied again), the header
        is read again: byte for byte the one opened, the file is still this record (the
        header holds every image's lengths and every scan group's CRC), and each group's
        CRC is checked again before its bytes are used; otherwise the file is another.
        ``verdicts`` is the list of CRC verdicts that belongs to the file as opened: a
        check made through a file that another thread has since found replaced is kept
        in that file's list, never in the new one's.

        Raises:
            RecordError: not a regular file, not the record this object opened, or gone
                since it was opened.
            FileNotFoundError: no such file (when this object is being made).
        """
        try:
            if not stat.S_ISREG(os.stat(self.path).st_mode):
                raise RecordError(f"{self.path}: not a regular file")
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            if self._identity is None:        # opening: the caller named a missing file
                raise
            raise RecordError(f"{self.path}: the record file is gone (deleted or moved after it was opened): "
                              f"open the record set again") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise RecordError(f"{self.path}: not a regular file")
            # Regular files ignore O_NONBLOCK: reads block as usual.
            f = open(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        with self._state:
            if self._identity is None:
                self._identity = identity
            if identity == self._identity:
                return f, self._verdicts
        try:
            same = _digest(os.pread(fd, self._head[0], 0)) == self._head[1]
        except OSError:
            same = False
        if not same:
            f.close()
            raise RecordError(f"{self.path}: the record file changed after it was opened (rewritten, replaced "
                              f"or truncated): open the record set again")
        with self._state:
            if self._identity != identity:
                self._identity, self._size = identity, st.st_size
                self._verdicts = [None] * (self.scans + 1)
            return f, self._verdicts

    def _read_header(self, f) -> None:
        path = self.path
        size = os.fstat(f.fileno()).st_size
        head = f.read(HEADER.size)
        if head[:8] != MAGIC[:len(head)] or not head:
            raise RecordError(f"{path}: not a dlbooster record (bad magic)")
        if len(head) < HEADER.size:
            raise RecordError(f"{path}: truncated record: {len(head)} bytes, shorter than the "
                              f"{HEADER.size}-byte fixed header")
        _, version, n, s, m, reserved = HEADER.unpack(head)
        if version != FORMAT_VERSION:
            raise RecordError(f"{path}: record format version {version}; this reader reads {FORMAT_VERSION}")
        rest = m + 8 * n * (s + 1) + _GROUP.size * (s + 1) + _CRC.size
        if HEADER.size + rest > size:      # before reading: the sizes are not trusted yet
            raise RecordError(f"{path}: truncated record: its header needs {HEADER.size + rest} bytes, "
                              f"the file has {size}")
        body = f.read(rest)
        (crc,) = _CRC.unpack(body[-_CRC.size:])
        if zlib.crc32(head + body[:-_CRC.size]) != crc:
            raise RecordError(f"{path}: corrupt record: header CRC mismatch")
        if reserved:
            raise RecordError(f"{path}: corrupt record: reserved header field is not 0")
        meta = _metadata(body[:m], n, s, path)
        self._head = (len(head) + len(body), _digest(head + body))   # what a later open compares
        self.images, self.scans = n, s
        self.labels, self.names, self.classes = meta["labels"], meta["names"], meta["classes"]
        self.source_bytes, self.scan_counts = meta["source_bytes"], meta["scan_counts"]
        lengths = np.frombuffer(body, dtype="<u8", count=n * (s + 1), offset=m).reshape(s + 1, n)
        table = np.frombuffer(body, dtype=np.dtype([("offset", "<u8"), ("length", "<u8"), ("crc", "<u4"),
                                                    ("pad", "<u4")]), count=s + 1, offset=m + 8 * n * (s + 1))
        # Python integers: u64 fields near 2^64 neither wrap nor turn negative.
        offsets, group_lengths = table["offset"].tolist(), table["length"].tolist()
        expected = HEADER.size + rest
        for g in range(s + 1):
            if (offsets[g] != expected or sum(lengths[g].tolist()) != group_lengths[g]
                    or int(lengths[g].max(initial=0)) > group_lengths[g] or table["pad"][g]):
                raise RecordError(f"{path}: corrupt record: inconsistent index at scan group {g}")
            expected += group_lengths[g]
        if expected >= 1 << 63:             # every offset and length below it fits int64
            raise RecordError(f"{path}: corrupt record: its index ends at byte {expected}")
        self._size = size                   # as opened; a file may be shorter (read prefixes only)
        self.lengths = lengths.astype(np.int64)
        self.group_offsets = np.array(offsets, dtype=np.int64)
        self.group_lengths = np.array(group_lengths, dtype=np.int64)
        self._crcs = table["crc"].tolist()
        # Start of each image's piece within its group.
        self.starts = np.concatenate((np.zeros((s + 1, 1), np.int64), np.cumsum(self.lengths, axis=1)[:, :-1]),
                                     axis=1)
        self._verdicts = [None] * (s + 1)    # "ok", or the group's error

    def __len__(self) -> int:
        return self.images

    def prefix_bytes(self, fidelity: int | None = None) -> int:
        """Bytes of the file's prefix that holds every image at ``fidelity`` (None: full)."""
        k = self._fidelity(fidelity)
        return int(self.group_offsets[k] + self.group_lengths[k])

    def _fidelity(self, fidelity: int | None) -> int:
        if fidelity is None:
            return self.scans
        if isinstance(fidelity, bool) or not isinstance(fidelity, (int, np.integer)) or fidelity < 1:
            raise ValueError(f"fidelity must be an integer of at least 1, not {fidelity!r}")
        return min(int(fidelity), self.scans)

    def _pread(self, fd: int, start: int, length: int, what: str) -> bytes:
        # Past the end of the file as opened, the index may be forged (a terabyte group):
        # the file's size now, not a read of ``length`` bytes, decides.
        self._require(fd, start + length, what)
        data = os.pread(fd, min(length, _PIECE), start) if length else b""
        if 0 < len(data) < length:            # a long span, or a short read
            parts, done = [data], len(data)
            while done < length and (part := os.pread(fd, min(length - done, _PIECE), start + done)):
                parts.append(part)
                done += len(part)
            data = b"".join(parts)
        if len(data) < length:
            self._truncated(fd, start + length, what)
        return data

    def _require(self, fd: int, end: int, what: str) -> None:
        """Raise the truncation RecordError when the file ends before ``end``."""
        if end > self._size and end > os.fstat(fd).st_size:
            self._truncated(fd, end, what)

    def _truncated(self, fd: int, end: int, what: str) -> None:
        raise RecordError(f"{self.path}: truncated record: {what} needs bytes up to {end}, "
                          f"the file has {os.fstat(fd).st_size}")

    def _check(self, fd: int, g: int, verdicts: list) -> None:
        """Check scan group ``g``'s CRC once (the first time, reading it in pieces of
        ``_PIECE``), keeping the verdict in ``verdicts``, the file's list from :meth:`_open`.

        Raises:
            RecordError: the file ends inside the group, or its CRC does not match (the
                verdict is kept: a damaged group is not read again).
        """
        verdict = verdicts[g]
        if verdict is None:
            with self._lock:
                verdict = verdicts[g]
                if verdict is None:
                    try:
                        start, length, crc = int(self.group_offsets[g]), int(self.group_lengths[g]), 0
                        self._require(fd, start + length, f"scan group {g}")
                        for at in range(start, start + length, _PIECE):
                            crc = zlib.crc32(self._pread(fd, at, min(_PIECE, start + length - at),
                                                         f"scan group {g}"), crc)
                        verdict = "ok" if crc == self._crcs[g] else \
                            f"{self.path}: corrupt record: scan group {g} CRC mismatch"
                    except RecordError as exc:
                        verdict = str(exc)
                    verdicts[g] = verdict
        if verdict != "ok":
            raise RecordError(verdict)

    def pieces(self, index: int, fidelity: int | None = None) -> list[bytes]:
        """Header and first ``fidelity`` scans of image ``index`` (fewer when it has fewer).

        Raises:
            IndexError: no such image; ValueError: a fidelity below 1; RecordError: as
            :meth:`_check`, or the file is gone or no longer a record's length.
        """
        if isinstance(index, bool) or not isinstance(index, numbers.Integral):
            raise TypeError(f"{self.path}: an image index is an integer, not {index!r}")
        if not 0 <= index < self.images:
            raise IndexError(f"{self.path}: image {index} out of range 0..{self.images - 1}")
        k = min(self._fidelity(fidelity), self.scan_counts[index])
        f, verdicts = self._open()
        with f:
            fd = f.fileno()
            out = []
            for g in range(k + 1):
                self._check(fd, g, verdicts)
                start = int(self.group_offsets[g] + self.starts[g, index])
                out.append(self._pread(fd, start, int(self.lengths[g, index]), f"image {index}"))
        return out

    def image(self, index: int, fidelity: int | None = None) -> bytes:
        """Image ``index`` as a JPEG of its header and first ``fidelity`` scans + EOI."""
        return rebuild(self.pieces(index, fidelity))

    def read_prefix(self, fidelity: int | None = None) -> list[bytes]:
        """Every image at ``fidelity`` from one contiguous read of the file's prefix
        (what a reader streaming whole records does), every group's CRC checked."""
        k = self._fidelity(fidelity)
        end = self.prefix_bytes(k)
        f, _ = self._open()
        with f:
            view = memoryview(self._pread(f.fileno(), 0, end, f"fidelity {k}"))
        for g in range(k + 1):
            group = view[int(self.group_offsets[g]):int(self.group_offsets[g] + self.group_lengths[g])]
            if zlib.crc32(group) != self._crcs[g]:
                raise RecordError(f"{self.path}: corrupt record: scan group {g} CRC mismatch")
        images = []
        for i in range(self.images):
            starts = self.group_offsets + self.starts[:, i]
            images.append(b"".join(view[int(starts[g]):int(starts[g] + self.lengths[g, i])]
                                   for g in range(min(k, self.scan_counts[i]) + 1)) + EOI)
        return images


def _digest(data: bytes) -> bytes:
    """A record header's fingerprint: kept instead of the header itself (tens of KB per
    file, held for every file of a data set in every rank)."""
    return hashlib.blake2b(data, digest_size=32).digest()


def _metadata(raw: bytes, n: int, s: int, path: str) -> dict:
    """The metadata block, checked against the header.

    Raises:
        RecordError: not JSON, or a field missing, of the wrong type or length, or
            contradicting the header (image and scan counts, labels outside the classes),
            class names repeated, a source size of 2^63 bytes or more.
    """
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"{path}: corrupt record metadata: {exc}") from None

    def fail(what: str):
        raise RecordError(f"{path}: corrupt record metadata: {what}")

    if not isinstance(meta, dict):
        fail("not a JSON object")
    if meta.get("format") != "dlbooster-pcr" or meta.get("version") != FORMAT_VERSION:
        fail("format or version field")
    if meta.get("images") != n or meta.get("scans") != s:
        fail("image or scan count differs from the header")
    classes = meta.get("classes")
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        fail("classes must be a list of names")
    if len(set(classes)) != len(classes):
        fail("class names must differ (a label would have two names)")
    # The writer stores what os.stat gave, an off_t (int64): a larger size was never a
    # file's, so the metadata is forged or damaged.
    checks = {"labels": lambda v: 0 <= v < len(classes), "source_bytes": lambda v: 0 <= v < 1 << 63,
              "scan_counts": lambda v: 1 <= v <= s}
    for key, ok in checks.items():
        values = meta.get(key)
        if (not isinstance(values, list) or len(values) != n
                or not all(type(v) is int and ok(v) for v in values)):
            fail(f"{key} must be {n} integers in range")
    names = meta.get("names")
    if not isinstance(names, list) or len(names) != n or not all(isinstance(v, str) for v in names):
        fail(f"names must be {n} strings")
    if n and max(meta["scan_counts"]) != s:
        fail("no image has the header's scan count")
    return meta


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
        if not os.path.isdir(self.root):
            what = ("not a folder (a record set is the folder that holds the record files)"
                    if os.path.exists(self.root) else "no such folder")
            raise FileNotFoundError(f"{self.root}: {what}")
        paths = record_paths(self.root)
        if not paths:
            raise FileNotFoundError(f"{self.root}: no record files (*{SUFFIX})")
        self.files = [RecordFile(p) for p in paths]
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



def is_record_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding record files."""
    return os.path.isdir(path) and bool(record_paths(path))


def record_paths(folder: str | os.PathLike) -> list[Path]:
    """The record files of ``folder`` (``*.pcr``), in name order with numbers compared
    as numbers (``records-99999.pcr`` before ``records-100000.pcr``, which a writer of
    more than 100,000 files names). Hidden names (a leading dot) are left out, as the
    shell's and :mod:`glob`'s ``*`` leaves them out: macOS copies put an AppleDouble
    ``._NAME`` beside each file, which is no record."""
    def key(path: Path) -> list:
        # ASCII digit runs (odd places of the split) as (0, number, text), the text
        # between as (1, text): comparable in any mix; other scripts' digits are text.
        return [(0, int(part), part) if i % 2 else (1, part)
                for i, part in enumerate(re.split(r"([0-9]+)", path.name)) if part]
    return sorted((p for p in Path(folder).glob("*" + SUFFIX) if not p.name.startswith(".")), key=key)


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
        images are equal), ``sample`` (images measured), ``unmeasured`` (names of the
        first ``sample`` images Pillow refuses to decode, e.g. past its
        decompression-bomb limit: left out of the PSNR figures).

    Raises:
        ValueError: ``sample`` below 1.
        RecordError: a damaged record among the sampled images.
    """
    from PIL import Image

    if sample < 1:
        raise ValueError(f"sample must be at least 1, not {sample}")
    entries, full, unmeasured = [], [], []
    for rf, i in list(records.entries())[:sample]:
        data = rf.image(i)            # a damaged record raises RecordError here
        try:
            full.append(_decode_rgb(data))
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
            unmeasured.append(rf.names[i])
        else:
            entries.append((rf, i))
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
            "scans": records.scans, "source_bytes": source, "sample": len(entries), "unmeasured": unmeasured,
            "fidelities": rows}
