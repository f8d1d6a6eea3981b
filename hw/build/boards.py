"""Board builds of the decoder device: what a user with the vendor tools needs.

:func:`write_board_build` writes, for one board, the Verilog of the top
(:class:`dlbooster.hw.device.Device`, module ``dlbooster_decoder``) and:

- PYNQ boards (Zynq-7000 ``pynq-z2``, Zynq UltraScale+ ``zcu104``): ``build.tcl`` for
  Vivado in batch mode. It packages the Verilog as an IP
  (``ipx::package_project``, VLNV :data:`VLNV`: the interfaces are inferred from the
  port names, ``s_axi_control_*`` as AXI4-Lite slave, ``m_axi_gmem_*`` as AXI4 master,
  ``ap_clk``/``ap_rst_n``/``interrupt``), builds a block design (the processing system
  with board presets, the decoder's master on a high-performance port into DDR, its
  control slave on a general-purpose master port, its interrupt on the PS's fabric
  interrupt), runs synthesis and implementation and copies ``dlbooster.bit`` and
  ``dlbooster.hwh`` (the pair ``pynq.Overlay`` loads) into the output folder.
- Alveo boards (``alveo-u50``, ``alveo-u250``): ``kernel.xml`` (an RTL kernel with
  XRT's ``ap_ctrl_hs`` protocol, its arguments at the job registers of
  :class:`dlbooster.hw.regs.Reg`), ``package_xo.tcl`` (Vivado ``package_xo``) and
  ``link.cfg`` for ``v++ -l`` on the board's platform (the master to HBM[0] on the U50,
  DDR[0] on the U250).
- ``README.md``: the tool versions and the commands that run it.

Sources of the conventions: Vivado Design Suite Tcl Command Reference (UG835), "Creating
an RTL kernel" in the Vitis user guide (UG1393: ``kernel.xml``, ``package_xo``, v++
``--config`` files), PYNQ's overlay documentation (``.bit`` + ``.hwh``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

from amaranth.back import verilog

from ..regs import Reg

__all__ = ["BOARDS", "Board", "KERNEL_ARGS", "VIVADO_COMMANDS", "VLNV", "check_board_build", "kernel_xml", "write_board_build"]

#: Vendor:library:name:version of the packaged decoder IP (what the pynq driver binds to).
VLNV = "dlbooster.org:dlbooster:dlbooster_decoder:1.0"

#: Top-level module name.
TOP = "dlbooster_decoder"


@dataclass(frozen=True)
class Board:
    """One supported board.

    Attributes:
        name: the ``--board`` value.
        kind: ``pynq`` (Zynq SoC, Vivado block design) or ``alveo`` (XRT RTL kernel).
        part: the FPGA part.
        data_width: the decoder's AXI4 data width, bits (the port it meets).
        clock_mhz: the fabric clock the build asks for.
        board_part: Vivado board part (board files give the PS presets); PYNQ boards.
        platform: the Vitis platform; Alveo boards.
        memory: the memory bank the decoder's master connects to; Alveo boards.
    """

    name: str
    kind: str
    part: str
    data_width: int
    clock_mhz: int
    board_part: str = ""
    platform: str = ""
    memory: str = ""


BOARDS: dict[str, Board] = {b.name: b for b in (
    # PYNQ-Z2: Zynq-7020; S_AXI_HP0 is 64 bits wide, FCLK_CLK0 100 MHz in PYNQ's base designs.
    Board("pynq-z2", "pynq", "xc7z020clg400-1", 64, 100, board_part="tul.com.tw:pynq-z2:part0:1.0"),
    # ZCU104: Zynq UltraScale+ XCZU7EV; S_AXI_HP0_FPD is 128 bits wide.
    Board("zcu104", "pynq", "xczu7ev-ffvc1156-2-e", 128, 200, board_part="xilinx.com:zcu104:part0:1.1"),
    Board("alveo-u50", "alveo", "xcu50-fsvh2104-2-e", 256, 300,
          platform="xilinx_u50_gen3x16_xdma_5_202210_1", memory="HBM[0]"),
    Board("alveo-u250", "alveo", "xcu250-figd2104-2L-e", 512, 300,
          platform="xilinx_u250_gen3x16_xdma_4_1_202210_1", memory="DDR[0]"),
)}

#: The RTL kernel's arguments: (name, register offset, bytes, is a device pointer). They
#: are the job registers: XRT needs them to know the master's memory bank, and its own
#: kernel call writes them and sets AP_START alone, which queues that one job (one-shot
#: mode); the host driver queues jobs through the same offsets and JOB_PUSH.
KERNEL_ARGS = (
    ("in_addr", Reg.JOB_IN_ADDR_LO, 8, True),
    ("in_len", Reg.JOB_IN_LEN, 4, False),
    ("out_addr", Reg.JOB_OUT_ADDR_LO, 8, True),
    ("out_cap", Reg.JOB_OUT_CAP, 4, False),
    ("job_id", Reg.JOB_ID, 4, False),
)


def _package_ip_tcl(source: str, ip_dir: str) -> str:
    """Tcl that packages ``source`` (the Verilog) as the decoder IP in ``ip_dir``."""
    vendor, library, name, version = VLNV.split(":")
    return f"""\
