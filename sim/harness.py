"""Fast C++ (Verilator) harness of the entropy decoder core.

cocotb drives the core one clock at a time from Python (a few thousand clocks per
second); this harness runs the clocks in C++ (``sim/cpp/entropy_main.cpp``), millions
per second, for benchmarks and full-corpus checks. The executable is built on first use
and cached by a hash of the flattened Verilog (:func:`dlbooster.sim.netlist.export_flat_verilog`)
and the harness source; an index keyed by the gateware's Python sources and the
parameters finds it again without elaborating the design (as the simulated device's).
"""

from __future__ import annotations

import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlbooster import jpeg
from dlbooster.jpeg import ZIGZAG, model

from .flow import SPEED_CONFIG, build_verilated, cache_root, make_folder, toolchain_env
from .netlist import export_flat_verilog

__all__ = ["EntropyHarness", "HarnessResult", "IdctHarness", "IdctResult", "blocks_from_beats",
           "build_chain_harness", "build_entropy_harness", "build_idct_harness", "pack",
           "ChainHarness", "ChainResult", "LaneHarness", "LaneResult", "build_lane_harness"]

_CPP = Path(__file__).parent / "cpp" / "entropy_main.cpp"
_CPP_IDCT = Path(__file__).parent / "cpp" / "idct_main.cpp"
_CPP_CHAIN = Path(__file__).parent / "cpp" / "chain_main.cpp"
_CPP_LANE = Path(__file__).parent / "cpp" / "lane_main.cpp"
TIMEOUT = 0xFFFFFFFF


def _build_harness(make, params: dict, top: str, cpp: Path, exe_name: str, cflags: str = "",
                   extra: tuple[Path, ...] = ()) -> Path:
    """Build (or reuse) a Verilator executable of the component ``make()`` returns,
    driven by ``cpp`` (:func:`dlbooster.sim.flow.build_verilated`). ``params`` are the
    component's; with ``extra`` (its sources outside ``dlbooster.hw``) they key an
    index (:func:`dlbooster.sim.device.indexed_build`) that finds a finished build
    without elaborating and flattening the design again (tens of seconds for a lane)."""
    from .device import indexed_build, source_key

    toolchain_env()
    header = cpp.parent / "harness.h"
    source = cpp.read_text() + header.read_text() + SPEED_CONFIG.read_text()
    flags = ["-CFLAGS", f"-O2 {cflags}".strip()]
    root = make_folder(cache_root() / "harness")
    # This file too: it maps the parameters onto the component's constructor.
    key = source_key({"top": top, "harness": exe_name, **params}, [cpp, header, Path(__file__), *extra], flags)
    return indexed_build(root, f"{exe_name}-{key}", lambda: build_verilated(
        export_flat_verilog(make(), top), top, cpp, flags, folder=root, name=exe_name, output=f"V{exe_name}",
        sources=[source]))


def build_entropy_harness() -> Path:
    """Build (or reuse) the entropy decoder's Verilator harness; returns its path."""
    from dlbooster.hw.entropy import EntropyDecoder

    return _build_harness(EntropyDecoder, {}, "entropy_decoder", _CPP, "entropy")


def build_idct_harness(lanes: int = 1, modular: bool = False) -> Path:
    """Build (or reuse) the Verilator harness of ``Idct(lanes, modular=modular)``; returns
    its path."""
    from dlbooster.hw.idct import Idct

    return _build_harness(lambda: Idct(lanes, modular=modular), {"lanes": lanes, "modular": modular}, "idct",
                          _CPP_IDCT, "idct", f"-DLANES={lanes}")


def build_chain_harness(fifo_depth: int = 0, lanes: int = 1) -> Path:
    """Build (or reuse) the harness of :class:`dlbooster.sim.chain.EntropyIdctChain`."""
    from .chain import EntropyIdctChain

    return _build_harness(lambda: EntropyIdctChain(fifo_depth, lanes), {"fifo_depth": fifo_depth, "lanes": lanes},
                          "chain", _CPP_CHAIN, "chain", f"-DLANES={lanes}", extra=(Path(__file__).parent / "chain.py",))


def build_lane_harness(max_width: int = 8192, lanes: int = 4) -> Path:
    """Build (or reuse) the Verilator harness of :class:`dlbooster.hw.lane.Lane`."""
    from dlbooster.hw.lane import Lane

    return _build_harness(lambda: Lane(max_width, lanes), {"max_width": max_width, "lanes": lanes}, "lane",
                          _CPP_LANE, "lane")


