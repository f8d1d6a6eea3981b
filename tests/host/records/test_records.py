"""Progressive Compressed Records : lossless transcoding, the record format,
its reader's checks, the Loader at each fidelity, the fidelity choice and the CLI.

Inputs are JPEGs generated from scikit-image's photographs with Pillow (every
subsampling, grayscale, CMYK, restart intervals, optimised tables, progressive
sources); Pillow is the oracle for every decoded pixel.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from jpegtools import make_jpeg, photo_crop, pillow_rgb, png_bytes

from dlbooster.records import pcr as R

pytestmark = pytest.mark.skipif(shutil.which("jpegtran") is None,
                                reason="jpegtran missing (apt-get install libjpeg-turbo-progs)")

# (name, width, height, make_jpeg options): one per feature the records must carry.
VARIANTS = [
    ("c420", 96, 80, dict(subsampling=2, quality=80)),
    ("c422", 67, 45, dict(subsampling=1, quality=90)),
    ("c444", 40, 33, dict(subsampling=0, quality=60, name="coffee.png")),
    ("c440", 50, 48, dict(subsampling="440", quality=75)),
    ("gray", 72, 41, dict(subsampling="gray", quality=85)),
    ("restart", 120, 64, dict(subsampling=2, quality=70, restart_blocks=3)),
    ("optimised", 88, 88, dict(subsampling=2, quality=95, optimize=True, name="chelsea.png")),
    ("progressive", 64, 72, dict(subsampling=2, quality=75, progressive=True)),
    ("cmyk", 32, 24, dict(subsampling=0, quality=90, mode="CMYK")),
]


def _folder(root: Path) -> Path:
    """An ImageFolder: two classes, the variants alternating between them."""
    for n, (name, w, h, options) in enumerate(VARIANTS):
        d = root / f"class{n % 2}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.jpg").write_bytes(make_jpeg(w, h, **options))
    return root


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(source folder, record folder, WriteReport) with 4 images per record."""
    tmp = tmp_path_factory.mktemp("records")
    src = _folder(tmp / "src")
    report = R.write_records(src, tmp / "rec", images_per_record=4)
    return src, tmp / "rec", report


def _rgb(data: bytes) -> np.ndarray:
    image, exc = pillow_rgb(data)
    assert exc is None, exc
    return image


def test_split_scans_round_trip():
    baseline = make_jpeg(48, 40, subsampling=2, restart_blocks=2)
    pieces = R.split_scans(baseline)
    assert len(pieces) == 2 and pieces[0].startswith(b"\xff\xd8")
    assert pieces[1].startswith(b"\xff\xc4") or pieces[1].startswith(b"\xff\xda")
    assert R.rebuild(pieces) == baseline           # Pillow ends with EOI and nothing after it
    progressive = R.transcode(baseline)
    pieces = R.split_scans(progressive)
    assert len(pieces) == 11                       # jpegtran's simple progression for colour
    assert R.rebuild(pieces) == progressive
    assert all(p.count(b"\xff\xda") == 1 for p in pieces[1:]) and b"\xff\xda" not in pieces[0]
    for bad, message in ((b"GIF89a", "no SOI"), (b"\xff\xd8\xff\xd9", "no scan"),
                         (b"\xff\xd8\xff\xdb\x01\x00", "past the end")):
        with pytest.raises(R.RecordError, match=message):
            R.split_scans(bad)


def test_write_is_lossless_and_ordered(written):
    src, rec, report = written
    from dlbooster.runtime.sources import image_folder

    samples, classes, _ = image_folder(src)
    assert report.images == len(VARIANTS) and report.skipped == []
    # jpegtran's simple progression: 10 scans for YCbCr, 2 + 4 x components otherwise.
    assert len(report.records) == 3 and report.scans == 18
    records = R.RecordSet(rec)
    assert records.classes == classes and len(records) == len(samples)
    assert records.labels() == [s.label for s in samples]
    for (rf, i), sample in zip(records.entries(), samples):
        assert rf.names[i] == os.path.relpath(sample.path, src)
        assert rf.source_bytes[i] == os.path.getsize(sample.path)
        source = _rgb(Path(sample.path).read_bytes())
        assert np.array_equal(_rgb(rf.image(i)), source), sample.path        # bit-exact
        assert rf.scan_counts[i] == (6 if "gray" in sample.path else 18 if "cmyk" in sample.path else 10)


def test_hidden_files_beside_the_records_are_not_records(written, tmp_path):
    """macOS copies put an AppleDouble ``._NAME`` beside each file: no record, as the
    shell's ``*`` leaves it out."""
    _, rec, _ = written
    copy = tmp_path / "copy"
    shutil.copytree(rec, copy)
    for path in sorted(copy.glob("*.pcr")):
        (copy / f"._{path.name}").write_bytes(b"\x00\x05\x16\x07" + bytes(80))
    records = R.RecordSet(copy)
    assert [rf.path for rf in records.files] == [str(p) for p in sorted(copy.glob("[!.]*.pcr"))]
    assert len(records.files) == 3 and len(records) == len(R.RecordSet(rec))
    hidden_only = tmp_path / "hidden"
    hidden_only.mkdir()
    (hidden_only / "._records-00000.pcr").write_bytes(bytes(84))
    assert not R.is_record_dir(hidden_only)
    with pytest.raises(FileNotFoundError, match="no record files"):
        R.RecordSet(hidden_only)


def test_fidelities_decode_and_grow(written):
    _, rec, _ = written
    records = R.RecordSet(rec)
    sizes = [records.prefix_bytes(k) for k in range(1, records.scans + 1)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1] == records.prefix_bytes(None)
    assert sizes[-1] == sum(os.path.getsize(f.path) for f in records.files)
    for rf in records.files:
        for k in (1, 3, rf.scans):
            prefix = rf.read_prefix(k)
            for i in range(rf.images):
                data = rf.image(i, k)
                assert prefix[i] == data                    # one read == random access
                assert data.endswith(b"\xff\xd9")
                image = _rgb(data)                          # every fidelity decodes
                assert image.shape == _rgb(rf.image(i)).shape
        first = rf.image(0, 1)
        assert len(first) < len(rf.image(0))
        with pytest.raises(ValueError):
            rf.image(0, 0)
        with pytest.raises(IndexError):
            rf.image(rf.images, 1)


