"""Board build folders (hw/build/boards.py): generated for every board and validated as far as
this machine allows; the validation catches broken scripts, XML and ports."""

from __future__ import annotations

import shutil

import pytest

from dlbooster.hw.build.boards import BOARDS, KERNEL_ARGS, TOP, check_board_build, write_board_build
from dlbooster.hw.regs import Reg
from dlbooster.sim.flow import lint_verilog

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
    assert check_board_build(out, name, lint=lint_verilog if name in ("pynq-z2", "alveo-u250") else None) == []
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
    assert any("assign_bd_adress" in p for p in check_board_build(out, "pynq-z2", lint=None))
    script.write_text(good.replace("error \"implementation did not finish", "error {implementation did not finish"))
    assert any(p.startswith("build.tcl:") for p in check_board_build(out, "pynq-z2", lint=None))
    script.write_text(good.replace("ipx::package_project", "ipx::package_projekt"))
    assert check_board_build(out, "pynq-z2", lint=None)
    # Vivado's reports act on the open design: without open_run they stop the batch run.
    script.write_text(good.replace("open_run impl_1\n", ""))
    assert check_board_build(out, "pynq-z2", lint=None) == [
        "build.tcl: reports with no design open (open_run before report_*)"]


@pytest.mark.parametrize("name", ["pynq-z2", "zcu104"])
def test_processing_system_ip_is_the_releases_own(builds, name):
    """No version on the PS IP: zynq_ultra_ps_e is 3.4 in Vivado 2022.x and 3.5 from
    2023.1, and a pinned one is "not found" in the other releases."""
    text = (builds[name][0] / "build.tcl").read_text()
    ps = "processing_system7" if name == "pynq-z2" else "zynq_ultra_ps_e"
    assert f"create_bd_cell -type ip -vlnv xilinx.com:ip:{ps} ps\n" in text


