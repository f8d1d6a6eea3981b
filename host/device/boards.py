"""Board drivers: the decoder on PYNQ (Zynq) and Alveo (XRT) boards.

Both are *transports* for :class:`dlbooster.device.driver.DecoderDevice`, the driver that the
simulated device runs in CI (register programming, job submission, completions):
only register access, buffer allocation, waiting and reset differ.

- :class:`PynqTransport`: a decoder IP in a ``pynq.Overlay`` (a ``.bit`` with its
  ``.hwh`` on Zynq, or an ``.xclbin`` on Alveo through PYNQ's XRT support). The IP's
  driver class is :func:`decoder_ip_class` (a ``pynq.DefaultIP`` bound to
  :data:`dlbooster.hw.build.boards.VLNV`); buffers come from ``pynq.allocate`` (their
  ``device_address``, ``flush``/``invalidate``); waiting uses the IP's interrupt pin
  when PYNQ exposes it, else polls the interrupt status register.
- :class:`XrtTransport`: XRT's Python binding ``pyxrt``: the kernel opened with
  exclusive CU access (needed for ``read_register``/``write_register``), buffers as
  ``pyxrt.bo`` in the memory bank of the kernel's master, ``sync`` for DMA.

:func:`find_boards` lists what is present (``dlbooster devices``);
:func:`open_board` loads a bitstream or xclbin and returns a started
:class:`DecoderDevice` (``dlbooster flash``). Without pynq or pyxrt installed, or with
no board, they raise :class:`BoardError` saying which.

APIs: PYNQ 3.x documentation (Overlay, DefaultIP ``bindto``, ``allocate``,
``Interrupt``), XRT native Python API ``pyxrt`` (device, xclbin, kernel, bo).
"""

from __future__ import annotations

import re
import struct
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from dlbooster.device.driver import DecoderDevice, drain
from dlbooster.hw.build.boards import BOARDS, TOP, VLNV
from dlbooster.hw.regs import Reg

__all__ = ["BoardError", "PynqTransport", "XrtTransport", "bit_header", "check_binary", "decoder_ip_class",
           "find_boards", "hwh_info", "open_board"]


class BoardError(RuntimeError):
    """No board driver library, no board, or no decoder in the loaded design."""


def _pynq():
    try:
        import pynq
    except ImportError as exc:
        raise BoardError("PYNQ is not installed (pip install pynq; on a board it comes with the "
                         "PYNQ image)") from exc
    return pynq


def _pyxrt():
    try:
        import pyxrt
    except ImportError as exc:
        raise BoardError("XRT's Python binding pyxrt is not importable (install XRT and source "
                         "/opt/xilinx/xrt/setup.sh)") from exc
    return pyxrt


_ip_class = None


def decoder_ip_class():
    """The ``pynq.DefaultIP`` subclass bound to the decoder's VLNV (made on first call,
    which registers it with PYNQ so overlays loaded afterwards use it).

    Raises:
        BoardError: PYNQ is not installed.
    """
    global _ip_class
    if _ip_class is None:
        pynq = _pynq()

        class DecoderIP(pynq.DefaultIP):
            """The dlbooster decoder in a PYNQ overlay; :meth:`decoder` drives it."""

            bindto = [VLNV]

            def decoder(self) -> DecoderDevice:
                """The started :class:`DecoderDevice` over this IP (one per IP: the
                driver keeps the job staging registers' last values)."""
                if getattr(self, "_decoder", None) is None:
                    self._decoder = DecoderDevice(PynqTransport(self))
                    self._decoder.start()
                return self._decoder

        _ip_class = DecoderIP
    return _ip_class


def _poll(transport, reg: Reg, deadline: float) -> bool:
    """Poll register ``reg`` until it is non-zero (True) or ``deadline``
    (``time.monotonic()`` seconds) passes (False)."""
    while not transport.read32(reg):
        if time.monotonic() > deadline:
            return False
        time.sleep(20e-6)
    return True