# Package the decoder's Verilog as an IP; Vivado infers the AXI interfaces from the
# port names (s_axi_control_*, m_axi_gmem_*) and the clock, reset and interrupt.
create_project -in_memory -part $part
add_files -norecurse [file join $here {source}]
set_property top {TOP} [current_fileset]
update_compile_order -fileset sources_1
ipx::package_project -root_dir [file join $here {ip_dir}] -vendor {vendor} -library {library} \\
    -taxonomy /UserIP -import_files -set_current true
set core [ipx::current_core]
set_property name {name} $core
set_property version {version} $core
set_property display_name {{dlbooster JPEG decoder}} $core
ipx::associate_bus_interfaces -busif s_axi_control -clock ap_clk $core
ipx::associate_bus_interfaces -busif m_axi_gmem -clock ap_clk $core
ipx::create_xgui_files $core
ipx::update_checksums $core
ipx::check_integrity $core
ipx::save_core $core
close_project
"""


def _pynq_tcl(board: Board, lanes: int, max_width: int) -> str:
    zynq7 = board.part.startswith("xc7z")
    if zynq7:
        # No version: the one the Vivado release ships (zynq_ultra_ps_e is 3.4 in 2022.x,
        # 3.5 from 2023.1; a pinned one is "not found" in the other releases).
        ps_vlnv, ps_rule = "xilinx.com:ip:processing_system7", "xilinx.com:bd_rule:processing_system7"
        ps_config = ("CONFIG.PCW_USE_S_AXI_HP0 {1} CONFIG.PCW_S_AXI_HP0_DATA_WIDTH {64} "
                     "CONFIG.PCW_USE_FABRIC_INTERRUPT {1} CONFIG.PCW_IRQ_F2P_INTR {1} "
                     f"CONFIG.PCW_FPGA0_PERIPHERAL_FREQMHZ {{{board.clock_mhz}}}")
        ps_rule_config = '{make_external "FIXED_IO, DDR" apply_board_preset "1"}'
        gp, hp, irq = "/ps/M_AXI_GP0", "/ps/S_AXI_HP0", "ps/IRQ_F2P"
    else:
        ps_vlnv, ps_rule = "xilinx.com:ip:zynq_ultra_ps_e", "xilinx.com:bd_rule:zynq_ultra_ps_e"
        ps_config = ("CONFIG.PSU__USE__S_AXI_GP2 {1} CONFIG.PSU__SAXIGP2__DATA_WIDTH {128} "
                     "CONFIG.PSU__USE__M_AXI_GP0 {1} CONFIG.PSU__USE__M_AXI_GP1 {0} CONFIG.PSU__USE__IRQ0 {1} "
                     f"CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ {{{board.clock_mhz}}}")
        ps_rule_config = '{apply_board_preset "1"}'
        gp, hp, irq = "/ps/M_AXI_HPM0_FPD", "/ps/S_AXI_HP0_FPD", "ps/pl_ps_irq0"
    vendor, library, name, version = VLNV.split(":")
    return f"""\
