"""Files the product reads and writes: command-line inputs expanded to files, outputs
checked before long work, and files written whole or not at all."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

__all__ = ["walk_inputs", "output_problem", "json_target_problem", "save_png"]


def walk_inputs(paths: list[str]) -> list[tuple[str, str]]:
    """Expand PATH arguments to (input path, output name) pairs, folders recursively.

    Output names are paths relative to the deepest folder holding every input (a lone
    file keeps its base name), so inputs from different folders never collide.
    """
    found = []
    for arg in paths:
        if os.path.isdir(arg):
            before = len(found)
            seen = set()
            # A folder that cannot be listed becomes an input of its own, so that it is
            # reported (as unreadable) instead of silently missing. Linked folders are
            # followed, as torchvision's ImageFolder does, each real folder once.
            for root, dirs, files in os.walk(arg, onerror=lambda exc: found.append(exc.filename),
                                             followlinks=True):
                real = os.path.realpath(root)
                if real in seen:
                    dirs.clear()
                    continue
                seen.add(real)
                dirs.sort()
                found.extend(os.path.join(root, f) for f in sorted(files))
            if len(found) == before:
                print(f"dlbooster: no files under {arg}", file=sys.stderr)
        else:
            found.append(arg)
    if not found:
        return []
    base = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in found])
    return [(p, os.path.relpath(os.path.abspath(p), base)) for p in found]


def output_problem(value, option: str) -> str | None:
    """Why the output file ``value`` of ``option`` cannot be written (``{option} {value}:
    ...``), or None: checked before minutes of measurement, synthesis or training. The
    file is opened for appending (made, then removed, when it did not exist), so a
    folder without write permission or a read-only file system is found too.
    """
    value = os.fspath(value)
    target = Path(value)
    if not value:
        return f"{option}: an empty path; give a file name"
    if target.is_dir():
        return f"{option} {value}: a folder; give a file name"
    if not target.parent.is_dir():
        return f"{option} {value}: no such folder {target.parent}"
    existed = target.exists()
    try:
        with open(target, "a"):
            pass
    except OSError as exc:
        return f"{option} {value}: {exc.strerror or exc}"
    if not existed:
        target.unlink()
    return None


def json_target_problem(value: str | None) -> str | None:
    """:func:`output_problem` of a ``--json`` FILE; None also for no file and ``-`` (stdout)."""
    return None if value in (None, "-") else output_problem(value, "--json")


def save_png(image, target: Path) -> None:
    """Write ``image`` as ``target`` whole or not at all: Ctrl-C, SIGTERM or a full disk
    mid-write leaves no truncated PNG (a partial file is removed, never renamed)."""
    from PIL import Image

    target.parent.mkdir(parents=True, exist_ok=True)
    # A short name of its own: the target's name may already be near NAME_MAX.
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=".dlb-", suffix=".partial")
    os.close(fd)
    partial = Path(name)
    try:
        Image.fromarray(image).save(partial, "PNG")
        os.replace(partial, target)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise
