"""IEEE 1180-1990 IDCT accuracy test (SPEC.md section 4).

The generator, the double-precision forward DCT and reference IDCT, and the error
statistics with their pass limits. The device under test is any function from
coefficient blocks to 8-bit samples, as the decoder produces them; :func:`signed_output`
recovers the signed IDCT output (before the +128 level shift and the range limit) that
the standard compares, by running each block with its DC coefficient offset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["LIMITS", "RANGES", "Ieee1180Result", "combine", "input_blocks", "offset_inputs",
           "reference", "run", "signed_output", "zero_input_gives_zero"]

#: (L, H) input ranges; each is also run with every value negated.
RANGES = ((256, 255), (5, 5), (300, 300))

#: Pass limits: peak error, per-position and overall mean square error, per-position and
#: overall |mean error|.
LIMITS = {"peak": 1, "pmse": 0.06, "omse": 0.02, "pme": 0.015, "ome": 0.0015}

_U = np.arange(8)
# c[u, x] = C(u)/2 * cos((2x + 1) u pi / 16), C(0) = 1/sqrt(2): orthonormal DCT-II basis.
_C = np.cos((2 * _U[None, :] + 1) * _U[:, None] * np.pi / 16) / 2
_C[0] /= np.sqrt(2)


def input_blocks(low: int, high: int, count: int = 10000, sign: int = 1) -> np.ndarray:
    """Random 8x8 sample blocks of the standard's generator (randx starts at 1).

    Returns:
        int64 array (count, 8, 8), values in ``-low..high`` (times ``sign``).
    """
    randx = 1
    out = np.empty(count * 64, dtype=np.int64)
    span = low + high + 1
    for n in range(count * 64):
        randx = (randx * 1103515245 + 12345) & 0xFFFFFFFFFFFFFFFF
        i = randx & 0x7FFFFFFE
        out[n] = int(i / 0x7FFFFFFF * span) - low
    return sign * out.reshape(count, 8, 8)


def _round(x: np.ndarray) -> np.ndarray:
    return np.floor(x + 0.5).astype(np.int64)


def reference(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Forward DCT and reference IDCT in double precision.

    Args:
        samples: int array (N, 8, 8).

    Returns:
        ``(coefficients, expected)``: the rounded DCT clipped to -2048..2047 (int16,
        (N, 64), natural order) and the rounded reference IDCT of those, clipped to
        -256..255 (int64, (N, 8, 8)).
    """
    coef = np.clip(_round(_C @ samples @ _C.T), -2048, 2047)
    expected = np.clip(_round(_C.T @ coef @ _C), -256, 255)
    return coef.reshape(-1, 64).astype(np.int16), expected


_OFFSETS = (128, 0, -128)


def offset_inputs(coef: np.ndarray) -> np.ndarray:
    """The blocks :func:`combine` needs: ``coef`` three times, DC + 8k for k = +128, 0, -128.

    Adding 8k to the DC coefficient (quantiser 1) adds exactly ``k << 18`` to every
    row-pass sum of ISLOW (the DC term is ``d0 << 13`` in both passes and DESCALE 11 of
    it is exact), so it shifts every output by exactly k; the three runs see the output
    through the 8-bit range limit over -256..255.

    Args:
        coef: int16 (N, 64), DC within -2048..2047.

    Returns:
        int16 (3N, 64).
    """
    shifted = np.repeat(coef.astype(np.int16)[None], len(_OFFSETS), axis=0)
    for n, k in enumerate(_OFFSETS):
        shifted[n, :, 0] += 8 * k
    return shifted.reshape(-1, 64)


def combine(samples: np.ndarray) -> np.ndarray:
    """The signed ISLOW output clipped to -256..255 (int64 (N, 8, 8)) from the uint8
    samples (3N, 8, 8) of the :func:`offset_inputs` blocks."""
    low, mid, high = samples.reshape(len(_OFFSETS), -1, 8, 8).astype(np.int64)
    return np.where(low < 255, low - 256, np.where(high > 0, high, mid - 128))


def signed_output(idct: Callable[[np.ndarray], np.ndarray], coef: np.ndarray) -> np.ndarray:
    """The signed ISLOW output, clipped to -256..255, from a decoder-style IDCT.

    Args:
        idct: maps int16 coefficient blocks (N, 64) in natural order (quantiser 1) to
            uint8 samples (N, 8, 8) (e.g. :func:`dlbooster.jpeg.model.idct_islow` or the RTL).
        coef: int16 (N, 64), DC within -2048..2047.

    Returns:
        int64 (N, 8, 8), see :func:`offset_inputs`.
    """
    return combine(idct(offset_inputs(coef)))


@dataclass
class Ieee1180Result:
    """Error statistics of one run (one range and sign) against :data:`LIMITS`."""

    low: int
    high: int
    sign: int
    peak: int
    pmse: float
    omse: float
    pme: float
    ome: float

    @property
    def passed(self) -> bool:
        return (self.peak <= LIMITS["peak"] and self.pmse <= LIMITS["pmse"]
                and self.omse <= LIMITS["omse"] and self.pme <= LIMITS["pme"]
                and self.ome <= LIMITS["ome"])

    def to_json(self) -> dict:
        return {"range": [-self.low, self.high], "sign": self.sign, "peak": self.peak,
                "pmse": self.pmse, "omse": self.omse, "pme": self.pme, "ome": self.ome,
                "passed": self.passed}


def run(idct: Callable[[np.ndarray], np.ndarray], count: int = 10000) -> list[Ieee1180Result]:
    """The six runs (three ranges, each sign) of ``count`` blocks.

    Args:
        idct: as for :func:`signed_output`; called once with all runs' blocks
            (18 * ``count`` of them), so a simulator starts only once.
        count: blocks per run (the standard uses 10,000).

    Returns:
        One :class:`Ieee1180Result` per run.
    """
    runs = [(low, high, sign) for low, high in RANGES for sign in (1, -1)]
    refs = [reference(input_blocks(low, high, count, sign)) for low, high, sign in runs]
    samples = idct(np.concatenate([offset_inputs(coef) for coef, _ in refs]))
    per_run = samples.reshape(len(runs), -1, 8, 8)
    results = []
    for (low, high, sign), (_, expected), got in zip(runs, refs, per_run):
        err = combine(got) - expected
        sq = err.astype(np.float64) ** 2
        results.append(Ieee1180Result(
            low=low, high=high, sign=sign, peak=int(np.abs(err).max()),
            pmse=float(sq.mean(axis=0).max()), omse=float(sq.mean()),
            pme=float(np.abs(err.mean(axis=0)).max()), ome=float(abs(err.mean()))))
    return results


def zero_input_gives_zero(idct: Callable[[np.ndarray], np.ndarray]) -> bool:
    """The standard's last check: an all-zero block gives an all-zero output."""
    return bool((signed_output(idct, np.zeros((1, 64), dtype=np.int16)) == 0).all())
