"""dlbooster.runtime.transforms: crop boxes, resizes, flips and normalisation against torchvision."""

from __future__ import annotations

import math
import os
import shutil

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2.functional as TF
from dlbooster.runtime.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    CenterCrop,
    DeviceTransform,
    RandomResizedCrop,
    eval_transform,
    pad_batch,
    train_transform,
)
from torchvision.transforms import InterpolationMode

SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


def images_of(sizes, seed=0, hwc=False):
    """Random uint8 images of the given (h, w); hwc: CHW views of HWC buffers."""
    g = torch.Generator().manual_seed(seed)
    if hwc:
        return [torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=g).permute(2, 0, 1)
                for h, w in sizes]
    return [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in sizes]


def tv_params(h, w, scale=SCALE, ratio=RATIO):
    """torchvision's RandomResizedCrop.get_params on an h x w image (global torch RNG)."""
    return T.RandomResizedCrop.get_params(torch.zeros(1).expand(3, h, w), list(scale), list(ratio))


def tv_fallback(h, w, ratio=RATIO):
    """torchvision's fallback box: a scale no candidate can fit forces it."""
    return tv_params(h, w, scale=(1e9, 1e9), ratio=ratio)


def follows_rules(box, h, w, scale, ratio):
    """Whether integer sides (height, width) can come from rounding real sides whose area
    fraction is in scale and whose aspect ratio is in ratio (each side within 0.5)."""
    _, _, bh, bw = box
    area = h * w
    return ((bw - 0.5) * (bh - 0.5) <= scale[1] * area + 1e-9
            and (bw + 0.5) * (bh + 0.5) >= scale[0] * area - 1e-9
            and (bw - 0.5) / (bh + 0.5) <= ratio[1] + 1e-9
            and (bw + 0.5) / (bh - 0.5) >= ratio[0] - 1e-9)


# --- RandomResizedCrop.params -------------------------------------------------------


@pytest.mark.parametrize("scale,ratio", [(SCALE, RATIO), ((0.5, 0.9), (0.5, 2.0))])
def test_rrc_boxes_inside_and_follow_rules_or_fallback(scale, ratio):
    g = torch.Generator().manual_seed(1)
    sizes = torch.randint(1, 600, (3000, 2), generator=g)
    sizes[:4] = torch.tensor([[1, 1], [1, 1000], [1000, 1], [600, 600]])
    boxes = RandomResizedCrop(scale=scale, ratio=ratio).params(sizes, g)
    assert boxes.dtype == torch.int64 and boxes.shape == (3000, 4)
    top, left, bh, bw = boxes.unbind(1)
    assert (bh >= 1).all() and (bw >= 1).all() and (top >= 0).all() and (left >= 0).all()
    assert (top + bh <= sizes[:, 0]).all() and (left + bw <= sizes[:, 1]).all()
    ruled = 0
    for box, (h, w) in zip(boxes.tolist(), sizes.tolist()):
        if follows_rules(box, h, w, scale, ratio):
            ruled += 1
        else:
            assert tuple(box) == tv_fallback(h, w, ratio), (box, h, w)
    # Most random sizes admit a candidate: the rule check above is not vacuous.
    assert ruled > 0.6 * len(boxes)


def test_rrc_positions_cover_the_image():
    # The first fitting candidate is placed uniformly: offsets reach both ends.
    sizes = torch.tensor([[40, 50]]).repeat(4000, 1)
    boxes = RandomResizedCrop(scale=(0.1, 0.1), ratio=(1.0, 1.0)).params(
        sizes, torch.Generator().manual_seed(2))
    assert (boxes[:, 2:] == torch.tensor([14, 14])).all()  # round(sqrt(200)) = 14
    assert set(boxes[:, 0].tolist()) == set(range(40 - 14 + 1))
    assert set(boxes[:, 1].tolist()) == set(range(50 - 14 + 1))