def test_skipped_inputs_are_reported(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    good = make_jpeg(32, 32)
    (src / "a" / "good.jpg").write_bytes(good)
    (src / "a" / "png.jpg").write_bytes(png_bytes(photo_crop(16, 16)))
    (src / "a" / "empty.jpg").write_bytes(b"")
    (src / "a" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    # A few hundred bytes declaring 65500 x 65500 pixels: jpegtran's memory cap stops it.
    huge = bytearray(make_jpeg(16, 16, subsampling=0))
    sof = huge.index(b"\xff\xc0")
    huge[sof + 5:sof + 9] = struct.pack(">HH", 65500, 65500)
    (src / "a" / "huge.jpg").write_bytes(bytes(huge))
    os.mkfifo(src / "a" / "fifo.jpg")
    report = R.write_records(src, tmp_path / "rec")
    assert report.images == 1
    skipped = dict(report.skipped)
    assert set(skipped) == {str(src / "a" / n) for n in ("png.jpg", "empty.jpg", "truncated.jpg", "huge.jpg", "fifo.jpg")}
    for path, reason in skipped.items():
        assert path in reason and ("jpegtran" in reason or "Pillow" in reason or "not a regular file" in reason)
        assert "\n" not in reason, reason          # jpegtran's warnings joined into one line
    assert "too large to transcode: jpegtran needs more than 1024 MB" in skipped[str(src / "a" / "huge.jpg")]
    with pytest.raises(FileExistsError):
        R.write_records(src, tmp_path / "rec")
    # Inside SRC the records folder would turn into a class of SRC; nothing is created.
    with pytest.raises(ValueError, match="inside the source folder"):
        R.write_records(src, src / "rec")
    assert not (src / "rec").exists()


def _copy(rec: Path, tmp: Path) -> Path:
    target = tmp / "one.pcr"
    shutil.copy(sorted(rec.glob("*.pcr"))[0], target)
    return target


@pytest.mark.parametrize("piece", [None, 3])
def test_reader_rejects_damage(written, tmp_path, monkeypatch, piece):
    """``piece``: reads and CRCs in pieces of 3 bytes, as spans over ``_PIECE`` (64 MiB;
    one pread moves at most about 2 GiB) are: the same bytes and the same verdicts."""
    _, rec, _ = written
    path = _copy(rec, tmp_path)
    good = path.read_bytes()
    full = [R.RecordFile(path).image(i) for i in range(R.RecordFile(path).images)]
    if piece is not None:
        monkeypatch.setattr(R, "_PIECE", piece)
    rf = R.RecordFile(path)
    offsets, lengths = rf.group_offsets.copy(), rf.group_lengths.copy()
    assert [rf.image(i) for i in range(rf.images)] == full
    assert rf.read_prefix(None) == full

    # A flipped byte in scan group 3: fidelities below 3 still read, 3 and above fail.
    damaged = bytearray(good)
    damaged[int(offsets[3]) + int(lengths[3]) // 2] ^= 0x40
    path.write_bytes(bytes(damaged))
    rf = R.RecordFile(path)
    assert rf.image(0, 2) == R.rebuild(R.split_scans(full[0])[:3])
    with pytest.raises(R.RecordError, match=r"one.pcr: corrupt record: scan group 3 CRC"):
        rf.image(0, 3)
    with pytest.raises(R.RecordError, match="scan group 3"):
        rf.read_prefix(5)

    # Truncated inside the last group: the header still opens, full fidelity fails.
    path.write_bytes(good[: int(offsets[-1]) + 5])
    rf = R.RecordFile(path)
    assert rf.read_prefix(rf.scans - 1)
    with pytest.raises(R.RecordError, match="truncated record"):
        rf.image(rf.scan_counts.index(rf.scans))          # the image with the last group
    with pytest.raises(R.RecordError, match="truncated record"):
        rf.read_prefix(None)

    for data, message in ((good[:20], "truncated record: 20 bytes, shorter than the 32-byte fixed header"),
                          (good[:3], "truncated record: 3 bytes"), (b"", "bad magic"),
                          (good[:100], "truncated record"), (b"PK\x03\x04" + good[4:], "bad magic"),
                          (b"PK", "bad magic"),
                          (good[:8] + struct.pack("<I", 2) + good[12:], "version 2"),
                          (good[:40] + bytes([good[40] ^ 1]) + good[41:], "header CRC")):
        path.write_bytes(data)
        with pytest.raises(R.RecordError, match=message):
            R.RecordFile(path)


def _forge(good: bytes, *, n=None, s=None, meta=None, lengths=None, group_lengths=None) -> bytes:
    """``good`` with header fields, metadata or index replaced, its header CRC made
    right again: only the reader's own checks can catch what is wrong."""
    import zlib

    magic, version, n0, s0, m0, reserved = struct.unpack_from("<8sIIIIQ", good)
    meta_raw = good[32:32 + m0]
    index = good[32 + m0:32 + m0 + 8 * n0 * (s0 + 1)]
    table_at = 32 + m0 + len(index)
    table = good[table_at:table_at + 24 * (s0 + 1)]
    groups = good[table_at + len(table) + 4:]
    if meta is not None:
        meta_raw = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    if lengths is not None:
        index = np.asarray(lengths, dtype="<u8").tobytes()
    # Group offsets follow the header, whose size may have changed.
    shift = len(meta_raw) - m0
    rows = np.frombuffer(table, dtype=np.dtype([("o", "<u8"), ("l", "<u8"), ("c", "<u4"), ("p", "<u4")])).copy()
    rows["o"] += np.uint64(shift) if shift >= 0 else np.uint64(0)
    if shift < 0:
        rows["o"] -= np.uint64(-shift)
    if group_lengths is not None:
        rows["l"] = np.asarray(group_lengths, dtype=np.uint64)
    head = struct.pack("<8sIIIIQ", magic, version, n0 if n is None else n, s0 if s is None else s,
                       len(meta_raw), reserved) + meta_raw + index + rows.tobytes()
    return head + struct.pack("<I", zlib.crc32(head)) + groups


def test_reader_rejects_forged_records(written, tmp_path):
    """Damage that keeps the header CRC right: sizes far beyond the file, metadata of the
    wrong shape or range, piece lengths that wrap around 2^64. Each is a RecordError
    naming the file, before any large allocation."""
    _, rec, _ = written
    path = _copy(rec, tmp_path)
    good = path.read_bytes()
    rf = R.RecordFile(path)
    meta = json.loads(good[32:32 + struct.unpack_from("<I", good, 20)[0]])
    n, first, first_at_1 = rf.images, rf.image(0), rf.image(0, 1)
    wrapped = rf.lengths.astype(np.uint64)
    # Sums stay right modulo 2^64: one piece "shrinks" by wrapping around, one grows.
    wrapped[2, 0] = (int(wrapped[2, 0]) - 10**6) % 2**64
    wrapped[2, 1] = int(wrapped[2, 1]) + 10**6
    beyond = rf.lengths.astype(np.uint64)
    beyond[-1, 0] += np.uint64(1 << 63)
    cases = [
        (_forge(good, n=0xFFFFFFFF), "truncated record"),
        (_forge(good, n=0xFFFFFFFF, s=0xFFFFFFFF), "truncated record"),
        (_forge(good, meta={**meta, "labels": [-1] + meta["labels"][1:]}), "labels must be"),
        (_forge(good, meta={**meta, "labels": [len(meta["classes"])] + meta["labels"][1:]}), "labels must be"),
        (_forge(good, meta={**meta, "labels": [True] + meta["labels"][1:]}), "labels must be"),
        (_forge(good, meta={**meta, "labels": [1e30] + meta["labels"][1:]}), "labels must be"),
        (_forge(good, meta={**meta, "names": None}), "names must be"),
        (_forge(good, meta={**meta, "scan_counts": [0] + meta["scan_counts"][1:]}), "scan_counts must be"),
        (_forge(good, meta={**meta, "source_bytes": meta["source_bytes"][1:]}), "source_bytes must be"),
        (_forge(good, meta={k: v for k, v in meta.items() if k != "classes"}), "classes must be"),
        (_forge(good, meta={**meta, "classes": [meta["classes"][0]] * len(meta["classes"])}),
         "class names must differ"),
        (_forge(good, meta={**meta, "source_bytes": [1 << 63] + meta["source_bytes"][1:]}), "source_bytes must be"),
        (_forge(good, meta={**meta, "images": n + 1}), "image or scan count"),
        (_forge(good, meta=[meta]), "not a JSON object"),
        (_forge(good, meta=b"[" * 100_000 + b"]" * 100_000), "corrupt record metadata"),
        (_forge(good, lengths=wrapped), "inconsistent index at scan group 2"),
        # Consistent, but past 2^63: no OverflowError from int64 conversion.
        (_forge(good, lengths=beyond, group_lengths=beyond.sum(axis=1)), "its index ends at byte"),
    ]
    for data, message in cases:
        path.write_bytes(data)
        with pytest.raises(R.RecordError, match=message) as caught:
            R.RecordFile(path)
        assert str(path) in str(caught.value)
    # The forging itself is sound: unchanged fields give a readable record.
    path.write_bytes(_forge(good, meta=meta))
    assert R.RecordFile(path).image(0) == first
    # The largest size an off_t holds is a size a file could have.
    path.write_bytes(_forge(good, meta={**meta, "source_bytes": [(1 << 63) - 1] + meta["source_bytes"][1:]}))
    assert R.RecordFile(path).source_bytes[0] == (1 << 63) - 1
    # A last group declared a terabyte long opens (a truncated file still serves its
    # prefixes), and reading it is a truncated record with the file's real size, not a
    # terabyte read (MemoryError).
    huge = rf.lengths.astype(np.uint64)
    huge[-1, -1] += np.uint64(1 << 40)
    data = _forge(good, lengths=huge, group_lengths=huge.sum(axis=1))
    path.write_bytes(data)
    forged = R.RecordFile(path)
    assert forged.image(0, 1) == first_at_1
    with pytest.raises(R.RecordError, match=f"truncated record: scan group {rf.scans} needs bytes up to "
                                            f"{len(data) + (1 << 40)}, the file has {len(data)}$"):
        forged.image(rf.scan_counts.index(rf.scans))     # an image with a piece in the last group

    # Not a regular file, whatever its name.
    (tmp_path / "dir.pcr").mkdir()
    with pytest.raises(R.RecordError, match="not a regular file"):
        R.RecordFile(tmp_path / "dir.pcr")
    os.mkfifo(tmp_path / "fifo.pcr")
    with pytest.raises(R.RecordError, match="not a regular file"):
        R.RecordFile(tmp_path / "fifo.pcr")

    # Truncated after it was opened: reported (no fault from a stale mapping).
    path.write_bytes(good)
    rf = R.RecordFile(path)
    os.truncate(path, 4096)                          # the header is whole: the group is short
    with pytest.raises(R.RecordError, match=r"truncated record: scan group \d+ needs bytes up to \d+, "
                                            r"the file has 4096$"):
        rf.image(rf.images - 1)
    os.truncate(path, 40)                            # inside the header: another file
    with pytest.raises(R.RecordError, match="changed after it was opened"):
        rf.image(0)


def test_info_leaves_out_images_pillow_refuses(written, monkeypatch):
    """``records info`` measures PSNR with Pillow; an image past Pillow's
    decompression-bomb limit is named as not measured, not a traceback."""
    _, rec, _ = written
    records = R.RecordSet(rec)
    sizes = {name: Image.open(io.BytesIO(rf.image(i))).size for rf, i in records.entries()
             for name in [rf.names[i]]}
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)     # refused above 2,000 pixels
    result = R.info(records, sample=len(sizes))
    large = sorted(name for name, (w, h) in sizes.items() if w * h > 2000)
    assert large and sorted(result["unmeasured"]) == large
    assert result["sample"] == len(sizes) - len(large) > 0
    code, out, _ = _cli("records", "info", str(rec), "--sample", str(len(sizes)))
    assert code == 0 and f"not measured: {large[0]} (Pillow does not decode it)" in out


def test_loader_reads_records_at_each_fidelity(written):
    import torch

    from dlbooster import Loader

    _, rec, _ = written
    records = R.RecordSet(rec)
    expected = {}
    for k in (1, 4, None):
        with Loader(records, 4, backend="cpu", shuffle=True, seed=3, fidelity=k) as loader:
            seen = []
            for batch in loader:
                for slot, index in enumerate(batch.indices.tolist()):
                    rf, i = list(records.entries())[index]
                    ref = _rgb(rf.image(i, k))
                    h, w = batch.sizes[slot].tolist()
                    got = batch.images[slot, :, :h, :w].permute(1, 2, 0).numpy()
                    assert np.array_equal(got, ref), (index, k)
                    assert batch.labels[slot].item() == rf.labels[i]
                    seen.append(index)
                assert batch.outcomes == []
            assert sorted(seen) == list(range(len(records)))
            assert loader.report.accounted == loader.report.positions == len(records)
            expected[k] = seen
    assert expected[1] == expected[4] == expected[None]    # fidelity changes bytes, not order
    # Sharding: the two ranks' indices are DistributedSampler's.
    sampler = torch.utils.data.DistributedSampler(range(len(records)), num_replicas=2, rank=1, shuffle=True, seed=3)
    with Loader(records, 2, backend="cpu", seed=3, rank=1, world_size=2, fidelity=2) as loader:
        assert [i for b in loader for i in b.indices.tolist()] == list(sampler)
    with pytest.raises(ValueError, match="fidelity must be an integer 1..18 for .*, not 19$"):
        Loader(records, 2, backend="cpu", fidelity=19)
    with pytest.raises(ValueError, match="not '2'$"):
        Loader(records, 2, backend="cpu", fidelity="2")
    # A NumPy integer is an integer, as RecordFile.image takes it.
    with Loader(records, 2, backend="cpu", shuffle=False, fidelity=np.int64(2)) as loader:
        assert loader.fidelity == 2 and type(loader.fidelity) is int
        assert next(iter(loader)).outcomes == []
    rf = records.files[0]
    for index in (1.5, True, "0"):
        with pytest.raises(TypeError, match=f"^{re.escape(rf.path)}: an image index is an integer, not "):
            rf.image(index)
    assert rf.image(np.int64(0)) == rf.image(0)
    with pytest.raises(ValueError, match="records source only"):
        Loader([(str(rec), 0)], 2, backend="cpu", fidelity=1)


def test_loader_reports_a_corrupt_record_per_sample(written, tmp_path):
    from dlbooster import Loader

    _, rec, _ = written
    folder = tmp_path / "rec"
    shutil.copytree(rec, folder)
    victim = sorted(folder.glob("*.pcr"))[1]
    data = bytearray(victim.read_bytes())
    rf = R.RecordFile(victim)
    spot = int(rf.group_offsets[2]) + 1
    count = rf.images
    data[spot] ^= 0xFF
    victim.write_bytes(bytes(data))
    with Loader(str(folder), 3, backend="cpu", shuffle=False, fidelity=1) as loader:   # group 2 unread
        assert sum(len(b.indices) for b in loader) == len(VARIANTS)
    with Loader(str(folder), 3, backend="cpu", shuffle=False, on_error="skip") as loader:
        delivered = sum(len(b.indices) for b in loader)
        skipped = loader.report.skipped
    assert delivered == len(VARIANTS) - count and len(skipped) == count
    for outcome in skipped:
        assert outcome.status == "error" and outcome.reason == "unreadable"
        assert outcome.path.startswith(str(victim) + "#") and "scan group 2 CRC" in outcome.detail


def _past_the_clock_tick(st) -> None:
    """Wait until a change made now gets a status-change time other than ``st``'s."""
    while time.time_ns() - st.st_ctime_ns < 50_000_000:      # past the file clock's coarse tick
        time.sleep(0.01)


def test_a_record_file_changed_after_opening_is_reported(written, tmp_path):
    """A record file rewritten or replaced while its record set is open was read with
    the old index and the old CRC verdicts (misaligned bytes, or another image under the
    old label); each read now checks that the path still names the record opened."""
    from dlbooster import Loader

    _, rec, _ = written
    folder = tmp_path / "rec"
    shutil.copytree(rec, folder)
    first, second = sorted(folder.glob("*.pcr"))[:2]
    records = R.RecordSet(folder)
    rf = records.files[0]
    assert rf.image(0) == R.RecordFile(rec / first.name).image(0)
    os.replace(second, first)                        # another record under the same name
    with pytest.raises(R.RecordError, match=r"changed after it was opened"):
        rf.image(0)
    shutil.copy(rec / first.name, tmp_path / "spare.pcr")
    gone = R.RecordFile(tmp_path / "spare.pcr")
    os.unlink(gone.path)                             # a RecordError too, as records.md says
    with pytest.raises(R.RecordError, match=r"\.pcr: the record file is gone \(deleted or moved after it was "
                                            r"opened\): open the record set again"):
        gone.read_prefix()
    with pytest.raises(FileNotFoundError):
        R.RecordFile(gone.path)
    # New contents in place with the old inode and modification time (cp -p, rsync -t
    # --inplace, tar): only the status-change time tells them apart.
    third = R.RecordFile(folder / sorted(rec.glob("*.pcr"))[2].name)
    victim, before = Path(third.path), os.stat(third.path)
    data = bytearray(victim.read_bytes())
    data[R.HEADER.size + 20] ^= 0x01                # in the metadata: the header differs
    _past_the_clock_tick(before)
    with open(victim, "r+b") as f:
        f.write(data)
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(victim)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    with pytest.raises(R.RecordError, match=r"changed after it was opened"):
        third.image(0)
    with Loader(records, 4, backend="cpu", shuffle=False, on_error="skip") as loader:
        delivered = sum(len(b.indices) for b in loader)
        skipped = {o.index: o.detail for o in loader.report.skipped}
    # The first and third files' images: changed; the second's: its file is gone; the rest: read.
    n1, n2, n3 = (f.images for f in records.files[:3])
    assert delivered == records.images - n1 - n2 - n3 and sorted(skipped) == list(range(n1 + n2 + n3))
    assert all("changed after it was opened" in skipped[i] for i in [*range(n1), *range(n1 + n2, n1 + n2 + n3)])


def test_a_record_file_whose_metadata_alone_changed_is_still_read(written, tmp_path):
    """A chmod, a hard link, a touch, or the same bytes copied again change the file's
    status-change time (or more) but not the record: its images are still read (every
    one was refused as changed). Its scan groups' CRCs are checked again, so new bytes
    under an unchanged header are still caught."""
    _, rec, _ = written
    folder = tmp_path / "rec"
    shutil.copytree(rec, folder)
    records = R.RecordSet(folder)
    rf = records.files[0]
    path, want = Path(rf.path), [rf.image(i) for i in range(rf.images)]
    changes = [lambda: os.chmod(path, 0o600),
               lambda: os.link(path, tmp_path / "link.pcr"),
               lambda: os.utime(path),
               lambda: shutil.copy(rec / path.name, tmp_path / "copy.pcr") or os.replace(tmp_path / "copy.pcr", path)]
    for change in changes:
        _past_the_clock_tick(os.stat(path))
        change()
        assert [rf.image(i) for i in range(rf.images)] == want
        assert rf.read_prefix(1) == [rf.image(i, 1) for i in range(rf.images)]
    # The last scan group's bytes changed in place, header untouched: the group's CRC,
    # checked again since the change, refuses the images that have a scan in it.
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    _past_the_clock_tick(os.stat(path))
    path.write_bytes(bytes(data))
    last = [i for i in range(rf.images) if rf.scan_counts[i] == rf.scans]
    assert last and len(last) < rf.images
    for i in range(rf.images):
        if i in last:
            with pytest.raises(R.RecordError, match=f"scan group {rf.scans} CRC mismatch"):
                rf.image(i)
        else:
            assert rf.image(i) == want[i]


def test_a_check_through_a_replaced_file_does_not_vouch_for_its_replacement(written, tmp_path):
    """A reader thread opened the file; another found it replaced by a copy with the
    same header but a damaged last scan group, and reset the CRC verdicts; the first
    thread's check of the old file then finished. Its verdicts stay with the old file:
    the damaged group is still refused (they were kept for the new file, whose bad bytes
    then read without error). The threads' order is forced by calling the steps in turn."""
    _, rec, _ = written
    folder = tmp_path / "rec"
    shutil.copytree(rec, folder)
    rf = R.RecordSet(folder).files[0]
    path = Path(rf.path)
    old, old_verdicts = rf._open()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "copy.pcr").write_bytes(bytes(data))
    os.replace(tmp_path / "copy.pcr", path)
    rf._open()[0].close()                                  # the other thread: a new identity
    with old:
        for g in range(rf.scans + 1):
            rf._check(old.fileno(), g, old_verdicts)       # the old file's groups are sound
    assert old_verdicts == ["ok"] * (rf.scans + 1)
    last = next(i for i in range(rf.images) if rf.scan_counts[i] == rf.scans)
    with pytest.raises(R.RecordError, match=f"scan group {rf.scans} CRC mismatch"):
        rf.image(last)


def test_a_fifo_swapped_in_after_the_check_is_not_waited_on(written, tmp_path, monkeypatch):
    """The path is checked to be a regular file, then opened: a FIFO put there in
    between blocked ``open()`` until a writer came (forever, without one). The file is
    opened without blocking and checked again."""
    import threading

    _, rec, _ = written
    fifo = tmp_path / "swapped.pcr"
    os.mkfifo(fifo)
    real_stat, record = os.stat, str(next(rec.glob("*.pcr")))
    # os.stat answers for the record file, as it would have just before the swap.
    monkeypatch.setattr(R.os, "stat", lambda path, *a, **k: real_stat(record if os.fspath(path) == str(fifo)
                                                                      else path, *a, **k))
    result = []

    def open_it():
        try:
            R.RecordFile(fifo)
        except R.RecordError as exc:
            result.append(str(exc))

    thread = threading.Thread(target=open_it, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():                          # release the blocked open() before failing
        os.close(os.open(fifo, os.O_WRONLY))
    assert not thread.is_alive() and result == [f"{fifo}: not a regular file"]


def test_device_backend_sends_records_to_the_cpu(written):
    """Progressive images are outside the hardware profile: the decode service's
    pre-screen sends each to the CPU path without a device job (fallback, reason
    progressive)."""
    from dlbooster import Loader

    _, rec, _ = written
    with Loader(str(rec), 9, backend="sim", backend_options={"lanes": 1, "max_width": 256},
                shuffle=False, fidelity=3) as loader:
        batch = next(iter(loader))
        assert {(o.status, o.reason) for o in batch.outcomes} == {("fallback", "progressive")}
        assert len(batch.outcomes) == len(VARIANTS)
        assert all(o.detail == "host pre-screen" for o in batch.outcomes)
        stats = loader.service.stats
        assert stats.jobs == 0 and sum(stats.lane_clocks.values()) == 0


class _Tiny:
    """A small CNN (fast on the CPU) for the fidelity search, with batch norm and
    dropout: both must not make the passes at different fidelities differ."""

    @staticmethod
    def make():
        import torch

        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                   torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Dropout(0.5),
                                   torch.nn.Linear(8, 2))


def test_choose_fidelity(written):
    import torch

    from dlbooster.records.fidelity import choose_fidelity

    _, rec, _ = written
    model = _Tiny.make()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    low = choose_fidelity(model, rec, batch_size=4, batches=2, image_size=32, threshold=-0.999)
    assert low.fidelity == 1 and list(low.scores) == [1] and low.batches == 2
    strict = choose_fidelity(model, rec, batch_size=4, batches=2, image_size=32, threshold=1.0)
    assert list(strict.scores) == list(range(1, 18))
    assert all(-1.0 <= s <= 1.0 + 1e-6 for s in strict.scores.values())
    assert strict.fidelity == next((k for k, s in strict.scores.items() if s >= 1.0), 18)
    mid = choose_fidelity(model, rec, batch_size=4, batches=2, image_size=32,
                          threshold=(strict.scores[1] + strict.scores[17]) / 2)
    assert mid.fidelity == next(k for k, s in strict.scores.items() if s >= mid.threshold)
    # The same batches, batch-norm state and dropout masks in every call and pass.
    assert mid.scores == {k: pytest.approx(strict.scores[k], abs=1e-5) for k in mid.scores}
    for k, v in model.state_dict().items():                   # the model is left as it was
        assert torch.equal(v, before[k]), k
    assert torch.equal(torch.random.get_rng_state(), rng)     # and the global random state
    with pytest.raises(ValueError):
        choose_fidelity(model, rec, threshold=1.5)


def test_choose_fidelity_leaves_out_a_final_batch_of_one(written):
    """Nine images in batches of eight: the second batch would hold one image, which
    batch norm over features refuses in train mode; it is left out. A partial batch
    that is the only one is measured."""
    import torch

    from dlbooster.records.fidelity import choose_fidelity

    _, rec, _ = written
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=4), torch.nn.Flatten(),
                                torch.nn.BatchNorm1d(4 * 8 * 8), torch.nn.Linear(4 * 8 * 8, 2))
    choice = choose_fidelity(model, rec, batch_size=8, batches=2, image_size=32, threshold=1.0)
    assert (choice.batches, choice.batch_size) == (1, 8)
    assert list(choice.scores) == list(range(1, min(choice.fidelity, 17) + 1))
    assert choose_fidelity(model, rec, batch_size=16, batches=2, image_size=32, threshold=-0.999).batches == 1


