"""ITU-T T.81 (JPEG) constants shared by the gateware and the host: marker codes, the
zigzag order of coefficients.

:class:`Marker` is a standard :class:`enum.IntEnum`: Amaranth takes its members as
8-bit constants and the class as a shape (``Signal(Marker)``, ``m.Case(Marker.SOS)``),
and the host's parser imports this module without importing Amaranth (about 0.4 s of
start-up for every command and ``import dlbooster``).
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = ["Marker", "ZIGZAG"]


class Marker(enum.IntEnum):
    """The code byte that follows ``0xFF`` in a marker (T.81 Table B.1)."""
    TEM = 0x01
    SOF0 = 0xC0     # baseline sequential DCT, Huffman
    SOF1 = 0xC1     # extended sequential DCT, Huffman
    SOF2 = 0xC2
    SOF3 = 0xC3
    DHT = 0xC4
    SOF5 = 0xC5
    SOF6 = 0xC6
    SOF7 = 0xC7
    JPG = 0xC8
    SOF9 = 0xC9
    SOF10 = 0xCA
    SOF11 = 0xCB
    DAC = 0xCC
    SOF13 = 0xCD
    SOF14 = 0xCE
    SOF15 = 0xCF
    RST0 = 0xD0
    RST1 = 0xD1
    RST2 = 0xD2
    RST3 = 0xD3
    RST4 = 0xD4
    RST5 = 0xD5
    RST6 = 0xD6
    RST7 = 0xD7
    SOI = 0xD8
    EOI = 0xD9
    SOS = 0xDA
    DQT = 0xDB
    DNL = 0xDC
    DRI = 0xDD
    DHP = 0xDE
    EXP = 0xDF
    COM = 0xFE


#: Natural (row-major) index of the k-th coefficient in zigzag order (T.81 Figure A.6).
ZIGZAG = np.array(
    [0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5,
     12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6, 7, 14, 21, 28,
     35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
     58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63],
    dtype=np.int64,
)
ZIGZAG.flags.writeable = False