@dataclass
class HarnessResult:
    """One decode: ``status`` (``Status`` value, or :data:`TIMEOUT`), ``symbols``,
    ``cycles`` (clocks from start to done), ``beats`` (uint64 (N, 2): payload bits 0-63,
    64-65)."""

    status: int
    symbols: int
    cycles: int
    beats: np.ndarray


class _Process:
    """A harness executable reading jobs on stdin; ends on a 0xFFFFFFFF word."""

    def __init__(self, exe: Path, name: str):
        self.name = name
        self.proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(struct.pack("<I", 0xFFFFFFFF))
            self.proc.stdin.close()
            self.proc.wait()
        self.proc.stdout.close()

    def _read(self, n: int) -> bytes:
        out = self.proc.stdout.read(n)
        if len(out) != n:
            raise RuntimeError(f"{self.name} exited early")
        return out


def _coef_beats(blocks: np.ndarray, comps: np.ndarray) -> tuple[dict, np.ndarray]:
    """CoefBeat fields of many blocks at once, as :func:`dlbooster.hw.idct.block_beats`
    gives them one block at a time; also the index of each block's last beat."""
    n = len(blocks)
    zz = blocks[:, ZIGZAG].astype(np.int64)
    present = np.zeros((n, 65), dtype=bool)
    present[:, :64] = zz != 0
    present[:, 0] = True
    present[:, 64] = ~present[:, 63]           # end-of-block beat
    blk, k = np.nonzero(present)
    coef = k < 64
    starts = np.searchsorted(blk, np.arange(n))
    pos = np.arange(len(blk)) - starts[blk]
    fields = {
        "comp": comps[blk], "bx": blk & 0xFFFF, "by": blk >> 16,
        "index": np.where(coef, ZIGZAG[np.minimum(k, 63)], 0),
        "value": np.where(coef, zz[blk, np.minimum(k, 63)], 0) & 0xFFFF,
        "coef": coef, "first": k == 0, "last": k >= 63, "count": pos + coef,
    }
    ends = np.append(starts[1:], len(blk)) - 1
    return fields, ends


def _pack_fields(layout, fields: dict) -> tuple[np.ndarray, np.ndarray]:
    """Pack per-field integer arrays into payload bits 0-63 and 64-127 (uint64 each)."""
    lo = hi = None
    for name, field in layout:
        v = np.asarray(fields[name]).astype(np.uint64) & np.uint64((1 << field.width) - 1)
        if lo is None:
            lo, hi = np.zeros_like(v), np.zeros_like(v)
        if field.offset < 64:
            lo |= v << np.uint64(field.offset)
            if field.offset + field.width > 64:
                hi |= v >> np.uint64(64 - field.offset)
        else:
            hi |= v << np.uint64(field.offset - 64)
    return lo, hi


def _scan_job(data: bytes, info) -> tuple[bytes, bytes, bytes]:
    """The entropy decoder's part of a harness job for the first scan of a file:
    (u32 count + TableWrite words, the ScanConfig as three u32, u32 length + the bytes)."""
    from dlbooster.hw.entropy import ScanConfig, TableWrite, scan_program

    config, writes, start, end = scan_program(info)
    scan_bits = pack(ScanConfig, config)
    words = [pack(TableWrite, w) for w in writes]
    stream = data[start:end]
    return (struct.pack("<I", len(words)) + struct.pack(f"<{len(words)}I", *words),
            struct.pack("<3I", scan_bits & 0xFFFFFFFF, (scan_bits >> 32) & 0xFFFFFFFF, scan_bits >> 64),
            struct.pack("<I", len(stream)) + stream)


class EntropyHarness(_Process):
    """A running Verilator harness of the entropy decoder; decode many scans through one
    core instance.

    Use as a context manager: ``with EntropyHarness() as h: h.decode(data)``.
    """

    def __init__(self):
        super().__init__(build_entropy_harness(), "entropy harness")

    def decode(self, data: bytes, info=None, *, ready_percent: int = 100, seed: int = 1) -> HarnessResult:
        """Decode the first scan of a hardware-decodable JPEG.

        Args:
            data: the file.
            info: ``dlbooster.jpeg.parse(data)`` if already done.
            ready_percent: probability (%) that the coefficient output is ready in a clock.
            seed: seed of the output back-pressure pattern.
        """
        tables, scan, stream = _scan_job(data, info or jpeg.parse(data))
        job = tables + scan + stream + struct.pack("<II", ready_percent, seed)
        self.proc.stdin.write(job)
        self.proc.stdin.flush()
        status, symbols, cycles, n = struct.unpack("<IIQI", self._read(20))
        raw = np.frombuffer(self._read(12 * n), dtype=np.dtype([("lo", "<u8"), ("hi", "<u4")]))
        beats = np.stack([raw["lo"], raw["hi"].astype(np.uint64)], axis=1) if n else np.zeros((0, 2), np.uint64)
        return HarnessResult(status, symbols, cycles, beats)


