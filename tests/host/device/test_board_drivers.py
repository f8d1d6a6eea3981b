"""Board drivers (dlbooster.device.boards) on a machine without boards: every way of not having
one gives a clear error naming what is missing. The register protocol they run is
DecoderDevice's, tested against the simulated device (tests/sim/test_device_sim.py)."""

from __future__ import annotations

import importlib.util
import logging
import struct

import pytest

from dlbooster import backends
from dlbooster.backends import get_backend
from dlbooster.device.boards import BoardError, bit_header, check_binary, decoder_ip_class, find_boards, open_board
from dlbooster.cli import main
from dlbooster.hw.build.boards import VLNV

HAVE_PYNQ = importlib.util.find_spec("pynq") is not None
HAVE_PYXRT = importlib.util.find_spec("pyxrt") is not None
no_drivers = pytest.mark.skipif(HAVE_PYNQ or HAVE_PYXRT, reason="a board driver library is installed")


def make_bit(part: str = "7z020clg400", data: bytes = b"\xff" * 64 + b"\xaa\x99\x55\x66", cut: int = 0) -> bytes:
    """A .bit as Vivado lays it out: the fixed preamble, fields a-d, then e and the data
    (``cut`` bytes short of what e says)."""
    def field(key: bytes, text: str) -> bytes:
        value = text.encode() + b"\0"
        return key + struct.pack(">H", len(value)) + value
    return (b"\x00\x09\x0f\xf0\x0f\xf0\x0f\xf0\x0f\xf0\x00\x00\x01"
            + field(b"a", "dlbooster_pynq_z2_wrapper;UserID=0XFFFFFFFF;Version=2024.1") + field(b"b", part)
            + field(b"c", "2026/12/05") + field(b"d", "10:00:00")
            + b"e" + struct.pack(">I", len(data)) + data[:len(data) - cut])


def make_xclbin(cut: int = 0, platform: str = "xilinx_u50_gen3x16_xdma_5_202210_1") -> bytes:
    """An xclbin's fixed start (XRT xclbin.h): the xclbin2 magic, at 0x130 the file's
    length, at 0x160 the platform's VBNV."""
    size = 0x400
    head = (b"xclbin2\0".ljust(0x130, b"\0") + struct.pack("<Q", size)).ljust(0x160, b"\0") + platform.encode()
    return head.ljust(size - cut, b"\0")


def make_hwh(device: str = "7z020", vlnv: str = VLNV) -> str:
    """A hardware handoff as Vivado writes it, cut to what PYNQ and the check read: the
    system's device and a MODULE per IP instance."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<EDKSYSTEM EDWVERSION="1.2" TIMESTAMP="Sat Dec  5 10:00:00 2026" VIVADOVERSION="2024.1">
  <SYSTEMINFO ARCH="zynq" BOARD="tul.com.tw:pynq-z2:part0:1.0" DEVICE="{device}" NAME="dlbooster"
              PACKAGE="clg400" SPEEDGRADE="-1"/>
  <MODULES>
    <MODULE FULLNAME="/decoder" INSTANCE="decoder" MODTYPE="dlbooster_decoder" VLNV="{vlnv}"/>
    <MODULE FULLNAME="/ps" INSTANCE="ps" MODTYPE="processing_system7" VLNV="xilinx.com:ip:processing_system7:5.5"/>
  </MODULES>
</EDKSYSTEM>
"""


def test_bad_board_and_missing_files(tmp_path):
    with pytest.raises(BoardError, match="unknown board"):
        open_board("pynq-z9", tmp_path / "x.bit")
    with pytest.raises(BoardError, match="no such file"):
        open_board("pynq-z2", tmp_path / "x.bit")
    (tmp_path / "x.bit").write_bytes(make_bit())
    with pytest.raises(BoardError, match=r"x\.hwh is missing"):
        open_board("pynq-z2", tmp_path / "x.bit")
    (tmp_path / "x.xclbin").write_bytes(b"\0")
    # A binary for the other kind of board is named before any driver library is tried.
    with pytest.raises(BoardError, match=r"alveo-u50 loads an \.xclbin .* not x\.bit"):
        open_board("alveo-u50", tmp_path / "x.bit")
    with pytest.raises(BoardError, match=r"pynq-z2 loads a \.bit with its \.hwh .* not x\.xclbin"):
        open_board("pynq-z2", tmp_path / "x.xclbin")
    # A file without the suffix is named as such, not by its missing .hwh; a folder as a folder.
    (tmp_path / "afile").write_bytes(b"\0")
    with pytest.raises(BoardError, match=r"pynq-z2 loads a \.bit with its \.hwh .* not afile$"):
        open_board("pynq-z2", tmp_path / "afile")
    with pytest.raises(BoardError, match=r": a folder; give the \.bit \(its \.hwh beside it\) or the \.xclbin$"):
        open_board("pynq-z2", tmp_path)