@pytest.mark.parametrize("h,w,scale,ratio", [
    (1, 1000, SCALE, RATIO),          # too thin for any candidate: wide fallback
    (1000, 1, SCALE, RATIO),          # tall fallback
    (2, 1000, SCALE, RATIO),
    (1, 1, SCALE, RATIO),
    (300, 400, (2.0, 3.0), RATIO),    # area never fits: whole image (ratio 4/3 allowed)
    (100, 100, (2.0, 3.0), (2.0, 3.0)),  # square image, wide ratios: clamped to 2
    (90, 1000, (2.0, 3.0), RATIO),
])
def test_rrc_fallback_degenerate_sizes(h, w, scale, ratio):
    expected = tv_fallback(h, w, ratio)
    boxes = RandomResizedCrop(scale=scale, ratio=ratio).params(
        torch.tensor([[h, w]] * 50), torch.Generator().manual_seed(3))
    assert (boxes == torch.tensor(expected)).all(), (boxes[0].tolist(), expected)
    if (h, w) == (1, 1000):
        assert expected == (0, 499, 1, 1)
    if (h, w) == (100, 100):
        assert expected == (25, 0, 50, 100)


def test_rrc_fallback_sides_at_least_one_pixel():
    # A 5 x 1 image with ratio >= 3: torchvision's fallback is round(1 / 3) = 0 rows high;
    # ours keeps one row.
    assert tv_fallback(5, 1, (3.0, 4.0)) == (2, 0, 0, 1)
    boxes = RandomResizedCrop(ratio=(3.0, 4.0)).params(
        torch.tensor([[5, 1]]), torch.Generator().manual_seed(0))
    assert boxes.tolist() == [[2, 0, 1, 1]]


@pytest.mark.parametrize("h,w", [(375, 500), (100, 900), (640, 480)])
def test_rrc_distribution_matches_torchvision(h, w):
    n = 4000
    ours = RandomResizedCrop().params(torch.tensor([[h, w]] * n), torch.Generator().manual_seed(4))
    torch.manual_seed(4)
    ref = torch.tensor([tv_params(h, w) for _ in range(n)], dtype=torch.float64)
    ours = ours.double()

    def stats(boxes):
        frac = boxes[:, 2] * boxes[:, 3] / (h * w)
        log_ratio = (boxes[:, 3] / boxes[:, 2]).log()
        fallback = (boxes == torch.tensor(tv_fallback(h, w), dtype=torch.float64)).all(1)
        return (frac.mean().item(), frac.quantile(0.25).item(), frac.quantile(0.75).item(),
                log_ratio.mean().item(), fallback.double().mean().item(),
                (boxes[:, 0] / (h - boxes[:, 2] + 1)).mean().item())

    got, want = stats(ours), stats(ref)
    for name, a, b, tol in zip(("mean area", "q25 area", "q75 area", "mean log ratio",
                                "fallback rate", "relative top"), got, want,
                               (0.02, 0.03, 0.03, 0.015, 0.02, 0.03)):
        assert abs(a - b) < tol, (name, a, b)


def test_params_rejects_bad_sizes():
    crop = RandomResizedCrop()
    g = torch.Generator()
    for sizes in (torch.tensor([3, 4]), torch.tensor([[3, 4, 5]]), torch.tensor([[3.0, 4.0]]),
                  torch.tensor([[0, 4]]), torch.tensor([[3, -1]])):
        with pytest.raises(ValueError):
            crop.params(sizes, g)
        with pytest.raises(ValueError):
            CenterCrop().params(sizes)


# --- crop + resize ------------------------------------------------------------------


@pytest.mark.parametrize("antialias", [True, False])
def test_rrc_resize_matches_torchvision_resized_crop(antialias):
    sizes = [(375, 500), (60, 40), (224, 224), (17, 300), (500, 120)]
    images = images_of(sizes, seed=5)
    crop = RandomResizedCrop(size=64, antialias=antialias)
    boxes = crop.params(torch.tensor(sizes), torch.Generator().manual_seed(6))
    fast = crop(images, torch.Generator().manual_seed(6))       # CPU default: uint8 kernel
    crop.uint8_resize = False
    out = crop(images, torch.Generator().manual_seed(6))
    assert out.shape == fast.shape == (5, 3, 64, 64) and out.dtype == fast.dtype == torch.float32
    # Both downscaling and upscaling boxes are exercised.
    assert (boxes[:, 2:] > 64).any() and (boxes[:, 2:] < 64).any()
    for image, box, got, got_u8 in zip(images, boxes.tolist(), out, fast):
        want = TF.resized_crop(image.float(), *box, [64, 64], antialias=antialias)
        assert (got - want).abs().max() <= 1e-3
        # torchvision's own uint8 kernel rounds to integers: within one level of ours,
        # and the CPU's uint8 path is exactly that kernel.
        want_u8 = TF.resized_crop(image, *box, [64, 64], antialias=antialias)
        assert (got.round() - want_u8.float()).abs().max() <= 1
        assert torch.equal(got_u8, want_u8.float())


