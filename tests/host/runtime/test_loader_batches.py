"""``dlbooster.Loader`` batches on the cpu backend: pixels, labels, shapes, padding, transforms.

Every delivered image equals Pillow's ``np.asarray(Image.open(path).convert("RGB"))``:
uint8 images in (n, 3, H, W) batches zero-padded to the batch's largest (h, w), with
``sizes`` (n, 2) and ``labels`` (n,) int64 as ImageFolder's. Also: a folder source lists
like ImageFolder; a batch size beyond a rank's share reserves only that share's pool
slots; an empty batch has the transform's shape; padding beyond the available memory
raises MemoryError naming the inputs; the train and eval transforms equal their own
application to Pillow's images, and a transform's views of pool memory (slots or the
spill area) are copied before the buffer is reused.
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dlbooster.runtime.transforms import eval_transform, train_transform

from jpegtools import feature_files, gen, make_jpeg, photo, photo_crop, png_bytes, skimage_data_dir
from loader_helpers import N_SHARD, WIDTH, check_batches, drain, make_loader, pillow_file, tiny_files, write


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


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    return tiny_files(tmp_path_factory.mktemp("tiny"))


# ---------------------------------------------------------------------------------
# Pillow's pixels and ImageFolder's labels


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


# ---------------------------------------------------------------------------------
# Empty batches and padding


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
    monkeypatch.setattr(transforms, "available_memory", lambda: 64 << 20)
    with make_loader([(str(wide), 0), (str(tall), 1)], 2, backend="cpu") as loader:
        with pytest.raises(MemoryError, match=r"batch 0: padding 2 images to 20000x20000 needs 2\.2 GiB.*"
                                              f"the tallest image is {re.escape(str(tall))}, "
                                              f"the widest {re.escape(str(wide))}"):
            drain(loader)
    monkeypatch.undo()
    with make_loader([(str(wide), 0), (str(tall), 1)], 1, backend="cpu") as single:
        assert [tuple(b.images.shape) for b in drain(single)] == [(1, 3, 1, 20000), (1, 3, 20000, 1)]


# ---------------------------------------------------------------------------------
# Transforms


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