def test_binaries_are_checked_before_a_driver_loads_them(tmp_path):
    bit, xclbin = tmp_path / "x.bit", tmp_path / "x.xclbin"
    bit.write_bytes(make_bit())
    assert bit_header(bit) == {"design": "dlbooster_pynq_z2_wrapper;UserID=0XFFFFFFFF;Version=2024.1",
                               "part": "7z020clg400", "date": "2026/12/05", "time": "10:00:00", "bytes": 68}
    (tmp_path / "x.hwh").write_text(make_hwh())
    assert check_binary("pynq-z2", bit)["part"] == "7z020clg400"
    assert check_binary("pynq-z2", bit)["hwh"] == {"device": "7z020", "vlnvs": {
        VLNV, "xilinx.com:ip:processing_system7:5.5"}}
    for content, match in ((b"\0" * 100, r"x\.bit: not a Xilinx bitstream \(no \.bit header\)"),
                           (b"", "not a Xilinx bitstream"),
                           (make_bit(cut=1), "x.bit: truncated bitstream: 67 of its 68 configuration bytes"),
                           (make_bit()[:40], r"x\.bit: truncated \.bit header: the file ends at byte 40, "
                                             r"inside the header field at byte 13"),
                           (make_bit()[:13], r"truncated \.bit header: the file ends at byte 13"),
                           (make_bit()[:13] + b"z", r"damaged \.bit header at byte 13"),
                           (make_bit("7z010clg400"), "x.bit was built for 7z010clg400, but pynq-z2 has "
                                                     "xc7z020clg400-1")):
        bit.write_bytes(content)
        with pytest.raises(BoardError, match=match):
            open_board("pynq-z2", bit)
    # The .hwh must describe a design with the decoder, for the same device.
    bit.write_bytes(make_bit())
    for hwh, match in ((make_hwh(vlnv="xilinx.com:hls:other:1.0"), r"x\.hwh: no IP of type "
                        r"dlbooster\.org:dlbooster:dlbooster_decoder:1\.0 in the design it describes"),
                       (make_hwh(device="xczu7ev"), r"x\.hwh describes a design for xczu7ev, but pynq-z2 has "
                                                   r"xc7z020clg400-1"),
                       ("<xml/", r"x\.hwh: not a hardware handoff file \(XML: ")):
        (tmp_path / "x.hwh").write_text(hwh)
        with pytest.raises(BoardError, match=match):
            open_board("pynq-z2", bit)
    (tmp_path / "x.hwh").write_text(make_hwh())
    # The suffix in another case is still a bitstream.
    upper = tmp_path / "X.BIT"
    upper.write_bytes(make_bit())
    (tmp_path / "X.hwh").write_text(make_hwh())
    assert check_binary("pynq-z2", upper)["part"] == "7z020clg400"
    # The part with an automotive grade prefix; a name of another form is let through.
    for part in ("xa7z020clg400-1I", "XC7Z020CLG400-1", "custom"):
        bit.write_bytes(make_bit(part))
        assert check_binary("pynq-z2", bit)["part"] == part
    # The ZCU104's UltraScale+ part, written with or without its family prefix.
    (tmp_path / "x.hwh").write_text(make_hwh("xczu7ev"))
    for part in ("xczu7ev-ffvc1156-2-e", "zu7ev-ffvc1156-2-e"):
        bit.write_bytes(make_bit(part))
        assert check_binary("zcu104", bit)["part"] == part
        with pytest.raises(BoardError, match=f"built for {part}, but pynq-z2 has"):
            check_binary("pynq-z2", bit)
    xclbin.write_bytes(make_xclbin())
    assert check_binary("alveo-u50", xclbin) == {"bytes": 0x400, "platform": "xilinx_u50_gen3x16_xdma_5_202210_1"}
    # Another shell of the same card (XRT checks the shell itself), the colon form, and
    # a name of no known form are let through; another card is not.
    for platform in ("xilinx_u50_gen3x16_xdma_201920_3", "xilinx:u50:gen3x16_xdma_5:202210.1", "", "custom"):
        xclbin.write_bytes(make_xclbin(platform=platform))
        assert check_binary("alveo-u50", xclbin)["platform"] == platform
    xclbin.write_bytes(make_xclbin(platform="xilinx_u250_gen3x16_xdma_4_1_202210_1"))
    with pytest.raises(BoardError, match=r"x\.xclbin was linked for the platform "
                                         r"xilinx_u250_gen3x16_xdma_4_1_202210_1, but alveo-u50 is "
                                         r"xilinx_u50_gen3x16_xdma_5_202210_1"):
        open_board("alveo-u50", xclbin)
    XCLBIN = tmp_path / "y.XCLBIN"
    XCLBIN.write_bytes(make_xclbin(platform="xilinx_u250_gen3x16_xdma_4_1_202210_1"))
    assert check_binary("alveo-u250", XCLBIN)["bytes"] == 0x400
    for content, match in ((b"PK\3\4" + b"\0" * 600, r"x\.xclbin: not an xclbin \(no xclbin2 header\)"),
                           (b"xclbin2\0", "x.xclbin: truncated xclbin: 8 bytes, shorter than its header"),
                           (make_xclbin(cut=24), "x.xclbin: truncated xclbin: 1,000 of its 1,024 bytes")):
        xclbin.write_bytes(content)
        with pytest.raises(BoardError, match=match):
            open_board("alveo-u250", xclbin)