def _field(beats: np.ndarray, offset: int, width: int) -> np.ndarray:
    """Bits ``offset .. offset + width - 1`` (width <= 64) of payloads held as uint64
    words (N, K), least significant word first."""
    word, shift = divmod(offset, 64)
    value = beats[:, word] >> np.uint64(shift)
    if shift and shift + width > 64:
        value = value | (beats[:, word + 1] << np.uint64(64 - shift))
    return value & np.uint64((1 << width) - 1)


def _read_rows(proc: "_Process", lanes: int, n_blocks: int | None, check: bool = True):
    """Read ``u32 n_beats, u32 words`` and the output beats of a harness; returns
    ``(samples uint8 (N, 8, 8), tags int64 (N, 3), range_fault bool (N,))`` per block,
    checking that every block's beats come in row order with ``last`` on the final one."""
    from dlbooster.hw.idct import block_rows

    n, words = struct.unpack("<II", proc._read(8))
    raw = np.frombuffer(proc._read(4 * words * n), dtype="<u4").reshape(n, words)
    if words % 2:
        raw = np.concatenate([raw, np.zeros((n, 1), dtype="<u4")], axis=1)
    rows = raw.astype(np.uint64)
    rows = rows[:, 0::2] | (rows[:, 1::2] << np.uint64(32))
    layout = block_rows(lanes)
    get = {name: _field(rows, layout[name].offset, layout[name].width).astype(np.int64)
           for name in ("comp", "bx", "by", "row", "last", "range_fault")}
    off = layout["samples"].offset
    samples = np.stack([_field(rows, off + 8 * k, 8) for k in range(8 * lanes)], axis=1)
    per = 8 // lanes
    if not check:
        return None
    if n % per or (n_blocks is not None and n != per * n_blocks):
        raise RuntimeError(f"{n} output beats, expected {per} per block")
    blocks = n // per
    order = np.tile(np.arange(0, 8, lanes), blocks)
    if (get["row"] != order).any() or (get["last"] != (get["row"] == 8 - lanes)).any():
        raise RuntimeError("IDCT output beats out of row order")
    samples = samples.astype(np.uint8).reshape(blocks, 8, 8)
    tags = np.stack([get["comp"][::per], get["by"][::per], get["bx"][::per]], axis=1)
    return samples, tags, get["range_fault"][per - 1::per] == 1


def blocks_from_beats(beats: np.ndarray, shapes: list[tuple[int, int]]) -> tuple[list[np.ndarray], np.ndarray]:
    """Rebuild coefficient grids from CoefBeat payloads, checking the block framing.

    Args:
        beats: uint64 (N, 2) as in :class:`HarnessResult`.
        shapes: per component (blocks_high, blocks_wide).

    Returns:
        ``(grids, tags)``: per component an int16 (bh, bw, 64) array, and the
        (component, by, bx) tag of every block in emission order (int64 (B, 3)).

    Raises:
        ValueError: the beats are not framed as blocks (each starts with a DC beat
            marked ``first``, ends with a ``last`` beat whose ``count`` equals its
            coefficient beats, at most 64 of them, all with the block's tag) or a block
            lies outside the component grids.
    """
    from dlbooster.hw.entropy import CoefBeat

    get = {name: _field(beats, field.offset, field.width).astype(np.int64) for name, field in CoefBeat}
    first, last, coef = get["first"] == 1, get["last"] == 1, get["coef"] == 1
    starts, ends = np.flatnonzero(first), np.flatnonzero(last)
    if len(beats) and (len(starts) != len(ends) or starts[0] != 0 or ends[-1] != len(beats) - 1
                       or (len(starts) > 1 and not (starts[1:] == ends[:-1] + 1).all())):
        raise ValueError("beats are not framed into blocks by first/last")
    block = np.cumsum(first) - 1
    tag = get["comp"] * (1 << 32) + get["by"] * (1 << 16) + get["bx"]
    if len(beats) and ((tag != tag[starts][block]).any() or not (coef[starts]).all()
                       or (get["index"][starts] != 0).any()):
        raise ValueError("a block's beats disagree on its tag, or it does not start with DC")
    counts = np.bincount(block[coef], minlength=len(starts))
    if (counts > 64).any() or (get["count"][ends] != counts).any():
        raise ValueError("a block's count differs from its coefficient beats or exceeds 64")
    value = get["value"]
    value = np.where(value >= 1 << 15, value - (1 << 16), value)
    grids = [np.zeros((bh, bw, 64), dtype=np.int16) for bh, bw in shapes]
    for c, grid in enumerate(grids):
        sel = coef & (get["comp"] == c)
        if (get["by"][sel] >= grid.shape[0]).any() or (get["bx"][sel] >= grid.shape[1]).any():
            raise ValueError(f"a block of component {c} lies outside its grid")
        grid[get["by"][sel], get["bx"][sel], get["index"][sel]] = value[sel]
    if (get["comp"][starts] >= len(grids)).any():
        raise ValueError("a block names a component the scan does not have")
    tags = np.stack([get["comp"][starts], get["by"][starts], get["bx"][starts]], axis=1)
    return grids, tags


