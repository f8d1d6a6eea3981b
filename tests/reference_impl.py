"""Independent, deliberately plain implementations of SPEC.md section 3.

Written from the text of the spec (and libjpeg-turbo's C where the spec is silent), not
from dlbooster.jpeg.model, so that the model's stages can be checked against them.
"""

from __future__ import annotations

import numpy as np

# ---------------------------------------------------------------------------------
# 3.1 ISLOW IDCT


def spec_range_limit_table() -> list[int]:
    """T[i] = i + 128 (0..127), 255 (128..511), 0 (512..895), i - 896 (896..1023)."""
    table = []
    for i in range(1024):
        if i <= 127:
            table.append(i + 128)
        elif i <= 511:
            table.append(255)
        elif i <= 895:
            table.append(0)
        else:
            table.append(i - 896)
    return table


_T = np.array(spec_range_limit_table(), dtype=np.uint8)


def _descale(x, n):
    return (x + (1 << (n - 1))) >> n


def _one_pass(d):
    """One 1-D ISLOW pass over d[0..7] (arrays of any common shape, int64)."""
    d0, d1, d2, d3, d4, d5, d6, d7 = d
    z1 = (d2 + d6) * 4433
    t2 = z1 - d6 * 15137
    t3 = z1 + d2 * 6270
    t0 = (d0 + d4) * 8192
    t1 = (d0 - d4) * 8192
    e10, e13, e11, e12 = t0 + t3, t0 - t3, t1 + t2, t1 - t2
    a0, a1, a2, a3 = d7, d5, d3, d1
    z1 = a0 + a3
    z2 = a1 + a2
    z3 = a0 + a2
    z4 = a1 + a3
    z5 = (z3 + z4) * 9633
    a0 = a0 * 2446
    a1 = a1 * 16819
    a2 = a2 * 25172
    a3 = a3 * 12299
    z1 = z1 * -7373
    z2 = z2 * -20995
    z3 = z3 * -16069 + z5
    z4 = z4 * -3196 + z5
    a0 = a0 + z1 + z3
    a1 = a1 + z2 + z4
    a2 = a2 + z2 + z3
    a3 = a3 + z1 + z4
    return [e10 + a3, e11 + a2, e12 + a1, e13 + a0, e13 - a0, e12 - a1, e11 - a2, e10 - a3]


def _wrap32(x):
    return ((x + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def spec_idct_values(coef: np.ndarray, quant: np.ndarray) -> np.ndarray:
    """The signed IDCT outputs v (before the range limit), int64 (N, 8, 8).

    coef: (N, 64) quantised coefficients in natural order; quant: (64,) natural order.
    The pass-1 results are stored in a 32-bit ``int`` workspace, as in jidctint.c.
    """
    x = coef.astype(np.int64).reshape(-1, 8, 8) * np.asarray(quant, dtype=np.int64).reshape(8, 8)
    # Pass 1, down the columns: inputs are the 8 rows of every column at once.
    o = _one_pass([x[:, i, :] for i in range(8)])  # o[r]: (N, 8 columns)
    ws = _wrap32(np.stack([_descale(o[r], 11) for r in range(8)], axis=1))  # (N, row, col)
    # Pass 2, along the rows.
    o = _one_pass([ws[:, :, i] for i in range(8)])  # o[c]: (N, 8 rows)
    return np.stack([_descale(o[c], 18) for c in range(8)], axis=2)


def spec_idct(coef: np.ndarray, quant: np.ndarray) -> np.ndarray:
    """Samples T[v & 1023], uint8 (N, 8, 8)."""
    return _T[spec_idct_values(coef, quant) & 1023]


# ---------------------------------------------------------------------------------
# 3.2 Fancy upsampling (pure Python, one sample at a time)


def spec_upsample(plane, h: int, v: int, height: int, width: int) -> np.ndarray:
    p = [[int(s) for s in row] for row in np.asarray(plane)]
    rows, cols = len(p), len(p[0])

    def nbr(r, d):  # neighbour row, edges copy the row itself
        return p[min(max(r + d, 0), rows - 1)]

    out: list[list[int]]
    if (h, v) == (1, 1):
        out = p
    elif h == 2 and cols <= 2:
        out = []
        for r in range(rows):
            line = []
            for i in range(cols):
                line += [p[r][i], p[r][i]]
            out += [line] * v
    elif (h, v) == (2, 1):
        out = []
        for r in range(rows):
            row, n = p[r], cols
            line = [0] * (2 * n)
            for i in range(n):
                if i == 0:
                    line[0] = row[0]
                else:
                    line[2 * i] = (3 * row[i] + row[i - 1] + 1) >> 2
                if i == n - 1:
                    line[2 * n - 1] = row[n - 1]
                else:
                    line[2 * i + 1] = (3 * row[i] + row[i + 1] + 2) >> 2
            out.append(line)
    elif (h, v) == (1, 2):
        out = []
        for r in range(rows):
            above, below = nbr(r, -1), nbr(r, 1)
            out.append([(3 * p[r][i] + above[i] + 1) >> 2 for i in range(cols)])
            out.append([(3 * p[r][i] + below[i] + 2) >> 2 for i in range(cols)])
    elif (h, v) == (2, 2):
        out = []
        n = cols
        for r in range(rows):
            for d in (-1, 1):
                other = nbr(r, d)
                c = [3 * p[r][i] + other[i] for i in range(n)]
                line = [0] * (2 * n)
                line[0] = (4 * c[0] + 8) >> 4
                line[2 * n - 1] = (4 * c[n - 1] + 7) >> 4
                for i in range(1, n):
                    line[2 * i] = (3 * c[i] + c[i - 1] + 8) >> 4
                for i in range(n - 1):
                    line[2 * i + 1] = (3 * c[i] + c[i + 1] + 7) >> 4
                out.append(line)
    else:
        raise ValueError((h, v))
    return np.array([line[:width] for line in out[:height]], dtype=np.uint8).reshape(height, width)


# ---------------------------------------------------------------------------------
# 3.3 YCbCr -> RGB


def spec_ycbcr_to_rgb(y, cb, cr) -> np.ndarray:
    """Floor division by 2**16 (== arithmetic shift) on Python-sized integers."""
    y = np.asarray(y, dtype=np.int64)
    xb = np.asarray(cb, dtype=np.int64) - 128
    xr = np.asarray(cr, dtype=np.int64) - 128
    r = y + np.floor_divide(91881 * xr + 32768, 65536)
    b = y + np.floor_divide(116130 * xb + 32768, 65536)
    g = y + np.floor_divide(-22554 * xb + 32768 - 46802 * xr, 65536)
    return np.minimum(np.maximum(np.stack([r, g, b], axis=-1), 0), 255).astype(np.uint8)
