"""``dlbooster.Loader`` end to end: pixels, labels, accounting, sharding, transforms.

Pillow is the oracle throughout: every delivered image must equal
``np.asarray(Image.open(path).convert("RGB"))``, and an input is an error exactly where
Pillow raises on it. Sharding is checked against ``DistributedSampler`` + ``DataLoader``.
The ``sim`` tests drive the 4-lane, 256-pixel build that tests/sim/test_device_sim.py uses
(one instance shared by the module, reset before each test).
"""

from __future__ import annotations

import io
import logging
import math
import os
import pickle
import re
import resource
import shutil
import struct
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dlbooster import jpeg
from dlbooster.errors import DecodeError
from dlbooster.runtime.loader import Loader
from dlbooster.sim.flow import simulator_available
from dlbooster.runtime.transforms import eval_transform, train_transform

from jpegtools import (corpus_paths, drop_huffman, feature_files, gen, gif_bytes, make_jpeg, photo, photo_crop,
                       png_bytes, require_corpus, skimage_data_dir)

WIDTH = 256          # the sim build of tests/sim/test_device_sim.py: lanes 1 and 4, 256-pixel lines
LANES = 4

needs_verilator = pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")


# ---------------------------------------------------------------------------------
# Helpers


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
    return list(loader)


# ---------------------------------------------------------------------------------
# 1. cpu backend: Pillow's pixels, ImageFolder's labels


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    """An ImageFolder of three classes: generated JPEGs of every feature, real photos
    (as shipped and re-encoded), and odd sizes in a nested folder plus a PNG."""
    root = tmp_path_factory.mktemp("folder")
    for name, data in feature_files(WIDTH).items():
        if name != "no_eoi":                       # Pillow raises on it: see the accounting tests
            write(root / "a_generated" / f"{name}.jpg", data)
    photos = root / "b_photos"
    photos.mkdir()
    for name in ("rocket.jpg", "hubble_deep_field.jpg"):
        (photos / name).write_bytes((skimage_data_dir() / name).read_bytes())
    write(photos / "chelsea_420.jpg", make_jpeg(0, 0, image=photo("chelsea.png"), subsampling=2, quality=90))
    write(photos / "coffee_444_optimised.jpg",
          make_jpeg(0, 0, image=photo("coffee.png"), subsampling=0, quality=80, optimize=True))
    write(photos / "camera_gray_restart.jpg",
          make_jpeg(0, 0, image=photo("camera.png"), subsampling="gray", quality=75, restart_rows=2))
    nested = root / "c_mixed" / "deeper"
    write(nested / "odd_420_restart.jpg", gen(61, 47, subsampling=2, quality=50, restart_blocks=3))
    write(nested / "odd_422_optimised.jpg", gen(45, 31, subsampling=1, quality=90, optimize=True))
    write(root / "c_mixed" / "odd_444.jpg", gen(7, 5, subsampling=0, quality=95))
    write(root / "c_mixed" / "gray_odd.jpg", gen(13, 11, subsampling="gray", quality=40))
    write(root / "c_mixed" / "photo.png", png_bytes(photo_crop(33, 21, "chelsea.png")))
    return root


def test_a_batch_size_beyond_the_shard_reserves_only_the_shards_slots(image_folder):
    """As DataLoader, a batch size larger than a rank's share of the epoch gives one batch
    of that share; the batch pool holds that many slots, not batch_size (10**6 slots of
    1 megapixel would be 3 TB)."""
    from torchvision.datasets import ImageFolder

    n = len(ImageFolder(str(image_folder)))
    with make_loader(image_folder, 10**6, backend="cpu", rank=1, world_size=2) as loader:
        share = len(loader.sampler)
        assert share == (n + 1) // 2 and len(loader) == 1
        assert {len(b.data) for b in loader.pool.buffers} == {share}
        (batch,) = drain(loader)
        assert sorted(batch.indices.tolist()) == sorted(loader.sampler.indices())


def test_cpu_epochs_equal_pillow_and_imagefolder(image_folder):
    from torchvision.datasets import ImageFolder

    reference = ImageFolder(str(image_folder))
    # rocket (640x427) fits a 300k-pixel slot, hubble_deep_field (1000x872) does not.
    with make_loader(image_folder, 4, backend="cpu", shuffle=True, seed=3, slot_pixels=300_000) as loader:
        assert loader.backend_name == "cpu"
        assert [(s.path, s.label) for s in loader.samples] == [(p, t) for p, t in reference.samples]
        assert len(loader) == math.ceil(len(reference) / 4)
        refs: dict = {}
        orders = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            batches = drain(loader)
            assert len(batches) == len(loader)
            order = check_batches(loader, batches, refs)
            assert sorted(order) == list(range(len(reference))), "each sample exactly once per epoch"
            assert all(b.outcomes == [] for b in batches)
            for batch in batches:
                assert batch.labels.tolist() == [reference.targets[i] for i in batch.indices.tolist()]
            report = loader.report
            assert (report.epoch, report.positions, report.delivered, report.replaced) == \
                (epoch, len(reference), len(reference), 0)
            assert report.skipped == [] and report.fallbacks == [] and report.accounted == report.positions
            stats = loader.stats()
            assert stats.images == len(reference)
            assert stats.outcomes == {"ok": len(reference)}      # this epoch's
            if epoch == 0:
                assert stats.oversize == 1
            orders.append(order)
        assert orders[0] != orders[1], "set_epoch changes the shuffle"
    assert len(set(reference.targets)) == 3


# ---------------------------------------------------------------------------------
# 2. Accounting of bad inputs, policies


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory):
    return bad_inputs(tmp_path_factory.mktemp("bad"))


@pytest.fixture(scope="module")
def sim_backend():
    from dlbooster.backends import SimBackend

    backend = SimBackend(lanes=LANES, max_width=WIDTH)
    yield backend
    backend.device.transport.close()


@pytest.fixture
def sim(sim_backend):
    """The shared 4-lane sim backend, its memory port well-behaved and the device reset."""
    from dlbooster.sim.device import PortBehaviour

    sim_backend.device.transport.set_port(PortBehaviour())
    sim_backend.device.watchdog = 1 << 24     # the build's; a test's own survives resets
    sim_backend.device.reset()
    return sim_backend


def _backend(request, name):
    return request.getfixturevalue("sim") if name == "sim" else name


@pytest.mark.parametrize("backend", ["cpu", pytest.param("sim", marks=needs_verilator)])
def test_bad_inputs_outcomes_and_accounting(bad_dir, backend, request):
    source = [(str(path), n) for n, path in enumerate(bad_dir.values())]
    names = list(bad_dir)
    refs = {path: pillow_file(path) for path, _ in source}
    failing = {path for path, (_, exc) in refs.items() if exc is not None}
    # What Pillow does with each input (the oracle; checked here so a Pillow change shows).
    assert {names[label] for path, label in source if path in failing} == \
        {"missing", "empty", "truncated", "precision12", "huge"}
    with make_loader(source, 3, backend=_backend(request, backend), slot_pixels=64 * 64,
                     on_error="skip") as loader:
        batches = drain(loader)
        delivered = check_batches(loader, batches, refs)
        assert sorted(delivered) == sorted(label for path, label in source if path not in failing)
        outcomes = {o.path: o for b in batches for o in b.outcomes}
        for path, label in source:
            name = names[label]
            if path in failing:
                outcome = outcomes[path]
                assert (outcome.status, outcome.index, outcome.backend) == ("error", label, None), name
                if name == "missing":
                    assert outcome.reason == "unreadable" and "FileNotFoundError" in outcome.detail
                else:
                    assert outcome.reason == "undecodable", name
                if name not in ("missing", "empty"):
                    assert type(refs[path][1]).__name__ in outcome.detail, (name, outcome.detail)
                assert path in str(outcome)
            elif backend == "cpu":
                assert path not in outcomes, f"{name}: the cpu backend decodes it itself"
            elif path in outcomes:
                outcome = outcomes[path]
                assert (outcome.status, outcome.backend) == ("fallback", "cpu"), name
                assert outcome.reason, name
        if backend == "sim":
            # Outside the device's profile: decoded by the CPU path. The headers' faults are
            # the pre-screen's, before any device time; the entropy-coded data's the device's.
            expect = {"png": ("not-jpeg", "host pre-screen"), "gif": ("not-jpeg", "host pre-screen"),
                      "cmyk": ("components", "host pre-screen"), "progressive": ("progressive", "host pre-screen")}
            for name, (reason, detail) in expect.items():
                outcome = outcomes[str(bad_dir[name])]
                assert (outcome.status, outcome.reason, outcome.detail, outcome.extra) == \
                    ("fallback", reason, detail, {}), name
            outcome = outcomes[str(bad_dir["truncated_entropy_eoi"])]
            assert (outcome.status, outcome.reason) == ("fallback", "truncated") and outcome.extra["cycles"] > 0
            for name in ("good", "good_odd"):
                assert str(bad_dir[name]) not in outcomes, name
            # Only the inputs whose headers are in the profile cost device jobs.
            assert loader.service.stats.jobs == len(
                {"good", "good_odd", "truncated", "truncated_entropy_eoi", "corrupt_entropy"})
        report = loader.report
        assert report.positions == len(source) and report.accounted == report.positions
        assert report.delivered == len(source) - len(failing) and report.replaced == 0
        assert sorted(o.path for o in report.skipped) == sorted(failing)
        assert report.fallbacks == [o for b in batches for o in b.outcomes if o.status == "fallback"]
        stats = loader.stats()
        assert sum(stats.outcomes.values()) == len(source)
        assert stats.outcomes["error:unreadable"] == 1
        assert stats.outcomes["error:undecodable"] == len(failing) - 1
        assert stats.outcomes.get("ok", 0) + len(report.fallbacks) == report.delivered
        assert loader.pool.free == loader.pool.depth


def test_the_pre_screen_keeps_inputs_outside_the_profile_off_the_device(bad_dir, tmp_path):
    """Inputs whose headers put them outside the hardware profile (not a JPEG, CMYK,
    progressive, 12-bit, wider than the device) cost no device job: they go to the CPU
    path with the header classification's reason, and only inputs whose headers are in
    the profile become jobs."""
    from dlbooster.device.instant import InstantBackend, InstantTransport

    wide = write(tmp_path / "wide.jpg", gen(72, 8, subsampling=0))
    paths = {**bad_dir, "wide": wide}
    transport = InstantTransport(lanes=2, job_depth=4, max_width=64)
    for name in ("good", "good_odd"):
        transport.learn(paths[name].read_bytes(), pillow_file(str(paths[name]))[0])
    source = [(str(path), n) for n, path in enumerate(paths.values())]
    with make_loader(source, 3, backend=InstantBackend(transport), slot_pixels=80 * 64, on_error="skip") as loader:
        batches = drain(loader)
        outcomes = {o.path: o for b in batches for o in b.outcomes}
        assert loader.report.accounted == len(source)
        for name, reason in {"png": "not-jpeg", "gif": "not-jpeg", "cmyk": "components",
                             "progressive": "progressive", "wide": "width"}.items():
            outcome = outcomes[str(paths[name])]
            assert (outcome.status, outcome.reason, outcome.detail) == ("fallback", reason, "host pre-screen"), name
        # 12-bit and 65535 x 65535: kept off the device too; Pillow fails on both, so the
        # outcome is Pillow's error.
        for name in ("precision12", "huge"):
            assert outcomes[str(paths[name])].status == "error", name
        for name in ("good", "good_odd"):
            assert str(paths[name]) not in outcomes, name
        assert loader.service.stats.jobs == len(
            {"good", "good_odd", "truncated", "truncated_entropy_eoi", "corrupt_entropy"})


@pytest.mark.corpus
@needs_verilator
def test_sim_loader_over_the_whole_corpus(sim):
    """Every corpus file through the Loader on the simulated 4-lane device (one image per
    batch: no padding to the corpus's largest frames): each delivered image is Pillow's,
    each skipped one is a file Pillow fails on, every index is accounted for, and the
    pre-screen's fallbacks are the ones whose headers are outside the profile, so every
    device job is a file whose headers the full classification would pass."""
    root = require_corpus()
    paths = [str(root / rel) for rel in corpus_paths()]
    with make_loader([(p, i) for i, p in enumerate(paths)], 1, backend=sim, on_error="skip") as loader:
        for batch in loader:
            for k, index in enumerate(batch.indices.tolist()):
                h, w = batch.sizes[k].tolist()
                want, exc = pillow_file(paths[index])
                assert exc is None and np.array_equal(batch.images[k, :, :h, :w].permute(1, 2, 0).numpy(),
                                                      want), paths[index]
        report = loader.report
        assert report.accounted == report.positions == len(paths)
        for outcome in report.skipped:
            assert pillow_file(outcome.path)[1] is not None, outcome
        # The headers' verdict of each file, as the pre-screen judges it (None: the device's).
        verdicts = {}
        for path in paths:
            with open(path, "rb") as f:
                data = f.read()
            if not data:                      # never parsed: an error before the pre-screen
                continue
            tables = jpeg.standard_huffman_segment(jpeg.parse(data, headers_only=True))
            if tables is not None:            # a Motion-JPEG frame is judged with the tables it gets
                data = jpeg.with_standard_huffman(data, tables)
            verdicts[path] = jpeg.classify(jpeg.parse(data, headers_only=True), max_width=WIDTH)
        for outcome in report.fallbacks:
            if outcome.detail == "host pre-screen":
                assert verdicts[outcome.path] == outcome.reason, outcome
        # Exactly the files whose headers are in the profile cost a device job.
        assert loader.service.stats.jobs == sum(verdict is None for verdict in verdicts.values())