def test_check_without_tclsh_is_a_usage_error_before_anything_is_written(tmp_path, monkeypatch, capsys):
    from dlbooster.cli import main

    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "tclsh" else real_which(name))
    assert main(["build", "--board", "pynq-z2", "--out", str(tmp_path / "b"), "--check"]) == 2
    assert "--check runs the Tcl scripts under tclsh, which is not installed" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_an_interrupted_build_leaves_no_new_folder(tmp_path, monkeypatch, capsys):
    import dlbooster.hw.build.boards as boards
    import dlbooster.hw.device as device
    from dlbooster.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(device, "Device", lambda **kwargs: None)   # nothing to elaborate
    monkeypatch.setattr(boards.verilog, "convert", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_board_build("pynq-z2", tmp_path / "new", lanes=1, max_width=256)
    assert not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()                # a folder that was there stays
    with pytest.raises(KeyboardInterrupt):
        write_board_build("pynq-z2", tmp_path / "old", lanes=1, max_width=256)
    assert (tmp_path / "old").is_dir()
    # A folder under a file is refused before the elaboration, naming the file.
    (tmp_path / "afile").write_text("")
    assert main(["build", "--board", "pynq-z2", "--out", str(tmp_path / "afile" / "p" / "q")]) == 2
    assert capsys.readouterr().err == f"dlbooster build: {tmp_path / 'afile'} exists and is not a folder\n"


# (board, file, text, its replacement, what the problem says): edits a user or a merge
# could make that the vendor tools would fail on, or that build the wrong thing.
BROKEN_EDITS = [
    ("pynq-z2", "build.tcl", "set part xc7z020clg400-1", "set part xc7z010clg400-1", "for the board's part"),
    ("pynq-z2", "build.tcl", "tul.com.tw:pynq-z2:part0:1.0", "tul.com.tw:pynq-z1:part0:1.0", "board part"),
    ("pynq-z2", "build.tcl", "dlbooster_decoder:1.0 decoder", "dlbooster_decoder:2.0 decoder", "no decoder cell"),
    ("pynq-z2", "build.tcl", "set_property version 1.0", "set_property version 1.1", "the packaged IP is not"),
    ("pynq-z2", "build.tcl", "[get_bd_pins decoder/interrupt]", "", "interrupt is not connected"),
    ("pynq-z2", "build.tcl", "[get_bd_intf_pins decoder/m_axi_gmem]", "[get_bd_intf_pins decoder/M_AXI]",
     "decoder/m_axi_gmem is not connected"),
    ("pynq-z2", "build.tcl", "FPGA0_PERIPHERAL_FREQMHZ {100}", "FPGA0_PERIPHERAL_FREQMHZ {50}", "fabric clock"),
    ("pynq-z2", "build.tcl", "-to_step write_bitstream", "-to_step route_design", "write_bitstream"),
    ("pynq-z2", "build.tcl", "[file join $here dlbooster.hwh]\n", "[file join $here other.hwh]\n",
     "does not copy dlbooster.hwh"),
    ("zcu104", "build.tcl", "PL0_REF_CTRL__FREQMHZ {200}", "PL0_REF_CTRL__FREQMHZ {100}", "fabric clock"),
    ("alveo-u50", "package_xo.tcl", "-kernel_name dlbooster_decoder", "-kernel_name decoder", "no package_xo"),
    ("alveo-u50", "package_xo.tcl", "set part xcu50", "set part xcu55", "for the board's part"),
    ("alveo-u50", "kernel.xml", 'vlnv="dlbooster.org', 'vlnv="dlbooster.com', "the kernel's vlnv"),
    ("alveo-u50", "kernel.xml", 'interrupt="true"', 'interrupt="false"', "no interrupt"),
    ("alveo-u50", "kernel.xml", 'offset="0x18"', 'offset="0xZZ"', "offset='0xZZ' is not a number"),
    ("alveo-u50", "kernel.xml", 'dataWidth="32"', 'dataWidth="wide"', "dataWidth='wide' is not a number"),
    ("alveo-u50", "kernel.xml", 'type="uint"', 'type="float"', "argument in_len"),
    ("alveo-u50", "kernel.xml", 'mode="slave"', 'mode="master"', "port s_axi_control must be"),
    ("alveo-u50", "link.cfg", "sp=dlbooster_decoder_1", "# sp=dlbooster_decoder_1", "no sp="),
    ("alveo-u50", "link.cfg", "[connectivity]\nnk=", "[clock]\nnk=", "no nk="),
    ("alveo-u50", "link.cfg", "freqHz=300000000", "freqHz=250000000", "no freqHz=300000000"),
]


@pytest.mark.parametrize("board, name, text, edit, says", BROKEN_EDITS,
                         ids=[f"{b}-{n}-{i}" for i, (b, n, *_) in enumerate(BROKEN_EDITS)])
def test_check_catches_broken_edits(builds, tmp_path, board, name, text, edit, says):
    out = _copy(builds, board, tmp_path)
    path = out / name
    good = path.read_text()
    assert text in good
    path.write_text(good.replace(text, edit))
    problems = check_board_build(out, board, lint=None)
    assert problems and all(p.startswith(f"{name}: ") for p in problems) and says in problems[0], problems


def test_check_of_a_folder_with_missing_files(builds, tmp_path):
    out = _copy(builds, "alveo-u250", tmp_path)
    (out / "link.cfg").unlink()
    (out / "README.md").unlink()
    assert check_board_build(out, "alveo-u250", lint=None) == [
        "link.cfg: cannot be read: No such file or directory", "README.md: cannot be read: No such file or directory"]
    (out / f"{TOP}.v").write_text("module other(); endmodule\n")
    assert f"{TOP}.v: no module {TOP}" in check_board_build(out, "alveo-u250", lint=None)
    (out / f"{TOP}.v").unlink()
    assert check_board_build(out, "alveo-u250", lint=None)[0] == \
        f"{TOP}.v: cannot be read: No such file or directory"
    assert len(check_board_build(tmp_path / "none", "pynq-z2", lint=None)) == 3


def test_check_runs_in_a_folder_whose_path_has_tcl_brackets(tmp_path):
    out = tmp_path / "a {b} [c] $d"
    write_board_build("pynq-z2", out, lanes=1, max_width=256)
    assert check_board_build(out, "pynq-z2", lint=None) == []


def test_check_catches_wrong_kernel_xml_and_ports(builds, tmp_path):
    out = _copy(builds, "alveo-u250", tmp_path)
    xml = out / "kernel.xml"
    good = xml.read_text()
    xml.write_text(good.replace('offset="0x1c"', 'offset="0x20"'))
    assert any("arguments" in p for p in check_board_build(out, "alveo-u250", lint=None))
    xml.write_text(good.replace("</args>", ""))
    assert any(p.startswith("kernel.xml:") for p in check_board_build(out, "alveo-u250", lint=None))
    xml.write_text(good)
    verilog = out / f"{TOP}.v"
    verilog.write_text(verilog.read_text().replace("m_axi_gmem_araddr", "m_axi_gmem_rdaddr"))
    problems = check_board_build(out, "alveo-u250", lint=None)
    assert any("m_axi_gmem_araddr" in p for p in problems)
    assert any("m_axi_gmem_rdaddr is outside" in p for p in problems)


def test_cli_board_build(tmp_path, capsys):
    from dlbooster.cli import main

    assert main(["build", "--board", "zcu104"]) == 2
    assert main(["build", "--board", "zcu104", "--out", str(tmp_path / "z"), "--lanes", "1",
                 "--max-width", "256"]) == 0
    assert (tmp_path / "z" / "build.tcl").is_file()
    captured = capsys.readouterr()
    assert "zcu104" in captured.out and captured.err == "dlbooster build: --board needs --out DIR\n"
    # An Alveo build's scripts in the folder would mix with this one: named.
    (tmp_path / "z" / "kernel.xml").write_text("<root/>")
    assert main(["build", "--board", "zcu104", "--out", str(tmp_path / "z"), "--max-width", "256"]) == 0
    assert capsys.readouterr().err == (f"dlbooster build: warning: {tmp_path / 'z'} also holds kernel.xml from an "
                                       f"earlier build for another board; they do not belong to this zcu104 build "
                                       f"(remove them)\n")


def test_cli_check_only_validates_a_folder_as_it_is(builds, tmp_path, capsys):
    from dlbooster.cli import main

    out = _copy(builds, "alveo-u50", tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert main(["build", "--board", "alveo-u50", "--out", str(out), "--check-only"]) == 0
    assert capsys.readouterr().out == (f"{out}: alveo-u50 checks (files, ports, verilator lint, Tcl dry run, "
                                       f"kernel.xml, link.cfg): all passed\n")
    (out / "link.cfg").write_text((out / "link.cfg").read_text().replace("HBM[0]", "DDR[0]"))
    assert main(["build", "--board", "alveo-u50", "--out", str(out), "--check-only"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "problem: link.cfg: no sp=dlbooster_decoder_1.m_axi_gmem:HBM[0] in [connectivity]",
        f"{out}: alveo-u50 checks (files, ports, verilator lint, Tcl dry run, kernel.xml, link.cfg): 1 problem(s)"]
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != "link.cfg"} == \
        {k: v for k, v in before.items() if k != "link.cfg"}       # nothing written
    assert main(["build", "--board", "alveo-u50", "--out", str(tmp_path / "none"), "--check-only"]) == 2
    assert capsys.readouterr().err == (f"dlbooster build: --check-only validates a board folder as it is: "
                                       f"{tmp_path / 'none'}: no such folder\n")
    with pytest.raises(SystemExit):
        main(["build", "--board", "alveo-u50", "--out", str(out), "--check", "--check-only"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_board_build_refusals_and_fit_warning(tmp_path, capsys, monkeypatch):
    """A PYNQ-Z2 build took the device's 8192-pixel default and any lane count without a
    word, --lint and --data-width were ignored with --board, and --max-width had no
    bound (70000 elaborated for minutes). Board builds now default to 2048 pixels and
    warn when the lanes will likely not fit the part; the rest is refused at once."""
    from dlbooster.cli import main
    from dlbooster.hw.device import Device
    from dlbooster.hw.build.synth import fit_problem

    out = str(tmp_path / "p")
    assert main(["build", "--board", "pynq-z2", "--out", out, "--lint"]) == 2
    assert capsys.readouterr().err == ("dlbooster build: --lint goes with --verilog; --check validates a board "
                                       "folder, lint included\n")
    assert main(["build", "--board", "pynq-z2", "--out", out, "--data-width", "512"]) == 2
    assert "pynq-z2's memory port is 64 bits" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["build", "--board", "pynq-z2", "--out", out, "--max-width", "70000"])
    assert exc.value.code == 2 and "--max-width: must be at most 65535, not 70000" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_width is 1 to 65535 pixels, not 70000"):
        Device(max_width=70000)
    assert not (tmp_path / "p").exists()
    # Two lanes at the default width: warned before anything is built (here the write
    # fails as on a read-only file system, so nothing is).
    import dlbooster.hw.build.boards as boards

    def read_only(board, out, **kwargs):
        raise OSError(30, "Read-only file system", str(out))

    monkeypatch.setattr(boards, "write_board_build", read_only)
    assert main(["build", "--board", "pynq-z2", "--out", str(tmp_path / "ro"), "--lanes", "2"]) == 1
    err = capsys.readouterr().err
    assert err.endswith(f"dlbooster build: cannot write {tmp_path / 'ro'}: Read-only file system\n"), err
    assert err.startswith("dlbooster build: warning: 2 lane(s) at 2048-pixel line buffers need about 145 BRAM36, "
                          "more than the 80 % of the xc7z020 a design may use (112 BRAM36)"), err
    assert "1 lane(s) fit at 2048 pixels; 2 lane(s) fit at up to 1576 pixels (--max-width)" in err
    # What the issue-9 projection found (docs/benchmarks.md): one 2048-pixel lane fits
    # the PYNQ-Z2, three the ZCU104; an 8192-pixel lane fits neither.
    assert fit_problem("pynq-z2", 1, 2048) is None and fit_problem("zcu104", 3, 2048) is None
    assert fit_problem("zcu104", 4, 2048) is not None
    assert "none fits at 8192 pixels" in fit_problem("pynq-z2", 1, 8192)
    assert "none fits at 8192 pixels" in fit_problem("zcu104", 1, 8192)
    assert fit_problem("alveo-u50", 1, 8192) is None
