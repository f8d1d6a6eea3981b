"""Real photographs that installed packages ship, and JPEG test sets made from them.

A fresh machine has no dataset; scikit-image's wheel carries a few real photographs
(``skimage/data``: the astronaut, the cat "chelsea", coffee, a rocket launch, a retina,
the Hubble deep field, motorcycles, ...). dlbooster encodes them with Pillow into JPEGs
that cover the decoder's features (every subsampling, qualities, restart intervals,
optimised Huffman tables, gray).
"""

from __future__ import annotations

import importlib.util
import io
import os
from pathlib import Path

import numpy as np

__all__ = ["PHOTO_NAMES", "packaged_photos", "load_photo", "encode_variants", "default_corpus"]

#: Real photographs in scikit-image's ``data`` folder (name, file).
PHOTO_NAMES = (
    "astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "retina.jpg",
    "hubble_deep_field.jpg", "motorcycle_left.png", "motorcycle_right.png", "camera.png",
    "moon.png", "coins.png", "brick.png", "grass.png", "gravel.png", "ihc.png",
)


def packaged_photos() -> list[Path]:
    """Paths of the real photographs shipped by installed packages (may be empty)."""
    spec = importlib.util.find_spec("skimage")
    if spec is None or spec.origin is None:
        return []
    data = Path(spec.origin).parent / "data"
    return [data / name for name in PHOTO_NAMES if (data / name).is_file()]


def load_photo(path: Path) -> np.ndarray:
    """Load a photograph as (H, W, 3) uint8 RGB (gray photos replicated)."""
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


#: (suffix, Pillow save options) of the variants :func:`encode_variants` writes.
VARIANTS = (
    ("444_q95", {"quality": 95, "subsampling": 0}),
    ("422_q90", {"quality": 90, "subsampling": 1}),
    ("420_q75", {"quality": 75, "subsampling": 2}),
    ("420_q50_opt", {"quality": 50, "subsampling": 2, "optimize": True}),
    ("444_q85_rst", {"quality": 85, "subsampling": 0, "restart_marker_blocks": 7}),
    ("gray_q80", {"quality": 80, "gray": True}),
)


def encode_variants(out_dir: str | os.PathLike, photos: list[Path] | None = None) -> list[Path]:
    """Encode every packaged photograph in each of :data:`VARIANTS` as a JPEG file.

    Returns:
        The written paths, ``out_dir/<photo>_<variant>.jpg``.
    """
    from PIL import Image

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in photos if photos is not None else packaged_photos():
        rgb = Image.fromarray(load_photo(path))
        for suffix, options in VARIANTS:
            options = dict(options)
            image = rgb.convert("L") if options.pop("gray", False) else rgb
            buf = io.BytesIO()
            image.save(buf, "JPEG", **options)
            target = out / f"{path.stem}_{suffix}.jpg"
            target.write_bytes(buf.getvalue())
            written.append(target)
    return written


def default_corpus() -> Path | None:
    """The shared test corpus: ``$DLBOOSTER_CORPUS``, else ``../shared/corpus`` beside the
    source checkout or the working directory; None when absent."""
    candidates = []
    if os.environ.get("DLBOOSTER_CORPUS"):
        candidates.append(Path(os.environ["DLBOOSTER_CORPUS"]))
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "corpus")
    candidates.append(Path.cwd().parent / "shared" / "corpus")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    return None