def test_a_kept_verdict_follows_pillows_pixel_limit(tmp_path, monkeypatch):
    """The pre-screen's verdict is kept per file across epochs, but a file Pillow's pixel
    limit refuses (``too-large``) must fail where Pillow fails: lowering
    ``Image.MAX_IMAGE_PIXELS`` between epochs sends it to the CPU path, which raises
    Pillow's error, instead of the device decoding it by the verdict of the old limit."""
    from dlbooster.device.instant import InstantBackend, InstantTransport

    path = write(tmp_path / "a.jpg", gen(64, 64, subsampling=2))
    transport = InstantTransport(lanes=1, job_depth=2)
    transport.learn(path.read_bytes(), pillow_file(str(path))[0])
    with make_loader([(str(path), 0)], 1, backend=InstantBackend(transport), slot_pixels=64 * 64,
                     on_error="skip") as loader:
        assert [b.indices.tolist() for b in loader] == [[0]] and loader.stats().outcomes == {"ok": 1}
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)        # errors above 2,000 pixels
        assert [b.indices.tolist() for b in loader] == [[]]
        [skipped] = loader.report.skipped
        assert (skipped.status, skipped.reason) == ("error", "undecodable")
        assert "DecompressionBombError" in skipped.detail
        assert loader.service.stats.jobs == 1
        monkeypatch.undo()
        assert [b.indices.tolist() for b in loader] == [[0]] and loader.stats().outcomes == {"ok": 1}


@pytest.mark.parametrize("backend", ["cpu", "model"])
def test_files_of_4_gib_or_more_are_decoded_from_the_file(backend, tmp_path):
    """Sparse files of LARGE_FILE bytes (a 60 GB one was read whole, and failed with a
    MemoryError): never read into memory; Pillow decodes them from the file, so a JPEG
    followed by zeros is Pillow's image and zeros alone are Pillow's error."""
    from dlbooster.backends import LARGE_FILE

    head = gen(40, 24, subsampling=2, quality=80)
    big, zeros = write(tmp_path / "big.jpg", head), write(tmp_path / "zeros.jpg", b"")
    os.truncate(big, LARGE_FILE + 5)
    os.truncate(zeros, LARGE_FILE)
    good = write(tmp_path / "good.jpg", gen(16, 16, subsampling=0))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss        # KiB on Linux
    with make_loader([(str(big), 0), (str(zeros), 1), (str(good), 2)], 3, backend=backend,
                     on_error="skip") as loader:
        (batch,) = drain(loader)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 256 * 1024
    assert batch.indices.tolist() == [0, 2] and batch.labels.tolist() == [0, 2]
    assert tuple(batch.sizes[0].tolist()) == (24, 40)
    assert np.array_equal(batch.images[0, :, :24, :40].permute(1, 2, 0).numpy(), pillow_file(big)[0])
    (skipped,) = loader.report.skipped
    assert (skipped.index, skipped.status, skipped.reason) == (1, "error", "undecodable")
    assert "cannot identify image file" in skipped.detail
    unusual = [(o.index, o.status, o.reason, o.backend) for o in batch.outcomes]
    assert unusual == ([] if backend == "cpu" else [(0, "fallback", "input-size", "cpu")]) + [
        (1, "error", "undecodable", None)]


@pytest.mark.timeout(120)       # a hang guard: three headers are rejected at once
def test_huge_declared_frame_is_an_error_without_a_huge_buffer(tmp_path):
    data = patch_sof(gen(16, 16, subsampling=0, quality=80), width=65535, height=65535)
    path = write(tmp_path / "huge.jpg", data)
    _, pillow_exc = pillow_file(path)
    assert type(pillow_exc).__name__ == "DecompressionBombError"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss        # KiB on Linux
    with make_loader([(str(path), 0)] * 3, 2, backend="cpu", slot_pixels=64 * 64) as loader:
        batches = drain(loader)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
    assert grown < 256 * 1024, f"peak RSS grew by {grown} KiB"
    assert [len(b.indices) for b in batches] == [0, 0]
    assert tuple(batches[0].images.shape) == (0, 3, 0, 0)
    outcomes = [o for b in batches for o in b.outcomes]
    assert [(o.status, o.reason) for o in outcomes] == [("error", "undecodable")] * 3
    assert all("DecompressionBombError" in o.detail and o.path == str(path) for o in outcomes)
    assert loader.report.accounted == loader.report.positions == 3


def test_an_empty_batch_has_the_transforms_shape_and_goes_through_a_model(tmp_path):
    """Every sample skipped: with a DeviceTransform the batch is (0, 3, size, size) in its
    dtype and memory format, which a model's forward takes (a data-parallel rank must
    still run it: DDP's first evaluation forward broadcasts buffers)."""
    import torchvision

    from dlbooster.runtime.transforms import eval_transform

    path = write(tmp_path / "bad.jpg", b"\xff\xd8 not a jpeg")
    with make_loader([(str(path), 0)] * 2, 2, backend="cpu", transform=eval_transform(32, resize=36)) as loader:
        (batch,) = drain(loader)
    assert tuple(batch.images.shape) == (0, 3, 32, 32) and batch.images.dtype == torch.float32
    assert batch.images.is_contiguous(memory_format=torch.channels_last)
    assert len(batch.labels) == 0
    net = torchvision.models.resnet18(num_classes=2).eval()
    with torch.no_grad():
        assert tuple(net(batch.images).shape) == (0, 2)


def test_padding_beyond_the_memory_available_raises_naming_the_inputs(tmp_path, monkeypatch):
    """Two valid, small JPEGs, 20000x1 and 1x20000, pad to a 2.2 GiB batch without a
    transform: the iteration raises MemoryError naming both, before allocating (the
    available memory is replaced by 64 MiB). One image per batch, the same files load."""
    import dlbooster.runtime.transforms as transforms

    wide = write(tmp_path / "a" / "wide.jpg", make_jpeg(20000, 1))
    tall = write(tmp_path / "a" / "tall.jpg", make_jpeg(1, 20000))
    monkeypatch.setattr(transforms, "_available_memory", lambda: 64 << 20)
    with make_loader([(str(wide), 0), (str(tall), 1)], 2, backend="cpu") as loader:
        with pytest.raises(MemoryError, match=r"batch 0: padding 2 images to 20000x20000 needs 2\.2 GiB.*"
                                              f"the tallest image is {re.escape(str(tall))}, "
                                              f"the widest {re.escape(str(wide))}"):
            drain(loader)
    monkeypatch.undo()
    with make_loader([(str(wide), 0), (str(tall), 1)], 1, backend="cpu") as single:
        assert [tuple(b.images.shape) for b in drain(single)] == [(1, 3, 1, 20000), (1, 3, 20000, 1)]


def test_policy_raise_names_the_path(bad_dir):
    source = [(str(bad_dir[name]), i) for i, name in enumerate(("good", "png", "empty", "good_odd", "huge"))]
    with make_loader(source, 2, backend="cpu", on_error="raise") as loader:
        it = iter(loader)
        first = next(it)
        assert first.indices.tolist() == [0, 1] and first.outcomes == []
        with pytest.raises(DecodeError) as err:
            next(it)
        assert str(bad_dir["empty"]) in str(err.value)
        assert err.value.source == str(bad_dir["empty"]) and err.value.reason == "undecodable"
        assert err.value.index == 2 and str(err.value).startswith(f"sample 2: {bad_dir['empty']}: undecodable")
        copy = pickle.loads(pickle.dumps(err.value))
        assert (copy.index, copy.source, copy.reason, str(copy)) == (2, err.value.source, "undecodable",
                                                                     str(err.value))
        # The abandoned epoch gave every buffer back; the next epoch stops at the same input.
        assert loader.pool.free == loader.pool.depth
        with pytest.raises(DecodeError, match="empty"):
            drain(loader)
        assert loader.pool.free == loader.pool.depth


def test_policy_replace(bad_dir):
    names = ("missing", "good", "truncated", "cmyk", "huge")
    source = [(str(bad_dir[name]), 10 + i) for i, name in enumerate(names)]
    calls = []

    def replace(index, outcome):
        calls.append((index, outcome.path, outcome.status))
        return np.full((5, 7, 3), index, np.uint8)

    with make_loader(source, 2, backend="cpu", on_error="replace", replace=replace) as loader:
        batches = drain(loader)
    assert sorted(calls) == [(0, source[0][0], "error"), (2, source[2][0], "error"), (4, source[4][0], "error")]
    assert [b.indices.tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    for batch in batches:
        assert batch.labels.tolist() == [10 + i for i in batch.indices.tolist()]
        for i, index in enumerate(batch.indices.tolist()):
            h, w = batch.sizes[i].tolist()
            got = batch.images[i][:, :h, :w].permute(1, 2, 0).numpy()
            if index in (0, 2, 4):
                assert (h, w) == (5, 7) and (got == index).all()
            else:
                assert np.array_equal(got, pillow_file(source[index][0])[0])
    assert [o.path for b in batches for o in b.outcomes] == [source[0][0], source[2][0], source[4][0]]
    report = loader.report
    assert (report.replaced, report.delivered, report.skipped) == (3, 2, [])
    assert report.accounted == report.positions == 5


def test_bad_policy_arguments():
    with pytest.raises(ValueError):
        make_loader([("x.jpg", 0)], 1, on_error="ignore")
    with pytest.raises(ValueError):
        make_loader([("x.jpg", 0)], 1, on_error="replace")
    with pytest.raises(ValueError):
        make_loader([("x.jpg", 0)], 0)
    for size in (2.5, True, "2", None):
        with pytest.raises(TypeError, match="batch_size must be an integer"):
            make_loader([("x.jpg", 0)], size)
    with pytest.raises(ValueError, match="does not fit in int64"):   # found at once, not mid-epoch
        make_loader([("x.jpg", 2**63)], 1)
    for workers in (0, -1):                     # 0 was read as "every core"
        with pytest.raises(ValueError, match=f"cpu_workers must be at least 1 .*not {workers}"):
            make_loader([("x.jpg", 0)], 1, cpu_workers=workers)
    for workers in (1.5, True):                 # 1.5 ran two threads
        with pytest.raises(TypeError, match=f"cpu_workers must be an integer, not {workers!r}"):
            make_loader([("x.jpg", 0)], 1, cpu_workers=workers)
    from dlbooster.runtime.service import DecodeService

    for depth, error in ((0, ValueError), (-2, ValueError), (2.0, TypeError)):   # 0 or less: no bound
        with pytest.raises(error, match="device_queue must be"):
            DecodeService("cpu", device_queue=depth)


@pytest.mark.parametrize("kw, error, match", [
    (dict(prefetch=-1), ValueError, "prefetch must be at least 0, not -1"),
    (dict(prefetch=1.0), TypeError, "prefetch must be an integer, not 1.0"),
    (dict(slot_pixels=0), ValueError, "slot_pixels must be at least 1, not 0"),
    (dict(slot_pixels=True), TypeError, "slot_pixels must be an integer, not True"),
    (dict(seed=1.5), TypeError, "seed must be an integer, not 1.5"),
    (dict(seed=2**64), ValueError, r"seed must be in \[-2\*\*63, 2\*\*64\) .*not 18446744073709551616"),
    (dict(rank=1.0, world_size=2), TypeError, "rank must be an integer, not 1.0"),
    (dict(rank=True, world_size=2), TypeError, "rank must be an integer, not True"),
    (dict(world_size=2.0), TypeError, "world_size must be an integer, not 2.0"),
    (dict(transform=42), TypeError, "transform must be callable or None, not 42"),
    (dict(on_error="replace", replace="zeros"), TypeError, "replace must be callable or None, not 'zeros'"),
    (dict(on_error="skip", replace=lambda index, outcome: None), ValueError,
     "replace= is used only with on_error='replace', not on_error='skip'"),
])
def test_cheap_argument_errors_name_the_argument_before_the_backend_is_made(monkeypatch, kw, error, match):
    """Each found before the backend is made (a sim build takes minutes), naming the
    argument: ``seed=1.5`` said only "'float' object cannot be interpreted as an
    integer", ``rank=True`` passed as 1, ``transform=42`` failed at the first batch and
    ``replace`` with another policy was ignored."""
    def no_backend(*args, **kwargs):
        raise AssertionError("the backend was made before the arguments were checked")

    monkeypatch.setattr("dlbooster.runtime.service.get_backend", no_backend)
    with pytest.raises(error, match=match):
        make_loader([("x.jpg", 0)], 1, backend="cpu", **kw)


@pytest.mark.parametrize("env, kw, match", [
    ({"WORLD_SIZE": "2"}, dict(rank=3), r"rank must be in \[0, 1\], got 3 \(world_size from environment "
                                        r"variable WORLD_SIZE='2'\)"),
    ({"WORLD_SIZE": "0"}, dict(rank=0), r"world_size must be >= 1, got 0 \(world_size from environment variable "
                                        r"WORLD_SIZE='0'\)"),
    ({"RANK": "4"}, dict(world_size=2), r"rank must be in \[0, 1\], got 4 \(rank from environment variable "
                                        r"RANK='4'\)"),
    ({"RANK": "5", "WORLD_SIZE": "2"}, {}, r"environment variable RANK=5 is outside \[0, WORLD_SIZE=2\)"),
])
def test_a_rank_or_world_size_out_of_range_from_the_environment_names_the_variable(monkeypatch, env, kw, match):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=match):
        make_loader([("x.jpg", 0)], 1, backend="cpu", **{"rank": None, "world_size": None, **kw})


