"""Board build folders (hw/boards.py): generated for every board and validated as far as
this machine allows; the validation catches broken scripts, XML and ports."""

from __future__ import annotations

import shutil

import pytest

from dlbooster.hw.boards import BOARDS, KERNEL_ARGS, TOP, check_board_build, write_board_build
from dlbooster.hw.regs import Reg

pytestmark = pytest.mark.skipif(shutil.which("tclsh") is None, reason="needs tclsh")


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("boards")
    return {name: (root / name, write_board_build(name, root / name, lanes=1, max_width=256)) for name in BOARDS}


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_board_folder_is_complete_and_valid(builds, name):
    out, written = builds[name]
    expected = {f"{TOP}.v", "README.md"} | (
        {"build.tcl"} if BOARDS[name].kind == "pynq" else {"kernel.xml", "package_xo.tcl", "link.cfg"})
    assert {p.name for p in written} == expected
    # Lint the narrowest and the widest master; the others differ only in data width.
    assert check_board_build(out, name, lint=name in ("pynq-z2", "alveo-u250")) == []
    assert f"{BOARDS[name].data_width}-bit AXI4 master" in (out / "README.md").read_text()


def test_kernel_arguments_are_the_job_registers(builds):
    text = (builds["alveo-u50"][0] / "kernel.xml").read_text()
    assert 'offset="0x10"' in text and 'offset="0x1c"' in text
    assert [int(o) for _, o, _, _ in KERNEL_ARGS] == [Reg.JOB_IN_ADDR_LO, Reg.JOB_IN_LEN, Reg.JOB_OUT_ADDR_LO,
                                                       Reg.JOB_OUT_CAP, Reg.JOB_ID]
    assert "sp=dlbooster_decoder_1.m_axi_gmem:HBM[0]" in (builds["alveo-u50"][0] / "link.cfg").read_text()


def _copy(builds, name, tmp_path):
    out = tmp_path / name
    shutil.copytree(builds[name][0], out)
    return out


def test_check_catches_broken_tcl(builds, tmp_path):
    out = _copy(builds, "pynq-z2", tmp_path)
    script = out / "build.tcl"
    good = script.read_text()
    script.write_text(good.replace("assign_bd_address", "assign_bd_adress"))
    assert any("assign_bd_adress" in p for p in check_board_build(out, "pynq-z2", lint=False))
    script.write_text(good.replace("error \"implementation did not finish", "error {implementation did not finish"))
    assert any(p.startswith("build.tcl:") for p in check_board_build(out, "pynq-z2", lint=False))
    script.write_text(good.replace("ipx::package_project", "ipx::package_projekt"))
    assert check_board_build(out, "pynq-z2", lint=False)


def test_check_catches_wrong_kernel_xml_and_ports(builds, tmp_path):
    out = _copy(builds, "alveo-u250", tmp_path)
    xml = out / "kernel.xml"
    good = xml.read_text()
    xml.write_text(good.replace('offset="0x1c"', 'offset="0x20"'))
    assert any("arguments" in p for p in check_board_build(out, "alveo-u250", lint=False))
    xml.write_text(good.replace("</args>", ""))
    assert any(p.startswith("kernel.xml:") for p in check_board_build(out, "alveo-u250", lint=False))
    xml.write_text(good)
    verilog = out / f"{TOP}.v"
    verilog.write_text(verilog.read_text().replace("m_axi_gmem_araddr", "m_axi_gmem_rdaddr"))
    problems = check_board_build(out, "alveo-u250", lint=False)
    assert any("m_axi_gmem_araddr" in p for p in problems)
    assert any("m_axi_gmem_rdaddr is outside" in p for p in problems)


def test_cli_board_build(tmp_path, capsys):
    from dlbooster.cli import main

    assert main(["build", "--board", "zcu104"]) == 2
    assert main(["build", "--board", "zcu104", "--out", str(tmp_path / "z"), "--lanes", "1",
                 "--max-width", "256"]) == 0
    assert (tmp_path / "z" / "build.tcl").is_file()
    assert "zcu104" in capsys.readouterr().out
