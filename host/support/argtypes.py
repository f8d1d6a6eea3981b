"""argparse types shared by the command line and the benchmarks: each parses one
option's text or raises :class:`argparse.ArgumentTypeError` with the reason."""

from __future__ import annotations

import argparse
import re

__all__ = ["integer_in", "positive", "max_width", "count", "lanes", "percent", "torch_device", "positive_number"]


def integer_in(minimum: int, maximum: int | None = None):
    """An argparse type: an integer of at least ``minimum`` (and at most ``maximum``)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, not {value}")
        return value
    return parse


#: argparse types: counts, sizes, widths (at least 1); limits and optional parts (0: none);
#: a device's lanes (1..32: BUSY has a bit per lane, docs/device.md); percentages of clocks.
positive = integer_in(1)
#: ``--max-width``: a JPEG frame is at most 65535 pixels wide (T.81 B.2.2).
max_width = integer_in(1, 65535)
count = integer_in(0)
lanes = integer_in(1, 32)
percent = integer_in(1, 100)


def torch_device(text: str) -> str:
    """argparse type: a PyTorch device this command runs on: ``cpu``, ``cuda`` or
    ``cuda:N``."""
    if re.fullmatch(r"cpu|cuda(:(0|[1-9][0-9]*))?", text):
        return text
    raise argparse.ArgumentTypeError(f"give cpu, cuda or cuda:N, not {text!r}")


def positive_number(text: str) -> float:
    """argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, not {text}")
    return value