def test_a_constructor_failing_after_the_backend_was_made_closes_the_service(tiny_source, monkeypatch):
    """The service's dispatcher thread (and a simulated device) outlived the failure."""
    import threading

    from dlbooster.device.instant import InstantBackend, InstantTransport

    def no_memory(*args, **kwargs):
        raise MemoryError("no room for the pool")

    monkeypatch.setattr("dlbooster.runtime.loader.BatchPool", no_memory)
    before = set(threading.enumerate())
    with pytest.raises(MemoryError, match="no room for the pool"):
        make_loader(tiny_source, 2, backend=InstantBackend(InstantTransport(lanes=1, job_depth=2)))
    assert [t.name for t in set(threading.enumerate()) - before] == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_cuda_device_without_cuda_is_named_at_construction():
    """Not a RuntimeError from deep inside torch's pinned allocation."""
    with pytest.raises(ValueError, match="sees no CUDA device .*use device='cpu'"):
        make_loader([("x.jpg", 0)], 1, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batches_equal_the_cpu_batches(tiny_source):
    """Pinned buffers, the side copy stream and its events: every batch on the GPU
    equals the CPU loader's, while the consumer's stream is kept busy so that copies
    and the buffers' reuse overlap its work."""
    with make_loader(tiny_source, 2, backend="cpu", prefetch=2) as cpu:
        want = [(b.images.clone(), b.labels.clone(), b.indices.tolist()) for b in cpu]
    with make_loader(tiny_source, 2, backend="cpu", prefetch=2, device="cuda") as gpu:
        assert gpu.pool.pinned
        busy = torch.randn(2048, 2048, device="cuda")
        for _ in range(2):
            got = []
            for batch in gpu:
                for _ in range(4):                            # the consumer's step
                    busy = busy @ busy / busy.norm()
                got.append((batch.images.cpu(), batch.labels.cpu(), batch.indices.tolist()))
            assert len(got) == len(want)
            for (gi, gl, gx), (wi, wl, wx) in zip(got, want):
                assert gx == wx and torch.equal(gl, wl) and torch.equal(gi, wi)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_copies_held_back_still_deliver_the_cpu_batches(tiny_source, monkeypatch):
    """The copy stream is held back (a GPU sleep queued before each batch's copies) and
    the batches stay on the GPU, unsynchronised, until the epoch ends: a buffer refilled
    before its copy ran, or a consumer reading a batch before it arrived, would differ
    from the CPU loader's batches. Slots of 16 x 16 pixels send the larger images through
    the oversize path's pinned copies too; "cuda" is fixed to the current GPU."""
    with make_loader(tiny_source, 2, backend="cpu", prefetch=2, slot_pixels=16 * 16) as cpu:
        want = [(b.images.clone(), b.labels.clone(), b.indices.tolist()) for b in cpu]
    assemble = Loader._assemble

    def held_back(self, pending, report):
        with torch.cuda.stream(self._copy_stream):
            torch.cuda._sleep(20_000_000)
        return assemble(self, pending, report)
    monkeypatch.setattr(Loader, "_assemble", held_back)
    with make_loader(tiny_source, 2, backend="cpu", prefetch=2, slot_pixels=16 * 16, device="cuda") as gpu:
        assert gpu.device == torch.device("cuda", torch.cuda.current_device())
        assert gpu.stats() is None and gpu.pool.pinned
        for _ in range(2):
            got = [(b.images, b.labels, b.indices.tolist()) for b in gpu]
            assert gpu.stats().oversize > 0
            torch.cuda.synchronize()
            assert len(got) == len(want)
            for (gi, gl, gx), (wi, wl, wx) in zip(got, want):
                assert gx == wx and torch.equal(gl.cpu(), wl) and torch.equal(gi.cpu(), wi)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_a_failed_oversize_copy_names_the_image_and_still_guards_the_buffer(tiny_source, monkeypatch):
    """An oversize image whose pinned copy fails (pinned or GPU memory exhausted) is a
    MemoryError naming it, and the batch's copy already queued on the side stream still
    gets the buffer's event, so the buffer's reuse and the pool's close wait for it."""
    assemble, buffers = Loader._assemble, []

    def remember(self, pending, report):
        buffers.append(pending.buffer)
        return assemble(self, pending, report)

    def exhausted(self, *args, **kwargs):
        # What cudaHostAlloc's failure raises (C10_CUDA_CHECK): not an OutOfMemoryError.
        raise torch.AcceleratorError("CUDA error: out of memory (test)")
    monkeypatch.setattr(Loader, "_assemble", remember)
    with make_loader(tiny_source, 2, backend="cpu", prefetch=2, slot_pixels=16 * 16, device="cuda") as gpu:
        monkeypatch.setattr(torch.Tensor, "pin_memory", exhausted)
        with pytest.raises(MemoryError, match=r"copying .*\.jpg to cuda:\d"):
            for _ in gpu:
                pass
        assert buffers and buffers[-1].copied is not None
        buffers[-1].copied.synchronize()
        assert buffers[-1].copied.query()


def test_epoch_figures_progress_bar_and_skip_log(bad_dir, tiny_source, capsys, caplog):
    """The epoch's figures are what they say (images/s is images over the epoch's wall
    seconds, host cores its process CPU time over them); the progress bar shows on rank
    0 only, one step per batch; a skipped sample is logged with its path."""
    source = tiny_source[:5]
    for rank, shows in ((0, True), (1, False)):
        with make_loader(source, 2, backend="cpu", slot_pixels=32 * 32, progress=True, rank=rank,
                         world_size=2) as loader:
            loader.set_epoch(3)
            start_cpu = time.process_time()
            batches = drain(loader)
            cpu = time.process_time() - start_cpu
            stats = loader.stats()
            assert stats.images == sum(len(b.indices) for b in batches) == 3
            assert 0 < stats.seconds and stats.images_per_s == pytest.approx(stats.images / stats.seconds)
            # The epoch's CPU time is part of this test's, which is measured around it.
            assert 0 < stats.host_cores * stats.seconds <= cpu + 1e-3
            assert set(stats.queue_peak) <= set(loader.service.queue_depths())
            assert stats.outcomes == {"ok": 3} and stats.lane_busy == {}
        bar = capsys.readouterr().err
        assert ("epoch 3" in bar and "2/2" in bar) == shows, bar
    with caplog.at_level(logging.WARNING, logger="dlbooster"):
        with make_loader([(str(bad_dir["empty"]), 0)], 1, backend="cpu", on_error="skip") as loader:
            assert [len(b.indices) for b in drain(loader)] == [0]
            [skipped] = loader.report.skipped
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping ")] == [
        f"skipping {skipped}"]
    assert str(skipped).startswith(f"{bad_dir['empty']}: error (undecodable: ")


# ---------------------------------------------------------------------------------
# 3. Sharding: DistributedSampler + DataLoader, index for index


N_SHARD = 11


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return [(str(write(root / f"{i:02d}.jpg", gen(8 + i, 8, subsampling=i % 3, quality=50 + i))), 100 + i)
            for i in range(N_SHARD)]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world_size", [2, 3])