def test_center_crop_geometry_matches_torchvision_resize_center_crop():
    tv = T.Compose([T.Resize(256, interpolation=InterpolationMode.NEAREST), T.CenterCrop(224)])
    sizes = [(375, 500), (500, 375), (333, 500), (256, 256), (224, 300), (17, 23), (10, 200),
             (480, 640), (1200, 257), (257, 1200)]
    boxes = CenterCrop().params(torch.tensor(sizes))
    for (h, w), (top, left, bh, bw) in zip(sizes, boxes.tolist()):
        rows = torch.arange(h, dtype=torch.float32).view(h, 1).expand(h, w)
        cols = torch.arange(w, dtype=torch.float32).view(1, w).expand(h, w)
        kept = tv(torch.stack([rows, cols]))
        # Source pixels torchvision keeps: its first and last row and column.
        first_row, last_row = kept[0].min().item(), kept[0].max().item()
        first_col, last_col = kept[1].min().item(), kept[1].max().item()
        assert abs(top - first_row) <= 1 and abs(top + bh - 1 - last_row) <= 1, (h, w, top, bh)
        assert abs(left - first_col) <= 1 and abs(left + bw - 1 - last_col) <= 1, (h, w, left, bw)
    # A 375 x 500 image: resized to 256 x 341, rows 16..240 kept, i.e. source rows
    # 23.4..351.6 (edges rounded: 23..352), columns 58..282 of 341 (85..413 of 500).
    assert boxes[0].tolist() == [23, 85, 329, 328]


def test_center_crop_values_close_to_torchvision():
    # A smooth image: one resampling instead of two and the edge rounding move values
    # only slightly.
    h, w = 375, 500
    y = torch.arange(h, dtype=torch.float32).view(h, 1)
    x = torch.arange(w, dtype=torch.float32).view(1, w)
    smooth = torch.stack([128 + 100 * torch.sin(y / 40 + x / 55),
                          (128 + 100 * torch.cos(x / 30)).expand(h, w),
                          (x * 0.5).expand(h, w)]).round().to(torch.uint8)
    ours = CenterCrop()([smooth])[0]
    ref = TF.center_crop(TF.resize(smooth.float(), [256]), [224])
    diff = (ours - ref).abs()
    assert diff.mean() < 1.0 and diff.max() < 4.0, (diff.mean(), diff.max())


def test_rejects_bad_crop_arguments():
    for kw in ({"size": 0}, {"size": 2.5}, {"size": True}, {"scale": (0.9, 0.1)},
               {"scale": (-0.1, 1.0)}, {"scale": (0.0, 0.0)}, {"scale": (0.1, math.inf)},
               {"scale": 0.5}, {"ratio": (0.0, 1.0)}, {"ratio": (2.0, 1.0)}, {"ratio": (1, 2, 3)}):
        with pytest.raises(ValueError):
            RandomResizedCrop(**kw)
    for kw in ({"size": 300}, {"size": 0}, {"resize": -1}):
        with pytest.raises(ValueError):
            CenterCrop(**kw)
    # The message states the rule that was broken.
    with pytest.raises(ValueError, match=r"scale must be a finite \(min, max\) pair with 0 <= min <= max and max > 0, "
                                         r"got \(0, 0\)"):
        RandomResizedCrop(scale=(0, 0))
    with pytest.raises(ValueError, match=r"ratio must be a finite \(min, max\) pair with 0 < min <= max, got \(0, 1\)"):
        RandomResizedCrop(ratio=(0, 1))


def test_crop_sizes_of_any_integer_type_are_plain_ints():
    crops = [RandomResizedCrop(np.int64(8)), CenterCrop(np.int32(8), np.uint16(10)), train_transform(np.int64(8)).crop]
    assert [type(c.size) for c in crops] == [int, int, int] and [c.size for c in crops] == [8, 8, 8]
    assert type(crops[1].resize) is int and crops[1].resize == 10
    with pytest.raises(ValueError, match="positive int"):
        RandomResizedCrop(np.int64(0))


