"""Errors raised by dlbooster decoders.

Every error names the input (``source``: a path, or ``"<bytes>"``) and a short machine
readable ``reason`` so that the runtime can count outcomes per reason.

Hierarchy:

- :class:`DecodeError`: the input cannot be decoded at all (Pillow raises on it too).
- :class:`FallbackError`: a backend declined the input; the CPU path must decode it.

  - :class:`Unsupported`: outside the hardware profile (SPEC.md section 2), found from
    the headers alone, before any entropy-coded data is touched.
  - :class:`Malformed`: the entropy-coded data is damaged in a way the hardware detects
    (bad Huffman code, more than 64 coefficients in a block, wrong RSTn, marker inside
    entropy data, end of data before the last MCU) or leaves the numeric range in which
    libjpeg-turbo's C and SIMD paths agree.
"""

from __future__ import annotations

__all__ = ["DlboosterError", "DecodeError", "FallbackError", "Unsupported", "Malformed"]


class DlboosterError(Exception):
    """Base class of every dlbooster error.

    Attributes:
        source: the input's path, or ``"<bytes>"`` for an in-memory buffer.
        reason: short reason code, e.g. ``"progressive"`` or ``"bad-huffman-code"``.
        detail: human readable detail (may be empty).
    """

    def __init__(self, reason: str, detail: str = "", source: str = "<bytes>"):
        self.reason = reason
        self.detail = detail
        self.source = source
        super().__init__(reason, detail, source)

    def __str__(self) -> str:
        text = f"{self.source}: {self.reason}"
        return f"{text} ({self.detail})" if self.detail else text


class DecodeError(DlboosterError):
    """The input is not decodable; the reference (Pillow) fails on it as well.

    Attributes:
        index: the sample's dataset index where a :class:`~dlbooster.Loader` raised it
            (policy ``raise``), else ``None``; ``str()`` then begins ``sample N:``.
    """

    def __init__(self, reason: str, detail: str = "", source: str = "<bytes>", index: int | None = None):
        super().__init__(reason, detail, source)
        self.index = index

    def __str__(self) -> str:
        text = super().__str__()
        return text if self.index is None else f"sample {self.index}: {text}"


class FallbackError(DlboosterError):
    """A backend could not decode the input; the CPU path must be used instead."""


class Unsupported(FallbackError):
    """The headers put the input outside the hardware profile (SPEC.md section 2)."""


class Malformed(FallbackError):
    """The entropy-coded data is damaged in a way the hardware detects.

    Attributes:
        offset: byte offset into the file where the fault was detected, or -1.
    """

    def __init__(self, reason: str, detail: str = "", source: str = "<bytes>", offset: int = -1):
        super().__init__(reason, detail, source)
        self.offset = offset
