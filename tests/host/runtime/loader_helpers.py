"""Helpers shared by the ``dlbooster.Loader`` tests (tests/host/runtime/test_loader_*.py).

Pillow is the oracle throughout: ``pillow_file`` gives
``np.asarray(Image.open(path).convert("RGB"))`` (uint8, (h, w, 3)) or the exception
Pillow raised, and ``check_batches`` asserts every delivered image equal to it. The
inputs are written by ``bad_inputs`` (named bad and good files) and ``tiny_files``
(``N_SHARD`` small JPEGs); each test module makes its own module-scoped fixtures of them.
"""

from __future__ import annotations

import struct
import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from dlbooster import jpeg
from dlbooster.runtime.loader import Loader

from jpegtools import gen, gif_bytes, make_jpeg, photo_crop, png_bytes

WIDTH = 256          # the sim build of tests/sim/test_device_sim.py: lanes 1 and 4, 256-pixel lines
N_SHARD = 11         # how many files tiny_files writes


def pillow_file(path) -> tuple[np.ndarray | None, BaseException | None]:
    """``np.asarray(Image.open(path).convert("RGB"))``, or the exception Pillow raised."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(path) as im:
                return np.asarray(im.convert("RGB")), None
    except Exception as exc:  # Pillow raises many types
        return None, exc


def make_loader(source, batch_size: int = 4, **kw) -> Loader:
    """A ``Loader`` over ``source``; unless ``kw`` says otherwise unshuffled, rank 0 of 1, two CPU workers."""
    kw.setdefault("shuffle", False)
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    kw.setdefault("cpu_workers", 2)
    return Loader(source, batch_size, **kw)


def check_batches(loader: Loader, batches, refs: dict | None = None) -> list[int]:
    """Assert every batch's images, sizes, padding and labels against Pillow; return the
    dataset indices delivered, in order."""
    refs = {} if refs is None else refs
    order: list[int] = []
    for batch in batches:
        n = len(batch.indices)
        images, labels = batch
        assert images is batch.images and labels is batch.labels
        assert batch.indices.dtype == torch.int64 and batch.sizes.dtype == torch.int64
        assert images.dtype == torch.uint8 and tuple(images.shape[:2]) == (n, 3)
        assert labels.dtype == torch.int64 and tuple(labels.shape) == (n,)
        assert tuple(batch.sizes.shape) == (n, 2)
        if n:
            assert tuple(images.shape[2:]) == tuple(batch.sizes.max(dim=0).values.tolist())
        for i in range(n):
            index = int(batch.indices[i])
            sample = loader.samples[index]
            if sample.path not in refs:
                refs[sample.path] = pillow_file(sample.path)
            ref, exc = refs[sample.path]
            assert exc is None, f"{sample.path} delivered, but Pillow raises {exc!r}"
            h, w = batch.sizes[i].tolist()
            assert (h, w) == ref.shape[:2], sample.path
            got = images[i][:, :h, :w].permute(1, 2, 0).numpy()
            assert np.array_equal(got, ref), f"{sample.path}: pixels differ from Pillow's"
            assert not images[i][:, h:, :].any() and not images[i][:, :, w:].any(), f"{sample.path}: padding"
            assert int(labels[i]) == sample.label
            order.append(index)
    return order


def write(path, data: bytes):
    """``data`` written to ``path`` (its folders made); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def patch_sof(data: bytes, *, width: int | None = None, height: int | None = None,
              marker: int | None = None, precision: int | None = None) -> bytes:
    """``data`` with its SOF0 header changed."""
    out = bytearray(data)
    i = data.index(b"\xff\xc0")
    if marker is not None:
        out[i + 1] = marker
    if precision is not None:
        out[i + 4] = precision
    if height is not None:
        out[i + 5:i + 7] = struct.pack(">H", height)
    if width is not None:
        out[i + 7:i + 9] = struct.pack(">H", width)
    return bytes(out)


def bad_inputs(root) -> dict[str, object]:
    """Named test inputs, written under ``root`` (``missing`` is not written)."""
    base = gen(40, 24, subsampling=2, quality=85)
    scan = jpeg.parse(base).scans[0]
    middle = (scan.data_start + scan.data_end) // 2
    corrupt = bytearray(base)
    for k in range(middle, middle + 8):
        corrupt[k] ^= 0x5A
    files = {
        "good": base,
        "empty": b"",
        "png": png_bytes(photo_crop(20, 12)),
        "gif": gif_bytes(photo_crop(18, 10)),
        "truncated": base[:middle],                                  # cut in the entropy data, no EOI
        "truncated_entropy_eoi": base[:middle] + base[scan.data_end:],   # libjpeg warns, decodes
        "corrupt_entropy": bytes(corrupt),
        "cmyk": make_jpeg(20, 12, mode="CMYK"),
        "progressive": gen(24, 16, subsampling=2, progressive=True),
        # A 12-bit SOF1 header on 8-bit data: Pillow (8-bit libjpeg) refuses the header.
        "precision12": patch_sof(base, marker=0xC1, precision=12),
        "huge": patch_sof(base, width=65535, height=65535),
        "good_odd": gen(37, 29, subsampling=1, quality=60),
    }
    paths = {}
    for name, data in files.items():
        paths[name] = write(root / f"{name}.jpg", data)
    paths["missing"] = root / "missing.jpg"
    return paths


def drain(loader: Loader) -> list:
    """The batches of one epoch of ``loader``."""
    return list(loader)


def tiny_files(root: Path) -> list[tuple[str, int]]:
    """``N_SHARD`` JPEGs under ``root``, the i-th (8 + i) x 8 pixels, labelled 100 + i."""
    return [(str(write(root / f"{i:02d}.jpg", gen(8 + i, 8, subsampling=i % 3, quality=50 + i))), 100 + i)
            for i in range(N_SHARD)]
