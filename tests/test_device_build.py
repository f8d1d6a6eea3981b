"""``dlbooster build --verilog``: the exported top has the interface SPEC.md section 5
asks of an XRT RTL kernel and a PYNQ IP, and is clean under ``verilator --lint-only -Wall``
with the waivers documented in hw/device.vlt."""

from __future__ import annotations

import re

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