def _cli(*args) -> tuple[int, str, str]:
    import contextlib

    from dlbooster.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:             # argparse's refusals
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def _counting(monkeypatch, owner, name) -> list:
    """Count the calls of ``owner.name`` (still called)."""
    calls, real = [], getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)
    monkeypatch.setattr(owner, name, counted)
    return calls


def test_cli_write_info_and_train(tmp_path, monkeypatch):
    src = tmp_path / "data"
    for split, n in (("train", 6), ("val", 4)):
        for c in ("ants", "bees"):
            d = src / split / c
            d.mkdir(parents=True)
            for j in range(n // 2):
                name = ("astronaut.png", "coffee.png", "chelsea.png")[j % 3]
                (d / f"{j}.jpg").write_bytes(make_jpeg(48 + 8 * j, 40, name=name, subsampling=j % 3))
    walks = _counting(monkeypatch, R, "image_folder")      # the listing the writer calls
    code, out, err = _cli("records", "write", str(src), str(tmp_path / "rec"), "--images-per-record", "4", "--json")
    assert code == 0, err
    assert sorted(Path(c[0]).name for c in walks) == ["train", "val"]      # each source walked once
    monkeypatch.undo()
    reports = json.loads(out)
    assert {Path(k).name for k in reports} == {"train", "val"}
    assert reports[str(tmp_path / "rec" / "train")]["images"] == 6
    bad = tmp_path / "bad" / "c"
    bad.mkdir(parents=True)
    (bad / "0.jpg").write_bytes(make_jpeg(16, 16))
    (bad / "1.jpg").write_bytes(b"\xff\xd8 not a JPEG")
    code, out, err = _cli("records", "write", str(tmp_path / "bad"), str(tmp_path / "rec-bad"))
    (line,) = [line for line in out.splitlines() if "skipped " in line and "1.jpg" in line]
    assert code == 1 and line.count("1.jpg") == 1, out       # the path once, then why
    # A name with a line break cannot forge a second "skipped" line.
    forged = "evil\n  skipped fake.jpg: forged.jpg"
    (bad / forged).write_bytes(b"\xff\xd8 not a JPEG")
    code, out, err = _cli("records", "write", str(tmp_path / "bad"), str(tmp_path / "rec-bad2"))
    assert code == 1 and sum("skipped " in line for line in out.splitlines()) == 2, out
    assert "evil\\n  skipped fake.jpg" in out
    code, out, err = _cli("records", "info", str(tmp_path / "rec" / "train"), "--json", "--sample", "3")
    assert code == 0, err
    result = json.loads(out)
    rows = result["fidelities"]
    assert [r["fidelity"] for r in rows] == list(range(1, 11)) and rows[-1]["of_full"] == 1.0
    assert rows[-1]["psnr_mean_db"] is None and rows[-1]["identical"] == 3
    assert all(r["psnr_mean_db"] is not None and 10 < r["psnr_mean_db"] < 99 for r in rows[:5])
    code, out, _ = _cli("records", "info", str(tmp_path / "rec" / "val"), "--sample", "3")
    assert code == 0 and "PSNR mean dB" in out
    # The text table says how many images each mean leaves out as already identical.
    header, _, *table, note = out.splitlines()[1:]
    assert header.split()[:5] == ["fidelity", "bytes", "of", "sources", "of"] and "identical" in header
    assert table[-1].split()[4] == "3" and table[-1].split()[5:] == ["inf", "inf"]
    assert note == "PSNR over the images not yet identical to full fidelity's (identical: how many are)"
    code, _, err = _cli("records", "write", str(src), str(tmp_path / "rec"))
    assert code == 2 and "already holds record files" in err
    # Train/val pairs are checked together before anything is written: output inside
    # SRC/val would become a class of that ImageFolder, and val's records beside old
    # ones would leave a new train set behind.
    before = sorted(p.relative_to(src) for p in src.rglob("*"))
    code, _, err = _cli("records", "write", str(src), str(src / "val" / "recs"))
    assert code == 2 and f"{src / 'val' / 'recs'}: inside the source folder {src}" in err
    assert sorted(p.relative_to(src) for p in src.rglob("*")) == before
    (tmp_path / "half" / "val").mkdir(parents=True)
    shutil.copy(next((tmp_path / "rec" / "val").glob("*.pcr")), tmp_path / "half" / "val")
    code, _, err = _cli("records", "write", str(src), str(tmp_path / "half"))
    assert code == 2 and f"{tmp_path / 'half' / 'val'}: already holds record files" in err
    assert not (tmp_path / "half" / "train").exists()
    code, _, err = _cli("records", "info", str(tmp_path))
    assert code == 2 and "no record files" in err
    code, _, err = _cli("records", "info", str(tmp_path / "nowhere"))
    assert code == 2 and f"{tmp_path / 'nowhere'}: no such folder" in err
    code, _, err = _cli("records", "info", str(tmp_path / "rec"))            # what `write` made
    assert code == 2 and err.strip().endswith("it holds the record sets train/ and val/: give one"), err
    code, _, err = _cli("records", "write", str(tmp_path / "nowhere"), str(tmp_path / "out2"))
    assert (code, err) == (2, f"dlbooster records write: {tmp_path / 'nowhere'}: no such folder\n")
    assert not (tmp_path / "out2").exists()
    # The folder holding train/ and val/ record sets is not an ImageFolder: the Loader says so.
    from dlbooster import Loader

    with pytest.raises(ValueError, match="a folder of record sets"):
        Loader(str(tmp_path / "rec"), 2, backend="cpu")
    code, _, err = _cli("records", "info", str(tmp_path / "rec" / "val"), "--sample", "0")
    assert code == 2 and "--sample: must be at least 1, not 0" in err
    code, _, err = _cli("records", "info", str(tmp_path / "rec" / "val"), "extra")
    assert code == 2 and "unrecognized arguments: extra" in err
    code, _, err = _cli("records", "write", str(src))
    assert code == 2 and "required: OUT" in err
    code, out, _ = _cli("records", "write", "--help")
    assert code == 0 and "--images-per-record" in out and "--sample" not in out
    code, out, _ = _cli("records", "info", "--help")
    assert code == 0 and "--sample" in out and "--images-per-record" not in out

    opened = _counting(monkeypatch, R.RecordSet, "__init__")
    code, out, err = _cli("train", "--records", str(tmp_path / "rec"), "--fidelity", "auto", "--steps", "2",
                          "--batch-size", "3", "--image-size", "32", "--json")
    assert code == 0, err
    assert sorted(Path(c[1]).name for c in opened) == ["train", "val"]     # each set opened once
    monkeypatch.undo()
    summary = json.loads(out)
    assert summary["records"] == str(tmp_path / "rec") and summary["backend"] == "cpu"
    assert 1 <= summary["fidelity"] <= 10 and summary["fidelity_choice"]["fidelity"] == summary["fidelity"]
    assert summary["steps"] == 2 and summary["val_top1"] is not None
    assert set(summary["outcomes"]) == {"ok"}
    code, out, err = _cli("train", "--records", str(tmp_path / "rec"), "--fidelity", "auto", "--steps", "1",
                          "--batch-size", "3", "--image-size", "32")
    (line,) = [line for line in out.splitlines() if line.startswith("fidelity ")]
    k = summary["fidelity"]
    if str(k) in summary["fidelity_choice"]["scores"]:
        assert line.startswith(f"fidelity {k} chosen: the lowest whose") and "reached 0.9 (1: " in line
    else:                                           # none reached it: full fidelity, said so
        assert line.startswith(f"fidelity {k} (full) chosen: no lower fidelity's") and "of 0.9 to " in line
    assert code == 0
    code, _, err = _cli("train", "--fidelity", "2", "--steps", "1")
    assert code == 2 and "--fidelity needs --records" in err
    # Refused before the run is announced (no "training ..." banner).
    rec = str(tmp_path / "rec")
    for args, message in ((["--fidelity", "0"], "argument --fidelity: must be at least 1, not 0"),
                          (["--fidelity", "x"], "argument --fidelity: not an integer: 'x'"),
                          (["--fidelity", "99"], f"dlbooster train: fidelity 99: the records in {rec} have 1..10 scans"),
                          (["--fidelity", "auto", "--fidelity-threshold", "2"],
                           "argument --fidelity-threshold: must be in (-1, 1], not 2")):
        code, out, err = _cli("train", "--records", rec, *args, "--steps", "1")
        assert (code, out) == (2, "") and message in err and "training" not in err, (args, err)
    code, _, err = _cli("records", "info", str(tmp_path / "rec" / "val" / "records-00000.pcr"))
    assert code == 2 and "records-00000.pcr: not a folder (a record set is the folder that holds" in err
    code, out, err = _cli("train", "--records", rec, "--fidelity", "3", "--fidelity-threshold", "0.5", "--steps", "1")
    assert (code, out) == (2, "") and "--fidelity-threshold applies to --fidelity auto only" in err
    for where, what in ((tmp_path / "nowhere", "no such folder"),
                        (tmp_path / "rec" / "val" / "records-00000.pcr", "not a folder")):
        code, out, err = _cli("train", "--records", str(where), "--steps", "1")
        assert (code, out, err) == (2, "", f"dlbooster train: {where}: {what}\n")


def test_records_write_refusals_and_interruption(tmp_path, monkeypatch):
    """What `records write` refuses before writing anything, and Ctrl-C: one line, no
    traceback, exit 130, no record file."""
    src = tmp_path / "data"
    _folder(src / "train")
    (src / "val" / "zebra").mkdir(parents=True)
    (src / "val" / "zebra" / "z.jpg").write_bytes(make_jpeg(16, 16))
    code, out, err = _cli("records", "write", str(src), str(tmp_path / "out"))
    assert (code, out) == (2, "") and err == (f"dlbooster records write: {src}: train/ and val/ have different "
                                              f"classes (train: class0, class1; val: zebra)\n")
    assert not (tmp_path / "out").exists()
    shutil.rmtree(src / "val")
    (tmp_path / "afile").write_text("")
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    code, out, err = _cli("records", "write", "", str(tmp_path / "out"))
    assert (code, out, err) == (2, "", "dlbooster records write: SRC is empty: give the folder of images to write\n")
    for out_arg, message in (("", "OUT is empty: give the folder to write the records to"),
                             (str(tmp_path / "afile"), f"{tmp_path / 'afile'}: not a folder"),
                             (str(tmp_path / "dangling"), f"{tmp_path / 'dangling'}: not a folder")):
        code, out, err = _cli("records", "write", str(src), out_arg)
        assert (code, out, err) == (2, "", f"dlbooster records write: {message}\n"), out_arg

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(R, "write_records", interrupted)
    code, out, err = _cli("records", "write", str(src), str(tmp_path / "out"))
    assert (code, out, err) == (130, "", "dlbooster records write: interrupted\n")
    assert R.record_paths(tmp_path / "out") == []


def test_a_train_folder_alone_is_written_with_its_own_classes(tmp_path):
    """`records write` took a source with train/ and no val/ as one class named "train"
    (every label 0), where `train` reads the classes inside train/."""
    from dlbooster.train.trainer import split_folder, record_sets

    src = tmp_path / "data"
    _folder(src / "train")
    code, out, err = _cli("records", "write", str(src), str(tmp_path / "out"))
    assert code == 0 and out.startswith(f"{tmp_path / 'out' / 'train'}: {len(VARIANTS)} images"), (out, err)
    train_set, val_set = record_sets(tmp_path / "out")
    assert val_set is None and train_set.classes == ["class0", "class1"] == split_folder(src)[2]
    assert train_set.labels() == [s.label for s in R.source_classes(src / "train")[0]]


def test_record_files_are_read_in_numeric_order(tmp_path):
    """A writer of more than 100,000 record files names the next ``records-100000``,
    which plain name order puts before ``records-10001``."""
    for n in (100000, 99999, 10001, 2, 10):
        (tmp_path / f"records-{n:05d}.pcr").touch()
    (tmp_path / "._records-00002.pcr").touch()             # AppleDouble: no record
    assert [p.name for p in R.record_paths(tmp_path)] == [
        "records-00002.pcr", "records-00010.pcr", "records-10001.pcr", "records-99999.pcr", "records-100000.pcr"]
    for name in ("x1\u00b22.pcr", "x\u0663.pcr", "1.pcr", "x.pcr"):   # ² and Arabic-Indic 3 are no number
        (tmp_path / name).touch()
    assert [p.name for p in R.record_paths(tmp_path)][:2] == ["1.pcr", "records-00002.pcr"]
    assert [p.name for p in R.record_paths(tmp_path)][-3:] == ["x1\u00b22.pcr", "x.pcr", "x\u0663.pcr"]


def test_a_second_writer_to_the_same_folder_is_refused(tmp_path):
    """Two writes into one OUT mixed their record files and shared temporary names; the
    first now holds the folder until its set is in place, and the second is refused at
    once. Meanwhile OUT shows no record file (the set appears whole)."""
    import threading

    src = _folder(tmp_path / "src")
    out = tmp_path / "out"
    started, go = threading.Event(), threading.Event()
    result = {}

    def progress(done, total):
        started.set()
        go.wait(60)

    def first():
        result["report"] = R.write_records(src, out, images_per_record=2, workers=1, progress=progress)
    t = threading.Thread(target=first)
    t.start()
    try:
        assert started.wait(60)
        with pytest.raises(FileExistsError, match=f"{out}: another records write is filling it"):
            R.write_records(src, out, images_per_record=2)
        assert R.record_paths(out) == []
    finally:
        go.set()
        t.join(60)
    report = result["report"]
    assert report.images == len(VARIANTS) and [Path(p) for p in report.records] == R.record_paths(out)
    assert sorted(p.name for p in out.iterdir()) == [Path(p).name for p in report.records]   # nothing hidden left
    assert len(R.RecordSet(out)) == len(VARIANTS)


def test_a_folder_that_cannot_be_locked_is_written_with_a_warning(tmp_path, monkeypatch, caplog):
    """On a file system without locks (``flock`` fails with ENOLCK) the write goes on,
    warning that a second writer would not be refused. ``flock`` is made to fail as
    such a mount fails it; nothing else is stood in for."""
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
    monkeypatch.setattr(fcntl, "flock", no_locks)
    src, out = _folder(tmp_path / "src"), tmp_path / "out"
    with caplog.at_level("WARNING", logger="dlbooster.records.pcr"):
        report = R.write_records(src, out, images_per_record=4)
    assert report.images == len(VARIANTS)
    assert [r.getMessage() for r in caplog.records] == [
        f"{out}: cannot lock .records-write.lock ([Errno {errno.ENOLCK}] {os.strerror(errno.ENOLCK)}); "
        f"a second writer would not be refused"]
    assert len(R.RecordSet(out)) == len(VARIANTS)
    assert sorted(p.name for p in out.iterdir()) == [Path(p).name for p in report.records]


def test_an_interrupted_or_failed_write_leaves_no_record_file(tmp_path):
    """A write stopped part way (Ctrl-C) or failing on a file (a full disk; here the
    file-size limit) left the files written so far, which looked like a whole set and
    made the rerun refuse; the failure named no file. Now nothing of the set is left
    (in the train/val layout, nor of train/ when val/ fails), the error names the
    record file, and the rerun writes the set."""
    import subprocess
    import sys

    src = tmp_path / "data"
    _folder(src / "train")
    (src / "val" / "class0").mkdir(parents=True)
    (src / "val" / "class0" / "big.jpg").write_bytes(make_jpeg(480, 400, quality=95, subsampling=0))
    (src / "val" / "class1").mkdir()                       # val/ has train/'s classes
    (src / "val" / "class1" / "small.jpg").write_bytes(make_jpeg(16, 16))
    out = tmp_path / "out"

    def stop(done, total):
        if done == 5:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        R.write_records(src / "train", out, images_per_record=1, workers=1, progress=stop)
    assert not out.exists()                  # the folder it made is removed too
    out.mkdir()                              # one the user made stays
    with pytest.raises(KeyboardInterrupt):
        R.write_records(src / "train", out, images_per_record=1, workers=1, progress=stop)
    assert list(out.iterdir()) == []
    # A file-size limit between train's largest record and val's: the write of val's
    # record fails (EFBIG, SIGXFSZ ignored) after train's set was written.
    small = max(os.path.getsize(p) for p in R.write_records(src / "train", tmp_path / "p1", images_per_record=1).records)
    big = os.path.getsize(R.write_records(src / "val", tmp_path / "p2", images_per_record=1).records[0])
    assert big > 2 * small
    code = ("import resource, signal, sys\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({(small + big) // 2}, resource.RLIM_INFINITY))\n"
            "from dlbooster.cli import main\n"
            f"sys.exit(main(['records', 'write', {str(src)!r}, {str(tmp_path / 'both')!r}, "
            "'--images-per-record', '1']))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    assert (f"File too large: writing record file: '{tmp_path / 'both' / 'val' / 'records-00000.pcr'}' "
            f"(the record files written to {tmp_path / 'both' / 'train'} are removed)") in run.stderr, run.stderr
    assert run.stdout == ""                  # train's summary is not printed for a removed set
    assert not (tmp_path / "both").exists()  # nor are the folders the command made left
    code, out_text, err = _cli("records", "write", str(src), str(tmp_path / "both"), "--images-per-record", "1")
    assert code == 0, err
    assert [len(R.RecordSet(tmp_path / "both" / s)) for s in ("train", "val")] == [len(VARIANTS), 2]


def test_a_val_folder_without_images_is_named_before_train_is_written(tmp_path):
    """In the train/val layout a val/ whose classes have no image file failed after
    train/'s set was written, with torchvision's message naming neither; it is now
    checked first and named, and nothing is written."""
    src = tmp_path / "data"
    _folder(src / "train")
    (src / "val" / "class0").mkdir(parents=True)
    (src / "val" / "class0" / "notes.txt").write_text("no images")
    code, _, err = _cli("records", "write", str(src), str(tmp_path / "rec"))
    assert code == 2 and f"{src / 'val'}: Found no valid file for the classes class0" in err, err
    assert not (tmp_path / "rec" / "train").exists() or R.record_paths(tmp_path / "rec" / "train") == []
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(str(src / 'val'))}: Found no valid file"):
        R.write_records(src / "val", tmp_path / "v")