# --- DeviceTransform ----------------------------------------------------------------


def identity_transform(**kw):
    """8 x 8 images through an 8 x 8 crop of the whole image: interpolation is exact."""
    return DeviceTransform(CenterCrop(size=8, resize=8), **kw)


def test_identity_crop_is_exact():
    images = images_of([(8, 8)] * 3, seed=7)
    out = CenterCrop(size=8, resize=8)(images)
    assert torch.equal(out, torch.stack(images).float())


def test_normalisation_exact():
    images = images_of([(8, 8)] * 4, seed=8)
    out = identity_transform(flip=False, channels_last=False)(images)
    x = torch.stack(images).float()
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert torch.equal(out, (x / 255 - mean) / std)
    want64 = (x.double() / 255 - mean.double()) / std.double()
    assert (out.double() - want64).abs().max() < 1e-6
    # Pixel 0 -> -mean/std, pixel 255 -> (1 - mean)/std.
    edge = identity_transform(flip=False, mean=(0.5, 0.25, 0.0), std=(0.5, 0.25, 2.0))(
        [torch.tensor([0, 255], dtype=torch.uint8).repeat_interleave(32).view(1, 8, 8).expand(3, 8, 8)])
    assert edge[0, :, 0, 0].tolist() == [-1.0, -1.0, 0.0]
    assert edge[0, :, 7, 7].tolist() == [1.0, 3.0, 0.5]


def test_flip_fraction_and_mirror_images():
    n = 2000
    images = images_of([(8, 8)] * n, seed=9)
    out = identity_transform(mean=(0, 0, 0), std=(1, 1, 1))(images)
    plain = torch.stack(images).float() / 255
    same = (out == plain).flatten(1).all(1)
    mirrored = (out == plain.flip(-1)).flatten(1).all(1)
    # Every output is exactly the image or exactly its mirror image (random images are
    # never symmetric), and about half are mirrored.
    assert (same ^ mirrored).all()
    assert 0.45 < mirrored.double().mean().item() < 0.55
    unflipped = identity_transform(flip=False, mean=(0, 0, 0), std=(1, 1, 1))(images)
    assert torch.equal(unflipped, plain)


def test_set_epoch_reproducible():
    sizes = [(375, 500), (120, 90), (64, 64), (500, 333)]
    images = images_of(sizes, seed=10)
    a, b = train_transform(size=32, seed=3), train_transform(size=32, seed=3)
    a.set_epoch(2)
    b.set_epoch(2)
    first = a(images)
    assert torch.equal(first, b(images))
    assert torch.equal(a(images), b(images))  # and the streams stay in step
    assert not torch.equal(first, a(images))  # next batch of the epoch: new draws
    a.set_epoch(2)
    assert torch.equal(a(images), first)
    boxes = {}
    for epoch in (2, 3):
        a.set_epoch(epoch)
        boxes[epoch] = a.crop.params(torch.tensor(sizes), a.generator)
    assert not torch.equal(boxes[2], boxes[3])
    a.set_epoch(3)
    assert not torch.equal(a(images), first)
    # seed + epoch: seed 4, epoch 1 is seed 3, epoch 2.
    c = train_transform(size=32, seed=4)
    c.set_epoch(1)
    assert torch.equal(c(images), first)


def test_noncontiguous_hwc_views_accepted():
    sizes = [(375, 500), (90, 120), (33, 17)]
    views = images_of(sizes, seed=11, hwc=True)
    assert not any(v.is_contiguous() for v in views)
    dense = [v.contiguous() for v in views]
    for make in (lambda: train_transform(size=48, seed=1), lambda: eval_transform(size=48)):
        got, want = make()(views), make()(dense)
        assert (got - want).abs().max() < 1e-4
    padded, _ = pad_batch(views)
    assert torch.equal(padded, pad_batch(dense)[0])


