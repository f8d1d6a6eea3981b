"""Bit-exact reference model of the dlbooster decoder lane ("golden model").

The model decodes hardware-decodable JPEGs (SPEC.md section 2) through the same stages
as the gateware, each exposed as a function so that testbenches can compare stage by
stage:

1. :func:`entropy_decode`: Huffman decoding of the single interleaved scan into
   quantised coefficient blocks in natural order (T.81 F.2.2, libjpeg-turbo
   ``jdhuff.c``), with RSTn handling and the malformation checks of SPEC.md section 2.
2. :func:`idct_islow`: dequantisation and the two-pass ISLOW IDCT with the ``& 1023``
   range limit (SPEC.md 3.1, libjpeg-turbo ``jidctint.c``).
3. :func:`upsample`: "fancy" chroma upsampling (SPEC.md 3.2, ``jdsample.c``).
4. :func:`ycbcr_to_rgb`: colour conversion (SPEC.md 3.3, ``jdcolor.c``).

:func:`decode` runs them all and returns a :class:`ModelOutput` holding every stage.

Besides the stream faults of SPEC.md section 2, the model flags blocks whose values
leave the range in which libjpeg-turbo's C IDCT and its x86 SIMD IDCT (16-bit lanes,
saturating packs) give the same samples (reason ``idct-range``); only corrupt or
deliberately extreme streams get there, and the CPU path then decodes them exactly as
the Pillow build at hand does.

Hot loops are compiled with numba (``cache=True``: the first call in a fresh checkout
compiles for a few seconds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from dlbooster.errors import Malformed, Unsupported
from dlbooster.jpeg import DEFAULT_MAX_WIDTH, HuffmanTable, JpegInfo, ZIGZAG, classify, parse

__all__ = [
    "ModelOutput",
    "decode",
    "block_order",
    "entropy_decode",
    "huffman_lookup",
    "idct_islow",
    "range_limit",
    "upsample",
    "ycbcr_to_rgb",
    "STATUS_REASONS",
    "REASON_STATUS",
]

# Status codes of the entropy stage (shared with the gateware's status register; 6 is
# the gateware's own "after-scan").
OK, BAD_CODE, COEF_OVERFLOW, UNEXPECTED_MARKER, BAD_RESTART, TRUNCATED = range(6)
FILL_BEFORE_STUFFING = 7
#: Reason code of each non-zero entropy-stage status.
STATUS_REASONS = {
    BAD_CODE: "bad-huffman-code",
    COEF_OVERFLOW: "coefficient-overflow",
    UNEXPECTED_MARKER: "unexpected-marker",
    BAD_RESTART: "bad-restart",
    TRUNCATED: "truncated",
    FILL_BEFORE_STUFFING: "fill-before-stuffing",
}
#: The entropy-stage status code of each reason (inverse of :data:`STATUS_REASONS`).
REASON_STATUS = {reason: code for code, reason in STATUS_REASONS.items()}


def huffman_lookup(table: HuffmanTable) -> np.ndarray:
    """Build a 16-bit lookahead table for one Huffman table.

    Entry ``i`` describes the code that starts the 16-bit window ``i`` (MSB first):
    ``(length << 8) | symbol``, or 0 when no code of at most 16 bits matches.
    Codes are assigned as in T.81 Annex C (``generate_code_table``).

    Returns:
        int32 array of shape (65536,).
    """
    lut = np.zeros(65536, dtype=np.int32)
    code = 0
    k = 0
    for length, count in enumerate(table.counts, start=1):
        for _ in range(count):
            if code < (1 << length):
                shift = 16 - length
                lut[code << shift : (code + 1) << shift] = (length << 8) | table.symbols[k]
            code += 1
            k += 1
        code <<= 1
    return lut


@numba.njit(cache=True, nogil=True)
def _decode_scan(data, end, pos, luts, comp_dc, comp_ac, comp_h, comp_v, comp_bw, comp_base,
                 mcux, mcuy, restart_interval, coef):
    # Returns (status, byte offset of the fault or of the end, symbols decoded).
    acc = np.int64(0)
    nbits = 0
    real = 0  # bits in acc that came from the file; the rest are zero padding
    stopped = False
    fill_fault = False  # stopped at FF fill bytes before a stuffed zero
    symbols = 0
    ncomp = comp_dc.shape[0]
    pred = np.zeros(ncomp, dtype=np.int64)
    next_rst = 0
    total = mcux * mcuy
    for mcu in range(total):
        if restart_interval > 0 and mcu > 0 and mcu % restart_interval == 0:
            # T.81 F.2.2.5 / jdhuff.c process_restart: drop buffered bits, find the marker.
            acc = np.int64(0)
            nbits = 0
            real = 0
            stopped = False
            fill_fault = False
            p = pos
            marker = -1
            while p < end:
                if data[p] != 0xFF:
                    p += 1
                    continue
                q = p + 1
                while q < end and data[q] == 0xFF:
                    q += 1
                if q >= end:
                    break
                if data[q] == 0:
                    p = q + 1
                    continue
                marker = data[q]
                p = q + 1
                break
            if marker != 0xD0 + next_rst:
                return BAD_RESTART, p, symbols
            next_rst = (next_rst + 1) & 7
            pos = p
            for c in range(ncomp):
                pred[c] = 0
        mx = mcu % mcux
        my = mcu // mcux
        for c in range(ncomp):
            hc = comp_h[c]
            vc = comp_v[c]
            for by in range(vc):
                for bx in range(hc):
                    blk = comp_base[c] + (my * vc + by) * comp_bw[c] + mx * hc + bx
                    k = 0
                    while k < 64:
                        if nbits < 32:
                            while nbits <= 48:
                                if not stopped and pos < end:
                                    b = data[pos]
                                    if b == 0xFF:
                                        # FF 00 is one FF data byte; FF (FF)* xx is a
                                        # marker. FF FF+ 00 (fill bytes before a stuffed
                                        # zero, not valid T.81) stops the data as a
                                        # marker does: jdhuff.c reads it as one FF data
                                        # byte on its slow path but as a marker on its
                                        # fast path, and which of the two Pillow's
                                        # output follows depends on its input buffering
                                        # (the gateware's Unstuffer, fill_fault).
                                        q = pos + 1
                                        while q < end and data[q] == 0xFF:
                                            q += 1
                                        if q == pos + 1 and q < end and data[q] == 0:
                                            pos = q + 1
                                        elif q < end and data[q] == 0:
                                            stopped = True
                                            fill_fault = True
                                            continue
                                        else:
                                            pos = q - 1 if q < end else end
                                            stopped = True
                                            continue
                                    else:
                                        pos += 1
                                    acc = (acc << 8) | b
                                    real += 8
                                else:
                                    stopped = True
                                    acc = acc << 8
                                nbits += 8
                        window = (acc >> (nbits - 16)) & 0xFFFF
                        entry = luts[comp_dc[c] if k == 0 else comp_ac[c], window]
                        if entry == 0:
                            return BAD_CODE, pos, symbols
                        length = entry >> 8
                        sym = entry & 0xFF
                        s = sym & 15
                        if length + s > real:
                            if fill_fault:
                                return FILL_BEFORE_STUFFING, pos, symbols
                            return (TRUNCATED if pos >= end else UNEXPECTED_MARKER), pos, symbols
                        nbits -= length
                        real -= length
                        value = np.int64(0)
                        if s:
                            bits = (acc >> (nbits - s)) & ((1 << s) - 1)
                            nbits -= s
                            real -= s
                            value = bits - ((1 << s) - 1) if bits < (1 << (s - 1)) else bits
                        acc &= (np.int64(1) << nbits) - 1
                        symbols += 1
                        if k == 0:
                            # jdhuff.c: the predictor wraps as a 32-bit integer, the
                            # coefficient is stored as a 16-bit JCOEF.
                            p32 = (pred[c] + value + 0x80000000) & 0xFFFFFFFF
                            pred[c] = p32 - 0x80000000
                            coef[blk, 0] = ((pred[c] + 0x8000) & 0xFFFF) - 0x8000
                            k = 1
                            continue
                        run = sym >> 4
                        if s:
                            k += run
                            if k > 63:
                                return COEF_OVERFLOW, pos, symbols
                            coef[blk, _NATURAL[k]] = value
                            k += 1
                        elif run == 15:
                            k += 16
                            if k > 64:
                                return COEF_OVERFLOW, pos, symbols
                        else:
                            break  # EOB (libjpeg treats any run with size 0 but ZRL as EOB)
    return OK, pos, symbols


_NATURAL = ZIGZAG.copy()


@dataclass
class _Geometry:
    """Block geometry of the single scan (T.81 A.2)."""

    mcux: int
    mcuy: int
    h: np.ndarray
    v: np.ndarray
    bw: np.ndarray
    bh: np.ndarray
    base: np.ndarray
    comp_w: list[int]
    comp_h: list[int]


def _geometry(info: JpegInfo) -> _Geometry:
    frame = info.frame
    hmax, vmax = frame.hmax, frame.vmax
    comps = frame.components
    comp_w = [-(-frame.width * c.h // hmax) for c in comps]
    comp_h = [-(-frame.height * c.v // vmax) for c in comps]
    if len(comps) == 1:
        # A single-component scan is non-interleaved: one block per MCU (T.81 A.2.2).
        h = v = np.ones(1, dtype=np.int64)
        mcux, mcuy = -(-comp_w[0] // 8), -(-comp_h[0] // 8)
    else:
        h = np.array([c.h for c in comps], dtype=np.int64)
        v = np.array([c.v for c in comps], dtype=np.int64)
        mcux, mcuy = -(-frame.width // (8 * hmax)), -(-frame.height // (8 * vmax))
    bw = mcux * h
    bh = mcuy * v
    base = np.concatenate([[0], np.cumsum(bw * bh)[:-1]]).astype(np.int64)
    return _Geometry(mcux, mcuy, h, v, bw, bh, base, comp_w, comp_h)


def block_order(info: JpegInfo) -> np.ndarray:
    """(component, block row, block column) of every block of the scan in decoding
    order (MCU by MCU, components in scan order, blocks row-major; T.81 A.2).

    Returns:
        int64 array of shape (blocks, 3).
    """
    geo = _geometry(info)
    order = []
    components = [index for index, _, _ in info.scans[0].components]
    for my in range(geo.mcuy):
        for mx in range(geo.mcux):
            for c in components:
                h, v = int(geo.h[c]), int(geo.v[c])
                order += [(c, my * v + by, mx * h + bx) for by in range(v) for bx in range(h)]
    return np.array(order, dtype=np.int64).reshape(-1, 3)


def entropy_decode(data: bytes, info: JpegInfo) -> tuple[list[np.ndarray], int]:
    """Decode the entropy-coded data of a hardware-decodable file.

    Args:
        data: the whole file.
        info: ``parse(data)``, classified as hardware-decodable.

    Returns:
        ``(blocks, symbols)``: per frame component an int16 array of shape
        (blocks_high, blocks_wide, 64) holding quantised coefficients in natural order,
        in the component's MCU-padded block grid; and the number of Huffman symbols
        (DC and AC codes, EOB and ZRL included) decoded.

    Raises:
        Malformed: bad Huffman code, more than 64 coefficients in a block, marker inside
            entropy data, wrong or missing RSTn, or end of data before the last MCU.
    """
    scan = info.scans[0]
    geo = _geometry(info)
    dc_slots = sorted({td for _, td, _ in scan.components})
    ac_slots = sorted({ta for _, _, ta in scan.components})
    luts = np.stack([huffman_lookup(scan.dc_tables[t]) for t in dc_slots]
                    + [huffman_lookup(scan.ac_tables[t]) for t in ac_slots])
    frame_index = np.array([index for index, _, _ in scan.components], dtype=np.int64)
    comp_dc = np.array([dc_slots.index(td) for _, td, _ in scan.components], dtype=np.int64)
    comp_ac = np.array([len(dc_slots) + ac_slots.index(ta) for _, _, ta in scan.components],
                       dtype=np.int64)
    coef = np.zeros((int((geo.bw * geo.bh).sum()), 64), dtype=np.int16)
    buf = np.frombuffer(data, dtype=np.uint8)
    # The MCU holds the scan's components in scan order (T.81 A.2.3).
    status, offset, symbols = _decode_scan(
        buf, scan.data_end, scan.data_start, luts, comp_dc, comp_ac, geo.h[frame_index],
        geo.v[frame_index], geo.bw[frame_index], geo.base[frame_index], geo.mcux, geo.mcuy,
        scan.restart_interval, coef)
    if status != OK:
        raise Malformed(STATUS_REASONS[status], f"entropy-coded data at byte {offset}", offset=offset)
    blocks = [
        coef[geo.base[c] : geo.base[c] + geo.bw[c] * geo.bh[c]].reshape(geo.bh[c], geo.bw[c], 64)
        for c in range(len(geo.base))
    ]
    return blocks, symbols


@numba.njit(cache=True, nogil=True)
def _idct_1d(d0, d1, d2, d3, d4, d5, d6, d7, out):
    # SPEC.md 3.1: one ISLOW pass (jidctint.c), exact integer arithmetic.
    z1 = (d2 + d6) * 4433
    t2 = z1 - d6 * 15137
    t3 = z1 + d2 * 6270
    t0 = (d0 + d4) << 13
    t1 = (d0 - d4) << 13
    e10 = t0 + t3
    e13 = t0 - t3
    e11 = t1 + t2
    e12 = t1 - t2
    a0, a1, a2, a3 = d7, d5, d3, d1
    z1 = a0 + a3
    z2 = a1 + a2
    z3 = a0 + a2
    z4 = a1 + a3
    z5 = (z3 + z4) * 9633
    a0 *= 2446
    a1 *= 16819
    a2 *= 25172
    a3 *= 12299
    z1 *= -7373
    z2 *= -20995
    z3 = z3 * -16069 + z5
    z4 = z4 * -3196 + z5
    a0 += z1 + z3
    a1 += z2 + z4
    a2 += z2 + z3
    a3 += z1 + z4
    out[0] = e10 + a3
    out[7] = e10 - a3
    out[1] = e11 + a2
    out[6] = e11 - a2
    out[2] = e12 + a1
    out[5] = e12 - a1
    out[3] = e13 + a0
    out[4] = e13 - a0


@numba.njit(cache=True, nogil=True)
def _fits16(x):
    return -32768 <= x <= 32767


@numba.njit(cache=True, nogil=True)
def _simd_safe(d0, d1, d2, d3, d4, d5, d6, d7):
    # Inputs and every pairwise sum a 16-bit SIMD lane may form must be exact.
    return (_fits16(d0) and _fits16(d1) and _fits16(d2) and _fits16(d3) and _fits16(d4)
            and _fits16(d5) and _fits16(d6) and _fits16(d7)
            and _fits16(d0 + d4) and _fits16(d0 - d4) and _fits16(d2 + d6)
            and _fits16(d7 + d1) and _fits16(d5 + d3) and _fits16(d7 + d3)
            and _fits16(d5 + d1) and _fits16(d7 + d3 + d5 + d1))


@numba.njit(cache=True, nogil=True)
def _idct_blocks(coef, quant, out, in_range):
    o = np.empty(8, dtype=np.int64)
    ws = np.empty(64, dtype=np.int64)
    limit = (1 << 31) - (1 << 18)
    for b in range(coef.shape[0]):
        ok = True
        x = np.empty(64, dtype=np.int64)
        for i in range(64):
            x[i] = np.int64(coef[b, i]) * quant[i]
        for col in range(8):  # pass 1: columns, DESCALE(o, 11) into a 32-bit workspace
            d0, d1, d2, d3 = x[col], x[8 + col], x[16 + col], x[24 + col]
            d4, d5, d6, d7 = x[32 + col], x[40 + col], x[48 + col], x[56 + col]
            ok = ok and _simd_safe(d0, d1, d2, d3, d4, d5, d6, d7)
            _idct_1d(d0, d1, d2, d3, d4, d5, d6, d7, o)
            for r in range(8):
                ok = ok and -limit <= o[r] <= limit
                w = (o[r] + (1 << 10)) >> 11
                ok = ok and _fits16(w)
                ws[r * 8 + col] = ((w + 0x80000000) & 0xFFFFFFFF) - 0x80000000
        for row in range(8):  # pass 2: rows, DESCALE(o, 18), & 1023 range limit
            base = row * 8
            d0, d1, d2, d3 = ws[base], ws[base + 1], ws[base + 2], ws[base + 3]
            d4, d5, d6, d7 = ws[base + 4], ws[base + 5], ws[base + 6], ws[base + 7]
            ok = ok and _simd_safe(d0, d1, d2, d3, d4, d5, d6, d7)
            _idct_1d(d0, d1, d2, d3, d4, d5, d6, d7, o)
            for c in range(8):
                ok = ok and -limit <= o[c] <= limit
                v = (o[c] + (1 << 17)) >> 18
                ok = ok and -512 <= v <= 511
                out[b, row, c] = _RANGE_LIMIT[v & 1023]
        in_range[b] = ok


def range_limit() -> np.ndarray:
    """The IDCT range-limit table T of SPEC.md 3.1, indexed by ``v & 1023`` (uint8, (1024,))."""
    i = np.arange(1024)
    return np.select([i < 128, i < 512, i < 896], [i + 128, 255, 0], i - 896).astype(np.uint8)


_RANGE_LIMIT = range_limit()


def idct_islow(coef: np.ndarray, quant: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dequantise and inverse-transform coefficient blocks (SPEC.md 3.1, ``jidctint.c``).

    Args:
        coef: quantised coefficients in natural order, int16, shape (N, 64) (or
            (..., 64); leading axes are flattened and restored).
        quant: the quantisation table in natural order, shape (64,), values 0..65535.

    Returns:
        ``(samples, in_range)``: uint8 samples of shape (..., 8, 8) (row-major), and a
        bool array of shape (...) that is False for blocks whose intermediate values
        leave the range where libjpeg-turbo's C and SIMD IDCTs agree (the samples then
        follow the C code: 64-bit products, 32-bit workspace, ``& 1023``).
    """
    lead = coef.shape[:-1]
    flat = np.ascontiguousarray(coef.reshape(-1, 64), dtype=np.int16)
    out = np.empty((flat.shape[0], 8, 8), dtype=np.uint8)
    in_range = np.empty(flat.shape[0], dtype=np.bool_)
    _idct_blocks(flat, np.asarray(quant, dtype=np.int64), out, in_range)
    return out.reshape(*lead, 8, 8), in_range.reshape(lead)


