"""The training run of the simulated device's profile-guided build.

Profile-guided optimisation (GCC's ``-fprofile-generate``, a run, ``-fprofile-use``, or
clang's ``-fprofile-instr-generate`` and ``-fprofile-instr-use``) lays the Verilated
model's code out for the branches a real decode takes: with GCC the device runs 1.05 to
1.19 times as many clocks per second with it (docs/benchmarks.md).
:func:`dlbooster.sim.device.build_device_library` runs this module in a process of its
own on the instrumented library: the profile is written when that process exits.

The workload needs nothing beyond Pillow: photo-like images (Pillow's Mandelbrot set
and Gaussian noise, blurred, for the smooth areas and the texture of photographs)
encoded at the qualities and subsamplings of the hardware profile, with and without
restart intervals and optimised tables, decoded through the host driver as
``dlbooster bench device`` does. The run reports how many images the device decoded and
how many of those differ from Pillow's decode (a profile does not depend on it; the
tests judge the device).

Usage: ``python -m dlbooster.sim.pgo LIBRARY``.
"""

from __future__ import annotations

import io
import sys

import numpy as np
from PIL import Image, ImageFilter

from dlbooster.backends import decode_pillow

__all__ = ["workload", "main"]


def _picture(width: int, height: int, seed: int) -> Image.Image:
    """A photo-like RGB picture: smooth shapes (a Mandelbrot view per channel) plus
    blurred Gaussian noise for texture; the same pixels for the same arguments."""
    rng = np.random.default_rng(seed)
    channels = []
    for c in range(3):
        x0, y0 = -2.0 + 0.3 * c + 0.2 * rng.random(), -1.2 + 0.2 * rng.random()
        shape = Image.effect_mandelbrot((width, height), (x0, y0, x0 + 2.6, y0 + 2.4), 64)
        grain = rng.normal(128, 40 + 20 * c, (height, width)).clip(0, 255).astype(np.uint8)
        noise = Image.fromarray(grain).filter(ImageFilter.GaussianBlur(1.2))
        channels.append(Image.blend(shape.filter(ImageFilter.GaussianBlur(2)), noise, 0.35))
    return Image.merge("RGB", channels)


def workload(max_width: int) -> list[bytes]:
    """The training JPEGs: baseline, 8-bit, inside ``max_width`` (pixels); 4:2:0, 4:2:2,
    4:4:4 and grayscale, qualities 50 to 95, one with a restart interval and one with
    optimised Huffman tables."""
    width = min(256, max_width)
    files = []
    for n, (subsampling, quality, extra) in enumerate([
            (2, 90, {}), (2, 75, {}), (1, 85, {}), (0, 95, {}), (2, 50, {"optimize": True}),
            (2, 80, {"restart_marker_blocks": 24}), ("gray", 85, {})]):
        picture = _picture(width, 192, seed=n)
        out = io.BytesIO()
        if subsampling == "gray":
            picture.convert("L").save(out, "JPEG", quality=quality, **extra)
        else:
            picture.save(out, "JPEG", quality=quality, subsampling=subsampling, **extra)
        files.append(out.getvalue())
    return files


def _rgb_bytes(jpeg: bytes) -> int:
    width, height = Image.open(io.BytesIO(jpeg)).size
    return width * height * 3


def main(argv: list[str] | None = None) -> int:
    """Decode :func:`workload` on the device library ``argv[0]`` (a path), at the line-buffer
    width the device reports. Prints one line: the images, how many the device decoded
    and how many of those differ from Pillow's decode, or the device's failure (a
    profile of a run cut short still serves; the tests judge the device). Returns 0."""
    from dlbooster.device.driver import DecoderDevice, DeviceError

    from .device import SimTransport

    (library,) = sys.argv[1:] if argv is None else argv
    with SimTransport(library=library) as sim:
        device = DecoderDevice(sim)
        device.start()
        files = workload(device.max_width)
        try:
            outcomes = device.decode_batch([(f, _rgb_bytes(f)) for f in files])
        except DeviceError as exc:
            print(f"profile run: {len(files)} images, stopped: {exc}")
            return 0
    decoded = [(o, f) for o, f in zip(outcomes, files) if o.image is not None]
    differ = sum(not np.array_equal(o.image, decode_pillow(f)) for o, f in decoded)
    print(f"profile run: {len(files)} images, {len(decoded)} decoded, {differ} different from Pillow")
    return 0


if __name__ == "__main__":
    sys.exit(main())