def test_bench_records_on_a_flat_folder(tmp_path):
    """`dlbooster bench records` on a folder of photos without class folders (as the
    ImageNet sample): the byte counts it reports are the files' and the records'."""
    from dlbooster.bench.records import bench_records

    flat = tmp_path / "flat"
    flat.mkdir()
    sizes = 0
    for j in range(5):
        data = make_jpeg(40 + 8 * j, 32, subsampling=j % 3, name=("astronaut.png", "coffee.png")[j % 2])
        (flat / f"{j}.JPEG").write_bytes(data)
        sizes += len(data)
    result = bench_records([str(flat)], rounds=1, loader_epochs=1, batch_size=2, images_per_record=2,
                           progress=lambda m: None)
    (d,) = result["datasets"]
    assert d["images"] == 5 and d["skipped"] == [] and d["source_bytes"] == sizes
    assert [r["fidelity"] for r in d["fidelities"]] == list(range(1, 11))
    assert d["fidelities"][-1]["bytes"] == d["record_bytes"]
    assert set(d["read"]) == set(d["loader"]) == {"jpeg files", "records k=1", "records k=2", "records k=5",
                                                  "records k=10"}
    assert d["read"]["jpeg files"]["cold"]["bytes"] == sizes
    by_k = {r["fidelity"]: r["bytes"] for r in d["fidelities"]}
    for k in (1, 2, 5, 10):
        assert d["read"][f"records k={k}"]["warm"]["bytes"] == by_k[k]
        assert d["loader"][f"records k={k}"]["images_per_s"] > 0
    assert result["training"] == []