class _PynqBuffer:
    """A ``pynq.allocate`` buffer as the transport interface wants it."""

    def __init__(self, buffer):
        self.buffer = buffer
        self.array = buffer                 # a numpy array subclass
        self.device_address = int(buffer.device_address)
        self.size = buffer.nbytes

    def sync_to_device(self, nbytes: int | None = None, offset: int = 0) -> None:
        # A slice of a PynqBuffer is a PynqBuffer of that range: only it is flushed.
        (self.buffer if nbytes is None else self.buffer[offset:offset + nbytes]).flush()

    def sync_from_device(self, nbytes: int | None = None, offset: int = 0) -> None:
        (self.buffer if nbytes is None else self.buffer[offset:offset + nbytes]).invalidate()

    def free(self) -> None:
        self.buffer.freebuffer()


class PynqTransport:
    """Register access, buffers and interrupts of a decoder IP in a PYNQ overlay.

    Args:
        ip: the overlay's decoder IP object (``overlay.<name>``, a ``DefaultIP``).
        overlay: the ``pynq.Overlay``, needed by :meth:`reset` (None: reset unavailable).
        clock_hz: the fabric clock, to turn ``wait``'s clock budget into seconds.
        target: the memory bank for ``pynq.allocate`` on Alveo (None: the default).
    """

    name = "pynq"

    def __init__(self, ip, overlay=None, clock_hz: float = 100e6, target=None):
        self.ip, self.overlay, self.clock_hz, self.target = ip, overlay, clock_hz, target
        self._interrupt = getattr(ip, "interrupt", None)

    def read32(self, offset: int) -> int:
        return int(self.ip.read(offset))

    def write32(self, offset: int, value: int) -> None:
        self.ip.write(offset, value & 0xFFFFFFFF)

    def read_block(self, offset: int, count: int) -> list[int]:
        """``count`` consecutive registers: on a memory-mapped device (Zynq) one slice of
        the MMIO's register array, whose ``tolist`` loads each 32-bit word once, in
        order, as ``MMIO.read`` does one; else one read each."""
        array = self.ip.mmio.array
        if isinstance(array, np.ndarray):
            return array[offset >> 2:(offset >> 2) + count].tolist()
        return [self.read32(offset + 4 * i) for i in range(count)]

    def write_block(self, offset: int, values) -> None:
        """Consecutive registers in one ``MMIO.write`` of bytes (pynq stores them word by word)."""
        self.ip.mmio.write(offset, np.asarray(values, "<u4").tobytes())

    def allocate(self, size: int, *, writable: bool = True) -> _PynqBuffer:
        pynq = _pynq()
        options = {"target": self.target} if self.target is not None else {}
        try:
            return _PynqBuffer(pynq.allocate(shape=(size,), dtype=np.uint8, **options))
        except RuntimeError as exc:
            # pynq reports exhausted device memory as RuntimeError("Allocate failed: ...");
            # the runtime's contract for a full memory is MemoryError.
            raise MemoryError(f"pynq.allocate of {size:,} bytes: {exc}") from exc

    def wait(self, max_clocks: int = 1 << 28) -> bool:
        """Block until the interrupt status register is non-zero, or ``max_clocks``
        fabric clocks have passed (False)."""
        deadline = time.monotonic() + max_clocks / self.clock_hz
        if self._interrupt is not None:
            import asyncio

            async def wait_irq():
                await asyncio.wait_for(self._interrupt.wait(), max(deadline - time.monotonic(), 0.0))
            try:
                if not self.read32(Reg.ISR):
                    asyncio.run(wait_irq())
            except TimeoutError:
                pass
            return bool(self.read32(Reg.ISR))
        return _poll(self, Reg.ISR, deadline)

    def reset(self) -> None:
        """Reset the device by loading the bitstream again (the PL is reset on download).

        Raises:
            BoardError: the transport was made without its overlay.
        """
        if self.overlay is None:
            raise BoardError("reset needs the overlay: PynqTransport(ip, overlay)")
        self.overlay.download()