def pack(layout, value: dict) -> int:
    """The payload bits of a stream beat given as a dict of ``layout``'s fields."""
    return layout.const(value).as_value().value


@dataclass
class IdctResult:
    """One job through the IDCT core.

    ``samples``: uint8 (N, 8, 8) per block in output order; ``tags``: int64 (N, 3)
    (component, by, bx); ``range_fault``: bool (N,) from each block's row-7 beat;
    ``cycles``: clocks from the first coefficient beat offered to the last row taken;
    ``latency``: clocks from the first block's last coefficient beat to its first row.
    """

    samples: np.ndarray
    tags: np.ndarray
    range_fault: np.ndarray
    cycles: int
    latency: int


class IdctHarness(_Process):
    """A running Verilator harness of :class:`dlbooster.hw.idct.Idct` (``sim/cpp/idct_main.cpp``).

    Use as a context manager: ``with IdctHarness() as h: h.transform(blocks, quant)``.
    """

    def __init__(self, lanes: int = 1, modular: bool = False):
        self.lanes = lanes
        super().__init__(build_idct_harness(lanes, modular), "idct harness")

    def transform(self, blocks: np.ndarray, quant, comps=None, *, valid_percent: int = 100,
                  ready_percent: int = 100, seed: int = 1) -> IdctResult:
        """Dequantise and inverse-transform blocks in the RTL.

        Args:
            blocks: int16 (N, 64) quantised coefficients in natural order.
            quant: per component a table of 64 values in natural order (a single table
                is used for component 0).
            comps: int (N,) component of each block (default all 0); blocks are tagged
                bx = index, by = index >> 16.
            valid_percent / ready_percent: probability (%) that a coefficient beat is
                offered / an output row is taken in a clock.
            seed: seed of both patterns.

        Raises:
            RuntimeError: the core stopped producing rows (a hang) or the harness failed.
        """
        from dlbooster.hw.entropy import CoefBeat
        from dlbooster.hw.idct import QuantWrite, quant_writes

        blocks = np.asarray(blocks, dtype=np.int16).reshape(-1, 64)
        tables = [quant] if np.ndim(quant) == 1 else list(quant)
        comps = np.zeros(len(blocks), dtype=np.int64) if comps is None else np.asarray(comps)
        words = [pack(QuantWrite, w) for c, t in enumerate(tables) for w in quant_writes(c, t)]
        fields, ends = _coef_beats(blocks, comps)
        lo, hi = _pack_fields(CoefBeat, fields)
        raw = np.empty(len(lo), dtype=np.dtype([("lo", "<u8"), ("hi", "<u4")]))
        raw["lo"], raw["hi"] = lo, hi
        job = (struct.pack("<I", len(words)) + struct.pack(f"<{len(words)}I", *words)
               + struct.pack("<I", len(raw)) + raw.tobytes()
               + struct.pack("<5I", len(blocks), ends[0] if len(blocks) else 0,
                             valid_percent, ready_percent, seed))
        self.proc.stdin.write(job)
        self.proc.stdin.flush()
        ok, cycles, latency = struct.unpack("<IQI", self._read(16))
        if not ok:
            _read_rows(self, self.lanes, None, check=False)
            raise RuntimeError(f"IDCT core hung: not all {len(blocks)} blocks came out in {cycles} clocks")
        samples, tags, faults = _read_rows(self, self.lanes, len(blocks))
        return IdctResult(samples, tags, faults, cycles, latency)


