"""Decode backends and the one-image decode API.

A backend turns the bytes of one file into an (H, W, 3) uint8 RGB array equal to
``PIL.Image.open(f).convert("RGB")``, or raises:

- :class:`~dlbooster.errors.FallbackError` when it cannot take the input (outside the
  hardware profile, or a stream fault the hardware flags); the CPU path then decodes it;
- :class:`~dlbooster.errors.DecodeError` when the input is not decodable at all.

Backends here: ``cpu`` (libjpeg-turbo through simplejpeg where that is proven identical
to Pillow, else Pillow itself), ``model`` (the reference model of the decoder lane) and
``sim`` (the simulated decoder device, driven like a board).
``auto`` picks a present board, else ``cpu``; the choice is logged.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import stat
import warnings
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import numpy as np

from dlbooster import jpeg
from dlbooster.jpeg import model as reference
from dlbooster.errors import DecodeError, FallbackError, Unsupported

__all__ = [
    "BACKENDS",
    "CpuBackend",
    "DecodeResult",
    "ModelBackend",
    "SimBackend",
    "decode",
    "decode_result",
    "decode_results",
    "get_backend",
    "LARGE_FILE",
    "LargeFile",
    "read_file",
    "read_input",
]

log = logging.getLogger("dlbooster")

try:
    import simplejpeg
except ImportError:  # pragma: no cover - simplejpeg is a declared dependency
    simplejpeg = None


def _simplejpeg_safe(info: jpeg.JpegInfo) -> bool:
    """True when simplejpeg's libjpeg-turbo decode is known to equal Pillow's.

    Both bundle libjpeg-turbo with the same defaults (ISLOW, fancy upsampling); they can
    differ only where Pillow's own Python header parser decides differently (colour
    modes, short APP segments, MPO, the decompression-bomb limit). simplejpeg runs in
    strict mode, so any libjpeg warning (corrupt data) sends the file to Pillow. Fill
    bytes before a stuffed zero (``Scan.fill_before_stuffing``) raise no warning, but
    libjpeg-turbo decodes them by whether its fast Huffman path is taken, which depends
    on how much input is buffered: Pillow feeds 64 KiB blocks, simplejpeg the whole
    file, so such files go to Pillow (as do files parsed ``headers_only``, whose
    entropy-coded data was not looked at).
    """
    frame = info.frame
    return (
        frame is not None
        and info.error is None
        and not info.headers_only
        and all(scan.fill_before_stuffing < 0 for scan in info.scans)
        and jpeg.pillow_header_error(info) is None
        and not info.mpf
        and not info.junk_bytes
        and info.eoi >= 0
        and frame.sof in (0, 1, 2)
        and frame.precision == 8
        and info.color_space in ("gray", "ycbcr")
        and frame.width * frame.height > 0
        and ((limit := jpeg.pillow_max_pixels()) is None or frame.width * frame.height <= limit)
    )


class CpuBackend:
    """Decode on the host CPU, identical to Pillow by construction.

    JPEGs that :func:`_simplejpeg_safe` admits go through simplejpeg (libjpeg-turbo,
    ~1.4x Pillow's images/s, see docs/benchmarks.md); everything else, including
    non-JPEG content, goes through ``PIL.Image.open(...).convert("RGB")``.
    """

    name = "cpu"

    def decode(self, data: bytes, info: jpeg.JpegInfo | None = None) -> np.ndarray:
        """Decode one file.

        Returns:
            (H, W, 3) uint8 array.

        Raises:
            DecodeError: Pillow cannot decode the input (reason ``undecodable``, detail
                names Pillow's exception).
        """
        if simplejpeg is not None:
            if info is None:
                info = jpeg.parse(data)
            if _simplejpeg_safe(info):
                try:
                    return simplejpeg.decode_jpeg(data, colorspace="rgb", strict=True)
                except ValueError:
                    pass  # a libjpeg warning or error: let Pillow decide
        return decode_pillow(data)

    def decode_into(self, data: bytes, info: jpeg.JpegInfo, out: np.ndarray) -> np.ndarray:
        """Like :meth:`decode`, writing into ``out`` when the image fits.

        Args:
            out: writable contiguous 1-D uint8 array (a batch slot).

        Returns:
            The (H, W, 3) uint8 image: a view of ``out``'s head when ``3 * H * W <=
            out.size`` (simplejpeg decodes in place; Pillow's result is copied in), else a
            new array.

        Raises:
            DecodeError: as :meth:`decode`.
        """
        if simplejpeg is not None and _simplejpeg_safe(info):
            n = 3 * info.frame.width * info.frame.height
            try:
                return simplejpeg.decode_jpeg(data, colorspace="rgb", strict=True,
                                              buffer=out[:n] if n <= out.size else None)
            except ValueError:
                pass
        image = decode_pillow(data)
        if image.size > out.size:
            return image
        view = out[: image.size].reshape(image.shape)
        view[...] = image
        return view


def decode_pillow(data: bytes | str) -> np.ndarray:
    """The reference: ``np.asarray(PIL.Image.open(f).convert("RGB"))``.

    Args:
        data: the file's bytes, or its path (str): Pillow then reads only what it needs
            (a :class:`LargeFile`).

    Raises:
        DecodeError: whatever Pillow raises, as reason ``undecodable``.
    """
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(data if isinstance(data, str) else io.BytesIO(data)) as im:
                return np.asarray(im.convert("RGB"))
    except Exception as exc:  # Pillow raises many types (OSError, SyntaxError, ...)
        # Pillow names the in-memory file by its repr, whose address differs per run.
        message = _BYTESIO_REPR.sub("", str(exc))
        raise DecodeError("undecodable", f"Pillow: {type(exc).__name__}: {message}") from exc


_BYTESIO_REPR = re.compile(r" ?<_io\.BytesIO object at 0x[0-9a-fA-F]+>")


class ModelBackend:
    """The reference model of the decoder lane (:mod:`dlbooster.jpeg.model`).

    Args:
        max_width: line-buffer width of the modelled lane, in pixels.
    """

    name = "model"

    def __init__(self, max_width: int = jpeg.DEFAULT_MAX_WIDTH):
        self.max_width = max_width

    def decode(self, data: bytes, info: jpeg.JpegInfo | None = None) -> np.ndarray:
        """Decode one file through the model.

        Raises:
            Unsupported: outside the hardware profile.
            Malformed: a stream fault the hardware flags.
        """
        return self.decode_stages(data, info).rgb

    def decode_stages(self, data: bytes, info: jpeg.JpegInfo | None = None) -> reference.ModelOutput:
        """Like :meth:`decode`, returning every stage of the model. A scan's undefined
        Huffman tables 0 and 1 are libjpeg-turbo's standard ones, inserted into the input
        as the runtime does for the device (:func:`dlbooster.jpeg.standard_huffman_segment`)."""
        if info is None:
            info = jpeg.parse(data)
        tables = jpeg.standard_huffman_segment(info)
        if tables is not None:
            data = jpeg.with_standard_huffman(data, tables)
            info = jpeg.parse(data)
        return reference.decode(data, info=info, max_width=self.max_width)


class DeviceBackend:
    """A backend over decoder devices (:class:`dlbooster.device.driver.DecoderDevice`): the
    simulated device and the boards share this, differing only in how the devices are
    made. ``self.devices`` (started), ``self.device`` (the first) and ``self.max_width``
    are set by subclasses.

    :meth:`decode_many` (``dlbooster decode --backend sim``, the device's verification
    path) sends only the inputs :func:`dlbooster.jpeg.host_prescreen` names to the CPU;
    every other input runs on the device, and a non-zero job status declines the input
    with the hardware's reason (:func:`dlbooster.hw.regs.device_reason`), so the
    gateware's own header checks are exercised. The runtime's decode service
    (:mod:`dlbooster.runtime.service`) pre-screens with the whole header classification instead.
    """

    name = "device"
    devices: list
    max_width: int

    def close(self) -> None:
        """Release the devices (subclasses free what they hold)."""
        self.devices.clear()

    def decode(self, data: bytes, info: jpeg.JpegInfo | None = None) -> np.ndarray:
        """Decode one file on the device.

        Raises:
            FallbackError: the pre-screen or the device declined it (reason as above).
        """
        out, _ = self.decode_many([data], [info or jpeg.parse(data)])[0]
        if isinstance(out, FallbackError):
            raise out
        return out

    def decode_many(self, datas: list[bytes], infos: list[jpeg.JpegInfo]) -> list[tuple[Any, dict]]:
        """Decode many files, all lanes busy. Returns per input ``(image or FallbackError,
        extra)``; ``extra`` holds the device's ``cycles``, ``symbols`` and ``lane`` for
        inputs that ran on it. A device fault (:class:`~dlbooster.device.driver.DeviceError`;
        the driver has reset the device) declines every input of the call that ran on it
        with reason ``device-fault``, for the CPU path."""
        from dlbooster.device.driver import DeviceError

        results: list[tuple[Any, dict] | None] = [None] * len(datas)
        jobs = []
        datas = list(datas)
        for i, (data, info) in enumerate(zip(datas, infos)):
            tables = jpeg.standard_huffman_segment(info)
            if tables is not None:            # a Motion-JPEG frame: the tables libjpeg-turbo assumes
                data = datas[i] = jpeg.with_standard_huffman(data, tables)
                info = jpeg.parse(data, headers_only=info.headers_only)
            reason = jpeg.host_prescreen(info, max_width=self.max_width)
            if reason is None and not data:
                reason = jpeg.classify(info, max_width=self.max_width)
            if reason is not None:
                results[i] = (Unsupported(reason, "host pre-screen"), {})
                continue
            frame = info.frame
            fits = frame is not None and frame.width <= self.max_width
            jobs.append((i, frame.width * frame.height * 3 if fits else 0))
        try:
            outcomes = self.device.decode_batch([(datas[i], cap) for i, cap in jobs])
        except DeviceError as exc:
            for i, _ in jobs:
                results[i] = (FallbackError("device-fault", str(exc)), {})
            return results
        for (i, _), outcome in zip(jobs, outcomes):
            done = outcome.completion
            extra = {"cycles": done.clocks, "symbols": done.symbols, "lane": done.lane}
            if done.status:
                results[i] = (FallbackError(done.reason, f"device status 0x{done.status:02x}"), extra)
            else:
                results[i] = (outcome.image, extra)
        return results


class SimBackend(DeviceBackend):
    """The simulated decoder device (:mod:`dlbooster.sim.device`), driven by the same
    driver as a board (:class:`dlbooster.device.driver.DecoderDevice`).

    Args:
        lanes: decoder lanes of each simulated device.
        max_width: its line-buffer width, pixels.
        devices: simulated devices (each its own simulation and memory; the runtime's
            :class:`~dlbooster.runtime.service.DecodeService` drives them all at once,
            :meth:`decode_many` uses the first).

    The first use builds the device (minutes; cached).
    """

    name = "sim"

    def __init__(self, lanes: int = 1, max_width: int = jpeg.DEFAULT_MAX_WIDTH, devices: int = 1):
        from dlbooster.device.driver import DecoderDevice
        from dlbooster.sim.device import SimTransport

        if devices < 1:
            raise ValueError(f"devices must be at least 1, not {devices}")
        self.lanes, self.max_width = lanes, max_width
        self.devices = [DecoderDevice(SimTransport(lanes=lanes, max_width=max_width)) for _ in range(devices)]
        for device in self.devices:
            device.start()
        self.device = self.devices[0]

    def close(self) -> None:
        """End the simulations and free their memory."""
        for device in self.devices:
            device.transport.close()
        self.devices.clear()

class BoardBackend(DeviceBackend):
    """A decoder board (:mod:`dlbooster.device.boards`): PYNQ (Zynq) or Alveo (XRT).

    Args:
        board: a ``dlbooster build --board`` name (``pynq-z2``, ``zcu104``, ``alveo-u50``,
            ``alveo-u250``).
        binary: the ``.bit`` (with its ``.hwh`` beside it) or ``.xclbin`` to load.

    Raises:
        dlbooster.device.boards.BoardError: as :func:`dlbooster.device.boards.open_board`: a binary
            that is not the board's, no driver library, no board, or no decoder in it.
    """

    def __init__(self, board: str, binary: str):
        from dlbooster.device.boards import open_board

        device = open_board(board, binary)
        self.name = device.transport.name
        self.devices = [device]
        self.device = device
        self.lanes, self.max_width = device.lanes, device.max_width


_logged_auto: list[bool] = []  # log the auto choice once per process

#: Backend names accepted by :func:`get_backend`.
BACKENDS = ("auto", "cpu", "model", "sim", "pynq", "xrt")


def get_backend(name: str = "auto", **options: Any):
    """Return a backend instance by name.

    Args:
        name: one of :data:`BACKENDS`. ``auto`` opens the board named by the
            ``DLBOOSTER_BOARD`` and ``DLBOOSTER_BINARY`` environment variables when both are
            set, else takes ``cpu``, and logs its choice (a warning when only one of
            them is set); ``pynq``/``xrt`` need ``board=`` and ``binary=`` options
            (:class:`BoardBackend`); ``xrt`` drives Alveo boards only, ``pynq`` either kind.
        options: backend options (``max_width`` for ``model``; ``lanes`` and
            ``max_width`` for ``sim``).

    Raises:
        ValueError: unknown name, a board backend without a board and binary, or
            ``xrt`` with a Zynq board.
    """
    if name == "auto":
        board, binary = os.environ.get("DLBOOSTER_BOARD"), os.environ.get("DLBOOSTER_BINARY")
        if board and binary:
            backend = BoardBackend(board, binary)
            log.info("backend auto: %s board %s with %s", backend.name, board, binary)
            return backend
        if not _logged_auto:
            if board or binary:               # half a configuration is a mistake worth showing
                log.warning("backend auto: %s is set but %s is not, using cpu",
                            *(("DLBOOSTER_BOARD", "DLBOOSTER_BINARY") if board else
                              ("DLBOOSTER_BINARY", "DLBOOSTER_BOARD")))
            else:
                log.info("backend auto: no decoder board configured (DLBOOSTER_BOARD, DLBOOSTER_BINARY), "
                         "using cpu")
            _logged_auto.append(True)
        return CpuBackend()
    if name in ("pynq", "xrt"):
        from dlbooster.hw.build.boards import BOARDS

        board = options.get("board") or os.environ.get("DLBOOSTER_BOARD")
        binary = options.get("binary") or os.environ.get("DLBOOSTER_BINARY")
        if not (board and binary):
            raise ValueError(f"backend {name} needs a board and its binary: board= and binary= (the command "
                             "line's --board and --binary), or the DLBOOSTER_BOARD and DLBOOSTER_BINARY "
                             "environment variables")
        if name == "xrt" and board in BOARDS and BOARDS[board].kind != "alveo":
            alveo = ", ".join(b for b, spec in BOARDS.items() if spec.kind == "alveo")
            raise ValueError(f"backend xrt drives Alveo boards ({alveo}); {board} is a Zynq board: use "
                             "backend pynq")
        return BoardBackend(board, binary)
    if name == "cpu":
        return CpuBackend()
    if name == "model":
        return ModelBackend(**options)
    if name == "sim":
        return SimBackend(**options)
    raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")


@dataclass
class DecodeResult:
    """Outcome of one input.

    Attributes:
        path: the input's name.
        status: ``ok`` (the requested backend decoded it), ``fallback`` (the CPU path
            did, because the requested backend could not) or ``error``.
        backend: the backend that produced the pixels, None on error.
        reason: why the requested backend declined or why decoding failed; None if ok.
        detail: human readable detail of ``reason``.
        image: (H, W, 3) uint8, None on error.
        extra: backend figures (``symbols`` for the model; ``cycles``, ``symbols`` and
            ``lane`` for the simulated device).
    """

    path: str
    status: str
    backend: str | None
    reason: str | None
    detail: str = ""
    image: np.ndarray | None = field(default=None, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def width(self) -> int | None:
        return None if self.image is None else int(self.image.shape[1])

    @property
    def height(self) -> int | None:
        return None if self.image is None else int(self.image.shape[0])

    @property
    def sha256(self) -> str | None:
        """Hex SHA-256 of the H*W*3 C-order RGB bytes."""
        if self.image is None:
            return None
        return hashlib.sha256(np.ascontiguousarray(self.image).data).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "status": self.status,
            "backend": self.backend,
            "reason": self.reason,
            "width": self.width,
            "height": self.height,
            "sha256": self.sha256,
            "detail": self.detail or None,
            **self.extra,
        }


def read_input(source: str | os.PathLike | bytes | bytearray | memoryview) -> tuple[bytes, str]:
    """An input's bytes and its name (the path, or ``<bytes>``).

    Raises:
        DecodeError: ``unreadable``: missing, not a regular file (a FIFO would block,
            ``/dev/zero`` would fill memory), or the read failed; ``undecodable``: empty
            (detail ``empty file`` or ``empty input``, as the runtime's service says).
        LargeFile: as :func:`read_file`.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, name = bytes(source), "<bytes>"
    else:
        name = os.fspath(source)
        data = read_file(name)[0]
    if not data:
        raise DecodeError("undecodable", "empty input" if name == "<bytes>" else "empty file", name)
    return data, name


#: Files of this many bytes or more are not read into memory: no device takes one (its
#: 32-bit ``JOB_IN_LEN``: reason ``input-size``, :mod:`dlbooster.jpeg`), and one can be
#: larger than memory. Pillow decodes them from the file, reading only what it needs.
LARGE_FILE = 1 << 32


class LargeFile(FallbackError):
    """:func:`read_file` left a file of :data:`LARGE_FILE` bytes or more on disk (reason
    ``input-size``, ``source`` its path): decode it with :func:`decode_pillow` on the path."""


_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC   # read_file's


def read_file(path: str, into: Callable[[int], np.ndarray | None] | None = None
              ) -> tuple[bytes | memoryview, os.stat_result]:
    """A regular file's bytes and its status (size, modification time).

    Regular files only: ``/dev/zero`` would fill memory, a FIFO would block (and opening
    one would release its writer); ``O_NONBLOCK`` covers a swap after the check. Raw
    descriptor calls: six system calls per file where ``stat`` and a buffered ``open()``
    make eleven (the runtime reads every input through here).

    Args:
        path: the file.
        into: optional ``into(size)`` giving a writable uint8 array of at least ``size``
            bytes (the file's size at ``fstat``), or None to decline. The file is then read
            straight into it (a device's staging buffer: no copy of the bytes afterwards)
            and the result is a memoryview of its head; at most ``size`` bytes are read, so
            a file that grows meanwhile is cut at the size it had when opened. Files whose
            size is 0 (``/proc`` files) are read into bytes to the end.

    Raises:
        DecodeError: ``unreadable`` (missing, not a regular file, a failed read, or
            more bytes than memory holds).
        LargeFile: the file has :data:`LARGE_FILE` bytes or more (nothing is read).
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise DecodeError("unreadable", "not a regular file", path)
        fd = os.open(path, _OPEN_FLAGS)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise DecodeError("unreadable", "not a regular file", path)
            size = st.st_size
            if size >= LARGE_FILE:
                raise LargeFile("input-size", f"{size} bytes, decoded by Pillow from the file", path)
            array = into(size) if into is not None and size else None
            if array is not None:
                view = memoryview(array)[:size]
                n = done = os.readv(fd, [view])
                # A read of 0 bytes: it shrank meanwhile: what it holds now, as a read to the end gives.
                while n and done < size:
                    n = os.readv(fd, [view[done:]])
                    done += n
                return (view if done == size else view[:done]), st
            parts = []
            while chunk := os.read(fd, max(size, 1 << 16)):
                parts.append(chunk)
        finally:
            os.close(fd)
    except (OSError, ValueError, MemoryError) as exc:   # ValueError: a NUL byte in the path
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or "out of memory"
        raise DecodeError("unreadable", f"{type(exc).__name__}: {detail}", path) from exc
    return (parts[0] if len(parts) == 1 else b"".join(parts)), st


def _from_file(large: LargeFile, backend) -> DecodeResult:
    """The result for a file :func:`read_file` left on disk: Pillow decodes it from the
    file, the CPU path's result for every backend (none other can take it)."""
    path, declined = large.source, not isinstance(backend, CpuBackend)
    try:
        image = decode_pillow(path)
    except DecodeError as exc:
        return DecodeResult(path, "error", None, exc.reason, exc.detail,
                            extra={"declined": large.reason} if declined else {})
    if declined:
        return DecodeResult(path, "fallback", "cpu", large.reason, large.detail, image)
    return DecodeResult(path, "ok", "cpu", None, image=image)


def _fallback(name: str, data: bytes, info, declined: FallbackError, cpu, extra: dict) -> DecodeResult:
    """The CPU path's result for an input a backend declined."""
    fallback = cpu or CpuBackend()
    try:
        image = fallback.decode(data, info)
    except DecodeError as exc:
        # The backend's own reason stays on record beside the CPU path's.
        return DecodeResult(name, "error", None, exc.reason, exc.detail,
                            extra={**extra, "declined": declined.reason})
    return DecodeResult(name, "fallback", fallback.name, declined.reason, declined.detail, image, extra)


def decode_result(source, backend="auto", *, cpu: CpuBackend | None = None) -> DecodeResult:
    """Decode one input with a backend, falling back to the CPU path when it declines.

    Args:
        source: a path or the file's bytes.
        backend: a backend name or instance.
        cpu: the CPU backend to fall back on (a fresh one if None).

    Returns:
        DecodeResult; never raises for bad input.
    """
    if isinstance(backend, str):
        backend = get_backend(backend)
    if hasattr(backend, "decode_many"):
        return decode_results([source], backend, cpu=cpu)[0]
    try:
        data, name = read_input(source)
    except DecodeError as exc:
        return DecodeResult(exc.source, "error", None, exc.reason, exc.detail)
    except LargeFile as large:
        return _from_file(large, backend)
    info = jpeg.parse(data)
    try:
        if isinstance(backend, ModelBackend):
            stages = backend.decode_stages(data, info)
            return DecodeResult(name, "ok", backend.name, None, image=stages.rgb,
                                extra={"symbols": stages.symbols})
        return DecodeResult(name, "ok", backend.name, None, image=backend.decode(data, info))
    except FallbackError as declined:
        return _fallback(name, data, info, declined, cpu, {})
    except DecodeError as exc:
        return DecodeResult(name, "error", None, exc.reason, exc.detail)


def decode_results(sources, backend="auto", *, cpu: CpuBackend | None = None) -> list[DecodeResult]:
    """:func:`decode_result` for many inputs; a backend with ``decode_many`` (``sim``)
    gets them all at once, so every lane is busy.

    Returns:
        One DecodeResult per source, in order; never raises for bad input.
    """
    if isinstance(backend, str):
        backend = get_backend(backend)
    if not hasattr(backend, "decode_many"):
        return [decode_result(source, backend, cpu=cpu) for source in sources]
    results: list[DecodeResult | None] = [None] * len(sources)
    readable = []
    for i, source in enumerate(sources):
        try:
            data, name = read_input(source)
        except DecodeError as exc:
            results[i] = DecodeResult(exc.source, "error", None, exc.reason, exc.detail)
            continue
        except LargeFile as large:
            results[i] = _from_file(large, backend)
            continue
        readable.append((i, name, data, jpeg.parse(data)))
    outs = backend.decode_many([r[2] for r in readable], [r[3] for r in readable])
    for (i, name, data, info), (out, extra) in zip(readable, outs):
        if isinstance(out, FallbackError):
            results[i] = _fallback(name, data, info, out, cpu, extra)
        else:
            results[i] = DecodeResult(name, "ok", backend.name, None, image=out, extra=extra)
    return results


def decode(source, backend: str = "auto") -> np.ndarray:
    """Decode one image to RGB exactly as ``PIL.Image.open(f).convert("RGB")``.

    Args:
        source: a path (str or PathLike) or the file's bytes.
        backend: ``auto``, ``cpu``, ``model`` or ``sim``; inputs the backend declines are
            decoded by the CPU path.

    Returns:
        (H, W, 3) uint8 numpy array.

    Raises:
        DecodeError: the input cannot be read or decoded; ``str(err)`` names the input
            and the reason.
    """
    result = decode_result(source, backend)
    if result.status == "error":
        raise DecodeError(result.reason, result.detail, result.path)
    return result.image

