"""``dlbooster build --verilog``: the exported top has the interface SPEC.md section 5
asks of an XRT RTL kernel and a PYNQ IP, and is clean under ``verilator --lint-only -Wall``
with the waivers documented in hw/device.vlt; and the C++ simulations' Verilator build
cache (:func:`dlbooster.sim.flow.build_verilated`), which the simulated device and the core
harnesses share."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dlbooster.sim.flow import simulator_available


@pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
def test_build_verilog_ports_and_lint(tmp_path, capsys):
    from dlbooster.cli import main

    out = tmp_path / "decoder.v"
    assert main(["build", "--verilog", str(out), "--lanes", "2", "--max-width", "256", "--lint"]) == 0
    assert "verilator --lint-only -Wall: clean" in capsys.readouterr().out
    text = out.read_text()
    header = re.search(r"module dlbooster_decoder\((.*?)\);", text, re.S).group(1)
    ports = {p.strip() for p in header.split(",")}
    for name in ("ap_clk", "ap_rst_n", "interrupt"):
        assert name in ports
    for ch in ("aw", "ar"):
        assert {f"s_axi_control_{ch}{s}" for s in ("addr", "valid", "ready")} <= ports
        assert {f"m_axi_gmem_{ch}{s}" for s in ("id", "addr", "len", "size", "burst", "valid", "ready")} <= ports
    assert {f"m_axi_gmem_{s}" for s in ("wdata", "wstrb", "wlast", "rdata", "rresp", "rlast", "rid",
                                        "bresp", "bid")} <= ports
    assert re.search(r"output \[63:0\] m_axi_gmem_araddr;", text)
    assert re.search(r"output \[127:0\] m_axi_gmem_wdata;", text)
    assert re.search(r"input \[11:0\] s_axi_control_awaddr;", text)


_COUNTER = """module counter(input clk, output reg [7:0] count);
  initial count = 0;
  always @(posedge clk) count <= count + 8'd{step};
endmodule
"""

_COUNTER_MAIN = """#include "Vcounter.h"
#include "verilated.h"
#include <cstdio>
int main() {
  VerilatedContext context;
  Vcounter top{&context};
  for (int i = 0; i < 10; ++i) { top.clk = 0; top.eval(); top.clk = 1; top.eval(); }
  std::printf("%u\\n", unsigned(top.count));
  top.final();
}
"""


@pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
def test_verilated_builds_are_cached_by_digest_and_concurrent_builds_share_one(tmp_path, monkeypatch):
    """Two threads asking for the same build get one build (the lock makes the second
    wait, then reuse it); a later call rebuilds nothing; other Verilog builds apart."""
    import subprocess
    import threading

    from dlbooster.sim import flow
    from dlbooster.sim.flow import build_verilated

    builds = []                       # the Verilator build commands that ran
    real_run = subprocess.run

    def counting_run(cmd, *args, **kwargs):
        if "-Mdir" in cmd:
            builds.append(cmd)
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(flow.subprocess, "run", counting_run)

    cpp = tmp_path / "main.cpp"
    cpp.write_text(_COUNTER_MAIN)
    folder = tmp_path / "cache"

    def build(step: int) -> Path:
        return build_verilated(_COUNTER.format(step=step), "counter", cpp, ["-CFLAGS", "-O1"], folder=folder,
                               name="counter", output="Vcounter", sources=[_COUNTER_MAIN])

    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(build(3))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 2 and results[0] == results[1]
    assert len(builds) == 1
    exe = results[0]
    assert subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout == "30\n"
    built = exe.stat().st_mtime_ns
    assert build(3) == exe and exe.stat().st_mtime_ns == built and len(builds) == 1
    assert [p.name for p in folder.iterdir() if p.is_dir()] == [exe.parent.name]

    other = build(5)
    assert other.parent != exe.parent and len(builds) == 2
    assert subprocess.run([str(other)], capture_output=True, text=True, check=True).stdout == "50\n"


def test_a_device_outside_its_register_fields_is_refused():
    """BUSY has a bit per lane (32) and CONFIG 8 bits of job FIFO depth: a device beyond
    them is refused with ValueError, not built with fields that overflow."""
    from dlbooster.hw.device import Device

    for kwargs, message in (({"lanes": 0}, "1 to 32 lanes, not 0"), ({"lanes": 33}, "1 to 32 lanes, not 33"),
                            ({"job_depth": 256}, "1 to 255 entries, not 256")):
        with pytest.raises(ValueError, match=message):
            Device(**kwargs)
    assert Device(lanes=32).id_width == 5


def test_a_device_build_says_so_before_its_minutes_of_silence(tmp_path, monkeypatch, caplog):
    """A cache miss warns (shown by default) that the build takes minutes and where it is
    cached; a hit says nothing. The build itself is replaced here: the device tests run
    the real one."""
    import logging

    import dlbooster.sim.device as simdev

    product = tmp_path / "libdlbdevice.so"
    product.write_bytes(b"")
    monkeypatch.setenv("DLBOOSTER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(simdev, "export_flat_verilog", lambda device, top: "")
    builds = []
    monkeypatch.setattr(simdev, "build_verilated", lambda *a, **kw: builds.append(kw) or product)
    with caplog.at_level(logging.INFO, logger="dlbooster.sim.device"):
        assert simdev.build_device_library(lanes=2, max_width=64) == product
    assert len(builds) == 1
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "building the simulated decoder device (2 lane(s), 64-pixel line buffers)" in warning.getMessage()
    assert str(tmp_path / "cache" / "device") in warning.getMessage()
    caplog.clear()
    assert simdev.build_device_library(lanes=2, max_width=64) == product     # the index finds it
    assert len(builds) == 1 and not caplog.records