@no_drivers
def test_no_driver_library(tmp_path):
    (tmp_path / "x.bit").write_bytes(make_bit("xczu7ev-ffvc1156-2-e"))
    (tmp_path / "x.hwh").write_text(make_hwh("xczu7ev"))
    (tmp_path / "x.xclbin").write_bytes(make_xclbin(platform="xilinx_u250_gen3x16_xdma_4_1_202210_1"))
    with pytest.raises(BoardError, match="PYNQ is not installed"):
        open_board("zcu104", tmp_path / "x.bit")
    with pytest.raises(BoardError, match="pyxrt is not importable.*PYNQ is not installed"):
        open_board("alveo-u250", tmp_path / "x.xclbin")
    with pytest.raises(BoardError, match="PYNQ is not installed"):
        decoder_ip_class()
    problems: list[str] = []
    assert find_boards(problems) == []
    assert problems == ["PYNQ is not installed (pip install pynq; on a board it comes with the PYNQ image)",
                        "XRT's Python binding pyxrt is not importable (install XRT and source "
                        "/opt/xilinx/xrt/setup.sh)"]


class _FailingDriver:
    """A stand-in for a driver library whose calls fail as pyxrt's and PYNQ's do on a
    machine without the card, or with a file they cannot load (RuntimeError,
    ValueError): what the test checks is that dlbooster reports it in one line."""

    class Device:
        devices = [object()]                  # PYNQ sees a board

    def device(self, index):
        raise RuntimeError("No devices found")

    def Overlay(self, path):
        raise ValueError(f"{path}: not a bitstream PYNQ can parse")


def test_a_driver_failure_is_one_line_not_a_traceback(monkeypatch, tmp_path, capsys):
    import dlbooster.device.boards as boards

    monkeypatch.setattr(boards, "_pyxrt", _FailingDriver)
    monkeypatch.setattr(boards, "_pynq", _FailingDriver)
    monkeypatch.setattr(boards, "decoder_ip_class", lambda: None)
    (tmp_path / "x.xclbin").write_bytes(make_xclbin())
    (tmp_path / "x.bit").write_bytes(make_bit())
    (tmp_path / "x.hwh").write_text(make_hwh())
    assert main(["flash", "--board", "alveo-u50", str(tmp_path / "x.xclbin")]) == 1
    assert capsys.readouterr().err == (f"dlbooster flash: XRT cannot open card 0 with {tmp_path / 'x.xclbin'}: "
                                       f"RuntimeError: No devices found\n")
    assert main(["flash", "--board", "pynq-z2", str(tmp_path / "x.bit")]) == 1
    assert capsys.readouterr().err == (f"dlbooster flash: PYNQ cannot load {tmp_path / 'x.bit'}: ValueError: "
                                       f"{tmp_path / 'x.bit'}: not a bitstream PYNQ can parse\n")


def test_board_backends_need_a_board_and_binary(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("DLBOOSTER_BOARD", raising=False)
    monkeypatch.delenv("DLBOOSTER_BINARY", raising=False)
    with pytest.raises(ValueError, match="needs a board and its binary: board= and binary= .*--board and --binary"):
        get_backend("pynq")
    with pytest.raises(ValueError, match="backend xrt drives Alveo boards .*pynq-z2 is a Zynq board"):
        get_backend("xrt", board="pynq-z2", binary=str(tmp_path / "x.bit"))
    assert get_backend("auto").name == "cpu"
    monkeypatch.setenv("DLBOOSTER_BOARD", "alveo-u50")
    monkeypatch.setattr(backends, "_logged_auto", [])
    with caplog.at_level(logging.INFO, logger="dlbooster.backends"):
        assert get_backend("auto").name == "cpu"      # half configured: a warning says so
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "backend auto: DLBOOSTER_BOARD is set but DLBOOSTER_BINARY is not, using cpu")]
    monkeypatch.setenv("DLBOOSTER_BINARY", str(tmp_path / "missing.xclbin"))
    with pytest.raises(BoardError, match="no such file"):
        get_backend("auto")


def test_cli_flash_and_devices(tmp_path, capsys):
    assert main(["flash", "--board", "pynq-z2", str(tmp_path / "none.bit")]) == 1
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "junk.bit").write_bytes(b"<html>not found</html>")
    assert main(["flash", "--board", "pynq-z2", str(tmp_path / "junk.bit")]) == 1
    assert capsys.readouterr().err == f"dlbooster flash: {tmp_path / 'junk.bit'}: not a Xilinx bitstream (no .bit " \
                                      f"header); give the .bit that Vivado's write_bitstream made\n"
    problems: list[str] = []
    boards = find_boards(problems)
    assert main(["devices"]) == (0 if boards else 1)
    out = capsys.readouterr().out
    assert ("no decoder boards found" in out) == (not boards)
    # Without boards, why each driver found none: "not installed" is not "no card".
    assert all(f"  {problem}" in out.splitlines() for problem in problems) and (boards or problems)