# dlbooster decoder for {board.name} ({board.part}): {lanes} lane(s), {max_width}-pixel line
# buffers, {board.data_width}-bit AXI4 master, {board.clock_mhz} MHz fabric clock.
# Run: vivado -mode batch -source build.tcl   (Vivado 2022.1 or newer, with the board files)
# Writes dlbooster.bit and dlbooster.hwh next to this script.
set here [file dirname [file normalize [info script]]]
set part {board.part}

{_package_ip_tcl(TOP + ".v", "ip")}
create_project -force dlbooster_{board.name.replace("-", "_")} [file join $here vivado] -part $part
set_property board_part {board.board_part} [current_project]
set_property ip_repo_paths [list [file join $here ip]] [current_project]
update_ip_catalog -rebuild

create_bd_design dlbooster
create_bd_cell -type ip -vlnv {ps_vlnv} ps
apply_bd_automation -rule {ps_rule} -config {ps_rule_config} [get_bd_cells ps]
set_property -dict [list {ps_config}] [get_bd_cells ps]
create_bd_cell -type ip -vlnv {vendor}:{library}:{name}:{version} decoder
# Control registers on a general-purpose master port, the memory master on a
# high-performance port into DDR, both through interconnects Vivado inserts.
apply_bd_automation -rule xilinx.com:bd_rule:axi4 -config [list Master {gp} Clk Auto] \\
    [get_bd_intf_pins decoder/s_axi_control]
apply_bd_automation -rule xilinx.com:bd_rule:axi4 -config [list Slave {hp} Clk Auto] \\
    [get_bd_intf_pins decoder/m_axi_gmem]
connect_bd_net [get_bd_pins decoder/interrupt] [get_bd_pins {irq}]
assign_bd_address
validate_bd_design
save_bd_design

make_wrapper -files [get_files dlbooster.bd] -top -import
set_property top dlbooster_wrapper [current_fileset]
update_compile_order -fileset sources_1
launch_runs impl_1 -to_step write_bitstream -jobs 4
wait_on_run impl_1
if {{[get_property PROGRESS [get_runs impl_1]] ne "100%"}} {{
    error "implementation did not finish: see [get_property DIRECTORY [get_runs impl_1]]"
}}
file copy -force [file join [get_property DIRECTORY [get_runs impl_1]] dlbooster_wrapper.bit] \\
    [file join $here dlbooster.bit]
file copy -force [lindex [get_files -all -of_objects [get_files dlbooster.bd] dlbooster.hwh] 0] \\
    [file join $here dlbooster.hwh]
# The reports need the implemented design open (UG835: they act on the current design).
open_run impl_1
report_utilization -file [file join $here utilization.txt]
report_timing_summary -file [file join $here timing.txt]
puts "dlbooster: wrote [file join $here dlbooster.bit] and [file join $here dlbooster.hwh]"
"""


def kernel_xml(board: Board) -> str:
    """``kernel.xml`` of the RTL kernel (UG1393 "RTL kernel XML file")."""
    args = []
    for n, (name, offset, size, pointer) in enumerate(KERNEL_ARGS):
        args.append(
            f'      <arg name={quoteattr(name)} addressQualifier="{1 if pointer else 0}" id="{n}" '
            f'port="{"m_axi_gmem" if pointer else "s_axi_control"}" size="0x{size:x}" offset="0x{int(offset):x}" '
            f'type="{"void*" if pointer else "uint"}" hostOffset="0x0" hostSize="0x{size:x}"/>')
    return f"""\
<?xml version="1.0" encoding="UTF-8"?>
<root versionMajor="1" versionMinor="6">
  <kernel name="{TOP}" language="ip_c" vlnv="{VLNV}" attributes=""
          preferredWorkGroupSizeMultiple="0" workGroupSize="1" interrupt="true"
          hwControlProtocol="ap_ctrl_hs">
    <ports>
      <port name="s_axi_control" mode="slave" range="0x1000" dataWidth="32" portType="addressable" base="0x0"/>
      <port name="m_axi_gmem" mode="master" range="0xFFFFFFFFFFFFFFFF" dataWidth="{board.data_width}"
            portType="addressable" base="0x0"/>
    </ports>
    <args>
{chr(10).join(args)}
    </args>
  </kernel>
