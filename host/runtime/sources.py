"""Where the samples of a data set come from: (image path, class label) lists.

:func:`image_folder` lists a ``root/<class>/**/<image>`` tree exactly as
``torchvision.datasets.ImageFolder`` does (same samples in the same order, same
classes and labels), without importing torchvision. :func:`as_samples` turns what a
user passes (such a folder, or a list of pairs) into a list of :class:`Sample`.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["IMG_EXTENSIONS", "Sample", "image_folder", "as_samples"]

#: Lower-case file extensions ImageFolder accepts, compared case-insensitively:
#: copied from ``torchvision.datasets.folder.IMG_EXTENSIONS`` (torchvision 0.29).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class Sample:
    """One sample: an image file and its class index.

    Attributes:
        path: path of the image file (str).
        label: class index (int, >= 0 for :func:`image_folder`).
    """

    path: str
    label: int


def image_folder(root: str | os.PathLike[str]) -> tuple[list[Sample], list[str], dict[str, int]]:
    """``(samples, classes, class_to_idx)`` of ``torchvision.datasets.ImageFolder(root)``.

    Classes are the names of ``root``'s sub-folders (symbolic links to folders and
    hidden folders count), sorted by code point (so ``"B"`` before ``"a"``), labelled
    0, 1, ... in that order. Each class folder is walked recursively, following
    symbolic links (except a link back to the folder it is in or one above it, which
    torchvision follows until the path is too long, listing the same images again at
    every depth), in sorted order of folder paths then of file names; a file is a
    sample when its name ends with one of :data:`IMG_EXTENSIONS` in any case (hidden
    files included). Paths are ``os.path.join(root, class, ..., name)`` strings, with
    ``~`` in ``root`` expanded.

    Raises:
        FileNotFoundError: ``root`` has no sub-folder, or a class folder has no image
            file (torchvision's messages).
        OSError: ``root`` or a folder under it cannot be listed (e.g.
            NotADirectoryError, FileNotFoundError, PermissionError; the error names the
            folder). torchvision passes over such a folder, and a class whose folder is
            unreadable is then reported as holding no image.
    """
    directory = os.path.expanduser(os.fspath(root))
    with os.scandir(directory) as entries:
        classes = sorted(entry.name for entry in entries if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    class_to_idx = {name: i for i, name in enumerate(classes)}

    samples: list[Sample] = []
    empty: list[str] = []
    for name in classes:
        found = len(samples)
        # Sorting the (dirpath, dirnames, filenames) tuples orders folders by path,
        # which is torchvision's order, not os.walk's top-down order.
        for dirpath, _, filenames in sorted(_walk(os.path.join(directory, name))):
            for filename in sorted(filenames):
                if filename.lower().endswith(IMG_EXTENSIONS):
                    samples.append(Sample(os.path.join(dirpath, filename), class_to_idx[name]))
        if len(samples) == found:
            empty.append(name)
    if empty:
        raise FileNotFoundError(
            f"Found no valid file for the classes {', '.join(empty)}. "
            f"Supported extensions are: {', '.join(IMG_EXTENSIONS)}")
    return samples, classes, class_to_idx


def _walk(top: str):
    """``os.walk(top, followlinks=True)`` without the cycles: a linked folder that is one
    of its own ancestors (a link to ``..``) is not entered again. torchvision's walk
    enters it until the path is too long, listing every image there again at each depth.
    """
    ancestors: dict[str, frozenset[str]] = {}   # dirpath -> the real paths of it and its ancestors
    for dirpath, dirnames, filenames in os.walk(top, onerror=_unlisted, followlinks=True):
        seen = ancestors[dirpath] = ancestors.get(os.path.dirname(dirpath), frozenset()) | {os.path.realpath(dirpath)}
        dirnames[:] = [d for d in dirnames if not (os.path.islink(os.path.join(dirpath, d))
                                                   and os.path.realpath(os.path.join(dirpath, d)) in seen)]
        yield dirpath, dirnames, filenames


def _unlisted(exc: OSError) -> None:
    """``os.walk``'s ``onerror``: a folder that cannot be listed fails the data set
    instead of silently losing its images."""
    raise exc


def _pair(i: int, item: object) -> Sample:
    if isinstance(item, Sample):
        # Checked like a pair too: the dataclass itself does not enforce its types.
        path, label = item.path, item.label
    elif isinstance(item, (str, bytes)) or not isinstance(item, Iterable):
        raise TypeError(f"sample {i}: expected a Sample or a (path, label) pair, got {item!r}")
    else:
        pair = tuple(item)
        if len(pair) != 2:
            raise TypeError(f"sample {i}: expected a (path, label) pair, got {len(pair)} items: {item!r}")
        path, label = pair
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"sample {i}: path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"sample {i}: path must be text, got {path!r}")
    try:
        # operator.index, not int(): 2.7 or "3" as a label is a bug upstream, not a class.
        label = operator.index(label)
    except TypeError:
        raise TypeError(f"sample {i}: label must be an integer, got {label!r}") from None
    if not -2**63 <= label < 2**63:           # batches carry labels as int64
        raise ValueError(f"sample {i}: label {label} does not fit in int64")
    return Sample(path, label)


def as_samples(source: object) -> list[Sample]:
    """The samples described by ``source``.

    Args:
        source: an image folder (``str`` or ``os.PathLike``), read by
            :func:`image_folder`; or an iterable (list, tuple, generator, ...) of
            :class:`Sample` objects and ``(path, label)`` pairs, each with a ``path``
            that is a ``str`` or ``os.PathLike`` (made a ``str``) and a ``label`` of
            any integer type (made an ``int``; floats and strings are refused).

    Returns:
        a new list of :class:`Sample`, in the given order.

    Raises:
        FileNotFoundError: the path does not exist, or as :func:`image_folder`.
        NotADirectoryError: the path exists but is not a folder.
        TypeError: ``source`` is none of the above (the message names its type), or an
            item is not a Sample or a (path, integer label) pair.
        ValueError: a label outside int64 (the batches' label dtype).
    """
    if isinstance(source, (str, os.PathLike)):
        path = os.path.expanduser(os.fspath(source))
        if not isinstance(path, str):
            raise TypeError(f"as_samples: a folder path must be text, got {source!r}")
        if not os.path.exists(path):
            raise FileNotFoundError(f"as_samples: no such folder: {path!r}")
        if not os.path.isdir(path):
            raise NotADirectoryError(f"as_samples: not a folder: {path!r}")
        return image_folder(path)[0]
    if isinstance(source, (bytes, bytearray, Mapping)) or not isinstance(source, Iterable):
        raise TypeError(
            "as_samples: expected an image folder path or an iterable of Sample / "
            f"(path, label) pairs, got {type(source).__name__}: {source!r:.80}")
    return [_pair(i, item) for i, item in enumerate(source)]