class _XrtBuffer:
    def __init__(self, pyxrt, bo, size: int):
        self._pyxrt, self.bo, self.size = pyxrt, bo, size
        self.array = np.frombuffer(bo.map(), dtype=np.uint8, count=size)
        self.device_address = int(bo.address())

    def sync_to_device(self, nbytes: int | None = None, offset: int = 0) -> None:
        self.bo.sync(self._pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE,
                     self.size - offset if nbytes is None else nbytes, offset)

    def sync_from_device(self, nbytes: int | None = None, offset: int = 0) -> None:
        self.bo.sync(self._pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE,
                     self.size - offset if nbytes is None else nbytes, offset)

    def free(self) -> None:
        self.array = None
        self.bo = None


class XrtTransport:
    """The decoder as an XRT kernel on an Alveo card, through ``pyxrt``.

    Args:
        xclbin: the linked ``.xclbin`` (``v++ -l`` of the ``build --board alveo-*`` folder).
        index: the card's XRT device index.
        clock_hz: the kernel clock (for ``wait``'s clock budget).

    Raises:
        BoardError: pyxrt is missing, the xclbin has no ``dlbooster_decoder`` kernel, or
            XRT fails (no card at ``index``, a file it cannot read or load), with XRT's
            message.
    """

    name = "xrt"

    def __init__(self, xclbin: str | Path, index: int = 0, clock_hz: float = 300e6):
        pyxrt = self._pyxrt = _pyxrt()
        self.clock_hz = clock_hz
        try:
            self.device = pyxrt.device(index)
            binary = pyxrt.xclbin(str(xclbin))
            kernels = [k.get_name() for k in binary.get_kernels()]
        except Exception as exc:              # pyxrt raises RuntimeError, with XRT's text
            raise BoardError(f"XRT cannot open card {index} with {xclbin}: {type(exc).__name__}: {exc}") from exc
        if TOP not in kernels:
            raise BoardError(f"{xclbin} has no {TOP} kernel")
        try:
            uuid = self.device.load_xclbin(binary)
            # Exclusive access: the only way XRT allows register reads and writes on a CU.
            self.kernel = pyxrt.kernel(self.device, uuid, TOP, pyxrt.kernel.cu_access_mode.exclusive)
            self.group = self.kernel.group_id(0)      # the bank of m_axi_gmem (argument in_addr)
        except Exception as exc:
            raise BoardError(f"XRT cannot load {xclbin} on card {index}: {type(exc).__name__}: {exc}") from exc

    def read32(self, offset: int) -> int:
        return int(self.kernel.read_register(offset))

    def write32(self, offset: int, value: int) -> None:
        self.kernel.write_register(offset, value & 0xFFFFFFFF)

    def allocate(self, size: int, *, writable: bool = True) -> _XrtBuffer:
        try:
            bo = self._pyxrt.bo(self.device, max(size, 4096), self._pyxrt.bo.normal, self.group)
        except RuntimeError as exc:
            # XRT's failed buffer allocation is a C++ system_error, a RuntimeError here; the
            # runtime's contract for a full memory is MemoryError.
            raise MemoryError(f"xrt.bo of {size:,} bytes: {exc}") from exc
        return _XrtBuffer(self._pyxrt, bo, size)

    def wait(self, max_clocks: int = 1 << 28) -> bool:
        """Poll ``DONE_COUNT``, not the interrupt status: XRT takes the interrupt of an
        ``ap_ctrl_hs`` kernel for its own scheduler, whose handler clears ``ISR``."""
        return _poll(self, Reg.DONE_COUNT, time.monotonic() + max_clocks / self.clock_hz)

    def reset(self, timeout_s: float = 5.0) -> None:
        """XRT has no per-kernel reset for user code, and clearing ``AP_START`` does not
        stop queued jobs: the device is drained instead (:func:`dlbooster.device.driver.drain`:
        its queued jobs run out, so none can touch buffers released next).

        Raises:
            DeviceError: it did not come to rest in ``timeout_s`` (a hung card needs
                ``xbutil reset``).
        """
        drain(self, timeout_s)