</root>
"""


def _package_xo_tcl(board: Board, lanes: int, max_width: int) -> str:
    return f"""\
# dlbooster decoder as an Alveo RTL kernel for {board.platform}: {lanes} lane(s),
# {max_width}-pixel line buffers, {board.data_width}-bit AXI4 master.
# Run: vivado -mode batch -source package_xo.tcl   (Vivado/Vitis 2022.2 or newer)
# Writes dlbooster_decoder.xo next to this script.
set here [file dirname [file normalize [info script]]]
set part {board.part}

{_package_ip_tcl(TOP + ".v", "ip")}
package_xo -xo_path [file join $here {TOP}.xo] -kernel_name {TOP} \\
    -ip_directory [file join $here ip] -kernel_xml [file join $here kernel.xml] -force
puts "dlbooster: wrote [file join $here {TOP}.xo]"
"""


def _link_cfg(board: Board) -> str:
    return f"""\
# v++ link configuration (UG1393 "--config"): one decoder compute unit, its memory
# master on {board.memory}, the kernel clock at {board.clock_mhz} MHz.
# Run: v++ -l -t hw --platform {board.platform} --config link.cfg -o dlbooster.xclbin {TOP}.xo
[connectivity]
nk={TOP}:1:{TOP}_1
sp={TOP}_1.m_axi_gmem:{board.memory}

[clock]
freqHz={board.clock_mhz * 1_000_000}:{TOP}_1
"""


def _readme(board: Board, lanes: int, max_width: int, files: list[str]) -> str:
    if board.kind == "pynq":
        steps = f"""\
1. Vivado 2022.1 or newer with the {board.name} board files installed
   (`{board.board_part}`), then:

       vivado -mode batch -source build.tcl

   Synthesis and implementation of the whole design take about an hour. Output:
   `dlbooster.bit`, `dlbooster.hwh`, `utilization.txt`, `timing.txt`.
2. Copy `dlbooster.bit` and `dlbooster.hwh` to the board (PYNQ 3.0 or newer) and run

       dlbooster flash --board {board.name} dlbooster.bit

   which loads the overlay and decodes a self-test image, compared with the CPU path."""
    else:
        steps = f"""\
1. Vivado/Vitis 2022.2 or newer and the `{board.platform}` platform, then, in this
   folder (`v++` finds `link.cfg` and the `.xo` here):

       vivado -mode batch -source package_xo.tcl
       v++ -l -t hw --platform {board.platform} --config link.cfg -o dlbooster.xclbin {TOP}.xo

   Linking takes a few hours. Output: `dlbooster.xclbin`.
2. On the host with the card and XRT:

       dlbooster flash --board {board.name} dlbooster.xclbin"""
    listing = "\n".join(f"- `{f}`" for f in files)
    return f"""\
# dlbooster decoder for {board.name}

{lanes} decoder lane(s), {max_width}-pixel line buffers, {board.data_width}-bit AXI4 master
(`m_axi_gmem`, 64-bit addresses), AXI4-Lite control (`s_axi_control`, XRT's ap_ctrl_hs
layout at 0x00-0x0C, then the job and completion FIFO registers of `dlbooster.hw.regs`,
`hw/regs.py` in the dlbooster source), `ap_clk` at {board.clock_mhz} MHz, `ap_rst_n`,
`interrupt`.
Part {board.part}. IP VLNV `{VLNV}`.

Files:

{listing}

Steps:

{steps}