@dataclass
class ChainResult:
    """One scan through entropy decoder and IDCT: ``status``, ``symbols``,
    ``done_cycles`` (start to the entropy decoder's done), ``cycles`` (start to the last
    row taken), ``samples`` uint8 (N, 8, 8) and ``tags`` int64 (N, 3) (component, by, bx)
    of the blocks in output order."""

    status: int
    symbols: int
    done_cycles: int
    cycles: int
    samples: np.ndarray
    tags: np.ndarray


class ChainHarness(_Process):
    """A running Verilator harness of the entropy decoder feeding the IDCT core."""

    def __init__(self, fifo_depth: int = 0, lanes: int = 1):
        self.lanes = lanes
        super().__init__(build_chain_harness(fifo_depth, lanes), "chain harness")

    def decode(self, data: bytes, info=None, *, ready_percent: int = 100, seed: int = 1) -> ChainResult:
        """Decode the first scan of a hardware-decodable JPEG to IDCT samples.

        Args:
            data: the file; info: its parsed headers if already at hand.
            ready_percent: probability (%) that an output row is taken in a clock.
            seed: seed of that pattern.
        """
        from dlbooster.hw.idct import QuantWrite, quant_writes

        info = info or jpeg.parse(data)
        tables, scan_words, stream = _scan_job(data, info)
        scan = info.scans[0]
        quant = [pack(QuantWrite, w) for c, (index, _, _) in enumerate(scan.components)
                 for w in quant_writes(c, scan.qtables[info.frame.components[index].tq])]
        n_blocks = len(model.block_order(info))
        job = (tables + struct.pack("<I", len(quant)) + struct.pack(f"<{len(quant)}I", *quant)
               + scan_words + stream + struct.pack("<III", n_blocks, ready_percent, seed))
        self.proc.stdin.write(job)
        self.proc.stdin.flush()
        status, symbols, done_cycles, cycles = struct.unpack("<IIQQ", self._read(24))
        samples, tags, _ = _read_rows(self, self.lanes, n_blocks if status == 0 else None)
        return ChainResult(status, symbols, done_cycles, cycles, samples, tags)


@dataclass
class LaneResult:
    """One file through the lane: ``status`` (0, a stop code, or :data:`TIMEOUT`),
    ``cycles`` (first input beat to ``done``), ``width``/``height`` (FrameInfo), and
    ``rgb`` uint8 (H, W, 3) when the status is 0 and W x H pixels came out (else the
    pixels that came out, (N, 3))."""

    status: int
    cycles: int
    width: int
    height: int
    rgb: np.ndarray


class LaneHarness(_Process):
    """A running Verilator harness of the whole decoder lane (``sim/cpp/lane_main.cpp``)."""

    def __init__(self, max_width: int = 8192, lanes: int = 4):
        super().__init__(build_lane_harness(max_width, lanes), "lane harness")

    def decode(self, data: bytes, *, ready_percent: int = 100) -> LaneResult:
        """Decode one file (offered 4 bytes per clock).

        Raises:
            RuntimeError: the harness process failed.
        """
        from dlbooster.hw.color import rgb_pixels
        from dlbooster.hw.headers import FrameInfo

        if not data:
            raise ValueError("a lane takes no empty file")
        self.proc.stdin.write(struct.pack("<I", len(data)) + data + struct.pack("<I", ready_percent))
        self.proc.stdin.flush()
        status, cycles, info_bits = struct.unpack("<IQQ", self._read(20))
        n, words = struct.unpack("<II", self._read(8))
        raw = np.frombuffer(self._read(4 * words * n), dtype="<u4").reshape(n, words)
        if words % 2:
            raw = np.concatenate([raw, np.zeros((n, 1), dtype="<u4")], axis=1)
        beats = raw.astype(np.uint64)
        beats = beats[:, 0::2] | (beats[:, 1::2] << np.uint64(32))
        layout = rgb_pixels(8)
        count = _field(beats, layout["n"].offset, layout["n"].width).astype(np.int64)
        off = layout["rgb"].offset
        px = np.stack([np.stack([_field(beats, off + 24 * k + 8 * c, 8) for c in range(3)], axis=1)
                       for k in range(8)], axis=1).astype(np.uint8)
        keep = np.arange(8)[None, :] < count[:, None]
        pixels = px[keep]
        width = int((info_bits >> FrameInfo["width"].offset) & 0xFFFF)
        height = int((info_bits >> FrameInfo["height"].offset) & 0xFFFF)
        if status == 0 and len(pixels) == width * height:
            pixels = pixels.reshape(height, width, 3)
        return LaneResult(status, cycles, width, height, pixels)