def upsample(plane: np.ndarray, h: int, v: int, height: int, width: int) -> np.ndarray:
    """Fancy upsampling of one chroma plane (SPEC.md 3.2, libjpeg-turbo ``jdsample.c``).

    Args:
        plane: uint8 samples, shape (rows, cols), already cropped to
            ceil(H * v_c / vmax) x ceil(W * h_c / hmax).
        h, v: upsampling factors (1 or 2 each).
        height, width: output size (the frame's H and W).

    Returns:
        uint8 array of shape (height, width).
    """
    p = plane.astype(np.int16)  # sums stay below 4096: 16 bits halve the temporaries
    rows, cols = p.shape
    if (h, v) == (1, 1):
        out = p
    elif h == 2 and cols <= 2:
        out = np.repeat(np.repeat(p, 2, axis=1), v, axis=0)  # h2v1/h2v2_upsample
    elif (h, v) == (2, 1):
        out = np.empty((rows, 2 * cols), dtype=np.int16)
        out[:, 0] = p[:, 0]
        out[:, 2::2] = (3 * p[:, 1:] + p[:, :-1] + 1) >> 2
        out[:, 1:-1:2] = (3 * p[:, :-1] + p[:, 1:] + 2) >> 2
        out[:, -1] = p[:, -1]
    else:
        above = np.concatenate([p[:1], p[:-1]])
        below = np.concatenate([p[1:], p[-1:]])
        if h == 1:
            out = np.empty((2 * rows, cols), dtype=np.int16)
            out[0::2] = (3 * p + above + 1) >> 2
            out[1::2] = (3 * p + below + 2) >> 2
        else:
            c = np.empty((2 * rows, cols), dtype=np.int16)
            c[0::2] = 3 * p + above
            c[1::2] = 3 * p + below
            out = np.empty((2 * rows, 2 * cols), dtype=np.int16)
            out[:, 0] = (4 * c[:, 0] + 8) >> 4
            out[:, 2::2] = (3 * c[:, 1:] + c[:, :-1] + 8) >> 4
            out[:, 1:-1:2] = (3 * c[:, :-1] + c[:, 1:] + 7) >> 4
            out[:, -1] = (4 * c[:, -1] + 7) >> 4
    return out[:height, :width].astype(np.uint8)