Generated by `dlbooster build --board {board.name} --lanes {lanes} --max-width {max_width}`.
"""


#: Line-buffer width of a board build unless one is given, pixels: one lane fits the
#: smallest board's block RAM at it (PYNQ-Z2; docs/benchmarks.md).
BOARD_MAX_WIDTH = 2048


def write_board_build(board_name: str, out: str | Path, *, lanes: int = 1,
                      max_width: int = BOARD_MAX_WIDTH) -> list[Path]:
    """Write the build folder for ``board_name`` (see the module docstring).

    Args:
        board_name: a key of :data:`BOARDS`.
        out: the folder to write (created; files in it are replaced).
        lanes: decoder lanes.
        max_width: line-buffer width, pixels.

    Returns:
        The files written.

    Raises:
        KeyError: unknown board.
    """
    from ..device import Device

    board = BOARDS[board_name]
    out = Path(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)    # first: a folder that cannot be made fails at once
    try:
        files = {f"{TOP}.v": verilog.convert(Device(lanes=lanes, max_width=max_width, data_width=board.data_width),
                                              name=TOP, emit_src=False)}
        if board.kind == "pynq":
            files["build.tcl"] = _pynq_tcl(board, lanes, max_width)
        else:
            files["kernel.xml"] = kernel_xml(board)
            files["package_xo.tcl"] = _package_xo_tcl(board, lanes, max_width)
            files["link.cfg"] = _link_cfg(board)
        files["README.md"] = _readme(board, lanes, max_width, list(files))
    except BaseException:
        if created:                           # interrupted or failed before any file: no empty folder left
            out.rmdir()
        raise
    written = []
    for name, text in files.items():
        path = out / name
        path.write_text(text)
        written.append(path)
    return written


#: Vivado commands the build scripts call (UG835), for :func:`check_board_build`'s dry run.
VIVADO_COMMANDS = (
    "add_files", "apply_bd_automation", "assign_bd_address", "close_project", "connect_bd_net",
    "create_bd_cell", "create_bd_design", "create_project", "current_fileset", "current_project",
    "get_bd_cells", "get_bd_intf_pins", "get_bd_pins", "get_files", "get_property", "get_runs",
    "launch_runs", "make_wrapper", "open_run", "package_xo", "report_timing_summary", "report_utilization",
    "save_bd_design", "set_property", "update_compile_order", "update_ip_catalog", "validate_bd_design",
    "wait_on_run", "ipx::associate_bus_interfaces", "ipx::check_integrity", "ipx::create_xgui_files",
    "ipx::current_core", "ipx::package_project", "ipx::save_core", "ipx::update_checksums",
)

# Stubs: each Vivado command logs its words and returns its own name (PROGRESS: 100%);
# `file copy` logs instead of copying; anything else that Tcl does not know is an error.
# A call is logged as one line, its words (after Tcl's substitution, newlines as spaces)
# joined by the unit separator, which no word of these scripts holds.
_TCL_PRELUDE = """\
namespace eval ipx {}
set ::dlb_log [open [lindex $argv 0] w]
set ::dlb_script [lindex $argv 2]
proc dlb_log words {
    puts $::dlb_log [join [lmap word $words {string map {"\\n" " "} $word}] "\\x1f"]
}
foreach cmd [split [lindex $argv 1] ,] {
    proc $cmd args [format {
        dlb_log [list %s {*}$args]
        if {"%s" eq "get_property" && [lindex $args 0] eq "PROGRESS"} { return "100%%" }
        return %s
    } $cmd $cmd $cmd]
}
rename file _dlb_file
proc file {sub args} {
    if {$sub eq "copy"} { dlb_log [list file copy {*}$args]; return }
    return [_dlb_file $sub {*}$args]
}
proc unknown args { error "not a Tcl or Vivado command: [lindex $args 0]" }
set argv {}
set argc 0
"""


def _top_ports(verilog: str) -> dict[str, tuple[str, int]]:
    """``name -> (direction, width)`` of the top module's ports."""
    start = verilog.index(f"module {TOP}(")
    body = verilog[start:verilog.index("endmodule", start)]
    ports = {}
    for direction, msb, name in re.findall(r"^\s*(input|output)\s+(?:\[(\d+):0\]\s+)?(\w+);", body, re.M):
        ports[name] = (direction, int(msb) + 1 if msb else 1)
    return ports


def _build_files(board: Board) -> list[str]:
    """The files :func:`write_board_build` writes for ``board``."""
    scripts = ["build.tcl"] if board.kind == "pynq" else ["kernel.xml", "package_xo.tcl", "link.cfg"]
    return [f"{TOP}.v", *scripts, "README.md"]


