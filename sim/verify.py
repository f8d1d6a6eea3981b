"""What the decoder lane must do with a file, and whether it did.

The expectation comes from the host: :func:`dlbooster.jpeg.classify` (the hardware
profile, SPEC.md section 2), the reference model (:func:`dlbooster.jpeg.model.decode`, for
the entropy-data faults and the IDCT range) and Pillow (the pixels).

============  ===========================================  ===============================
expect        when                                         the lane passes if
============  ===========================================  ===============================
``decode``    classify accepts, the model decodes          status 0, RGB == Pillow's (a
                                                           file Pillow rejects fails: the
                                                           host's profile has a gap)
``fault``     classify accepts, the model raises reason R  status names R (status_reason)
``stop``      classify rejects for a reason the gateware   a header stop (1..16) for the
              checks                                       reasons the frame and first
                                                           scan headers decide; an entropy
                                                           stop (0x21..0x27) for
                                                           ``after-scan`` and
                                                           ``multi-scan`` (the first scan
                                                           decodes, then what follows it
                                                           is wrong); either for
                                                           ``malformed-header`` and
                                                           ``dnl`` (found before or after
                                                           the scan)
``prescreen`` classify rejects for Pillow's own header     any status (the runtime's
              quirks (MPO, junk between segments, pixel    pre-screen sends these files
              limit, Pillow-only header errors)            to the CPU before the lane)
============  ===========================================  ===============================

Within a class the exact stop code may differ from classify's reason: the gateware
reports the first problem in file order, classify its own priority. Every file, whatever
its class, must also end within :func:`cycle_bound` clocks and put out no more than the
frame's ``W x H`` pixels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlbooster import jpeg
from dlbooster.backends import decode_pillow
from dlbooster.errors import DecodeError, FallbackError, Malformed
from dlbooster.jpeg import model

from .harness import TIMEOUT, LaneResult

__all__ = ["Verdict", "cycle_bound", "expectation", "padded_blocks",
           "stage_differences", "verify_lane"]

#: classify() reasons found only after the first scan, by the entropy decoder.
AFTER_SCAN_REASONS = frozenset({"after-scan", "multi-scan"})
#: classify() reasons whose cause may lie before or after the first scan.
ANYWHERE_REASONS = frozenset({"malformed-header", "dnl"})


def padded_blocks(info) -> int:
    """8x8 blocks of every component in the frame's MCU-padded grid (T.81 A.2); 0 without
    a frame. Sampling factors outside 1..4 count as 1 (the lane stops on them)."""
    frame = info.frame
    if frame is None:
        return 0
    comps = frame.components
    hv = [(c.h if 1 <= c.h <= 4 else 1, c.v if 1 <= c.v <= 4 else 1) for c in comps]
    if len(comps) == 1:
        return -(-frame.width // 8) * -(-frame.height // 8)
    hmax, vmax = max(h for h, _ in hv), max(v for _, v in hv)
    mcux, mcuy = -(-frame.width // (8 * hmax)), -(-frame.height // (8 * vmax))
    return mcux * mcuy * sum(h * v for h, v in hv)


def cycle_bound(n_bytes: int, blocks: int) -> int:
    """Clocks within which the lane must finish a file of ``n_bytes`` whose frame header
    gives ``blocks`` (:func:`padded_blocks`): 16 per byte (the entropy decoder takes at
    least one symbol per two clocks and a byte holds at most eight 1-bit codes; header
    bytes take one clock, a drain a quarter), 64 per block (one per sample; the pixel path
    needs under one per pixel of all components) and 8192 for table loading (eight
    256-clock lookahead fills) and pipeline latency."""
    return 16 * n_bytes + 64 * blocks + 8192


@dataclass
class Verdict:
    """One file through the lane, judged.

    ``expect`` and ``reason`` are the expectation (module doc), ``status`` and
    ``status_reason`` what the lane reported, ``ok`` the judgement and ``detail`` why
    it failed (empty when ok); ``equals_pillow`` whether the lane's RGB equals Pillow's
    (None when there was nothing to compare).
    """

    expect: str
    reason: str | None
    status: int
    status_reason: str | None
    ok: bool
    detail: str = ""
    equals_pillow: bool | None = None


def expectation(data: bytes, max_width: int) -> tuple[str, str | None, np.ndarray | None, object]:
    """``(expect, reason, pillow_rgb or None, info)`` for one file (module doc; ``info``
    is :func:`dlbooster.jpeg.parse`'s result)."""
    info = jpeg.parse(data)
    reason = jpeg.classify(info, max_width=max_width)
    if reason is not None:
        host_only = jpeg.host_prescreen(info, max_width=max_width) is not None
        return ("prescreen" if host_only else "stop"), reason, None, info
    try:
        model.decode(data, info=info, max_width=max_width)
    except Malformed as exc:
        return "fault", exc.reason, None, info
    try:
        return "decode", None, decode_pillow(data), info
    except DecodeError:
        return "decode", None, None, info


def _stop_allowed(reason: str, status: int) -> bool:
    header, entropy = 1 <= status <= 16, 0x21 <= status <= 0x27
    if reason in AFTER_SCAN_REASONS:
        return entropy
    if reason in ANYWHERE_REASONS:
        return header or entropy
    return header


def verify_lane(result: LaneResult, data: bytes, max_width: int) -> Verdict:
    """Judge a :class:`~dlbooster.sim.harness.LaneResult` for ``data`` (module doc)."""
    from dlbooster.hw.lane import status_reason

    expect, reason, rgb, info = expectation(data, max_width)
    if result.status == TIMEOUT:
        return Verdict(expect, reason, result.status, None, False, "no done: the lane hung")
    try:
        got = status_reason(result.status)
    except ValueError:
        return Verdict(expect, reason, result.status, None, False, f"unknown status {result.status:#x}")
    verdict = Verdict(expect, reason, result.status, got, True)
    problems = []
    if info.frame is not None:
        width, height = info.frame.width, info.frame.height
    else:
        width, height = result.width, result.height
    bound = cycle_bound(len(data), padded_blocks(info))
    if result.cycles > bound:
        problems.append(f"{result.cycles} clocks, over the bound {bound}")
    pixels = result.rgb.shape[0] * result.rgb.shape[1] if result.rgb.ndim == 3 else len(result.rgb)
    if pixels > width * height:
        problems.append(f"{pixels} pixels out of a {width}x{height} frame")
    if expect == "decode":
        if rgb is None:
            problems.append("Pillow rejects a file classify accepts and the model decodes")
        elif result.status != 0:
            problems.append(f"stopped with {result.status:#x} ({got}) on a file Pillow decodes")
        elif result.rgb.shape != rgb.shape:
            verdict.equals_pillow = False
            problems.append(f"shape {result.rgb.shape}, Pillow {rgb.shape}")
        else:
            verdict.equals_pillow = bool(np.array_equal(result.rgb, rgb))
            if not verdict.equals_pillow:
                bad = np.argwhere((result.rgb != rgb).any(axis=2))
                y, x = bad[0]
                problems.append(f"{len(bad)} pixels differ from Pillow, first at (y, x) = ({y}, {x})")
    elif expect == "fault" and got != reason:
        problems.append(f"status {result.status:#x} ({got}), the model says {reason}")
    elif expect == "stop" and not _stop_allowed(reason, result.status):
        problems.append(f"status {result.status:#x} ({got}) for a file classify rejects as {reason}")
    if problems:
        verdict.ok = False
        verdict.detail = "; ".join(problems)
    return verdict


def stage_differences(data: bytes, coef_beats: list[int], row_beats: list[int],
                      ycc_beats: list[int], lanes: int = 4, max_width: int = 8192) -> list[str]:
    """Where the lane's stages first leave the reference model (a debugging aid).

    Args:
        data: the file.
        coef_beats, row_beats, ycc_beats: raw payloads taken on the lane's probe ports
            (:class:`dlbooster.hw.lane.Lane` with ``probes=True``) in the order they fired:
            entropy decoder -> IDCT, IDCT -> planes, upsampled planes -> colour conversion.
        lanes: the lane's IDCT rows per beat.

    Returns:
        One line per stage that differs (``entropy``, ``idct``, ``upsample``), in pipeline
        order, naming the first differing block or pixel; empty when every stage agrees
        or the model does not decode the file (nothing to compare).
    """
    from dlbooster.hw.color import ycbcr_pixels
    from dlbooster.hw.entropy import CoefBeat
    from dlbooster.hw.idct import block_rows

    info = jpeg.parse(data)
    try:
        out = model.decode(data, info=info, max_width=max_width)
    except FallbackError:
        return []
    frame, scan = info.frame, info.scans[0]
    lines = []

    def inside(grids, comp, by, bx):
        return comp < len(grids) and by < grids[comp].shape[0] and bx < grids[comp].shape[1]

    got = [np.zeros_like(b) for b in out.coefficients]
    seen = [np.zeros(b.shape[:2], dtype=bool) for b in out.coefficients]
    outside = 0
    for raw in coef_beats:
        beat = CoefBeat.from_bits(raw)
        if not inside(got, beat.comp, beat.by, beat.bx):
            outside += 1
            continue
        seen[beat.comp][beat.by, beat.bx] = True
        if beat.coef:
            got[beat.comp][beat.by, beat.bx, beat.index] = beat.value
    if outside:
        lines.append(f"entropy: {outside} coefficient beats for blocks outside the image's grid")
    for c, want in enumerate(out.coefficients):
        bad = ~seen[c] | (got[c] != want).any(axis=2)
        if bad.any():
            by, bx = np.argwhere(bad)[0]
            k = int(np.argmax(got[c][by, bx] != want[by, bx]))
            lines.append(f"entropy: {int(bad.sum())} blocks of component {c} differ or are missing; "
                         f"first block (by={by}, bx={bx}): " + (
                             "never decoded" if not seen[c][by, bx] else
                             f"coefficient {k} (natural order) is {got[c][by, bx, k]}, "
                             f"the model has {want[by, bx, k]}"))
            break

    layout = block_rows(lanes)
    want_blocks = [model.idct_islow(b, scan.qtables[frame.components[c].tq])[0]
                   for c, b in enumerate(out.coefficients)]
    got_blocks = [np.zeros_like(w) for w in want_blocks]
    rows_seen = [np.zeros(w.shape[:2], dtype=np.int64) for w in want_blocks]
    outside = 0
    for raw in row_beats:
        beat = layout.from_bits(raw)
        if not inside(got_blocks, beat.comp, beat.by, beat.bx):
            outside += 1
            continue
        rows_seen[beat.comp][beat.by, beat.bx] += lanes
        for q in range(lanes):
            if beat.row + q < 8:
                got_blocks[beat.comp][beat.by, beat.bx, beat.row + q] = [beat.samples[8 * q + i] for i in range(8)]
    if outside:
        lines.append(f"idct: {outside} row beats for blocks outside the image's grid")
    for c, (g, w) in enumerate(zip(got_blocks, want_blocks)):
        bad = (g != w).any(axis=(2, 3)) | (rows_seen[c] != 8)
        if bad.any():
            by, bx = np.argwhere(bad)[0]
            lines.append(f"idct: {int(bad.sum())} blocks of component {c} differ or have not 8 rows; "
                         f"first block (by={by}, bx={bx}), {rows_seen[c][by, bx]} rows: lane\n{g[by, bx]}\n"
                         f"model\n{w[by, bx]}")
            break

    layout = ycbcr_pixels(8)
    planes = {"y": [], "cb": [], "cr": []}
    for raw in ycc_beats:
        beat = layout.from_bits(raw)
        for name in planes:
            planes[name] += [getattr(beat, name)[i] for i in range(beat.n)]
    h, w = frame.height, frame.width
    want_planes = out.upsampled if len(out.upsampled) == 3 else [out.upsampled[0], None, None]
    for name, want in zip(planes, want_planes):
        have = np.array(planes[name], dtype=np.int64)
        want = np.full((h, w), 128) if want is None else np.asarray(want, dtype=np.int64)
        if have.size != h * w:
            lines.append(f"upsample: {have.size} {name} samples for a {w}x{h} image")
            break
        bad = np.argwhere(have.reshape(h, w) != want)
        if len(bad):
            y, x = bad[0]
            lines.append(f"upsample: {len(bad)} {name} samples differ; first at (y={y}, x={x}): "
                         f"lane {have.reshape(h, w)[y, x]}, model {want[y, x]}")
            break
    return lines