def ycbcr_to_rgb(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> np.ndarray:
    """YCbCr to RGB (SPEC.md 3.3, libjpeg-turbo ``jdcolor.c``, SCALEBITS = 16).

    Args:
        y, cb, cr: uint8 planes of equal shape (H, W).

    Returns:
        uint8 array of shape (H, W, 3).
    """
    out = np.empty(y.shape + (3,), dtype=np.uint8)
    for r in range(0, y.shape[0], 256):  # row strips keep the int32 temporaries small
        ys = y[r:r + 256].astype(np.int32)
        xb = cb[r:r + 256].astype(np.int32) - 128
        xr = cr[r:r + 256].astype(np.int32) - 128
        strip = out[r:r + 256]
        strip[..., 0] = np.clip(ys + ((91881 * xr + 32768) >> 16), 0, 255)
        strip[..., 1] = np.clip(ys + ((-22554 * xb + 32768 - 46802 * xr) >> 16), 0, 255)
        strip[..., 2] = np.clip(ys + ((116130 * xb + 32768) >> 16), 0, 255)
    return out


@dataclass
class ModelOutput:
    """Every stage of one reference decode.

    Attributes:
        info: the parsed headers.
        coefficients: per component, int16 (blocks_high, blocks_wide, 64), quantised,
            natural order, MCU-padded block grid.
        samples: per component, uint8 (rows, cols) after the IDCT, cropped to the
            component's real size ceil(H*v/vmax) x ceil(W*h/hmax).
        upsampled: per component, uint8 (H, W).
        rgb: uint8 (H, W, 3).
        symbols: Huffman symbols decoded.
    """

    info: JpegInfo
    coefficients: list[np.ndarray]
    samples: list[np.ndarray]
    upsampled: list[np.ndarray]
    rgb: np.ndarray
    symbols: int


def decode(
    data: bytes,
    *,
    info: JpegInfo | None = None,
    max_width: int = DEFAULT_MAX_WIDTH,
    max_pixels: int | None = -1,
) -> ModelOutput:
    """Decode a JPEG through the reference model.

    Args:
        data: the whole file.
        info: ``parse(data)`` when already done.
        max_width, max_pixels: as for :func:`dlbooster.jpeg.classify`.

    Returns:
        ModelOutput; ``rgb`` equals ``PIL.Image.open(f).convert("RGB")`` byte for byte.

    Raises:
        Unsupported: outside the hardware profile (reason from ``classify``).
        Malformed: the entropy-coded data is damaged (reason from
            :data:`STATUS_REASONS`) or leaves the exact IDCT range (``idct-range``).
    """
    data = bytes(data)
    if info is None:
        info = parse(data)
    reason = classify(info, max_width=max_width, max_pixels=max_pixels)
    if reason is not None:
        raise Unsupported(reason, info.error or info.summary())
    frame = info.frame
    scan = info.scans[0]
    blocks, symbols = entropy_decode(data, info)
    geo = _geometry(info)
    samples = []
    for c, comp in enumerate(frame.components):
        pixels, in_range = idct_islow(blocks[c], scan.qtables[comp.tq])
        if not in_range.all():
            by, bx = np.argwhere(~in_range)[0]
            raise Malformed("idct-range", f"component {c} block ({by}, {bx})")
        bh, bw = in_range.shape
        plane = pixels.transpose(0, 2, 1, 3).reshape(bh * 8, bw * 8)
        samples.append(plane[: geo.comp_h[c], : geo.comp_w[c]])
    height, width = frame.height, frame.width
    if len(samples) == 1:
        upsampled = samples
        rgb = np.repeat(samples[0][:, :, None], 3, axis=2)
    else:
        hmax, vmax = frame.hmax, frame.vmax
        upsampled = [
            upsample(s, hmax // comp.h, vmax // comp.v, height, width)
            for s, comp in zip(samples, frame.components)
        ]
        rgb = ycbcr_to_rgb(*upsampled)
    return ModelOutput(info, blocks, samples, upsampled, rgb, symbols)