def _dry_run(tclsh: str, script: Path) -> tuple[list[list[str]] | None, str]:
    """Run ``script`` under ``tclsh`` with the Vivado commands stubbed: ``(calls, "")``,
    each call as its words after Tcl's substitution, or ``(None, the error)``."""
    with tempfile.TemporaryDirectory() as tmp:
        log, prelude = Path(tmp) / "calls.log", Path(tmp) / "run.tcl"
        # The script's path as an argument: braces or brackets in it would break a path
        # written into the Tcl source.
        prelude.write_text(_TCL_PRELUDE + "source $::dlb_script\n")
        run = subprocess.run([tclsh, str(prelude), str(log), ",".join(VIVADO_COMMANDS), str(script)],
                             capture_output=True, text=True, timeout=60)
        if run.returncode:
            return None, run.stderr.strip() or run.stdout.strip() or f"tclsh exit {run.returncode}"
        return [line.split("\x1f") for line in log.read_text().splitlines()], ""


def _called(calls: list[list[str]], *words: str) -> bool:
    """A call whose first words are ``words``."""
    return any(call[:len(words)] == list(words) for call in calls)


def _option(calls: list[list[str]], command: str, option: str) -> list[str]:
    """The values of ``option`` in every call of ``command``."""
    return [call[i + 1] for call in calls if call[0] == command
            for i, word in enumerate(call[:-1]) if word == option]


def _check_script(name: str, calls: list[list[str]], board: Board, ports: dict, folder: Path) -> list[str]:
    """What the dry run of one script in ``folder`` must show (see :func:`check_board_build`)."""
    problems = []
    vendor, library, ip_name, version = VLNV.split(":")
    if board.part not in _option(calls, "create_project", "-part"):
        problems.append(f"{name}: no project for the board's part {board.part} "
                        f"(create_project -part: {', '.join(_option(calls, 'create_project', '-part')) or 'none'})")
    if not _called(calls, "ipx::package_project"):
        problems.append(f"{name}: does not package the IP")
    else:
        packaged = (_option(calls, "ipx::package_project", "-vendor") == [vendor]
                    and _option(calls, "ipx::package_project", "-library") == [library]
                    and _called(calls, "set_property", "name", ip_name)
                    and _called(calls, "set_property", "version", version))
        if not packaged:
            problems.append(f"{name}: the packaged IP is not {VLNV}")
    for pin in ("s_axi_control", "m_axi_gmem", "interrupt"):
        used = any(word == f"decoder/{pin}" for call in calls for word in call[1:])
        if used and not any(p == pin or p.startswith(pin + "_") for p in ports):
            problems.append(f"{name}: connects decoder/{pin}, which the top does not have")
    if board.kind == "pynq":
        if not _called(calls, "set_property", "board_part", board.board_part):
            problems.append(f"{name}: the project's board part is not {board.board_part}")
        if not _called(calls, "create_bd_cell", "-type", "ip", "-vlnv", VLNV, "decoder"):
            problems.append(f"{name}: no decoder cell of the IP {VLNV} in the block design")
        for pin in ("decoder/s_axi_control", "decoder/m_axi_gmem"):
            if not _called(calls, "get_bd_intf_pins", pin):
                problems.append(f"{name}: {pin} is not connected")
        if not _called(calls, "get_bd_pins", "decoder/interrupt"):
            problems.append(f"{name}: the decoder's interrupt is not connected")
        # The PS's settings: each `set_property -dict` value is a list of names and values.
        settings = {}
        for value in _option(calls, "set_property", "-dict"):
            words = value.split()
            settings.update(zip(words[::2], words[1::2]))
        clock = "CONFIG.PCW_FPGA0_PERIPHERAL_FREQMHZ" if board.part.startswith("xc7z") else \
            "CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ"
        if settings.get(clock) != str(board.clock_mhz):
            problems.append(f"{name}: the fabric clock is not set to {board.clock_mhz} MHz ({clock})")
        if not _called(calls, "launch_runs", "impl_1", "-to_step", "write_bitstream"):
            problems.append(f"{name}: no implementation run to write_bitstream")
        copied = {Path(call[-1]) for call in calls if call[:2] == ["file", "copy"]}
        for file in ("dlbooster.bit", "dlbooster.hwh"):
            if not any(c.name == file and c.parent.resolve() == folder.resolve() for c in copied):
                problems.append(f"{name}: does not copy {file} into the folder")
        reports = [i for i, call in enumerate(calls) if call[0].startswith("report_")]
        if reports and not any(call[0] == "open_run" for call in calls[:reports[0]]):
            problems.append(f"{name}: reports with no design open (open_run before report_*)")
    elif not (_option(calls, "package_xo", "-kernel_name") == [TOP]
              and any(x.endswith("kernel.xml") for x in _option(calls, "package_xo", "-kernel_xml"))
              and any(x.endswith(f"{TOP}.xo") for x in _option(calls, "package_xo", "-xo_path"))):
        problems.append(f"{name}: no package_xo of the kernel {TOP} with kernel.xml into {TOP}.xo")
    return problems