def test_dtype_and_memory_format():
    images = images_of([(100, 80), (50, 70)], seed=12)
    out = train_transform(size=16, dtype=torch.bfloat16)(images)
    assert out.shape == (2, 3, 16, 16) and out.dtype == torch.bfloat16
    assert out.is_contiguous(memory_format=torch.channels_last)
    out = eval_transform(size=16, resize=20, channels_last=False)(images)
    assert out.dtype == torch.float32 and out.is_contiguous()
    # Normalised values of uint8 pixels stay within (0 - mean)/std .. (1 - mean)/std.
    assert out.min() >= -0.485 / 0.229 - 1e-5 and out.max() <= (1 - 0.406) / 0.225 + 1e-5


def test_eval_transform_is_deterministic_and_unflipped():
    images = images_of([(375, 500), (200, 100)], seed=13)
    t = eval_transform(size=24, resize=28)
    first = t(images)
    assert torch.equal(first, t(images))
    crop = CenterCrop(24, 28)(images)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert torch.equal(first, (crop / 255 - mean) / std)


def test_stays_on_the_images_device():
    # The meta device has no data: CPU operands in device arithmetic (a mean tensor
    # left on the CPU, say) raise, as on CUDA.
    images = [torch.empty(3, 100, 80, dtype=torch.uint8, device="meta"),
              torch.empty(50, 70, 3, dtype=torch.uint8, device="meta").permute(2, 0, 1)]
    for t in (train_transform(size=16), eval_transform(size=16, resize=20)):
        out = t(images)
        assert out.device.type == "meta" and out.shape == (2, 3, 16, 16)
    batch, sizes = pad_batch(images)
    assert batch.device.type == "meta" and batch.shape == (2, 3, 100, 80)
    assert sizes.device.type == "cpu" and sizes.tolist() == [[100, 80], [50, 70]]


# --- pad_batch ----------------------------------------------------------------------


def test_pad_batch_shapes_and_zeros():
    sizes = [(5, 7), (9, 3), (2, 2)]
    images = [im.clamp(min=1) for im in images_of(sizes, seed=14)]  # no zeros of their own
    batch, got_sizes = pad_batch(images)
    assert batch.shape == (3, 3, 9, 7) and batch.dtype == torch.uint8
    assert got_sizes.dtype == torch.int64 and got_sizes.tolist() == [list(s) for s in sizes]
    for i, (h, w) in enumerate(sizes):
        assert torch.equal(batch[i, :, :h, :w], images[i])
        assert (batch[i, :, h:, :] == 0).all() and (batch[i, :, :, w:] == 0).all()
    assert (batch != 0).sum() == sum(3 * h * w for h, w in sizes)


def test_pad_batch_refuses_padding_beyond_the_memory_available_before_allocating(monkeypatch):
    """65500x1 and 1x65500 images (small, valid) pad to 24 GiB: a MemoryError with the
    figures, before any allocation, instead of zero-filling pages until the OOM killer
    comes. The limit is the system's available memory, replaced here by 1 GiB."""
    import dlbooster.runtime.transforms as transforms

    monkeypatch.setattr(transforms, "available_memory", lambda: 1 << 30)
    images = [torch.ones(3, 65500, 1, dtype=torch.uint8), torch.ones(3, 1, 65500, dtype=torch.uint8)]
    allocations = []
    monkeypatch.setattr(torch.Tensor, "new_zeros", lambda *a, **k: allocations.append(a))
    with pytest.raises(MemoryError, match=r"padding 2 images to 65500x65500 needs 24\.0 GiB, more than the 1\.0 GiB"):
        pad_batch(images)
    assert allocations == []
    monkeypatch.undo()
    # The bound is exact; batches of up to 64 MiB are not checked (no file read each).
    images = [torch.ones(3, 4096, 2, dtype=torch.uint8), torch.ones(3, 2, 4096, dtype=torch.uint8)]
    need = 2 * 4096 * 4096 * 3
    monkeypatch.setattr(transforms, "available_memory", lambda: need - 1)
    with pytest.raises(MemoryError, match="needs 0.1 GiB"):
        pad_batch(images)
    monkeypatch.setattr(transforms, "available_memory", lambda: need)
    assert pad_batch(images)[0].shape == (2, 3, 4096, 4096)
    monkeypatch.setattr(transforms, "available_memory", lambda: 0)
    assert pad_batch(images_of([(5, 7), (9, 3)], seed=3))[0].shape == (2, 3, 9, 7)


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="no /proc/meminfo")
def test_available_memory_is_at_most_memavailable():
    from dlbooster.runtime.transforms import available_memory

    with open("/proc/meminfo") as f:
        line = next(line for line in f if line.startswith("MemAvailable:"))
    assert 0 < available_memory() <= int(line.split()[1]) * 1024 + (1 << 30)