def test_a_write_that_stores_no_image_fails_and_leaves_no_folder(tmp_path):
    """A source whose every image is skipped made an empty OUT and exited 1 as if some
    images had been skipped; it is now an error that gives the first reason, and the
    folders the write made are removed."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "empty.jpg").write_bytes(b"")
    (src / "a" / "png.jpg").write_bytes(png_bytes(photo_crop(16, 16)))
    out = tmp_path / "deep" / "out"
    with pytest.raises(R.RecordError, match=re.escape(f"{src}: no image could be stored, all 2 were skipped "
                                                      f"(the first: {src / 'a' / 'empty.jpg'}: ")):
        R.write_records(src, out)
    assert not (tmp_path / "deep").exists()
    code, out_text, err = _cli("records", "write", str(src), str(out))
    assert (code, out_text) == (2, "") and err.startswith(f"dlbooster records write: {src}: no image could be "
                                                           f"stored"), err
    assert not (tmp_path / "deep").exists()


def _write_in_child(src: Path, out: Path, patches: str):
    """``dlbooster records write SRC OUT --workers 1`` in a child Python after
    ``patches`` (source text run first; ``records``, ``os``, ``signal`` and the originals
    ``prepare``, ``write_file`` and ``remove`` are in scope) so that it signals itself
    at a chosen point."""
    import subprocess
    import sys

    code = ("import os, signal, sys\n"
            "from dlbooster.records import pcr as records\n"
            "from dlbooster.cli import main\n"
            "prepare, write_file, remove = records._prepare, records._write_file, records.remove_empty_folders\n"
            + patches +
            f"sys.exit(main(['records', 'write', {str(src)!r}, {str(out)!r}, '--workers', '1']))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def _signal_at_image(n: int, name: str) -> str:
    """Patch text: the process sends itself signal ``name`` as image ``n`` is prepared."""
    return ("seen = []\n"
            "def prepare_and_signal(*args):\n"
            "    seen.append(1)\n"
            f"    if len(seen) == {n}:\n"
            f"        os.kill(os.getpid(), signal.{name})\n"
            "    return prepare(*args)\n"
            "records._prepare = prepare_and_signal\n")


#: Patch text: SIGTERM as the command starts removing the folders it made.
_SIGTERM_AT_CLEANUP = ("def kill_then_remove(folders):\n"
                       "    os.kill(os.getpid(), signal.SIGTERM)\n"
                       "    return remove(folders)\n"
                       "records.remove_empty_folders = kill_then_remove\n")


def test_sigterm_during_a_write_is_handled_as_ctrl_c(tmp_path):
    """``kill`` (SIGTERM) during ``records write`` ended the process at once and left its
    staging folder and lock; it now unwinds as Ctrl-C does: one line, exit 143, no
    record file and no folder the command made. The signal is real, sent by the
    process to itself part way through the images."""
    src = _folder(tmp_path / "src")
    out = tmp_path / "out"
    run = _write_in_child(src, out, _signal_at_image(3, "SIGTERM"))
    assert (run.returncode, run.stdout, run.stderr) == (143, "", "dlbooster records write: terminated\n")
    assert not out.exists()
    # In process, the CLI puts back the SIGTERM handler it found.
    import signal
    before = signal.getsignal(signal.SIGTERM)
    code, _, err = _cli("records", "write", str(src), str(out))
    assert code == 0 and signal.getsignal(signal.SIGTERM) is before, err


def test_records_info_names_every_damaged_file(tmp_path):
    """A set with two damaged files named only the first; each is named now."""
    src = _folder(tmp_path / "src")
    rec = tmp_path / "rec"
    R.write_records(src, rec, images_per_record=2)
    files = R.record_paths(rec)
    assert len(files) >= 3
    for path in (files[0], files[2]):
        data = bytearray(path.read_bytes())
        data[0] ^= 0xFF                            # the magic
        path.write_bytes(bytes(data))
    code, out, err = _cli("records", "info", str(rec))
    assert (code, out) == (2, "")
    assert err == (f"dlbooster records info: {rec}: 2 of {len(files)} record files are damaged or unreadable:\n"
                   f"  {files[0]}: not a dlbooster record (bad magic)\n"
                   f"  {files[2]}: not a dlbooster record (bad magic)\n")


def test_make_folders_records_only_what_it_made(tmp_path, monkeypatch):
    """``OUT = new/../userdir`` with ``userdir`` already there: the failed write took
    ``userdir`` for a folder it had made and removed it (and left ``new``). Only what
    this write's own ``mkdir`` calls made is removed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "userdir").mkdir()
    src = tmp_path / "bad" / "c"
    src.mkdir(parents=True)
    (src / "0.jpg").write_bytes(b"\xff\xd8 not a JPEG")
    with pytest.raises(R.RecordError, match="no image could be stored"):
        R.write_records(tmp_path / "bad", Path("new/../userdir"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "userdir"]
    assert R.make_folders(Path("a/b/../c")) == [Path("a/b/../c"), Path("a/b"), Path("a")]
    assert R.make_folders(Path("a/b/../c")) == []
    (tmp_path / "afile").write_text("")
    with pytest.raises(NotADirectoryError):
        R.make_folders(Path("x/y/../../afile/q"))      # makes x and x/y, then meets the file
    assert not (tmp_path / "x").exists()        # what it made before the failure is removed


def test_an_interrupt_as_the_write_releases_its_lock_leaves_no_record_file(tmp_path, monkeypatch):
    """Ctrl-C after the files were renamed into place, while the lock was released, left
    the whole set behind though the write raised (so a train/val caller, which never got
    the report, could not remove it). The interrupt is raised where the lock is released."""
    import contextlib

    real = R.exclusive_lock

    @contextlib.contextmanager
    def interrupted_on_release(out):
        with real(out):
            yield
        raise KeyboardInterrupt
    monkeypatch.setattr(R, "exclusive_lock", interrupted_on_release)
    src = _folder(tmp_path / "src")
    with pytest.raises(KeyboardInterrupt):
        R.write_records(src, tmp_path / "out", images_per_record=2)
    assert not (tmp_path / "out").exists()


def test_an_interrupt_between_the_train_and_val_sets_removes_train(tmp_path, monkeypatch):
    """Ctrl-C after train/'s set was written, while the command recorded it, left
    train/ without val/; the whole pass over the sets is now covered."""
    src = tmp_path / "data"
    _folder(src / "train")
    _folder(src / "val")

    def interrupted(self):
        raise KeyboardInterrupt
    monkeypatch.setattr(R.WriteReport, "to_json", interrupted)
    code, out, err = _cli("records", "write", str(src), str(tmp_path / "rec"))
    assert (code, out, err) == (130, "", "dlbooster records write: interrupted\n")
    assert not (tmp_path / "rec").exists()


def test_a_second_sigterm_does_not_cut_the_cleanup_short(tmp_path):
    """Batch systems and impatient users send SIGTERM again; the second one, arriving
    while the first unwinds, ended the cleanup half way and left train/'s records. Both
    signals are real, sent by the process to itself: the first part way through val/,
    the second as the command starts removing what it made."""
    src = tmp_path / "data"
    _folder(src / "train")
    _folder(src / "val")
    out = tmp_path / "rec"
    run = _write_in_child(src, out, _signal_at_image(len(VARIANTS) + 2, "SIGTERM") + _SIGTERM_AT_CLEANUP)
    assert (run.returncode, run.stdout, run.stderr) == (143, "", "dlbooster records write: terminated\n")
    assert not out.exists()


@pytest.mark.parametrize("first", ["SIGINT", "ENOSPC"])
def test_a_sigterm_during_the_cleanup_of_another_stop_is_held(tmp_path, first):
    """A SIGTERM arriving while the command cleaned up after Ctrl-C, or after an error,
    stopped the cleanup and left train/'s records. Signals are held off the cleanup
    and raised once it is done: exit 143, nothing left. The signals are real, sent by
    the process to itself; the full disk is an ``OSError`` raised where val/'s record
    file is written."""
    src = tmp_path / "data"
    _folder(src / "train")
    _folder(src / "val")
    out = tmp_path / "rec"
    stop = (_signal_at_image(len(VARIANTS) + 2, "SIGINT") if first == "SIGINT" else
            "def full_disk(path, final, *args):\n"
            "    if final.parent.name == 'val':\n"
            "        raise OSError(28, 'No space left on device', str(final))\n"
            "    return write_file(path, final, *args)\n"
            "records._write_file = full_disk\n")
    run = _write_in_child(src, out, stop + _SIGTERM_AT_CLEANUP)
    assert (run.returncode, run.stdout, run.stderr) == (143, "", "dlbooster records write: terminated\n")
    assert not out.exists()