def _check_kernel_xml(path: Path, board: Board, ports: dict) -> list[str]:
    """kernel.xml against :func:`kernel_xml`'s rules (UG1393) and the Verilog's ports."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        return [f"kernel.xml: {exc}"]
    kernel = root.find("kernel")
    if kernel is None or kernel.get("name") != TOP or kernel.get("hwControlProtocol") != "ap_ctrl_hs":
        return ["kernel.xml: no ap_ctrl_hs kernel named " + TOP]
    problems = []
    if kernel.get("vlnv") != VLNV:
        problems.append(f"kernel.xml: the kernel's vlnv is {kernel.get('vlnv')}, not {VLNV}")
    if kernel.get("interrupt") != "true":
        problems.append("kernel.xml: the kernel has no interrupt")

    def number(element, attribute: str) -> int | None:
        try:
            return int(element.get(attribute, ""), 0)
        except ValueError:
            problems.append(f"kernel.xml: {element.tag} {element.get('name')}: {attribute}="
                            f"{element.get(attribute)!r} is not a number")
            return None

    xml_ports = {p.get("name"): p for p in kernel.iter("port")}
    widths = {"m_axi_gmem": ("master", ports.get("m_axi_gmem_wdata", ("", 0))[1]), "s_axi_control": ("slave", 32)}
    for name, (mode, width) in widths.items():
        port = xml_ports.get(name)
        if port is None:
            problems.append(f"kernel.xml: no port {name}")
        elif port.get("mode") != mode or number(port, "dataWidth") != width:
            problems.append(f"kernel.xml: port {name} must be a {width}-bit {mode} "
                            f"(mode {port.get('mode')}, dataWidth {port.get('dataWidth')})")
    for extra in sorted(set(xml_ports) - set(widths)):
        problems.append(f"kernel.xml: port {extra} is not on the top")
    args = []
    for a in kernel.iter("arg"):
        pointer = a.get("addressQualifier") == "1"
        args.append((a.get("name"), number(a, "offset"), number(a, "size"), pointer))
        want_port, want_type = ("m_axi_gmem", "void*") if pointer else ("s_axi_control", "uint")
        if a.get("port") != want_port or a.get("type") != want_type or a.get("hostSize") != a.get("size"):
            problems.append(f"kernel.xml: argument {a.get('name')}: port {a.get('port')}, type {a.get('type')}, "
                            f"hostSize {a.get('hostSize')} (want {want_port}, {want_type}, its size)")
    want = [(n, int(o), s, p) for n, o, s, p in KERNEL_ARGS]
    if args != want:
        problems.append(f"kernel.xml: arguments {args}, want {want}")
    return problems


def _check_link_cfg(path: Path, board: Board) -> list[str]:
    """link.cfg's settings, read as v++ reads a ``--config`` file (UG1393: ``[section]``
    headers, ``key=value`` lines, ``#`` comments, keys that may repeat)."""
    settings, section = set(), ""
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            settings.add((section, key, value))
    problems = []
    for need in (("connectivity", "nk", f"{TOP}:1:{TOP}_1"),
                 ("connectivity", "sp", f"{TOP}_1.m_axi_gmem:{board.memory}"),
                 ("clock", "freqHz", f"{board.clock_mhz * 1_000_000}:{TOP}_1")):
        if need not in settings:
            problems.append(f"link.cfg: no {need[1]}={need[2]} in [{need[0]}]")
    return problems


