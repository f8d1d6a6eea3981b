"""Device-side image transforms for the loader: crop, resize, flip and normalise in torch.

The decoder hands the loader a list of ``N`` uint8 RGB images, each a ``(3, h_i, w_i)``
tensor (sizes differ; often a non-contiguous CHW view of an HWC buffer), all on one
device. The transforms here turn such a list into one batched float tensor with torch
ops that run on that device (CPU or CUDA): no PIL and no numpy on the hot path. Only
the random draws run on the CPU, vectorised over the batch, with a ``torch.Generator``
that :meth:`DeviceTransform.set_epoch` reseeds so that runs are reproducible.

- :class:`RandomResizedCrop`: the training crop of torchvision's
  ``RandomResizedCrop`` (Inception-style scale augmentation), same rules and
  distribution, drawn for the whole batch at once.
- :class:`CenterCrop`: the evaluation crop, ``Resize(resize)`` + ``CenterCrop(size)``
  geometry as one crop box on the original image and one resize.
- :class:`DeviceTransform`: crop, then random horizontal flip and mean/std
  normalisation; :func:`train_transform` and :func:`eval_transform` build the usual ones.
- :func:`pad_batch`: zero-pads the images into one uint8 batch, for loaders that want
  the decoded pixels untouched.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "available_memory",
    "CenterCrop",
    "DeviceTransform",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "RandomResizedCrop",
    "eval_transform",
    "pad_batch",
    "train_transform",
]

#: Per-channel RGB mean and standard deviation of ImageNet on a 0..1 scale, the values
#: torchvision's pretrained models expect.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Candidates drawn per image before falling back to the central crop; torchvision's value.
_TRIES = 10


def _check_images(images: Sequence[Tensor]) -> Tensor:
    """Validate a batch of images; return their (N, 2) int64 CPU (h, w) sizes.

    Raises ValueError for an empty batch, or naming the index of an image that is not
    uint8, not (3, h, w) with h, w >= 1, or not on the device of image 0; TypeError for
    an element that is not a tensor.
    """
    if len(images) == 0:
        raise ValueError("empty image list")
    device = None
    for i, image in enumerate(images):
        if not isinstance(image, Tensor):
            raise TypeError(f"image {i} is a {type(image).__name__}, not a torch.Tensor")
        if image.dtype != torch.uint8:
            raise ValueError(f"image {i} has dtype {image.dtype}, expected torch.uint8")
        if image.dim() != 3 or image.shape[0] != 3 or image.shape[1] < 1 or image.shape[2] < 1:
            raise ValueError(
                f"image {i} has shape {tuple(image.shape)}, expected (3, h, w) with h, w >= 1")
        if device is None:
            device = image.device
        elif image.device != device:
            raise ValueError(f"image {i} is on {image.device}, image 0 on {device}")
    # Shapes are host metadata: building the sizes costs no device synchronisation.
    return torch.tensor([image.shape[1:] for image in images], dtype=torch.int64)


def _check_sizes(sizes: Tensor) -> Tensor:
    """Validate an (N, 2) integer CPU tensor of (h, w) sizes; return it as int64."""
    if not isinstance(sizes, Tensor):
        raise TypeError(f"sizes is a {type(sizes).__name__}, not a torch.Tensor")
    if (sizes.dim() != 2 or sizes.shape[1] != 2 or sizes.device.type != "cpu"
            or sizes.dtype.is_floating_point or sizes.dtype.is_complex or sizes.dtype == torch.bool):
        raise ValueError(
            f"sizes must be an (N, 2) integer CPU tensor of (h, w), got {tuple(sizes.shape)} "
            f"{sizes.dtype} on {sizes.device}")
    sizes = sizes.to(torch.int64)
    if sizes.numel() and int(sizes.min()) < 1:
        raise ValueError("sizes must be >= 1")
    return sizes


def _check_size(name: str, value) -> int:
    # Any integer type (NumPy's too, as argparse or a config may hand over), never a bool.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _check_range(name: str, value, zero_ok: bool) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (min, max) pair of numbers, got {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and (lo >= 0 if zero_ok else lo > 0) and lo <= hi and hi > 0):
        rule = "0 <= min <= max and max > 0" if zero_ok else "0 < min <= max"
        raise ValueError(f"{name} must be a finite (min, max) pair with {rule}, got {value!r}")
    return lo, hi


class _ResizedCrop:
    """Shared part of the crops: one box per image, cut out and resized to size x size.

    Subclasses define ``params(sizes, generator)``, the (N, 4) int64 boxes.
    """

    #: Resize uint8 crops directly (True), as float (False), or uint8 on the CPU only (None).
    uint8_resize: bool | None = None

    def __init__(self, size: int, antialias: bool):
        self.size = _check_size("size", size)
        self.antialias = bool(antialias)

    def __call__(self, images: Sequence[Tensor], generator: torch.Generator | None = None, *,
                 memory_format: torch.memory_format = torch.contiguous_format) -> Tensor:
        """Crop each image to its box from :meth:`params` and resize it to size x size.

        ``images``: N uint8 tensors of shape (3, h_i, w_i) on one device, any strides.
        ``generator``: the CPU generator for the random draws. Returns a float32
        (N, 3, size, size) tensor on the images' device, values in 0..255 (bilinear
        interpolation stays within the input range up to rounding), in ``memory_format``.
        Raises ValueError for an empty list or (naming the index) an image of the wrong
        dtype, shape or device, TypeError for a non-tensor.

        The resize is ``torch.nn.functional.interpolate(mode="bilinear",
        align_corners=False, antialias=self.antialias)``, the kernel torchvision's tensor
        ``resized_crop`` uses, so on the same box the result equals
        ``torchvision.transforms.v2.functional.resized_crop`` on the float image (with
        ``uint8_resize=False``; on the CPU the default resizes the uint8 crop, as
        torchvision does for uint8 tensors).
        """
        sizes = _check_images(images)
        return self._resize(images, self.params(sizes, generator), None, memory_format)

    def _resize(self, images: Sequence[Tensor], boxes: Tensor, mirrored: list[bool] | None,
                memory_format: torch.memory_format) -> Tensor:
        """Crop image i to ``boxes[i]``, resize it, mirror it when ``mirrored[i]``."""
        boxes = boxes.tolist()
        out = torch.empty((len(images), 3, self.size, self.size), dtype=torch.float32,
                          device=images[0].device, memory_format=memory_format)
        # On the CPU, uint8 input takes PyTorch's vectorised uint8 kernel (about 3x the
        # float path; results within one level of it). Elsewhere bilinear interpolation
        # is not implemented for uint8 on every device, so the crop goes to float first.
        uint8 = self.uint8_resize if self.uint8_resize is not None else images[0].device.type == "cpu"
        for i, (image, (top, left, height, width)) in enumerate(zip(images, boxes)):
            crop = image[:, top:top + height, left:left + width].unsqueeze(0)
            resized = F.interpolate(crop if uint8 else crop.float(), size=(self.size, self.size),
                                    mode="bilinear", align_corners=False, antialias=self.antialias)[0]
            # Mirroring the small resized image is exact and cheaper than the batch later.
            out[i] = resized.flip(-1) if mirrored is not None and mirrored[i] else resized
        return out


class RandomResizedCrop(_ResizedCrop):
    """Random crop of random area and aspect ratio, resized to ``size`` x ``size``.

    The training augmentation of Szegedy et al., "Going deeper with convolutions" (2015),
    with the rules of ``torchvision.transforms.RandomResizedCrop.get_params``: up to 10
    candidates per image, each with an area fraction uniform in ``scale`` and an aspect
    ratio (width / height) log-uniform in ``ratio``, sides rounded to whole pixels; the
    first candidate that fits in the image is placed uniformly at random, and when none
    fits the crop is the central one whose aspect ratio is the image's clamped to
    ``ratio``.

    ``size``: output side in pixels (int >= 1). ``scale``: (min, max) area fraction,
    0 <= min <= max, max > 0 (above 1 is allowed, as in torchvision, and only makes
    candidates miss more often). ``ratio``: (min, max) aspect ratio, 0 < min <= max.
    ``antialias``: antialiased bilinear resize (torchvision's default). Bad values raise
    ValueError (torchvision only warns about reversed ranges).
    """

    def __init__(self, size: int = 224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                 antialias: bool = True):
        super().__init__(size, antialias)
        self.scale = _check_range("scale", scale, zero_ok=True)
        self.ratio = _check_range("ratio", ratio, zero_ok=False)

    def params(self, sizes: Tensor, generator: torch.Generator | None) -> Tensor:
        """Draw one crop box per image.

        ``sizes``: (N, 2) integer CPU tensor of image (h, w), each >= 1. ``generator``:
        CPU ``torch.Generator`` (None: torch's default one). Returns an (N, 4) int64 CPU
        tensor of (top, left, height, width) in pixels, every box inside its image with
        height, width >= 1. Raises ValueError for a malformed ``sizes``.

        All N x 10 candidates are drawn at once, so the random stream differs from
        torchvision's (which draws one number at a time and stops at the first fit) and
        does not depend on which candidates fit: the boxes follow torchvision's
        distribution and rules, not its sequence. Each call consumes 22 N float64 draws.
        """
        sizes = _check_sizes(sizes)
        n = sizes.shape[0]
        h_img = sizes[:, :1].double()
        w_img = sizes[:, 1:].double()
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        area = h_img * w_img * torch.empty(n, _TRIES, dtype=torch.float64).uniform_(
            self.scale[0], self.scale[1], generator=generator)
        aspect = torch.empty(n, _TRIES, dtype=torch.float64).uniform_(
            lo, hi, generator=generator).exp_()
        # torch.round rounds half to even, like the Python round() torchvision uses.
        w = (area * aspect).sqrt_().round_()
        h = (area / aspect).sqrt_().round_()
        fits = (w > 0) & (w <= w_img) & (h > 0) & (h <= h_img)
        # argmax returns the first maximum: the first candidate that fits, per image.
        first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)
        h = h.gather(1, first)
        w = w.gather(1, first)
        # Uniform integer offsets in [0, h_img - h], as torch.randint(0, h_img - h + 1);
        # the clamp guards against u * n rounding up to n.
        u = torch.rand(n, 2, dtype=torch.float64, generator=generator)
        top = torch.minimum((u[:, :1] * (h_img - h + 1)).floor_(), h_img - h)
        left = torch.minimum((u[:, 1:] * (w_img - w + 1)).floor_(), w_img - w)
        boxes = torch.cat([top, left, h, w], dim=1).to(torch.int64)
        missed = ~fits.any(dim=1)
        boxes[missed] = self._fallback(sizes[missed])
        return boxes

    def _fallback(self, sizes: Tensor) -> Tensor:
        """torchvision's fallback: the central crop with aspect ratio clamped to ratio.

        Sides are clamped to at least 1 pixel, where torchvision would return an empty
        box (an image narrower than 1 / min(ratio) pixels with min(ratio) > 1, say).
        """
        h_img, w_img = sizes[:, 0], sizes[:, 1]
        in_ratio = w_img.double() / h_img.double()
        rmin, rmax = self.ratio
        narrow = in_ratio < rmin
        wide = in_ratio > rmax
        h = torch.where(narrow, (w_img.double() / rmin).round().long(), h_img).clamp(1)
        w = torch.where(wide, (h_img.double() * rmax).round().long(), w_img).clamp(1)
        h = torch.minimum(h, h_img)
        w = torch.minimum(w, w_img)
        return torch.stack([(h_img - h) // 2, (w_img - w) // 2, h, w], dim=1)


class CenterCrop(_ResizedCrop):
    """Evaluation crop: the geometry of ``Resize(resize)`` + ``CenterCrop(size)``.

    torchvision's pair resizes the shorter side to ``resize`` (the longer one to
    ``int(resize * long / short)``) and takes the central ``size`` x ``size`` square,
    ``round((side - size) / 2)`` from the top/left. Here that square is mapped back onto
    the original image (resized coordinate y is source coordinate y * h / new_h, the
    ``align_corners=False`` convention) and its edges rounded to whole pixels, so each
    image gets one crop box and one resize straight to ``size`` x ``size``: the same
    source region to within one pixel at each edge, and one resampling instead of two.
    Pixel values therefore differ slightly from torchvision's tensor path, and more from
    its PIL path (PIL resamples uint8 with its own rounding).

    ``size``: output side (int >= 1); ``resize``: the shorter side before cropping (int,
    >= size: torchvision would pad a larger crop). ``antialias``: antialiased bilinear
    resize. Bad values raise ValueError.
    """

    def __init__(self, size: int = 224, resize: int = 256, antialias: bool = True):
        super().__init__(size, antialias)
        self.resize = _check_size("resize", resize)
        if resize < size:
            raise ValueError(f"resize ({resize}) must be >= size ({size})")

    def params(self, sizes: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The crop box of each image; deterministic, ``generator`` is ignored.

        ``sizes``: (N, 2) integer CPU tensor of (h, w), each >= 1. Returns an (N, 4)
        int64 CPU tensor of (top, left, height, width) in source pixels, inside the
        image, height and width >= 1. Raises ValueError for a malformed ``sizes``.
        """
        sizes = _check_sizes(sizes)
        src = sizes.double()
        short = src.min(dim=1, keepdim=True).values
        # torchvision: new_long = int(resize * long / short), in float64 as in Python.
        resized = (self.resize * src / short).floor_()
        start = ((resized - self.size) / 2).round_()
        scale = src / resized
        lo = (start * scale).round_()
        hi = ((start + self.size) * scale).round_()
        extent = torch.minimum((hi - lo).clamp_(min=1), src)
        lo = torch.minimum(lo, src - extent)
        return torch.cat([lo, extent], dim=1).to(torch.int64)


class DeviceTransform:
    """Crop, random horizontal flip and normalisation of a batch, on the images' device.

    ``crop``: a :class:`RandomResizedCrop` or :class:`CenterCrop`. ``flip``: mirror each
    image left-right with probability 0.5. ``mean``, ``std``: per-channel RGB statistics
    on a 0..1 scale (default ImageNet's); the output is ``(x / 255 - mean) / std``
    computed in float32, then cast to ``dtype``. ``seed``: base seed of the CPU generator
    for crops and flips; :meth:`set_epoch` reseeds it with ``seed + epoch`` (construction
    seeds it as epoch 0). ``channels_last``: return the batch in
    ``torch.channels_last`` memory format (what convolutions on CUDA prefer).

    The generator is this object's own state: one transform serves one stream of
    batches, calls are not thread-safe, and the same seed, epoch and sequence of
    batches give identical outputs.
    """

    def __init__(self, crop: RandomResizedCrop | CenterCrop, flip: bool = True,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD, seed: int = 0,
                 dtype: torch.dtype = torch.float32, channels_last: bool = True):
        if not isinstance(crop, _ResizedCrop):
            raise TypeError(f"crop must be a RandomResizedCrop or CenterCrop, got {crop!r}")
        mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        if len(mean) != 3 or len(std) != 3:
            raise ValueError("mean and std must have one value per RGB channel")
        if not all(math.isfinite(s) and s > 0 for s in std) or not all(map(math.isfinite, mean)):
            raise ValueError(f"std must be finite and > 0 and mean finite, got {mean}, {std}")
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype (e.g. torch.float16), got {dtype!r}")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating point dtype, got {dtype}")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.crop = crop
        self.flip = bool(flip)
        self.mean = mean
        self.std = std
        self.seed = int(seed)
        self.dtype = dtype
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.generator = torch.Generator()
        self._stats: dict[str, tuple[Tensor, Tensor]] = {}
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Reseed the generator with ``seed + epoch``: each epoch gets its own draws."""
        self.generator.manual_seed(self.seed + int(epoch))

    def __call__(self, images: Sequence[Tensor]) -> Tensor:
        """Transform a batch.

        ``images``: N uint8 (3, h_i, w_i) tensors on one device, any strides. Returns an
        (N, 3, size, size) tensor of ``dtype`` on that device, normalised as described
        above. Raises ValueError for an empty list or (naming the index) an image of the
        wrong dtype, shape or device, TypeError for a non-tensor.
        """
        sizes = _check_images(images)
        boxes = self.crop.params(sizes, self.generator)
        mirrored = None
        if self.flip:
            # Drawn after the crop boxes, from the same generator, on the CPU.
            mirrored = (torch.rand(len(images), generator=self.generator) < 0.5).tolist()
        x = self.crop._resize(images, boxes, mirrored, self.memory_format)
        mean, std = self._statistics(x.device)
        # Three whole-batch ops, element for element the arithmetic (x / 255 - mean) / std.
        x.div_(255).sub_(mean).div_(std)
        return x.to(dtype=self.dtype, memory_format=self.memory_format)

    def empty(self, device: torch.device | str = "cpu") -> Tensor:
        """The output for a batch with no image: a (0, 3, size, size) tensor of ``dtype``
        on ``device``, in the transform's memory format (a model's forward accepts it,
        so that every rank of a data-parallel job still runs each batch's forward)."""
        size = self.crop.size
        return torch.empty((0, 3, size, size), dtype=self.dtype, device=device).contiguous(
            memory_format=self.memory_format)

    def _statistics(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """(1, 3, 1, 1) float32 mean and std on ``device``, made once per device."""
        key = str(device)
        if key not in self._stats:
            self._stats[key] = tuple(torch.tensor(v, dtype=torch.float32).view(1, 3, 1, 1).to(device)
                                     for v in (self.mean, self.std))
        return self._stats[key]


def train_transform(size: int = 224, **kw) -> DeviceTransform:
    """The standard ImageNet training transform: :class:`RandomResizedCrop` to ``size``,
    random flip, normalisation. ``kw`` goes to :class:`DeviceTransform`, except
    ``scale``, ``ratio`` and ``antialias``, which go to the crop."""
    crop_kw = {k: kw.pop(k) for k in ("scale", "ratio", "antialias") if k in kw}
    return DeviceTransform(RandomResizedCrop(size, **crop_kw), **kw)


def eval_transform(size: int = 224, resize: int = 256, **kw) -> DeviceTransform:
    """The standard ImageNet evaluation transform: :class:`CenterCrop` (shorter side to
    ``resize``, centre ``size`` square), no flip unless ``flip=True`` is passed,
    normalisation. ``kw`` goes to :class:`DeviceTransform`, except ``antialias``, which
    goes to the crop."""
    crop_kw = {"antialias": kw.pop("antialias")} if "antialias" in kw else {}
    kw.setdefault("flip", False)
    return DeviceTransform(CenterCrop(size, resize, **crop_kw), **kw)


#: Padded CPU batches larger than this are checked against the memory available first
#: (a file read, next to a zero-fill of at least this much).
_CHECK_ABOVE = 64 << 20


def available_memory(proc: str = "/proc", cgroup: str = "/sys/fs/cgroup") -> int | None:
    """Bytes the process can still take: the smaller of the system's ``MemAvailable``
    (``/proc/meminfo``) and the headroom (limit less usage) of every memory cgroup limit
    from the process's cgroup up to the root (v2 ``memory.max`` / ``memory.current``,
    v1 ``memory.limit_in_bytes`` / ``memory.usage_in_bytes``): a container's limit is
    not in ``MemAvailable``. None where none of these can be read."""
    found = []
    try:
        with open(f"{proc}/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"{proc}/self/cgroup") as f:
            entries = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        entries = []
    for entry in entries:
        if len(entry) != 3:
            continue
        _, controllers, path = entry
        if controllers == "":
            root, files = cgroup, ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            root, files = f"{cgroup}/memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):      # the cgroup, then each parent
            folder = "/".join([root, *parts[:depth]])
            limit, usage = (_read_int(f"{folder}/{name}") for name in files)
            if limit is not None and usage is not None and limit < 1 << 62:   # v1 writes "no limit" as ~2^63
                found.append(max(limit - usage, 0))
    return min(found) if found else None


def _read_int(path: str) -> int | None:
    """The integer a control file holds; None if absent or not a number ("max")."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def pad_batch(images: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Stack differently sized images into one zero-padded uint8 batch.

    ``images``: N uint8 (3, h_i, w_i) tensors on one device, any strides. Returns
    ``(batch, sizes)``: batch is a uint8 (N, 3, max h, max w) tensor (channels_last
    memory format) on that device with
    image i in ``batch[i, :, :h_i, :w_i]`` and zeros below and to the right; sizes is an
    (N, 2) int64 CPU tensor of (h_i, w_i). Raises ValueError for an empty list or
    (naming the index) an image of the wrong dtype, shape or device, TypeError for a
    non-tensor, and MemoryError, before allocating anything, for a CPU batch of over
    64 MiB larger than the memory available to the process (``MemAvailable`` of
    ``/proc/meminfo`` and any memory cgroup's limit; not checked where neither can be
    read). Small images of very different shapes, such as
    65500x1 and 1x65500, pad to gigabytes, and zero-filling such a batch would wake the
    kernel's OOM killer instead of failing.
    """
    sizes = _check_images(images)
    height, width = sizes.max(dim=0).values.tolist()
    need = len(images) * height * width * 3
    if need > _CHECK_ABOVE and images[0].device.type == "cpu":
        available = available_memory()
        if available is not None and need > available:
            raise MemoryError(f"padding {len(images)} images to {height}x{width} needs {need / 2**30:.1f} GiB, "
                              f"more than the {available / 2**30:.1f} GiB available")
    # Filled as (N, H, W, 3): decoders give HWC rows, so each copy is row-contiguous
    # (a CHW-ordered copy would scatter every byte); returned as an NCHW view in
    # channels_last memory format, the layout convolutions prefer anyway.
    batch = images[0].new_zeros((len(images), height, width, 3))
    for i, image in enumerate(images):
        batch[i, :image.shape[1], :image.shape[2]] = image.permute(1, 2, 0)
    return batch.permute(0, 3, 1, 2), sizes