_BIT_PREAMBLE = b"\x00\x09\x0f\xf0\x0f\xf0\x0f\xf0\x0f\xf0\x00\x00\x01"
_BIT_FIELDS = {b"a": "design", b"b": "part", b"c": "date", b"d": "time"}
_XCLBIN_MAGIC = b"xclbin2\x00"
_XCLBIN_LENGTH_AT = 0x130        # axlf.m_header.m_length, a little-endian uint64 (XRT xclbin.h)
_XCLBIN_VBNV_AT = 0x160          # axlf.m_header.m_platformVBNV, 64 bytes, NUL-terminated (XRT xclbin.h)


def bit_header(path: str | Path) -> dict:
    """The header of a Xilinx ``.bit`` file.

    Layout (the one Vivado writes; Xilinx does not document it, FPGA-FAQ 0026 does): 13
    fixed bytes, then fields ``a`` (design), ``b`` (part), ``c`` (date), ``d`` (time), each
    a key byte, a big-endian 16-bit length and a NUL-terminated string, then key ``e`` with
    a big-endian 32-bit length of the configuration data that follows.

    Returns:
        ``{"design", "part", "date", "time"}`` as str (those present), and ``"bytes"``,
        the configuration data's length in bytes (int).

    Raises:
        BoardError: the file does not start with that header, ends inside it or is
            shorter than its ``e`` field says (a truncated copy), or has an unknown field
            key (damaged); OSError from reading passes through.
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(len(_BIT_PREAMBLE) + len(_BIT_FIELDS) * (3 + 0xFFFF) + 5)   # the longest header
        size = f.seek(0, 2)
    if not head.startswith(_BIT_PREAMBLE):
        raise BoardError(f"{path}: not a Xilinx bitstream (no .bit header); give the .bit that Vivado's "
                         f"write_bitstream made")
    fields: dict = {}
    at = len(_BIT_PREAMBLE)
    while True:
        key = head[at:at + 1]
        if key == b"e" and at + 5 <= len(head):
            (fields["bytes"],) = struct.unpack_from(">I", head, at + 1)
            if size < at + 5 + fields["bytes"]:
                raise BoardError(f"{path}: truncated bitstream: {size - at - 5:,} of its {fields['bytes']:,} "
                                 f"configuration bytes")
            return fields
        if key and key != b"e" and key not in _BIT_FIELDS:
            raise BoardError(f"{path}: damaged .bit header at byte {at}")
        if at + (5 if key == b"e" else 3) > len(head) or \
                at + 3 + struct.unpack_from(">H", head, at + 1)[0] > len(head):
            raise BoardError(f"{path}: truncated .bit header: the file ends at byte {len(head)}, inside "
                             f"the header field at byte {at}")
        (length,) = struct.unpack_from(">H", head, at + 1)
        fields[_BIT_FIELDS[key]] = head[at + 3:at + 3 + length].rstrip(b"\0").decode("ascii", "replace")
        at += 3 + length


def _device(part: str) -> str | None:
    """The device of a part name, without family prefix, package or speed grade:
    ``7z020`` of ``xc7z020clg400-1`` or ``7z020clg400``, ``zu7ev`` of ``xczu7ev-ffvc1156-2-e``
    (an ``xa`` or ``xq`` grade prefix as ``xc``); None for a name not of that form."""
    m = re.match(r"(?:x[caq])?(\d*[a-z]+\d+(?:eg|ev|cg|dr)?)", part.lower())
    return m.group(1) if m and re.match(r"\d|zu|u", m.group(1)) else None


def check_binary(board: str, binary: str | Path) -> dict:
    """Check that ``binary`` looks like a file ``board`` can load, before a driver loads it.

    A ``.bit`` (the suffix in any case) must have a whole Xilinx bitstream header
    (:func:`bit_header`) whose part is the board's device (``xc7z020`` for the PYNQ-Z2;
    a part name this function cannot read is let through), and a ``.hwh`` beside it
    that describes a design with the decoder IP (:data:`~dlbooster.hw.build.boards.VLNV`) on
    the same device (:func:`hwh_info`). An ``.xclbin`` must start with XRT's ``xclbin2``
    magic, be as long as its header says, and be linked for a platform of the board's
    card (``m_platformVBNV``: ``xilinx_u50_...`` for the Alveo U50; another shell
    version of the same card is let through, XRT checks the shell when it loads).

    Returns:
        the ``.bit`` header's fields with ``"hwh"`` (:func:`hwh_info`), or
        ``{"bytes": N, "platform": VBNV}`` for an ``.xclbin``.

    Raises:
        BoardError: unknown board, a missing, unreadable or not regular file, the other
            board kind's file, a missing or foreign ``.hwh``, or a file that fails the
            checks above.
    """
    if board not in BOARDS:
        raise BoardError(f"unknown board {board!r}; choose from {', '.join(BOARDS)}")
    binary = Path(binary)
    if not binary.is_file():
        what = "a folder" if binary.is_dir() else "not a regular file" if binary.exists() else "no such file"
        raise BoardError(f"{binary}: {what}; give the .bit (its .hwh beside it) or the .xclbin")
    spec = BOARDS[board]
    suffix = binary.suffix.lower()
    if spec.kind == "alveo" and suffix != ".xclbin":
        raise BoardError(f"{board} loads an .xclbin (v++ links one from `dlbooster build --board {board}`), "
                         f"not {binary.name}")
    if spec.kind == "pynq" and suffix != ".bit":
        raise BoardError(f"{board} loads a .bit with its .hwh beside it (`dlbooster build --board {board}`), "
                         f"not {binary.name}")
    try:
        return _check_contents(board, spec, binary)
    except OSError as exc:
        raise BoardError(f"{binary}: cannot be read: {exc.strerror or exc}") from exc


def _check_contents(board: str, spec, binary: Path) -> dict:
    if spec.kind == "alveo":
        with open(binary, "rb") as f:
            head = f.read(_XCLBIN_VBNV_AT + 64)
            size = f.seek(0, 2)
        if not head.startswith(_XCLBIN_MAGIC):
            raise BoardError(f"{binary}: not an xclbin (no xclbin2 header); give the .xclbin that v++ -l made")
        if len(head) < _XCLBIN_VBNV_AT + 64:
            raise BoardError(f"{binary}: truncated xclbin: {size:,} bytes, shorter than its header")
        (length,) = struct.unpack_from("<Q", head, _XCLBIN_LENGTH_AT)
        if size < length:
            raise BoardError(f"{binary}: truncated xclbin: {size:,} of its {length:,} bytes")
        platform = head[_XCLBIN_VBNV_AT:_XCLBIN_VBNV_AT + 64].split(b"\0")[0].decode("ascii", "replace")
        got, want = _card(platform), _card(spec.platform)
        if got is not None and got != want:
            raise BoardError(f"{binary} was linked for the platform {platform}, but {board} is "
                             f"{spec.platform}")
        return {"bytes": length, "platform": platform}
    header = bit_header(binary)
    want, got = _device(spec.part), _device(header.get("part", ""))
    if got is not None and got != want:
        raise BoardError(f"{binary} was built for {header['part']}, but {board} has {spec.part}")
    hwh = binary.with_suffix(".hwh")
    if not hwh.is_file():
        raise BoardError(f"{hwh} is missing: PYNQ needs it beside the .bit")
    info = hwh_info(hwh)
    if VLNV not in info["vlnvs"]:
        raise BoardError(f"{hwh}: no IP of type {VLNV} in the design it describes; give the .hwh that "
                         f"the build of {binary.name} wrote")
    got = _device(info["device"])
    if got is not None and got != want:
        raise BoardError(f"{hwh} describes a design for {info['device']}, but {board} has {spec.part}")
    return {**header, "hwh": info}


def _card(platform: str) -> str | None:
    """The Alveo card a platform name is for: ``u50`` of ``xilinx_u50_gen3x16_xdma_5_202210_1``
    or of the colon form ``xilinx:u50:gen3x16_xdma_5:202210.1``; None for another form."""
    m = re.match(r"xilinx[_:](u\d+[a-z]*)[_:]", platform.lower())
    return m.group(1) if m else None


def hwh_info(path: str | Path) -> dict:
    """What a Vivado hardware handoff (``.hwh``, the XML PYNQ reads beside a ``.bit``)
    says of its design: ``{"device": str, "vlnvs": set[str]}``, the ``SYSTEMINFO``
    element's ``DEVICE`` (``7z020``; empty when absent) and the ``VLNV`` of every
    ``MODULE`` (each IP instance of the block design).

    Raises:
        BoardError: the file is not well-formed XML; OSError from reading passes through.
    """
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise BoardError(f"{path}: not a hardware handoff file (XML: {exc})") from exc
    system = root.find(".//SYSTEMINFO")
    return {"device": system.get("DEVICE", "") if system is not None else "",
            "vlnvs": {m.get("VLNV") for m in root.iter("MODULE") if m.get("VLNV")}}


def find_boards(problems: list[str] | None = None) -> list[dict]:
    """Boards with a driver present: ``{"driver", "name", "index"}`` per device
    (PYNQ's ``Device.devices`` and XRT's ``enumerate_devices``); empty when neither
    library is installed or nothing is attached. Where ``problems`` is a list, why each
    driver found nothing is appended to it (not installed, or its probe's error), so
    that "no board" and "no driver" can be told apart.
    """
    found = []

    def failed(driver: str, exc: Exception) -> None:
        if problems is not None:
            problems.append(str(exc) if isinstance(exc, BoardError) else f"{driver}: {type(exc).__name__}: {exc}")

    try:
        pynq = _pynq()
        for n, dev in enumerate(pynq.Device.devices):
            found.append({"driver": "pynq", "name": getattr(dev, "name", str(dev)), "index": n})
    except Exception as exc:  # no PYNQ, or a PYNQ without a board raising from its probes
        failed("PYNQ", exc)
    if not any(b["driver"] == "pynq" for b in found):
        try:
            pyxrt = _pyxrt()
            for n in range(pyxrt.enumerate_devices()):
                name = pyxrt.device(n).get_info(pyxrt.xrt_info_device.name)
                found.append({"driver": "xrt", "name": name, "index": n})
        except Exception as exc:  # no pyxrt, or no XRT driver loaded
            failed("XRT", exc)
    return found


def open_board(board: str, binary: str | Path) -> DecoderDevice:
    """Load ``binary`` (a ``.bit`` with its ``.hwh`` beside it, or an ``.xclbin``) on
    ``board`` and return a started :class:`DecoderDevice`.

    Raises:
        BoardError: as :func:`check_binary` (a file that is not the board's, checked
            before any driver is loaded), a missing driver library or board, or no
            decoder in the design.
    """
    check_binary(board, binary)
    binary, spec = Path(binary), BOARDS[board]
    if spec.kind == "alveo":
        try:
            transport = XrtTransport(binary, clock_hz=spec.clock_mhz * 1e6)
        except BoardError as exc:
            if "pyxrt" not in str(exc):
                raise
            try:
                transport = _pynq_transport(binary, spec)  # PYNQ's XRT support instead
            except BoardError as pynq_exc:
                raise BoardError(f"{exc}; {pynq_exc}") from pynq_exc
    else:
        transport = _pynq_transport(binary, spec)
    device = DecoderDevice(transport)
    device.start()
    return device


def _pynq_transport(binary: Path, spec) -> PynqTransport:
    pynq = _pynq()
    decoder_ip_class()
    if not pynq.Device.devices:
        raise BoardError("PYNQ finds no board on this machine")
    try:
        overlay = pynq.Overlay(str(binary))
    except Exception as exc:                  # PYNQ raises what its parsers and drivers raise
        raise BoardError(f"PYNQ cannot load {binary}: {type(exc).__name__}: {exc}") from exc
    for name, info in overlay.ip_dict.items():
        if info.get("type") == VLNV:
            return PynqTransport(getattr(overlay, name), overlay, clock_hz=spec.clock_mhz * 1e6)
    raise BoardError(f"{binary}: no IP of type {VLNV} in the design")