def check_board_build(out: str | Path, board_name: str, *,
                      lint: Callable[[Path, str], tuple[int, str]] | None = None) -> list[str]:
    """Validate a folder :func:`write_board_build` wrote (or a copy of it, edited or not),
    as far as this machine can without the vendor tools. Returns the problems found
    (empty: all good):

    - every file of the build is there and readable;
    - the top's ports follow SPEC.md section 5: ``ap_clk``, ``ap_rst_n``, ``interrupt``,
      a complete 32-bit AXI4-Lite slave ``s_axi_control_*``, a complete AXI4 master
      ``m_axi_gmem_*`` with 64-bit addresses and the board's data width;
    - the Verilog is lint-clean, when ``lint`` is given: a linter called as
      ``lint(path, top)`` that returns ``(exit code, messages)``, such as
      :func:`dlbooster.sim.flow.lint_verilog` (``verilator --lint-only -Wall`` with
      hw/device.vlt); the gateware's build tooling runs no simulator of its own;
    - every Tcl script runs under ``tclsh`` with the Vivado commands it calls replaced
      by stubs (:data:`VIVADO_COMMANDS`): it parses and calls nothing else; its calls
      make a project for the board's part, package the IP as :data:`VLNV` and connect
      only interfaces the top has; ``build.tcl`` also sets the board part, places the
      decoder, connects its control slave, memory master and interrupt, sets the
      fabric clock, implements to ``write_bitstream``, copies ``dlbooster.bit`` and
      ``dlbooster.hwh`` into the folder and opens the run before its reports;
      ``package_xo.tcl`` packages the kernel with ``kernel.xml``;
    - ``kernel.xml`` is well-formed, names the IP and the interrupt, its arguments sit
      at the job registers' offsets (:data:`KERNEL_ARGS`) on the right ports with the
      right types, its ports exist with the right widths; ``link.cfg`` sets the
      kernel, its master's memory bank and its clock.

    Raises:
        FileNotFoundError: ``tclsh`` or (with ``lint``) Verilator is missing.
    """
    from amaranth import Shape

    from ..axi import axi4_lite_slave_ports, axi4_master_ports

    board = BOARDS[board_name]
    out = Path(out)
    tclsh = shutil.which("tclsh")
    if tclsh is None:
        raise FileNotFoundError("tclsh is not installed")
    problems, texts = [], {}
    for name in _build_files(board):
        try:
            texts[name] = (out / name).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{name}: cannot be read: {getattr(exc, 'strerror', None) or exc}")
    if f"{TOP}.v" not in texts:
        return problems
    try:
        ports = _top_ports(texts[f"{TOP}.v"])
    except ValueError:
        return problems + [f"{TOP}.v: no module {TOP}"]
    id_width = ports.get("m_axi_gmem_arid", ("", 1))[1]
    expected = {"ap_clk": ("input", 1), "ap_rst_n": ("input", 1), "interrupt": ("output", 1)}
    for group in (axi4_lite_slave_ports("s_axi_control"), axi4_master_ports("m_axi_gmem", board.data_width, id_width)):
        for name, member in group.items():
            expected[name] = ("input" if member.flow.name == "In" else "output", Shape.cast(member.shape).width)
    for name, want in expected.items():
        if ports.get(name) != want:
            problems.append(f"port {name}: {ports.get(name)} (want {want})")
    for extra in sorted(set(ports) - set(expected)):
        problems.append(f"port {extra} is outside the interface rules")
    if lint is not None:
        code, messages = lint(out / f"{TOP}.v", TOP)
        if code or "%Warning" in messages or "%Error" in messages:
            problems.append("verilator --lint-only -Wall: " + messages.strip()[:2000])
    for name in [n for n in _build_files(board) if n.endswith(".tcl") and n in texts]:
        calls, error = _dry_run(tclsh, out / name)
        if calls is None:
            problems.append(f"{name}: {error}")
        else:
            problems += _check_script(name, calls, board, ports, out)
    if "kernel.xml" in texts:
        problems += _check_kernel_xml(out / "kernel.xml", board, ports)
    if "link.cfg" in texts:
        problems += _check_link_cfg(out / "link.cfg", board)
    return problems
