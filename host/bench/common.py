"""What every benchmark shares: the refusal it raises before measuring, the machine it
ran on, and its printed tables."""

from __future__ import annotations

import os
import platform
from datetime import date
from pathlib import Path

from dlbooster.runtime.service import usable_cpus

__all__ = ["Refused", "machine", "by_subsampling", "table", "image_folder_links"]


class Refused(ValueError):
    """A benchmark's inputs or options cannot be measured (no input the benchmark can
    use, an unwritable ``--json``, a model or device that does not exist); raised before
    the measurement, or instead of it. The message names the command; the CLI prints it
    and exits 2."""


def machine() -> dict:
    return {"machine": platform.machine(), "processor": platform.processor() or platform.machine(),
            "cpus": usable_cpus(), "python": platform.python_version(),
            "date": date.today().isoformat()}


def by_subsampling(rows: list[dict]) -> dict[str, list[dict]]:
    """Rows grouped by their ``subsampling``, plus ``all``, in sorted key order."""
    groups: dict[str, list[dict]] = {"all": list(rows)}
    for r in rows:
        groups.setdefault(r["subsampling"], []).append(r)
    return dict(sorted(groups.items()))


def table(headers: list[str], rows: list[list]) -> str:
    cells = [headers] + [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def image_folder_links(files: list[tuple[str, bytes]], root: Path) -> Path:
    """An ImageFolder layout of symlinks (two classes, alternating) over ``files``."""
    for n, (path, _) in enumerate(files):
        cls = root / f"class{n % 2}"
        cls.mkdir(parents=True, exist_ok=True)
        (cls / f"{n:05d}{Path(path).suffix.lower() or '.jpg'}").symlink_to(os.path.abspath(path))
    return root