def test_available_memory_takes_the_tightest_cgroup_limit(tmp_path):
    """A container's limit is not in MemAvailable: the headroom of every memory cgroup
    limit on the process's path counts, v2 and v1 ("max" and v1's ~2^63 mean none)."""
    from dlbooster.runtime.transforms import available_memory

    gib = 1 << 30

    def tree(cgroup_lines: str, files: dict[str, str]):
        proc, cg = tmp_path / "proc", tmp_path / "cg"
        shutil.rmtree(proc, ignore_errors=True)
        shutil.rmtree(cg, ignore_errors=True)
        (proc / "self").mkdir(parents=True)
        (proc / "meminfo").write_text(f"MemTotal: {16 * gib // 1024} kB\nMemAvailable: {8 * gib // 1024} kB\n")
        (proc / "self" / "cgroup").write_text(cgroup_lines)
        for name, text in files.items():
            (cg / name).parent.mkdir(parents=True, exist_ok=True)
            (cg / name).write_text(text)
        return available_memory(str(proc), str(cg))

    assert tree("0::/\n", {}) == 8 * gib
    assert tree("0::/a/b\n", {"a/b/memory.max": "max\n", "a/b/memory.current": "1\n",
                               "a/memory.max": f"{2 * gib}\n", "a/memory.current": f"{3 * gib // 2}\n"}) == gib // 2
    assert tree("4:memory:/x\n0::/\n", {"memory/x/memory.limit_in_bytes": "9223372036854771712\n",
                                        "memory/x/memory.usage_in_bytes": "5\n",
                                        "memory/memory.limit_in_bytes": f"{gib}\n",
                                        "memory/memory.usage_in_bytes": f"{gib // 4}\n"}) == 3 * gib // 4
    assert tree("0::/a\n", {"a/memory.max": f"{gib}\n", "a/memory.current": f"{2 * gib}\n"}) == 0
    assert available_memory(str(tmp_path / "none"), str(tmp_path / "none")) is None


# --- bad inputs ---------------------------------------------------------------------


def good():
    return torch.zeros(3, 4, 5, dtype=torch.uint8)


@pytest.mark.parametrize("images,match", [
    ([], "empty"),
    ([good(), torch.zeros(3, 4, 5)], "image 1 has dtype"),
    ([good(), good(), torch.zeros(4, 5, dtype=torch.uint8)], "image 2 has shape"),
    ([torch.zeros(4, 4, 5, dtype=torch.uint8)], "image 0 has shape"),
    ([good(), torch.zeros(4, 5, 3, dtype=torch.uint8)], "image 1 has shape"),
    ([good(), torch.zeros(3, 0, 5, dtype=torch.uint8)], "image 1 has shape"),
    ([good(), torch.zeros(3, 4, 5, dtype=torch.uint8, device="meta")], "image 1 is on meta"),
])
def test_bad_images_raise(images, match):
    for fn in (pad_batch, train_transform(size=8), eval_transform(size=8, resize=9),
               lambda ims: RandomResizedCrop(8)(ims, torch.Generator())):
        with pytest.raises(ValueError, match=match):
            fn(images)


def test_non_tensor_raises():
    with pytest.raises(TypeError, match="image 1"):
        pad_batch([good(), [[1]]])


def test_rejects_bad_transform_arguments():
    for kw in ({"std": (0.1, 0.0, 0.2)}, {"mean": (0.5, 0.5)}, {"dtype": torch.uint8},
               {"mean": (math.nan, 0, 0)}):
        with pytest.raises(ValueError):
            identity_transform(**kw)
    with pytest.raises(TypeError):
        DeviceTransform(lambda ims, g: ims)
    with pytest.raises(TypeError, match=r"torch\.dtype .*'float16'"):
        identity_transform(dtype="float16")
    for seed in (1.7, True, "3"):                 # was truncated to int(1.7) == 1
        with pytest.raises(TypeError, match=f"seed must be an int, got {seed!r}"):
            train_transform(8, seed=seed)
    assert train_transform(8, seed=np.int64(3)).seed == 3