def test_shards_equal_distributed_sampler(tiny_source, world_size, shuffle, drop_last):
    from torch.utils.data import DataLoader, DistributedSampler

    batch_size, seed = 2, 7
    loaders = [make_loader(tiny_source, batch_size, backend="cpu", shuffle=shuffle, seed=seed,
                           drop_last=drop_last, rank=r, world_size=world_size, slot_pixels=32 * 32)
               for r in range(world_size)]
    try:
        for epoch in (0, 1):
            covered = set()
            for rank, loader in enumerate(loaders):
                sampler = DistributedSampler(range(N_SHARD), num_replicas=world_size, rank=rank,
                                             shuffle=shuffle, seed=seed, drop_last=drop_last)
                sampler.set_epoch(epoch)
                reference = DataLoader(range(N_SHARD), batch_size=batch_size, sampler=sampler, drop_last=drop_last)
                expect = list(sampler)
                if drop_last:
                    expect = expect[: len(expect) // batch_size * batch_size]
                loader.set_epoch(epoch)
                assert len(loader) == len(reference)
                batches = drain(loader)
                got = [i for b in batches for i in b.indices.tolist()]
                assert got == expect, (rank, epoch)
                assert [b.indices.tolist() for b in batches] == [b.tolist() for b in reference]
                assert all(b.labels.tolist() == [100 + i for i in b.indices.tolist()] for b in batches)
                assert loader.report.positions == len(expect) == loader.report.accounted
                covered.update(got)
            if not drop_last:
                assert covered == set(range(N_SHARD))
    finally:
        for loader in loaders:
            loader.close()


# ---------------------------------------------------------------------------------
# 4. Transforms


@pytest.fixture(scope="module")
def transform_source(tmp_path_factory):
    root = tmp_path_factory.mktemp("transform")
    shapes = [(80, 60, 2), (50, 90, 1), (64, 64, 0), (120, 70, "gray"), (33, 100, 2)]
    source = [(str(write(root / f"{i}.jpg", gen(w, h, subsampling=s, quality=85))), i)
              for i, (w, h, s) in enumerate(shapes)]
    photo_path = write(root / "rocket.jpg", (skimage_data_dir() / "rocket.jpg").read_bytes())
    return source + [(str(photo_path), 5)]


def _reference_transform(transform, batches, source):
    """The transform applied to Pillow's images of each batch, in the loader's order."""
    out = []
    for batch in batches:
        views = [torch.from_numpy(pillow_file(source[i][0])[0].copy()).permute(2, 0, 1)
                 for i in batch.indices.tolist()]
        out.append(transform(views))
    return out


def test_train_transform_batches(transform_source):
    with make_loader(transform_source, 4, backend="cpu", shuffle=True, seed=1,
                     transform=train_transform(64, seed=5)) as loader:
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            batches = drain(loader)
            assert [len(b.indices) for b in batches] == [4, 2]
            for batch in batches:
                n = len(batch.indices)
                assert batch.images.dtype == torch.float32 and tuple(batch.images.shape) == (n, 3, 64, 64)
                assert torch.isfinite(batch.images).all()
                # The sizes are the decoded ones, before the crop.
                assert batch.sizes.tolist() == [list(pillow_file(transform_source[i][0])[0].shape[:2])
                                                for i in batch.indices.tolist()]
            reference = train_transform(64, seed=5)
            reference.set_epoch(epoch)
            expect = _reference_transform(reference, batches, transform_source)
            for batch, ref in zip(batches, expect):
                assert torch.equal(batch.images, ref), f"epoch {epoch}: the loader's draws differ"


def test_eval_transform_is_deterministic_across_epochs(transform_source):
    with make_loader(transform_source, 4, backend="cpu", shuffle=False, transform=eval_transform(64, 72)) as loader:
        epochs = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            epochs.append(drain(loader))
    expect = _reference_transform(eval_transform(64, 72), epochs[0], transform_source)
    for a, b, ref in zip(*epochs, expect):
        assert a.images.dtype == torch.float32 and tuple(a.images.shape) == (len(a.indices), 3, 64, 64)
        assert torch.equal(a.indices, b.indices) and torch.equal(a.images, b.images)
        assert torch.equal(a.images, ref)


# ---------------------------------------------------------------------------------
# 5, 6. The simulated device


@pytest.fixture(scope="module")
def sim_source(tmp_path_factory):
    """Six small JPEGs the device takes, one larger than a 64x64 slot (the device writes
    it to the batch buffer's spill area), one progressive (pre-screened), one missing file."""
    root = tmp_path_factory.mktemp("sim")
    subsamplings = (0, 1, 2, "gray", 2, "440")
    source = [(str(write(root / f"{i}.jpg", gen(48, 40 - 2 * i, subsampling=s, quality=60 + 5 * i))), i % 3)
              for i, s in enumerate(subsamplings)]
    source.append((str(write(root / "oversize.jpg", gen(96, 80, subsampling=2, quality=80))), 0))
    source.append((str(write(root / "progressive.jpg", gen(24, 16, subsampling=2, progressive=True))), 1))
    source.append((str(root / "missing.jpg"), 2))
    return source


def _sim_loader(source, backend, **kw):
    return make_loader(source, 4, backend=backend, slot_pixels=64 * 64, **kw)


@needs_verilator
def test_sim_loader_equals_pillow_and_cpu(sim, sim_source):
    with _sim_loader(sim_source, sim) as loader:
        assert loader.backend_name == "sim" and loader.service.lanes == LANES
        sim_batches = drain(loader)
        delivered = check_batches(loader, sim_batches)
        assert delivered == list(range(8))
        assert [len(b.indices) for b in sim_batches] == [4, 4, 0]
        assert tuple(sim_batches[-1].images.shape) == (0, 3, 0, 0)
        outcomes = [o for b in sim_batches for o in b.outcomes]
        assert [(o.index, o.status, o.backend, o.reason) for o in outcomes] == \
            [(7, "fallback", "cpu", "progressive"), (8, "error", None, "unreadable")]
        assert outcomes[0].path == sim_source[7][0] and outcomes[1].path == sim_source[8][0]
        # Progressive: the pre-screen's, no device time spent on it.
        assert (outcomes[0].detail, outcomes[0].extra) == ("host pre-screen", {})
        report = loader.report
        assert (report.positions, report.delivered, report.accounted) == (9, 8, 9)
        assert report.fallbacks == [outcomes[0]] and report.skipped == [outcomes[1]]
        stats = loader.stats()
        assert stats.outcomes == {"ok": 7, "fallback:progressive": 1, "error:unreadable": 1}
        assert stats.oversize == 1 and stats.images == 8
        assert sum(len(b.spills) for b in loader.pool.buffers) == 1, "the large image went to a spill area"
        assert stats.lane_busy, "no lane figures"
        assert set(stats.lane_busy) <= {f"device0.lane{k}" for k in range(LANES)}
        assert all(0 < v <= 1 for v in stats.lane_busy.values()), stats.lane_busy
        assert loader.pool.free == loader.pool.depth
    with _sim_loader(sim_source, "cpu") as loader:
        cpu_batches = drain(loader)
        assert [o.index for b in cpu_batches for o in b.outcomes] == [8]
    for s, c in zip(sim_batches, cpu_batches, strict=True):
        assert torch.equal(s.indices, c.indices) and torch.equal(s.sizes, c.sizes)
        assert torch.equal(s.labels, c.labels) and torch.equal(s.images, c.images)


@needs_verilator
def test_sim_loader_decodes_motion_jpeg_frames_on_the_device(sim, tmp_path):
    """Files without DHT (Motion-JPEG frames) reach the device with the standard tables
    inserted, in every epoch (the second from the pre-screen's cached verdict), and come
    back ``ok`` from it with Pillow's pixels; the dispatcher's staging buffers do not
    grow from one epoch to the next (each rewritten input's own buffer is given back)."""
    tables = {(0, 0), (0, 1), (1, 0), (1, 1)}
    source = [(str(write(tmp_path / f"{i}.jpg", drop_huffman(gen(40, 24 + 2 * i, subsampling=ss, quality=85),
                                                             tables))), i % 2)
              for i, ss in enumerate((0, 1, 2, "gray", 2, 0))]
    with _sim_loader(source, sim) as loader:
        held = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            batches = drain(loader)
            assert check_batches(loader, batches) == list(range(6))
            assert all(not b.outcomes for b in batches), "every image ok, none declined"
            assert loader.stats().outcomes == {"ok": 6}
            dispatcher = loader.service._dispatchers[0]
            held.append(len(dispatcher.allocated))
        assert held[0] == held[1]
        assert len(loader.service._screens) == 6 and all(v[4] is not None for v in loader.service._screens.values())


@needs_verilator
def test_a_file_replaced_with_its_old_size_and_mtime_is_screened_again(sim, tmp_path):
    """New contents given the old size and modification time (``cp -p``, ``rsync -t``):
    the pre-screen's cached verdict must not send them to the device. Here the new file's
    JFIF APP0 is cut short, which the device's header parser skips but Pillow refuses.
    Without the status-change time in the cache key, epoch 1 delivered it as ``ok``."""
    good = gen(37, 53, subsampling=0, quality=90)
    assert good[2:4] == b"\xff\xe0"
    rest = good[4 + struct.unpack(">H", good[4:6])[0]:]
    pad = len(good) - len(rest) - 15
    bad = good[:2] + b"\xff\xe0\x00\x07JFIF\x00" + b"\xff\xfe" + struct.pack(">H", pad + 2) + b"x" * pad + rest
    assert len(bad) == len(good)
    assert pillow_file(io.BytesIO(bad))[1] is not None and pillow_file(io.BytesIO(good))[1] is None
    path = write(tmp_path / "c" / "img.jpg", good)
    st = path.stat()
    with _sim_loader([(str(path), 0)], sim, on_error="skip") as loader:
        drain(loader)
        assert loader.report.delivered == 1 and not loader.report.skipped
        path.write_bytes(bad)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
        loader.set_epoch(1)
        batches = drain(loader)
        assert [len(b.indices) for b in batches] == [0]
        (skipped,) = loader.report.skipped
        assert (skipped.status, skipped.reason, skipped.path) == ("error", "undecodable", str(path))


@needs_verilator
def test_sim_lanes_stuck_one_at_a_time_end_in_a_reset(sim, tmp_path):
    """Single tasks on a 4-lane device whose memory stopped answering reads: each job's
    lane is freed by the watchdog but stays stuck on its dead transactions, so each
    next job goes to another lane; once all four are stuck the dispatcher resets the
    device, and the fifth job runs on the reset device. No job waits out the driver's
    wait bound (2**28 clocks; before, the fifth did), and every input comes from the CPU."""
    from dlbooster.runtime.pool import BatchPool
    from dlbooster.runtime.service import DecodeService, Task
    from dlbooster.sim.device import PortBehaviour

    paths = [str(write(tmp_path / f"{i}.jpg", gen(48, 40, subsampling=2, quality=85))) for i in range(5)]
    device = sim.device
    resets, task = [], [None]
    real_reset = device.reset
    device.reset = lambda: (resets.append(task[0]), real_reset())
    outcomes = []
    service = DecodeService(sim, cpu_workers=1)
    try:
        device.watchdog = 2000
        device.transport.set_port(PortBehaviour(stall_reads=True))
        pool = BatchPool(1, 64 * 64 * 3, depth=1, allocate=service.allocator())
        clocks0 = device.transport.counters()["clocks"]
        for i, path in enumerate(paths):
            task[0] = i
            buf = pool.acquire()
            buf.count = 1
            service.submit(Task(i, path, buf, 0, lambda task, outcome: outcomes.append(outcome)))
            service.drain()
            pool.release(buf)
        clocks = device.transport.counters()["clocks"] - clocks0
    finally:
        service.close(backend=False)
        del device.reset
    assert [(o.index, o.status, o.reason, o.backend) for o in outcomes] == [
        (i, "fallback", "watchdog", "cpu") for i in range(5)]
    assert sorted(o.extra["lane"] for o in outcomes[:LANES]) == list(range(LANES))
    assert resets == [LANES - 1], "one reset, during the task that left every lane stuck"
    # About 10,000: far under the driver's wait bound (2**28 clocks), which nothing waited out.
    assert clocks < 1 << 20, clocks


@needs_verilator
def test_sim_stalled_memory_falls_back_to_cpu(sim, sim_source):
    """The device's memory stops answering reads: the watchdog ends the jobs the lanes
    hold, and the lanes stay busy on their dead transactions. The dispatcher resets the
    device at the first watchdog completion and sends the jobs still in flight to the
    CPU (``device-fault``); it does not wait out the driver's wait bound (2**28 clocks,
    minutes in the simulator). Every image still arrives, from the CPU.

    A hook the Loader does not expose, reached through
    ``loader.service._dispatchers[0].device``: the watchdog register (default 2**24
    clocks, also minutes in the simulator)."""
    from dlbooster.sim.device import PortBehaviour

    with _sim_loader(sim_source, sim) as loader:
        device = loader.service._dispatchers[0].device
        assert device is sim.device
        device.watchdog = 2000
        device.transport.set_port(PortBehaviour(stall_reads=True))
        clocks0 = device.transport.counters()["clocks"]
        batches = drain(loader)
        clocks = device.transport.counters()["clocks"] - clocks0
        assert check_batches(loader, batches) == list(range(8))
        outcomes = [o for b in batches for o in b.outcomes]
        assert outcomes[-1].index == 8 and outcomes[-1].status == "error"
        fallbacks = outcomes[:-1]
        assert sorted(o.index for o in fallbacks) == list(range(8)), "every image came from the CPU"
        assert all(o.status == "fallback" and o.backend == "cpu" for o in fallbacks)
        reasons = {o.index: o.reason for o in fallbacks}
        assert reasons.pop(7) == "progressive"          # the pre-screen's: it never reached the device
        assert "watchdog" in reasons.values() and set(reasons.values()) <= {"watchdog", "device-fault"}, reasons
        assert loader.report.accounted == loader.report.positions == 9
        assert loader.report.fallbacks == fallbacks
        stats = loader.stats().outcomes
        assert stats["fallback:watchdog"] + stats["fallback:device-fault"] == 7
        # About one watchdog period (2,000 clocks), not the driver's bound (2**28).
        assert clocks < 1 << 20, f"{clocks} clocks: the dispatcher waited for the driver's bound"
    # The device works again once the memory answers.
    device.transport.set_port(PortBehaviour())
    device.reset()
    with _sim_loader(sim_source[:2], sim) as loader:
        batches = drain(loader)
        assert check_batches(loader, batches) == [0, 1] and batches[0].outcomes == []


# ---------------------------------------------------------------------------------
# 7. Abandoned epochs


@pytest.mark.timeout(120)       # a hang guard: leaving the epoch must not wait for it
def test_break_out_of_an_epoch_then_a_full_one(tiny_source):
    with make_loader(tiny_source, 2, backend="cpu", prefetch=2, slot_pixels=32 * 32) as loader:
        assert loader.pool.depth == 3
        for batch in loader:
            assert batch.indices.tolist() == [0, 1]
            break
        assert loader.pool.free == loader.pool.depth
        assert loader.stats().images == 2
        assert loader.report.accounted < loader.report.positions
        # A generator left suspended, then dropped, gives its buffers back too.
        it = iter(loader)
        next(it)
        next(it)
        del it
        assert loader.pool.free == loader.pool.depth
        loader.set_epoch(1)
        batches = drain(loader)
        assert check_batches(loader, batches) == list(range(N_SHARD))
        assert loader.report.accounted == loader.report.positions == N_SHARD
        assert loader.pool.free == loader.pool.depth


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_sampler_state_saved_mid_epoch_resumes_at_the_next_batch(tiny_source, drop_last):
    """The sampler's state counts the samples of the batches yielded, not of those
    decoded ahead (it was always at the epoch's end, and a resume from it read nothing
    more); after a full epoch it is at the end, as a DataLoader's."""
    kw = dict(backend="cpu", shuffle=True, seed=2, drop_last=drop_last, prefetch=2, slot_pixels=32 * 32)
    with make_loader(tiny_source, 2, **kw) as loader:
        loader.set_epoch(1)
        epoch = [b.indices.tolist() for b in loader]
        assert len(epoch) == (5 if drop_last else 6)
        assert loader.sampler.state_dict()["start"] == N_SHARD
        it = iter(loader)
        assert [next(it).indices.tolist() for _ in range(2)] == epoch[:2]
        state = loader.sampler.state_dict()
        assert state["start"] == 4 and state["epoch"] == 1
    with make_loader(tiny_source, 2, **kw) as resumed:
        resumed.sampler.load_state_dict(state)
        resumed.set_epoch(1)
        batches = drain(resumed)
        assert [b.indices.tolist() for b in batches] == epoch[2:]
        assert sorted(check_batches(resumed, batches)) == sorted(i for b in epoch[2:] for i in b)


def test_lane_busy_is_the_epochs(tiny_source):
    """``stats().lane_busy`` is each lane's clocks over its device's, both counted over
    the last epoch (it was the service's lifetime figure). The clock counters are set
    by hand here, as a simulated device's dispatcher sets them."""
    with make_loader(tiny_source, 4, backend="cpu", slot_pixels=32 * 32) as loader:
        stats = loader.service.stats
        stats.lane_clocks[0, 0], stats.device_clocks[0] = 400, 1000      # before the epoch
        for number, _ in enumerate(loader):
            if number == 0:
                stats.lane_clocks[0, 0], stats.lane_clocks[0, 1], stats.device_clocks[0] = 700, 100, 3000
        first = loader.stats()
        assert first.lane_busy == {"device0.lane0": 300 / 2000, "device0.lane1": 100 / 2000}
        assert loader.service.lane_busy() == {"device0.lane0": 700 / 3000, "device0.lane1": 100 / 3000}
        drain(loader)
        assert loader.stats().lane_busy == {}                            # the device ran no clock
        assert first.lane_busy == {"device0.lane0": 300 / 2000, "device0.lane1": 100 / 2000}


def test_lane_busy_of_a_device_that_counts_no_clocks_uses_its_fabric_clock(tmp_path):
    """A board counts no device clocks, only each job's (at its fabric clock,
    ``clock_hz``): its lanes' busy fraction is their job clocks over the fabric clock
    times the wall time, measured over the epoch (a window at least as long as the
    epoch's ``seconds``). The instant instrument, with no ``clock_hz``, has no figures."""
    from dlbooster.device.instant import InstantBackend, InstantTransport

    paths = [write(tmp_path / f"{i}.jpg", gen(16 + i, 16, subsampling=2)) for i in range(6)]
    for clock_hz in (None, 1e6):
        transport = InstantTransport(lanes=2, job_depth=4)
        if clock_hz:
            transport.clock_hz = clock_hz
        for path in paths:
            transport.learn(path.read_bytes(), pillow_file(str(path))[0])
        with make_loader([(str(p), 0) for p in paths], 3, backend=InstantBackend(transport),
                         slot_pixels=32 * 32) as loader:
            for _ in range(2):
                drain(loader)
                stats = loader.stats()
                assert stats.outcomes == {"ok": 6}
                if clock_hz is None:
                    assert stats.lane_busy == {}
                    continue
                # The instrument reports 1 clock per job; the lanes take turns.
                assert set(stats.lane_busy) == {"device0.lane0", "device0.lane1"}
                for fraction in stats.lane_busy.values():
                    # 3 jobs of 1 clock per lane, over a window a little longer than the epoch.
                    assert 3 / (clock_hz * (stats.seconds + 0.5)) <= fraction <= 3 / (clock_hz * stats.seconds)


def test_closing_twice_and_copying_folder_source(tmp_path, image_folder):
    """A folder given as a ``Path`` lists like ImageFolder; close is idempotent."""
    shutil.copytree(image_folder / "c_mixed", tmp_path / "only" / "c_mixed")
    loader = make_loader(tmp_path / "only", 8, backend="cpu")
    try:
        batches = drain(loader)
        assert len(check_batches(loader, batches)) == 5
    finally:
        loader.close()
        loader.close()


def test_a_transform_returning_views_of_its_inputs_yields_batches_that_stay(tiny_source):
    """On the CPU the inputs are views of a pool buffer that later batches refill: a
    transform's output sharing that memory (a view, or the list itself) is copied, so
    batches held past their step keep their pixels; other outputs are yielded as they
    are, uncopied."""
    refs = {path: pillow_file(path)[0] for path, _ in tiny_source}
    for transform in (lambda views: views[0].unsqueeze(0), lambda views: views):
        with make_loader(tiny_source, 1, backend="cpu", prefetch=1, slot_pixels=32 * 32,
                         transform=transform) as loader:
            held = [(b.images, int(b.indices[0])) for b in loader]
            assert len(held) == N_SHARD
            for images, index in held:
                got = images[0].permute(1, 2, 0).numpy()
                assert np.array_equal(got, refs[tiny_source[index][0]]), index
    fresh = []

    def new_memory(views):
        fresh.append(torch.stack([v.float().mean() for v in views]))
        return fresh[-1]

    with make_loader(tiny_source, 2, backend="cpu", slot_pixels=32 * 32, transform=new_memory) as loader:
        yielded = [b.images for b in loader]
    assert len(yielded) == 6 and all(a is b for a, b in zip(yielded, fresh, strict=True))


def test_a_failing_transform_gives_its_buffer_back(tiny_source):
    def broken(images):
        raise RuntimeError("transform failed")

    with make_loader(tiny_source, 2, backend="cpu", slot_pixels=32 * 32, transform=broken) as loader:
        with pytest.raises(RuntimeError, match="transform failed"):
            drain(loader)
        assert loader.pool.free == loader.pool.depth
        # Every failed epoch gives its buffer back: more failures than buffers never hang.
        for _ in range(loader.pool.depth + 1):
            with pytest.raises(RuntimeError, match="transform failed"):
                drain(loader)
        assert loader.pool.free == loader.pool.depth


def test_a_new_iteration_ends_a_suspended_one(tiny_source):
    with make_loader(tiny_source, 2, backend="cpu", slot_pixels=32 * 32) as loader:
        first = iter(loader)
        next(first)                      # peeked at, kept alive: holds the pool's buffers
        batches = drain(loader)          # must not wait for the first iteration's buffers
        assert len(batches) == len(loader)
        assert sorted(check_batches(loader, batches)) == list(range(len(tiny_source)))
        with pytest.raises(RuntimeError, match="ended by a newer one"):
            next(first)
        assert loader.pool.free == loader.pool.depth


@pytest.mark.timeout(120)       # a hang guard: a lost buffer made a later epoch wait forever
def test_iterations_on_several_threads_at_once_lose_no_buffer(tiny_source):
    """Threads iterating one loader at once end each other's iterations (RuntimeError),
    but none loses a pool buffer: an older iteration's cleanup on another thread once
    ran between a buffer's take and its submission, and that buffer never came back."""
    import threading

    with make_loader(tiny_source, 1, backend="cpu", prefetch=1, slot_pixels=32 * 32) as loader:
        ended, others = [], []

        def work():
            for _ in range(50):
                try:
                    for _ in loader:
                        pass
                except RuntimeError as exc:
                    (ended if "ended by a newer one" in str(exc) else others).append(exc)

        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not others
        assert ended, "no iteration was ended by another: the threads never overlapped"
        assert loader.pool.free == loader.pool.depth
        batches = drain(loader)
        assert check_batches(loader, batches) == list(range(N_SHARD))
        assert loader.report.accounted == loader.report.positions == N_SHARD
        assert loader.pool.free == loader.pool.depth


def _in_forked_child(work, timeout: float = 60):
    """``work()``'s result in a child forked from this process (given one PyTorch thread,
    as a ``DataLoader`` worker is), or ``repr`` of what it raised; fails if the child
    sends nothing within ``timeout`` seconds (a hang)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)

    def child():
        # As in DataLoader's workers: PyTorch's intra-op threads do not survive a fork.
        torch.set_num_threads(1)
        try:
            sender.send(work())
        except BaseException as exc:
            sender.send(f"raised {exc!r}")

    process = ctx.Process(target=child)
    process.start()
    try:
        assert receiver.poll(timeout), "the forked child sent nothing: hung"
        return receiver.recv()
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()


@pytest.mark.timeout(180)       # a hang guard: the parent's threads do not exist in the child
def test_a_loader_iterated_before_a_fork_works_in_the_child(tiny_source):
    """As in a ``DataLoader(num_workers > 0)`` worker: the child gets its own decode
    threads and the whole pool, even with an iteration of the parent's in flight; the
    parent's iteration goes on unharmed."""
    with make_loader(tiny_source, 2, backend="cpu", slot_pixels=32 * 32) as loader:
        assert check_batches(loader, drain(loader)) == list(range(N_SHARD))
        parents = iter(loader)
        first = next(parents)               # the parent's batches in flight at the fork

        def child():
            order = check_batches(loader, drain(loader))
            return order, loader.pool.free, loader.pool.depth

        order, free, depth = _in_forked_child(child)
        assert order == list(range(N_SHARD)) and free == depth
        assert check_batches(loader, [first, *parents]) == list(range(N_SHARD))
        assert loader.pool.free == loader.pool.depth


@pytest.mark.timeout(180)
def test_a_device_loader_in_a_forked_child_says_so(tiny_source):
    """A device backend's device and dispatcher threads are the parent's: iterating in
    the child raises at once, naming the fork, instead of waiting forever."""
    from dlbooster.device.instant import InstantBackend, InstantTransport

    transport = InstantTransport(lanes=2, job_depth=4)
    for path, _ in tiny_source:
        transport.learn(Path(path).read_bytes(), pillow_file(path)[0])
    with make_loader(tiny_source, 4, backend=InstantBackend(transport), slot_pixels=32 * 32) as loader:
        assert check_batches(loader, drain(loader)) == list(range(N_SHARD))

        def child():
            try:
                drain(loader)
            except RuntimeError as exc:
                loader.close()              # leaves the parent's device alone
                return str(exc), loader._closed
            return "no error"

        message, closed = _in_forked_child(child)
        assert "cannot be used in process" in message and "forked from it" in message and closed
        assert check_batches(loader, drain(loader)) == list(range(N_SHARD))   # the parent's still works


def test_a_loader_cannot_be_pickled_and_says_what_to_send(tiny_source):
    with make_loader(tiny_source, 2, backend="cpu", slot_pixels=32 * 32) as loader:
        with pytest.raises(TypeError, match="Loader cannot be pickled .*send its source and arguments"):
            pickle.dumps(loader)


def test_the_next_batch_is_submitted_before_a_batch_is_yielded(tiny_source):
    """The iterating thread submits batch n + 1 into the buffer batch n freed before it
    yields batch n, so decoding overlaps the consumer's step (one pool buffer here)."""
    with make_loader(tiny_source, 2, backend="cpu", prefetch=0, slot_pixels=32 * 32) as loader:
        assert loader.pool.depth == 1
        it = iter(loader)
        assert next(it).indices.tolist() == [0, 1]
        loader.service.drain()
        assert sum(loader.service.stats.outcomes.values()) == 4      # batches 0 and 1, no more
        assert loader.pool.free == 0
        rest = list(it)
        assert [b.indices.tolist() for b in rest] == [list(range(i, min(i + 2, N_SHARD))) for i in range(2, N_SHARD, 2)]
        assert loader.pool.free == 1


class Copy:
    """Stands in for the torch.cuda.Event of a batch's copy to a GPU (the pool's only use
    of it: query and synchronize), so that the pool's and the loader's handling of a
    copy still running is checked on machines without one."""

    def __init__(self, done):
        self.done, self.waited = done, 0

    def query(self):
        return self.done

    def synchronize(self):
        self.waited += 1
        self.done = True


def test_buffers_whose_copies_run_decode_ahead_once_the_next_batch_is_awaited(tiny_source):
    """On a GPU the buffer of the batch just yielded has its copy still running: the
    yield does not wait for it, but the next call, about to wait for its batch anyway,
    waits for that copy and submits the buffer, so every buffer of the pool decodes
    ahead (before, a buffer left at the yield sat idle until its batch was needed)."""
    with make_loader(tiny_source, 2, backend="cpu", prefetch=1) as loader:
        assert loader.pool.depth == 2
        copies = []
        release = loader.pool.release

        def release_with_a_running_copy(buf):
            buf.copied = Copy(False)
            copies.append(buf.copied)
            release(buf)
        loader.pool.release = release_with_a_running_copy
        it = iter(loader)
        assert next(it).indices.tolist() == [0, 1]
        loader.service.drain()
        assert sum(loader.service.stats.outcomes.values()) == 4 and copies[0].waited == 0
        assert next(it).indices.tolist() == [2, 3]
        loader.service.drain()
        assert sum(loader.service.stats.outcomes.values()) == 6 and copies[0].waited == 1
        assert [b.indices.tolist() for b in it] == [list(range(i, min(i + 2, N_SHARD))) for i in range(4, N_SHARD, 2)]


def test_taking_a_buffer_without_waiting_leaves_one_whose_copy_runs():
    from dlbooster.runtime.pool import BatchPool

    pool = BatchPool(2, 30, 1, pin=False)
    buf = pool.acquire()
    buf.copied = running = Copy(False)
    pool.release(buf)
    assert pool.acquire(timeout=0, wait_copy=False) is None
    assert pool.free == 1 and running.waited == 0
    assert pool.acquire(timeout=0) is buf and running.waited == 1 and buf.copied is None
    buf.copied = finished = Copy(True)
    pool.release(buf)
    assert pool.acquire(timeout=0, wait_copy=False) is buf and buf.copied is None and finished.waited == 1


# ---------------------------------------------------------------------------------
# 8. Faults of the runtime itself (found in review)


@needs_verilator
def test_sim_dispatcher_death_loses_nothing(sim, sim_source, monkeypatch):
    """A bus error on queuing a job: the dispatcher dies with jobs in hand; they and
    every later one are decoded on the CPU."""
    from dlbooster.hw.regs import Reg

    with _sim_loader(sim_source, sim) as loader:
        write32 = sim.device.transport.write32

        def bus_error_on_push(offset, value):
            if offset == Reg.JOB_PUSH:
                raise OSError("bus error")
            write32(offset, value)

        monkeypatch.setattr(sim.device.transport, "write32", bus_error_on_push)
        batches = drain(loader)
        assert check_batches(loader, batches) == list(range(8))
        fallbacks = [o for b in batches for o in b.outcomes if o.status == "fallback"]
        assert {o.index: o.reason for o in fallbacks} == {**{i: "device-fault" for i in range(7)}, 7: "progressive"}
        assert loader.report.accounted == loader.report.positions == 9
        assert loader.service._outstanding == 0


@needs_verilator
def test_sim_device_memory_exhausted_sends_images_to_the_cpu(sim, sim_source, monkeypatch):
    """Device memory runs out (the transport's allocate raises): each image the device
    would take is decoded on the CPU, reason ``device-memory``; the device stays up."""
    with _sim_loader(sim_source, sim) as loader:
        def exhausted(size, writable=True):
            raise MemoryError("device memory exhausted")

        monkeypatch.setattr(sim.device.transport, "allocate", exhausted)
        batches = drain(loader)
        assert check_batches(loader, batches) == list(range(8))
        fallbacks = {o.index: o.reason for b in batches for o in b.outcomes if o.status == "fallback"}
        # The progressive one is the pre-screen's, before any device memory is asked for.
        assert fallbacks == {**{i: "device-memory" for i in range(7)}, 7: "progressive"}
        assert loader.report.accounted == loader.report.positions == 9
        assert all(d.is_alive() for d in loader.service._dispatchers)


def test_closed_loader_raises(tiny_source):
    """close() inside the loop: the next step raises, with no batch from the freed pool
    (batches already decoded wait in it: prefetch 2)."""
    loader = make_loader(tiny_source, 2, backend="cpu", slot_pixels=32 * 32, prefetch=2)
    it = iter(loader)
    next(it)
    time.sleep(0.2)                           # the next batches are ready
    loader.close()
    with pytest.raises(RuntimeError, match="the loader was closed during the epoch"):
        next(it)
    with pytest.raises(RuntimeError, match="loader is closed"):
        list(loader)


def test_close_from_another_thread_waits_for_the_batch_being_assembled(tiny_source):
    """A batch is assembled from the pool's memory, which close() frees: close() from
    another thread waits until the batch is done, and the iteration then ends."""
    import threading

    closer = None

    def transform(views):
        nonlocal closer
        if closer is None:
            closer = threading.Thread(target=loader.close)
            closer.start()
            closer.join(0.3)
            # Still assembling: close() has not begun (it would set _closed first).
            assert closer.is_alive() and not loader._closed
            return [int(v.sum()) for v in views]   # the slots' pixels, read before close()
        return views

    loader = make_loader(tiny_source, 2, backend="cpu", slot_pixels=32 * 32, transform=transform)
    it = iter(loader)
    images, _ = next(it)
    closer.join()
    expected = [int(np.asarray(Image.open(path).convert("RGB"), np.int64).sum()) for path, _ in tiny_source[:2]]
    assert images == expected and loader._closed
    with pytest.raises(RuntimeError, match="the loader was closed during the epoch"):
        next(it)


def test_a_raising_done_callback_is_called_once(tiny_source):
    from dlbooster.runtime.pool import BatchPool
    from dlbooster.runtime.service import DecodeService, Task

    calls = []

    def done(task, outcome):
        calls.append((task.index, outcome.status))
        raise ValueError("consumer bug")

    pool = BatchPool(3, 3 * 32 * 32, 1)
    buf = pool.acquire()
    with DecodeService("cpu", cpu_workers=2) as service:
        service.submit_many([Task(i, tiny_source[i][0], buf, i, done) for i in range(3)])
        service.drain()
        assert sorted(calls) == [(0, "ok"), (1, "ok"), (2, "ok")]
        assert service._outstanding == 0


@pytest.mark.timeout(120)       # a hang guard: a FIFO blocks a plain open() for ever
def test_special_files_are_unreadable_not_read(tmp_path):
    good = write(tmp_path / "c" / "good.jpg", gen(16, 16))
    (tmp_path / "c" / "zero.jpg").symlink_to("/dev/zero")
    fifo = tmp_path / "c" / "fifo.jpg"
    __import__("os").mkfifo(fifo)
    with make_loader(str(tmp_path), 4, backend="cpu") as loader:
        (batch,) = drain(loader)
        assert [loader.samples[i].path for i in batch.indices.tolist()] == [str(good)]
        assert sorted((o.path.rsplit("/", 1)[1], o.reason, o.detail) for o in loader.report.skipped) == [
            ("fifo.jpg", "unreadable", "not a regular file"), ("zero.jpg", "unreadable", "not a regular file")]


def test_replace_returning_junk_names_the_input_and_counts_nothing(bad_dir):
    source = [(str(p), 0) for p in sorted(bad_dir.values())] if isinstance(bad_dir, dict) else bad_dir
    for junk in (np.full((4, 4, 3), 300.7), None, np.zeros((0, 0, 3), np.uint8)):
        with make_loader(source, 64, backend="cpu", on_error="replace",
                         replace=lambda index, outcome, junk=junk: junk) as loader:
            with pytest.raises((ValueError, TypeError)) as err:
                drain(loader)
            if isinstance(err.value, ValueError):
                assert "replace() for " in str(err.value)
            # The failed batch was not delivered: nothing of it is counted.
            assert loader.report.delivered == loader.report.replaced == 0
            assert loader.pool.free == loader.pool.depth


@needs_verilator
def test_sim_two_devices_at_once(sim_source):
    """Two simulated devices (each its own simulation, run from its own dispatcher thread
    at the same time): every image equal to Pillow's, both devices busy."""
    from dlbooster.backends import SimBackend

    backend = SimBackend(lanes=1, max_width=256, devices=2)
    try:
        with _sim_loader(sim_source, backend) as loader:
            assert loader.service.lanes == 2
            batches = drain(loader)
            assert check_batches(loader, batches) == list(range(8))
            busy = loader.stats().lane_busy
            assert set(busy) == {"device0.lane0", "device1.lane0"}
            assert all(0 < v <= 1 for v in busy.values())
            reasons = sorted((o.index, o.reason) for b in batches for o in b.outcomes)
            assert reasons == [(7, "progressive"), (8, "unreadable")]
    finally:
        backend.close()


# ---------------------------------------------------------------------------------
# The instant device (benchmark instrument) under the real runtime, and bench host


def test_instant_device_batches_equal_pillow_and_bench_host_accounts(tiny_source, monkeypatch):
    """The host-cost benchmark's instrument must deliver Pillow's pixels through the real
    driver and service (else the benchmark would time a broken path), and the benchmark
    must account every image, the time its files took to read and the instrument's work,
    alternate the instrument's pixel writes by epoch as its rows say, and give both
    epochs of a round the same batches."""
    from dlbooster.bench.runtime import JUDGED_ON, bench_host
    from dlbooster.hw.regs import Reg
    from dlbooster.device.instant import InstantBackend, InstantTransport

    transport = InstantTransport(lanes=2, job_depth=4)
    files = [(path, Path(path).read_bytes()) for path, _ in tiny_source]
    for path, data in files:
        transport.learn(data, pillow_file(path)[0])
    with make_loader(tiny_source, 5, backend=InstantBackend(transport), slot_pixels=32 * 32) as loader:
        batches = drain(loader)
        assert check_batches(loader, batches) == list(range(len(tiny_source)))
        assert loader.stats().outcomes == {"ok": len(tiny_source)}
        assert loader.service.stats.read_seconds > 0
        assert loader.service.stats.jobs == len(tiny_source)
    assert transport.device_seconds > 0

    jobs = []                                  # (pixels, input length) of every job the instrument runs
    run_job = InstantTransport._run_job

    def recorded(self, staged):
        jobs.append((self.pixels, staged[Reg.JOB_IN_LEN]))
        run_job(self, staged)
    monkeypatch.setattr(InstantTransport, "_run_job", recorded)
    result = bench_host(files, batch_size=4, epochs=2, lanes=2)
    # A warm-up epoch of each kind, then two rounds, each a control epoch and one with pixel
    # writes, alternating in order.
    n = len(files)
    assert result["images"] == n and [(r["round"], r["pixels"]) for r in result["epochs"]] == \
        [(1, False), (1, True), (2, True), (2, False)]
    assert result["rounds"] == 2 and result["timed_epochs"] == 4 and result["judged_on"] == JUDGED_ON
    epochs = [jobs[e * n:(e + 1) * n] for e in range(6)]       # the warm-ups, then the timed epochs
    assert len(jobs) == 6 * n
    assert [{pixels for pixels, _ in epoch} for epoch in epochs] == [{True}, {False}, {False}, {True}, {True},
                                                                     {False}]
    order = [[length for _, length in epoch] for epoch in epochs]
    assert order[2] == order[3] and order[4] == order[5]      # a round's two epochs: the same shuffle
    assert result["outcomes"] == {"ok": len(files)}         # the last epoch's
    for row in result["epochs"]:
        assert row["images"] == len(files)
        assert row["read_s"] > 0 and row["instrument_s"] > 0
        # CPU time less the instrument's, less the reads': identities, not speeds.
        per_image = 1e6 / row["images"]
        assert row["with_reads_us_per_image"] == pytest.approx((row["cpu_s"] - row["instrument_s"]) * per_image)
        assert row["host_us_per_image"] == pytest.approx(row["with_reads_us_per_image"] - row["read_s"] * per_image)
        threads = row["thread_cpu_us_per_image"]
        assert threads["MainThread"] > 0 and threads["dlbooster-device0"] > 0
    control = [r for r in result["epochs"] if not r["pixels"]]
    written = [r for r in result["epochs"] if r["pixels"]]
    assert result["host_us_per_image"] == pytest.approx(sum(r["host_us_per_image"] for r in control) / 2)   # medians of two
    assert result["with_pixel_writes_us_per_image"] == pytest.approx(sum(r["host_us_per_image"] for r in written) / 2)
    assert result["with_pixel_writes_and_reads_us_per_image"] == \
        pytest.approx(sum(r["with_reads_us_per_image"] for r in written) / 2)
    assert result["thread_cpu_us_per_image"]["control"]["MainThread"] == \
        pytest.approx(sum(r["thread_cpu_us_per_image"]["MainThread"] for r in control) / 2)
    assert result["goal_met"] == (result["host_us_per_image"] <= 20.0)
    assert result["goal_met_with_pixel_writes"] == (result["with_pixel_writes_us_per_image"] <= 20.0)
    # Each row counts its threads' context switches (Linux /proc): the iterating thread waits for batches.
    assert all(r["context_switches_per_image"]["MainThread"] >= 0 for r in result["epochs"])
    assert sum(r["context_switches_per_image"]["MainThread"] for r in result["epochs"]) > 0
    assert result["context_switches_per_image"]["control"]["MainThread"] == \
        pytest.approx(sum(r["context_switches_per_image"]["MainThread"] for r in control) / 2)
    with pytest.raises(ValueError, match="epochs must be at least 1"):
        bench_host(files, epochs=0)


def test_the_control_instrument_completes_alike_and_writes_no_pixels(tiny_source):
    """``pixels=False`` (``bench host``'s control epochs) gives the same completions, sizes
    and outcomes and leaves every batch slot as it was (zero: the pool's fresh memory);
    switched back on between epochs, the instrument writes Pillow's pixels again."""
    from dlbooster.device.instant import InstantBackend, InstantTransport

    transport = InstantTransport(lanes=2, job_depth=4, pixels=False)
    files = [(path, Path(path).read_bytes()) for path, _ in tiny_source]
    for path, data in files:
        transport.learn(data, pillow_file(path)[0])
    with make_loader(tiny_source, 5, backend=InstantBackend(transport), slot_pixels=32 * 32) as loader:
        batches = drain(loader)
        assert loader.stats().outcomes == {"ok": len(tiny_source)}
        assert [tuple(hw) for batch in batches for hw in batch.sizes.tolist()] == \
            [pillow_file(path)[0].shape[:2] for path, _ in tiny_source]
        assert all(not batch.images.any() for batch in batches)
        transport.pixels = True
        loader.set_epoch(1)
        assert check_batches(loader, drain(loader)) == list(range(len(tiny_source)))


def _instant_service(tmp_path, n: int, size: int, slot_pixels: int, job_depth: int = 4, device_memory: bool = True):
    """n generated JPEGs of size x size, an instant device that knows their pixels, a
    service over it and a one-buffer pool in the device's memory (else host memory)."""
    from dlbooster.device.instant import InstantBackend, InstantTransport
    from dlbooster.runtime.pool import BatchPool
    from dlbooster.runtime.service import DecodeService

    paths = [str(write(tmp_path / f"{i}.jpg", gen(size, size, subsampling=i % 3, quality=70 + i))) for i in range(n)]
    transport = InstantTransport(lanes=2, job_depth=job_depth)
    for p in paths:
        transport.learn(Path(p).read_bytes(), pillow_file(p)[0])
    service = DecodeService(InstantBackend(transport), cpu_workers=1)
    pool = BatchPool(n, 3 * slot_pixels, 1, allocate=service.allocator() if device_memory else None, pin=False)
    return paths, transport, service, pool


def _run_once_each(paths, service, pool, hook=None) -> dict:
    """Submit every path as one batch; return index -> (status, reason), asserting each
    task's done ran exactly once and the pixels delivered are Pillow's."""
    import collections
    import threading

    from dlbooster.runtime.service import Task

    calls, outcomes, lock = collections.Counter(), {}, threading.Lock()
    buf = pool.acquire()

    def done(task, outcome):
        with lock:
            calls[task.index] += 1
            outcomes[task.index] = (outcome.status, outcome.reason)
        if hook is not None:
            hook(task, outcome)

    service.submit_many([Task(i, p, buf, i, done) for i, p in enumerate(paths)])
    drained = threading.Thread(target=service.drain, daemon=True)
    drained.start()
    drained.join(30)
    assert not drained.is_alive(), "drain hung"
    assert dict(calls) == {i: 1 for i in range(len(paths))}
    for i, p in enumerate(paths):
        if outcomes[i][0] != "error":
            h, w = buf.sizes[i]
            image = buf.oversize.get(i)
            image = image if image is not None else buf.data[i, : h * w * 3].reshape(h, w, 3)
            assert (image == pillow_file(p)[0]).all(), p
    return outcomes


def test_instant_faults_mid_batch_lose_nothing_and_reset_before_freeing(tmp_path, monkeypatch):
    """Review findings on the batched dispatcher: a bus error on the second JOB_PUSH of a
    batch resets the device before the output room of any queued job is given back; a
    failing free of a refused job's buffer reports nothing twice; a done callback that
    raises SystemExit does not cost the other tasks theirs."""
    from dlbooster.hw.regs import Reg
    from dlbooster.runtime.pool import SpillBuffer

    # Images larger than a slot: every job gets its own room in the batch buffer's spill area.
    paths, t, service, pool = _instant_service(tmp_path, 8, 32, 16 * 16)
    events, write32, reset = [], t.write32, t.reset
    pushes = []
    give_back = SpillBuffer.free
    monkeypatch.setattr(SpillBuffer, "free", lambda room: (events.append(("free", room.device_address)),
                                                           give_back(room))[1])

    def faulty_write(offset, value):
        if offset == Reg.JOB_PUSH:
            pushes.append(t._staged[int(Reg.JOB_OUT_ADDR_LO)] | t._staged[int(Reg.JOB_OUT_ADDR_HI)] << 32)
            if len(pushes) == 2:
                raise OSError("bus error")
        write32(offset, value)

    t.write32 = faulty_write
    t.reset = lambda *a: (events.append(("reset",)), reset(*a))[1]
    outcomes = _run_once_each(paths, service, pool)
    assert set(outcomes.values()) == {("fallback", "device-fault")}
    assert events.index(("free", pushes[0])) > events.index(("reset",))
    service.close()
    (buf,) = pool.buffers
    assert set(t._buffers) == {buf.handle.device_address} | {h.device_address for h, _ in buf.spills}, \
        "the dead dispatcher's staging buffers are freed on close"
    pool.close()

    # Host memory slots: each job larger than a slot gets an output buffer of the dispatcher's.
    paths, t, service, pool = _instant_service(tmp_path / "b", 8, 32, 16 * 16, device_memory=False)
    read32, free = t.read32, t._free
    t.read32 = lambda offset: 1 if offset == Reg.JOB_PUSH else read32(offset)   # room for one job
    failed = []

    def faulty_free(buf):
        if buf.size >= 3 * 32 * 32 and not failed:
            failed.append(buf)
            raise OSError("free failed")
        free(buf)

    t._free = faulty_free
    service._dispatchers[0].spares = 0        # no spare output buffers: each refused job's is freed
    assert set(_run_once_each(paths, service, pool).values()) == {("fallback", "device-fault")}
    assert failed
    service.close()
    pool.close()

    paths, t, service, pool = _instant_service(tmp_path / "c", 8, 16, 16 * 16)
    exits = []

    def hook(task, outcome):
        if not exits:
            exits.append(task.index)
            raise SystemExit("consumer exits")

    outcomes = _run_once_each(paths, service, pool, hook)
    assert exits and all(status in ("ok", "fallback") for status, _ in outcomes.values())
    service.close()
    pool.close()


def test_a_device_whose_reset_fails_keeps_its_jobs_buffers_and_leaves_service(tmp_path, monkeypatch):
    """A device that stops completing and then fails its reset (an XRT card that does
    not come to rest) may still read and write the buffers of the jobs it held: they
    were handed to the next jobs as if the reset had worked, and the device stayed in
    use. Now they are not given back, and the device leaves service: every task is
    decoded on the CPU (``device-fault``), exactly once."""
    from dlbooster.hw.regs import Reg
    from dlbooster.runtime.pool import SpillBuffer

    paths, t, service, pool = _instant_service(tmp_path, 8, 32, 16 * 16)
    events, write32 = [], t.write32
    give_back = SpillBuffer.free
    monkeypatch.setattr(SpillBuffer, "free", lambda room: (events.append(("free", room.device_address)),
                                                           give_back(room))[1])
    rooms = []

    def write(offset, value):
        if offset == Reg.JOB_PUSH:
            rooms.append(t._staged[int(Reg.JOB_OUT_ADDR_LO)] | t._staged[int(Reg.JOB_OUT_ADDR_HI)] << 32)
            events.append(("push",))
        write32(offset, value)

    def reset(clocks=0):
        events.append(("reset",))
        raise OSError("the card did not come to rest")

    t.write32, t.reset = write, reset
    t._run_queued = lambda: None                 # the device never completes a job
    outcomes = _run_once_each(paths, service, pool)
    assert set(outcomes.values()) == {("fallback", "device-fault")}
    failed = events.index(("reset",))
    assert rooms and ("push",) not in events[failed:], "the device stayed in service"
    assert not {("free", room) for room in rooms} & set(events[failed:]), "a held job's room was given back"
    service.close()
    pool.close()


def test_a_fault_while_completing_a_decoded_job_loses_no_image(tmp_path):
    """A fault in the middle of the common completion path (here: recording an image's
    size raises once) takes the device out of service; the image being completed and
    every job still held are decoded on the CPU (reason ``device-fault``), the images
    completed before it stay ``ok``, and each task gets exactly one outcome."""
    paths, t, service, pool = _instant_service(tmp_path, 6, 16, 16 * 16)
    (buf,) = pool.buffers
    words, faults = buf.size_words, []

    class Words:
        def __setitem__(self, index, value):
            if index == 2 * 2 and not faults:
                faults.append(index)
                raise MemoryError("no room")
            words[index] = value

    buf.size_words = Words()
    outcomes = _run_once_each(paths, service, pool)
    assert faults == [4]
    assert outcomes[2] == ("fallback", "device-fault")
    assert outcomes[0] == outcomes[1] == ("ok", None)
    assert set(outcomes.values()) == {("ok", None), ("fallback", "device-fault")}
    service.close()
    pool.close()


def test_a_fault_after_a_declined_job_went_to_the_cpu_does_not_send_it_twice(tmp_path):
    """The CPU pool may raise after it has queued a declined job's fallback (its submit
    queues the work, then fails to start a worker thread): that job still gets exactly
    one outcome, and the device's other jobs go to the CPU once each."""
    import threading

    from dlbooster.device.instant import _key

    paths, t, service, pool = _instant_service(tmp_path, 4, 16, 16 * 16)
    del t.outputs[_key(Path(paths[3]).read_bytes())]   # never learned: the device declines it
    adjust, fired = service._cpu_pool._adjust_thread_count, []

    def adjust_then_fail():
        adjust()
        if threading.current_thread().name.startswith("dlbooster-device") and not fired:
            fired.append(True)
            raise RuntimeError("can't start new thread")

    service._cpu_pool._adjust_thread_count = adjust_then_fail
    outcomes = _run_once_each(paths, service, pool)      # asserts one done() per task
    assert fired
    assert outcomes[3] == ("fallback", "bad-job")
    assert service.stats.outcomes["fallback", "device-fault"] + service.stats.outcomes["ok", None] == 3
    service.close()
    pool.close()


def test_reads_of_inputs_that_never_reach_the_device_are_counted(tmp_path, monkeypatch):
    """A dispatcher adds its read time to the service's stats with its completions and
    when it stops: inputs the pre-screen sends to the CPU (no completion follows) are
    counted too."""
    from dlbooster import jpeg

    paths, t, service, pool = _instant_service(tmp_path, 3, 16, 16 * 16)
    monkeypatch.setattr(jpeg, "classify", lambda info, max_width: "junk")   # every input declined
    outcomes = _run_once_each(paths, service, pool)
    assert set(outcomes.values()) == {("fallback", "junk")}
    assert service.stats.jobs == 0
    service.close()
    assert service.stats.read_seconds > 0
    pool.close()


def test_instant_completion_with_inconsistent_figures_goes_to_the_cpu(tmp_path):
    """A completion whose size and byte count disagree (a device fault) is not trusted:
    the image is decoded on the CPU, reason ``device-fault``."""
    paths, t, service, pool = _instant_service(tmp_path, 4, 16, 16 * 16)
    run_job = t._run_job

    def lying(staged):
        run_job(staged)
        job, status, size, written, clocks, symbols = t._done[-1]
        if job % 2 == 0:
            t._done[-1] = (job, status, size, written - 3, clocks, symbols)

    t._run_job = lying
    outcomes = _run_once_each(paths, service, pool)
    assert sorted(outcomes.values()) == [("fallback", "device-fault")] * 2 + [("ok", None)] * 2
    service.close()
    pool.close()


def test_instant_completion_with_an_unknown_status_goes_to_the_cpu(tmp_path):
    """A status the driver does not know (here 0x17, which no lane reports, and 0x7F) is
    a per-job ``device-fault``: those images are decoded on the CPU and the device stays
    in service for the others."""
    paths, t, service, pool = _instant_service(tmp_path, 6, 16, 16 * 16)
    run_job = t._run_job

    def unknown(staged):
        run_job(staged)
        job, status, *rest = t._done[-1]
        if job in (1, 4):
            t._done[-1] = (job, (status & ~0xFF) | (0x17 if job == 1 else 0x7F), *rest)

    t._run_job = unknown
    outcomes = _run_once_each(paths, service, pool)
    assert [outcomes[i] for i in range(6)] == [("ok", None), ("fallback", "device-fault"), ("ok", None),
                                             ("ok", None), ("fallback", "device-fault"), ("ok", None)]
    assert service.stats.jobs == 6
    service.close()
    pool.close()


def test_a_watchdog_completion_naming_no_lane_of_the_build_is_not_a_stuck_lane():
    """The driver counts a lane as stuck from its watchdog completion; a completion that
    names a lane the build does not have (a fault) must not count towards "every lane
    stuck", which resets the device."""
    from dlbooster.device.driver import Completion, DecoderDevice
    from dlbooster.hw.regs import DeviceStatus
    from dlbooster.device.instant import InstantTransport

    device = DecoderDevice(InstantTransport(lanes=2))
    watchdog = [Completion(1, DeviceStatus.WATCHDOG, lane, 0, 0, 0, 0, 0) for lane in (5, 7)]
    device._track_stuck(watchdog)
    assert device.stuck == set() and not device.all_lanes_stuck
    device._track_stuck([Completion(2, DeviceStatus.WATCHDOG, lane, 0, 0, 0, 0, 0) for lane in (0, 1)])
    assert device.stuck == {0, 1} and device.all_lanes_stuck


def test_images_larger_than_a_slot_go_to_the_spill_area_without_allocating(tmp_path):
    """With device memory, images larger than a slot are written by the device into the
    batch buffer's spill area and delivered from there: equal to Pillow's, no copy, and
    after the first batch no transport allocation at all ."""
    paths, t, service, pool = _instant_service(tmp_path, 6, 40, 16 * 16)
    allocate = t.allocate
    sizes = []
    t.allocate = lambda size, **kw: (sizes.append(size), allocate(size, **kw))[1]
    try:
        for round_ in range(3):
            assert set(_run_once_each(paths, service, pool).values()) == {("ok", None)}
            (buf,) = pool.buffers
            # Six page-aligned rooms of 4,800 bytes (two pages): the two jobs the job FIFO
            # refuses each time give theirs back, so none is taken twice.
            assert len(buf.spills) == 1 and buf.spills[0][1] == 6 * 8192
            for i in range(6):                 # views of the spill chunk, not copies
                assert np.shares_memory(buf.oversize[i], buf.spills[0][0].array)
            if round_ == 0:
                # The spill chunk, and the staging buffers the inputs are read into.
                assert sorted(sizes) == [1 << 18] * (len(sizes) - 1) + [8 << 20], sizes
                sizes.clear()
            pool.release(buf)
        assert sizes == [], "no allocation after the first batch"
    finally:
        service.close()
        pool.close()


def test_a_transform_view_of_the_spill_area_is_copied_before_the_buffer_is_reused(tmp_path):
    """A transform that returns its inputs (views) gets copies of the images in the batch
    buffer's spill area as well as of those in its slots: the spill chunks are reused by
    the next batch in the buffer, which overwrote the images a consumer still held."""
    from dlbooster.device.instant import InstantBackend, InstantTransport

    paths = [str(write(tmp_path / f"{i}.jpg", gen(40 + 8 * i, 40, subsampling=i % 3, quality=70 + i)))
             for i in range(6)]
    transport = InstantTransport(lanes=2, job_depth=4)
    for p in paths:
        transport.learn(Path(p).read_bytes(), pillow_file(p)[0])
    # Slots of 16 x 16 pixels: every image goes to the spill area; one buffer, so every
    # batch reuses its chunks.
    with make_loader([(p, 0) for p in paths], 2, backend=InstantBackend(transport), slot_pixels=16 * 16,
                     prefetch=0, transform=list) as loader:
        held = [image for images, _ in loader for image in images]
        assert sum(len(buf.spills) for buf in loader.pool.buffers) == 1
        assert loader.stats().oversize == len(paths)
    for path, image in zip(paths, held):
        assert np.array_equal(image.permute(1, 2, 0).numpy(), pillow_file(path)[0]), path


def test_a_pool_that_fails_midway_unregisters_and_frees_what_it_made(monkeypatch):
    """The transport's memory runs out at the third buffer: the two made so far are
    unregistered from CUDA and then freed, in that order, before the MemoryError
    propagates (pinned pages freed while registered leak, and a later registration at
    the same address fails). The CUDA runtime is a stand-in: this machine has no GPU."""
    from dlbooster.runtime.pool import BatchPool

    calls = []

    class Runtime:
        def cudaHostRegister(self, ptr, size, flags):
            calls.append(("register", ptr))
            return 0

        def cudaHostUnregister(self, ptr):
            calls.append(("unregister", ptr))
            return 0

    class Handle:
        made = 0

        def __init__(self, size):
            if Handle.made == 2:
                raise MemoryError("transport memory exhausted")
            Handle.made += 1
            self.device_address, self.array = 1 << 32, np.zeros(size, np.uint8)

        def free(self):
            calls.append(("free", self.array.ctypes.data))

    monkeypatch.setattr(torch.cuda, "cudart", Runtime)
    with pytest.raises(MemoryError, match="exhausted"):
        BatchPool(2, 30, 3, allocate=Handle, pin=True)
    a, b = (ptr for kind, ptr in calls if kind == "register")
    assert calls == [("register", a), ("register", b), ("unregister", a), ("free", a), ("unregister", b), ("free", b)]


def test_a_transport_buffer_cuda_cannot_pin_is_used_unpinned(monkeypatch, caplog):
    """``cudaHostRegister`` fails for the second of two transport buffers (CUDA's
    out-of-memory code, 2): the pool warns with CUDA's message, stays usable and reports
    itself unpinned, and on close unregisters only the buffer that was registered. The
    CUDA runtime here is a stand-in that returns those codes: this machine has no GPU."""
    from dlbooster.runtime.pool import BatchPool

    calls = []

    class Runtime:
        def cudaHostRegister(self, ptr, size, flags):
            calls.append(("register", ptr, size))
            return 0 if len(calls) == 1 else 2

        def cudaHostUnregister(self, ptr):
            calls.append(("unregister", ptr))
            return 0

    class Handle:
        def __init__(self, size):
            self.device_address, self.array, self.freed = 1 << 32, np.zeros(size, np.uint8), False

        def free(self):
            self.freed = True

    monkeypatch.setattr(torch.cuda, "cudart", Runtime)
    with caplog.at_level("WARNING", logger="dlbooster.runtime.pool"):
        pool = BatchPool(2, 30, 2, allocate=Handle, pin=True)
    assert [b.registered for b in pool.buffers] == [True, False]
    assert pool.pinned is False
    assert [r.getMessage() for r in caplog.records] == ["cudaHostRegister failed: out of memory (2)"]
    ptrs = [b.host.data_ptr() for b in pool.buffers]
    handles = [b.handle for b in pool.buffers]
    assert calls == [("register", ptrs[0], 60), ("register", ptrs[1], 60)]
    buf = pool.acquire()
    buf.data[:] = 7
    assert int(buf.host.sum()) == 7 * 60
    pool.release(buf)
    pool.close()
    assert calls[2:] == [("unregister", ptrs[0])]
    assert [h.freed for h in handles] == [True, True]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_failed_cuda_pin_leaves_no_error_behind():
    """Registering memory twice fails (``cudaErrorHostMemoryAlreadyRegistered``); the
    error CUDA keeps for the thread is cleared, so the next kernel launch, which PyTorch
    checks with ``cudaGetLastError``, does not report it as its own."""
    from dlbooster.runtime.pool import _cuda_call

    memory = torch.zeros(1 << 16, dtype=torch.uint8)
    assert _cuda_call("cudaHostRegister", memory.data_ptr(), memory.numel(), 0)
    try:
        assert not _cuda_call("cudaHostRegister", memory.data_ptr(), memory.numel(), 0)
        x = torch.arange(4, device="cuda") + 1
        torch.cuda.synchronize()
        assert x.tolist() == [1, 2, 3, 4]
    finally:
        assert _cuda_call("cudaHostUnregister", memory.data_ptr())


def test_spill_rooms_come_back_in_reverse_order_and_on_clear():
    from dlbooster.runtime.pool import BatchBuffer, BatchPool

    # The pool's default limit: an eighth of a buffer's slot memory, at least 16 MiB.
    assert [b.spill_limit for b in BatchPool(64, 3 << 20, 2, pin=False).buffers] == [24 << 20] * 2
    assert BatchPool(4, 300, 1, pin=False).buffers[0].spill_limit == 16 << 20
    assert BatchPool(4, 300, 1, pin=False, spill_limit=5).buffers[0].spill_limit == 5

    class Handle:
        def __init__(self, size):
            self.size, self.device_address, self.array = size, 1 << 32, np.zeros(size, np.uint8)

    buf = BatchBuffer(np.zeros((2, 12), np.uint8))
    assert buf.spill_limit == 16 << 20
    buf.spill_limit = 64 << 20
    a = buf.spill(5000, Handle)                # two pages
    b = buf.spill(100, Handle)
    assert (a.device_address, b.device_address, a.size, b.size) == (1 << 32, (1 << 32) + 8192, 5000, 100)
    assert len(buf.spills) == 1 and buf.spills[0][0].size == 8 << 20 and buf.spills[0][1] == 3 * 4096
    a.free()                                   # not the last room: kept until clear
    assert buf.spills[0][1] == 3 * 4096
    b.free()
    a.free()
    assert buf.spills[0][1] == 0
    big = buf.spill((9 << 20) - 1000, Handle)  # larger than the chunk: a second one, in whole MiB
    assert len(buf.spills) == 2 and buf.spills[1][0].size == 9 << 20 and big.array.size == (9 << 20) - 1000
    buf.clear()
    assert [used for _, used in buf.spills] == [0, 0]
    buf.spill_limit = 20 << 20                 # 17 MiB held: a third chunk of 8 MiB would pass it
    assert buf.spill(8 << 20, Handle).offset == 0 and buf.spills[0][1] == 8 << 20
    assert buf.spill(9 << 20, Handle).offset == 0 and len(buf.spills) == 2
    assert buf.spill(4 << 20, Handle) is None and len(buf.spills) == 2
    # The smallest chunk that fits: a small image first must not take the room a larger
    # one of the same batch needs (first fit put it in the 9 MiB chunk and declined the 9 MiB image).
    buf.clear()
    buf.spills.reverse()                       # [9 MiB, 8 MiB]
    small = buf.spill(3 << 20, Handle)
    assert small.chunk is buf.spills[1] and buf.spill(9 << 20, Handle).chunk is buf.spills[0]


@pytest.mark.parametrize("device_memory", [True, False], ids=["spill", "host_slots"])
def test_instant_completion_claiming_more_than_the_output_capacity_goes_to_the_cpu(tmp_path, device_memory):
    """A completion whose size and byte count agree but exceed the capacity the job was
    given (its output buffer may be larger: a spare, a spill chunk) is a device fault."""
    paths, t, service, pool = _instant_service(tmp_path, 4, 32, 16 * 16, device_memory=device_memory)
    run_job = t._run_job

    def one_row_more(staged):
        run_job(staged)
        job, status, size, written, clocks, symbols = t._done[-1]
        w, h = size & 0xFFFF, size >> 16
        t._done[-1] = (job, status, w | (h + 1) << 16, written + 3 * w, clocks, symbols)

    t._run_job = one_row_more
    try:
        assert set(_run_once_each(paths, service, pool).values()) == {("fallback", "device-fault")}
    finally:
        service.close()
        pool.close()


@pytest.mark.parametrize("failure, reason", [(MemoryError("device memory full"), "device-memory"),
                                             (RuntimeError("Allocate failed: -12"), "device-fault")],
                         ids=["full", "transport_fault"])
def test_a_failed_input_staging_allocation_is_not_the_files_error(tmp_path, failure, reason):
    """The dispatcher reads each input into a staging buffer of device memory. When that
    allocation fails, the file is not at fault: a full memory (MemoryError) sends each
    input to the CPU as ``device-memory``; any other failure (pynq raises RuntimeError
    "Allocate failed") is a device fault, and its inputs are decoded on the CPU too."""
    paths, t, service, pool = _instant_service(tmp_path, 6, 40, 16 * 16)
    allocate = t.allocate

    def no_staging(size, *, writable=True):
        if not writable:                  # the input buffers: the device only reads them
            raise failure
        return allocate(size, writable=writable)

    t.allocate = no_staging
    try:
        assert set(_run_once_each(paths, service, pool).values()) == {("fallback", reason)}
    finally:
        service.close()
        pool.close()


@pytest.mark.parametrize("device_memory", [True, False], ids=["spill", "host_slots"])
def test_no_device_memory_for_an_output_sends_that_image_to_the_cpu(tmp_path, device_memory):
    """When the device's memory has no room for an image's output buffer, that image is
    decoded on the CPU (reason ``device-memory``) and the device stays in service."""
    paths, t, service, pool = _instant_service(tmp_path, 6, 40, 16 * 16, device_memory=device_memory)
    allocate, full = t.allocate, [True]

    def allocate_outputs_when_room(size, *, writable=True):
        if writable and full[0]:
            raise MemoryError("device memory full")
        return allocate(size, writable=writable)

    t.allocate = allocate_outputs_when_room
    try:
        assert set(_run_once_each(paths, service, pool).values()) == {("fallback", "device-memory")}
        pool.release(pool.buffers[0])
        full[0] = False
        assert set(_run_once_each(paths, service, pool).values()) == {("ok", None)}
    finally:
        service.close()
        pool.close()
