"""``dlbooster build --verilog``: the exported top has the interface SPEC.md section 5
asks of an XRT RTL kernel and a PYNQ IP, and is clean under ``verilator --lint-only -Wall``
with the waivers documented in hw/device.vlt; and the C++ simulations' Verilator build
cache (:func:`dlbooster.sim.flow.build_verilated`), which the simulated device and the core
harnesses share; and the simulated device's build where one_evaluation_per_clock does not
know its Verilog (clocked the ordinary way, with the same results)."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
from pathlib import Path

import pytest

from dlbooster import jpeg
from dlbooster.device.driver import DecoderDevice
from dlbooster.sim import device as simdev
from dlbooster.sim.flow import simulator_available
from dlbooster.sim.netlist import UnknownForm
from dlbooster.sim.verify import expectation

from jpegtools import gen, pillow_rgb


@pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
def test_build_verilog_ports_and_lint(tmp_path, capsys):
    from dlbooster.cli import main

    out = tmp_path / "decoder.v"
    assert main(["build", "--verilog", str(out), "--lanes", "2", "--max-width", "256", "--lint"]) == 0
    printed = capsys.readouterr()
    assert "verilator --lint-only -Wall: clean" in printed.out
    # The minute of elaboration is announced before it starts.
    assert printed.err == ("dlbooster build: elaborating 2 lane(s) with 256-pixel line buffers and writing Verilog "
                           "(a minute or more)\n")
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


def _counter_build(folder: Path, cpp: Path, step: int) -> Path:
    from dlbooster.sim.flow import build_verilated

    return build_verilated(_COUNTER.format(step=step), "counter", cpp, ["-CFLAGS", "-O1"], folder=folder,
                           name="counter", output="Vcounter", sources=[_COUNTER_MAIN])


def _toolchains() -> list:
    """The toolchains :func:`dlbooster.sim.flow.toolchain` can choose here, as
    ``DLBOOSTER_TOOLCHAIN`` values; a missing one's parameter is skipped."""
    from dlbooster.sim.flow import _llvm_toolchain, takes_gcc_profiles

    gcc = takes_gcc_profiles("c++")
    llvm = _llvm_toolchain(os.environ.get("PATH", "")) is not None
    return [pytest.param("gcc", marks=pytest.mark.skipif(not gcc, reason="no GCC with profile flags")),
            pytest.param("llvm", marks=pytest.mark.skipif(not llvm, reason="no clang and llvm-profdata of LLVM 16+"))]


def _profile_guided() -> bool:
    from dlbooster.sim.flow import profile_guided_available

    return profile_guided_available()


def _profiles(obj: Path) -> list[str]:
    """The profile files of either toolchain in a build's object folder."""
    return sorted(p.name for p in obj.iterdir() if p.suffix in (".gcda", ".profraw", ".profdata"))


@pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
@pytest.mark.parametrize("tools", _toolchains())
def test_a_profile_guided_build_trains_the_instrumented_product_then_compiles_it_with_the_profile(
        tmp_path, monkeypatch, tools):
    """``train`` runs once, on an instrumented product that writes the toolchain's profile
    (GCC's beside the objects, LLVM's where ``env`` says, then merged); the product is
    then compiled from that profile (and is no longer instrumented: running it writes no
    profile); its cache folder is not the plain build's; a failing training run fails
    the build."""
    import subprocess

    from dlbooster.sim.flow import build_verilated, toolchain

    monkeypatch.setenv("DLBOOSTER_TOOLCHAIN", tools)
    monkeypatch.delenv("MAKEFLAGS", raising=False)
    llvm = toolchain().profdata is not None
    assert llvm == (tools == "llvm")
    cpp = tmp_path / "main.cpp"
    cpp.write_text(_COUNTER_MAIN)
    folder = tmp_path / "cache"
    runs = []

    def train(product: Path, log, pass_fds, env) -> None:
        # The descriptor is the build's lock file, for the training process to hold, and
        # the lock is held while it trains: another open of the file cannot take it.
        fd, = pass_fds
        lock = Path(os.readlink(f"/proc/self/fd/{fd}"))
        assert lock.parent == folder and lock.name == f"{product.parent.name}.lock"
        with open(lock) as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        obj = product.parent / "obj"
        assert not _profiles(obj)
        out = subprocess.run([str(product)], capture_output=True, text=True, check=True, env=env,
                             cwd=tmp_path).stdout
        runs.append((out, _profiles(obj)))
        log.write(f"trained: {out}")

    def build(step: int, train) -> Path:
        return build_verilated(_COUNTER.format(step=step), "counter", cpp, ["-CFLAGS", "-O1"], folder=folder,
                               name="counter", output="Vcounter", sources=[_COUNTER_MAIN], train=train)

    exe = build(3, train)
    assert len(runs) == 1
    out, profiles = runs[0]
    assert out == "30\n"
    log = (exe.parent / "build.log").read_text()
    assert "trained: 30" in log and "missing-profile" not in log
    obj = exe.parent / "obj"
    before = {p.name: p.stat().st_mtime_ns for p in obj.iterdir() if p.name in _profiles(obj)}
    if llvm:
        assert len(profiles) == 1 and re.fullmatch(r"train-\d+\.profraw", profiles[0])
        assert f"-fprofile-instr-use={obj}/train.profdata" in log and "train.profdata" in before
        assert "clang++" in log and "-fprofile-use" not in log
        # The merged profile holds the run's counts (main's among them).
        shown = subprocess.run([toolchain().profdata, "show", "--all-functions", str(obj / "train.profdata")],
                               capture_output=True, text=True, check=True).stdout
        assert "main" in shown and int(re.search(r"Total functions: (\d+)", shown).group(1)) > 0
    else:
        assert "main.gcda" in profiles and "-fprofile-use" in log and "main.gcda" in before
        assert "-fprofile-instr" not in log
    assert subprocess.run([str(exe)], capture_output=True, text=True, check=True, cwd=tmp_path).stdout == "30\n"
    assert {p.name: p.stat().st_mtime_ns for p in obj.iterdir() if p.name in _profiles(obj)} == before
    assert not list(tmp_path.glob("*.profraw"))           # the final product writes no profile anywhere
    assert build(3, train) == exe and len(runs) == 1
    assert build(3, None).parent != exe.parent

    def failing(product: Path, log, pass_fds, env) -> None:
        subprocess.run([str(product)], check=True, capture_output=True, env=env)     # writes a profile
        subprocess.run(["false"], check=True)

    with pytest.raises(subprocess.CalledProcessError):
        build(7, failing)
    assert len(list(folder.glob("counter-*/"))) == 3
    assert sorted(folder.glob("counter-*/Vcounter")) == sorted([exe, build(3, None)])
    # Built again over the failed build's objects and profile: train finds none left.
    again = build(7, train)
    assert len(runs) == 2 and runs[1][0] == "70\n"
    assert subprocess.run([str(again)], capture_output=True, text=True, check=True).stdout == "70\n"


def test_a_profile_guided_build_needs_a_compiler_that_takes_gcc_s_profile_flags(monkeypatch):
    """The compiler is the one Verilator's makefile runs (``c++``, or ``CXX=`` in
    ``MAKEFLAGS``); one that refuses the flags, or is missing, gets no profile-guided
    build."""
    from dlbooster.sim import flow

    monkeypatch.delenv("DLBOOSTER_MARCH", raising=False)
    monkeypatch.setenv("MAKEFLAGS", "-j2 CXX=dlbooster-no-such-compiler")
    assert flow._make_cxx() == "dlbooster-no-such-compiler"
    assert flow.toolchain() == flow.Toolchain("dlbooster-no-such-compiler")
    assert not flow.profile_guided_available()
    monkeypatch.setenv("MAKEFLAGS", "CXX=true")          # accepts anything
    assert flow.profile_guided_available()
    monkeypatch.setenv("MAKEFLAGS", "CXX=false")
    assert not flow.profile_guided_available()
    monkeypatch.delenv("MAKEFLAGS")
    assert flow._make_cxx() == "c++"


def _fake_tool(folder: Path, name: str, text: str) -> None:
    """An executable ``folder/name`` that prints ``text`` (a version) whatever its arguments."""
    path = folder / name
    path.write_text(f"#!/bin/sh\necho '{text}'\n")
    path.chmod(0o755)


def test_the_toolchain_prefers_clang_of_llvm_16_or_newer_with_its_own_profile_tool(tmp_path, monkeypatch):
    """``auto`` takes the newest clang of LLVM 16 or newer that has the llvm-profdata of its
    release (beside it or versioned on PATH), else GCC's ``c++``; ``gcc`` never takes
    clang; ``llvm`` must find it; ``CXX=`` in MAKEFLAGS wins; the choice is in the cache key."""
    from dlbooster.sim import flow

    def chosen():
        # The search is cached per PATH; this test changes the folders' contents.
        flow._llvm_toolchain.cache_clear()
        return flow.toolchain()

    monkeypatch.delenv("MAKEFLAGS", raising=False)
    monkeypatch.setenv("DLBOOSTER_TOOLCHAIN", "auto")
    monkeypatch.setenv("DLBOOSTER_MARCH", "none")       # the stand-ins take any flag
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    monkeypatch.setenv("PATH", str(bin_))
    assert chosen() == flow.Toolchain("c++")
    key = flow.build_environment_key()
    _fake_tool(bin_, "clang++-14", "Debian clang version 14.0.6")
    _fake_tool(bin_, "llvm-profdata-14", "Debian LLVM version 14.0.6")
    _fake_tool(bin_, "clang++-17", "clang version 17.0.1")
    assert chosen() == flow.Toolchain("c++")        # 14 is too old, 17 has no profile tool
    _fake_tool(bin_, "llvm-profdata-17", "LLVM version 16.0.0")
    assert chosen() == flow.Toolchain("c++")        # not its release
    _fake_tool(bin_, "llvm-profdata-17", "LLVM version 17.0.1")
    llvm = flow.Toolchain(str(bin_ / "clang++-17"), str(bin_ / "llvm-profdata-17"))
    assert chosen() == llvm
    assert llvm.makeflags == [f"CXX={llvm.cxx}", f"LINK={llvm.cxx}"]
    assert llvm.flags == ["-CFLAGS", "-O3", "-LDFLAGS", "-latomic"]
    assert llvm.profile_use(Path("/o")) == ["-CFLAGS", "-fprofile-instr-use=/o/train.profdata"]
    assert flow.build_environment_key() != key
    # The cocotb builds' key names the compiler their make runs, whatever toolchain() takes.
    assert flow.build_environment_key(flow.Toolchain("c++")) == key
    # A newer release wins, its profile tool found beside the compiler's real path.
    real = tmp_path / "llvm-18" / "bin"
    real.mkdir(parents=True)
    _fake_tool(real, "clang++", "clang version 18.1.8")
    _fake_tool(real, "llvm-profdata", "LLVM version 18.1.8")
    (bin_ / "clang++").symlink_to(real / "clang++")
    assert chosen() == flow.Toolchain(str(bin_ / "clang++"), str(real / "llvm-profdata"))
    # A newer one that cannot link an instrumented library (no profile runtime) is passed over.
    (bin_ / "clang++-19").write_text("#!/bin/sh\ncase \"$*\" in *-fprofile-instr-generate*) exit 1;; esac\n"
                                     "echo 'clang version 19.1.0'\n")
    (bin_ / "clang++-19").chmod(0o755)
    _fake_tool(bin_, "llvm-profdata-19", "LLVM version 19.1.0")
    assert chosen() == flow.Toolchain(str(bin_ / "clang++"), str(real / "llvm-profdata"))
    monkeypatch.setenv("DLBOOSTER_TOOLCHAIN", "gcc")
    assert chosen() == flow.Toolchain("c++") and chosen().makeflags == []
    monkeypatch.setenv("DLBOOSTER_TOOLCHAIN", "llvm")
    assert chosen().profdata == str(real / "llvm-profdata")
    monkeypatch.setenv("MAKEFLAGS", "CXX=g++-12")
    assert chosen() == flow.Toolchain("g++-12")
    monkeypatch.delenv("MAKEFLAGS")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="DLBOOSTER_TOOLCHAIN=llvm: no clang"):
        chosen()
    monkeypatch.setenv("DLBOOSTER_TOOLCHAIN", "icc")
    with pytest.raises(ValueError, match="not auto, gcc or llvm"):
        chosen()


def test_the_builds_compile_for_this_machine_s_processor(tmp_path, monkeypatch):
    """``DLBOOSTER_MARCH``: ``native`` by default where the compiler takes it, ``none``,
    or a value the compiler must take; a native build's cache key holds what native
    means to the compiler on this machine."""
    from dlbooster.sim import flow

    # A stand-in compiler that takes -march=native and -march=x86-64-v3 only, and
    # predefines for native the macros of a file.
    cc, macros = tmp_path / "cc", tmp_path / "macros"
    macros.write_text("#define __AVX2__ 1\n")
    cc.write_text(f'#!/bin/sh\ncase "$*" in\n  *-march=native*-dM*) cat {macros};;\n'
                  '  *-march=native*|*-march=x86-64-v3*) ;;\n  *-march=*) exit 1;;\nesac\n')
    cc.chmod(0o755)
    monkeypatch.setenv("MAKEFLAGS", f"CXX={cc}")
    monkeypatch.delenv("DLBOOSTER_MARCH", raising=False)
    tools = flow.toolchain()
    assert tools == flow.Toolchain(str(cc), march="native")
    assert tools.flags == ["-CFLAGS", "-march=native"]
    key = flow.build_environment_key(tools)
    macros.write_text("#define __AVX2__ 1\n#define __AVX512F__ 1\n")
    flow._native_target.cache_clear()
    assert flow.build_environment_key(tools) != key
    keys = {tuple(key), tuple(flow.build_environment_key(tools))}
    monkeypatch.setenv("DLBOOSTER_MARCH", "x86-64-v3")
    assert flow.toolchain().flags == ["-CFLAGS", "-march=x86-64-v3"]
    keys.add(tuple(flow.build_environment_key()))
    monkeypatch.setenv("DLBOOSTER_MARCH", "none")
    assert flow.toolchain() == flow.Toolchain(str(cc)) and flow.toolchain().flags == []
    keys.add(tuple(flow.build_environment_key()))
    assert len(keys) == 4           # each target has a key of its own
    monkeypatch.setenv("DLBOOSTER_MARCH", "")
    assert flow.toolchain().march == "native"
    # A compiler that takes -march=native but does not say what it means: no native build.
    macros.write_text("")
    flow._native_target.cache_clear()
    assert flow.toolchain().march == ""
    monkeypatch.setenv("DLBOOSTER_MARCH", "native")
    with pytest.raises(ValueError, match="DLBOOSTER_MARCH=native"):
        flow.toolchain()
    monkeypatch.setenv("DLBOOSTER_MARCH", "armv8-a")
    with pytest.raises(ValueError, match="DLBOOSTER_MARCH=armv8-a: .* does not take -march=armv8-a"):
        flow.toolchain()
    # A compiler that takes no -march at all: the default target, by default.
    monkeypatch.delenv("DLBOOSTER_MARCH")
    monkeypatch.setenv("MAKEFLAGS", "CXX=false")
    assert flow.toolchain() == flow.Toolchain("false")


@pytest.mark.parametrize("max_width", [64, 256, 8192])
def test_the_profile_run_covers_the_hardware_profile_s_subsamplings_restarts_and_qualities(max_width):
    """The training JPEGs of the profile-guided device build are all hardware-decodable at
    the build's line-buffer width, and cover 4:2:0, 4:2:2, 4:4:4 and grayscale, a restart
    interval and several quantisation tables."""
    from dlbooster import jpeg
    from dlbooster.sim.pgo import workload

    infos = [jpeg.parse(f) for f in workload(max_width)]
    assert [jpeg.classify(i, max_width=max_width) for i in infos] == [None] * len(infos)
    assert {i.subsampling for i in infos} == {"4:2:0", "4:2:2", "4:4:4", "gray"}
    assert any(i.scans[0].restart_interval for i in infos)
    assert len({i.scans[0].qtables[0].tobytes() for i in infos}) == 6
    assert all(i.frame.width == min(256, max_width) for i in infos)


@pytest.mark.skipif(not simulator_available("verilator") or not _profile_guided(),
                    reason="verilator missing, or a toolchain without profile-guided builds")
def test_the_device_library_is_profile_guided_and_its_training_run_decodes_like_pillow():
    """The 1-lane device library (the build the device tests share) was compiled by the
    toolchain :func:`~dlbooster.sim.flow.toolchain` chose from a training run's profile,
    and that run's seven images equal Pillow's decodes."""
    from dlbooster.sim.device import build_device_library
    from dlbooster.sim.flow import toolchain

    log = (build_device_library(lanes=1, max_width=256).parent / "build.log").read_text()
    assert "profile run: 7 images, 7 decoded, 0 different from Pillow" in log
    if toolchain().profdata:
        assert "-fprofile-instr-generate" in log and "-fprofile-instr-use=" in log and toolchain().cxx in log
    else:
        assert "-fprofile-generate" in log and "-fprofile-use" in log


@pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
def test_a_partial_or_damaged_build_is_built_again(tmp_path, monkeypatch):
    """A product that a killed linker left (no record of a finished build), or one
    damaged since (its hash differs), is built again instead of loaded: loading a
    truncated shared library ends the process with a bus error."""
    import subprocess

    from dlbooster.sim import flow

    builds = []
    real_run = subprocess.run
    monkeypatch.setattr(flow.subprocess, "run",
                        lambda cmd, *a, **kw: (builds.append(cmd) if "-Mdir" in cmd else None) or real_run(cmd, *a, **kw))
    cpp = tmp_path / "main.cpp"
    cpp.write_text(_COUNTER_MAIN)
    exe = _counter_build(tmp_path / "cache", cpp, 2)
    assert len(builds) == 1 and flow.product_ok(exe)
    assert not exe.with_name("Vcounter.partial").exists()
    whole = exe.read_bytes()

    exe.write_bytes(whole[: len(whole) // 2])                 # damaged after its build
    assert not flow.product_ok(exe)
    assert _counter_build(tmp_path / "cache", cpp, 2) == exe and len(builds) == 2
    assert real_run([str(exe)], capture_output=True, text=True, check=True).stdout == "20\n"

    exe.write_bytes(b"")                                        # a link killed at its start
    exe.with_name("Vcounter.sha256").unlink()
    assert _counter_build(tmp_path / "cache", cpp, 2) == exe and len(builds) == 3
    assert real_run([str(exe)], capture_output=True, text=True, check=True).stdout == "20\n"

    # A link killed before its rename leaves a partial product newer than the objects,
    # which make alone would take as built.
    exe.with_name("Vcounter.partial").write_bytes(whole[: len(whole) // 3])
    exe.unlink()
    exe.with_name("Vcounter.sha256").unlink()
    assert _counter_build(tmp_path / "cache", cpp, 2) == exe and len(builds) == 4
    assert exe.read_bytes() == whole and flow.product_ok(exe)

    # A finished build is taken without the lock, so a read-only cache serves it.
    monkeypatch.setattr(flow, "_locked", lambda *a, **kw: pytest.fail("locked a finished build"))
    assert _counter_build(tmp_path / "cache", cpp, 2) == exe and len(builds) == 4


_ORPHANED_BUILD = """
import sys
from pathlib import Path
sys.path[:0] = [{tests!r}, str(Path({tests!r}).parent)]   # this module, and the jpegtools it imports
from test_device_build import _counter_build
_counter_build(Path({folder!r}), Path({cpp!r}), 7)
"""


@pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
def test_a_build_outlives_its_killed_python_process_with_the_lock(tmp_path, monkeypatch, caplog):
    """A build's compiler and linker inherit its lock: when the Python process that
    started it is killed, they run on, and another process waits for them instead of
    building in the same folder at the same time."""
    import logging
    import os
    import signal
    import subprocess
    import sys
    import time

    from dlbooster.sim import flow

    cpp = tmp_path / "main.cpp"
    cpp.write_text(_COUNTER_MAIN)
    folder = tmp_path / "cache"
    script = _ORPHANED_BUILD.format(tests=str(Path(__file__).parent), folder=str(folder), cpp=str(cpp))
    child = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(folder.glob("counter-*/obj")) and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.05)
    assert list(folder.glob("counter-*/obj")), "the build did not start"
    child.kill()                                                # the Python process alone
    child.wait()

    def group_alive() -> bool:
        """A process of the killed one's group still runs (zombies, which an init that
        is slow to reap keeps, do not count)."""
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == child.pid and fields[0] != "Z":
                return True
        return False

    assert group_alive(), "the orphaned build ended before the test could race it"
    (build_dir,) = (obj.parent for obj in folder.glob("counter-*/obj"))
    archive = build_dir / "obj" / "Vcounter__ALL.a"           # the compiled model, made just before the link
    assert not archive.exists()
    compiled_before = []              # at this process's own build: had the orphaned one compiled?
    real_run = subprocess.run

    def run(cmd, *a, **kw):
        if "-Mdir" in cmd:
            compiled_before.append(archive.exists())
        return real_run(cmd, *a, **kw)

    monkeypatch.setattr(flow.subprocess, "run", run)
    try:
        with caplog.at_level(logging.WARNING, logger="dlbooster.sim.flow"):
            exe = _counter_build(folder, cpp, 7)
    finally:
        if group_alive():
            os.killpg(child.pid, signal.SIGKILL)
    assert any("waiting for another process to finish the build of counter-" in r.getMessage()
               for r in caplog.records)
    # It waited for the orphaned build to end, then did what the killed process had left
    # to do: the link's product is not trusted without its record, so make links again.
    assert compiled_before == [True]
    assert flow.product_ok(exe)
    assert real_run([str(exe)], capture_output=True, text=True, check=True).stdout == "70\n"


def test_the_cache_folder_is_absolute_and_an_unusable_one_is_one_line(tmp_path, monkeypatch, capsys):
    """make runs in folders of its own, so a relative DLBOOSTER_CACHE is made absolute (an
    empty one is the default); a folder that cannot be made is a CacheError, which the
    command line prints as one line."""
    from dlbooster.cli import main
    from dlbooster.sim.flow import CacheError, cache_root

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DLBOOSTER_CACHE", "relative")
    assert cache_root() == tmp_path / "relative" and cache_root().is_dir()
    monkeypatch.setenv("DLBOOSTER_CACHE", "~/elsewhere")
    assert cache_root() == tmp_path / "home" / "elsewhere"
    from dlbooster.predict.profiles import profile_dir

    assert profile_dir() == tmp_path / "home" / "elsewhere" / "profiles"   # the same folder
    monkeypatch.setenv("DLBOOSTER_CACHE", "")
    assert cache_root() == tmp_path / "home" / ".cache" / "dlbooster"
    assert profile_dir() == cache_root() / "profiles"

    (tmp_path / "a-file").write_bytes(b"")
    monkeypatch.setenv("DLBOOSTER_CACHE", str(tmp_path / "a-file"))
    with pytest.raises(CacheError, match=r"build cache .*a-file \(DLBOOSTER_CACHE\) cannot be used: File exists"):
        cache_root()
    (tmp_path / "cache" / "device").parent.mkdir()
    (tmp_path / "cache" / "device").write_bytes(b"")              # a file where the device builds go
    monkeypatch.setenv("DLBOOSTER_CACHE", str(tmp_path / "cache"))
    from dlbooster.sim.device import build_device_library

    with pytest.raises(CacheError, match=r"build cache .*cache/device \(DLBOOSTER_CACHE\) cannot be used"):
        build_device_library()
    monkeypatch.setenv("DLBOOSTER_CACHE", str(tmp_path / "a-file"))
    (tmp_path / "x.jpg").write_bytes(b"\xff\xd8")
    assert main(["decode", "--backend", "sim", str(tmp_path / "x.jpg")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dlbooster decode: build cache ") and "a-file" in err


def test_the_build_environment_and_the_runtime_modules_the_gateware_imports_are_in_the_cache_keys(monkeypatch, tmp_path):
    """make takes MAKEFLAGS and CXX from the environment, and the gateware imports the
    runtime's zigzag order: a change to either must not reuse an old build."""
    from dlbooster.sim import device, flow

    monkeypatch.delenv("MAKEFLAGS", raising=False)
    plain = flow.build_environment_key()
    assert plain[-1], "the C++ compiler's version"
    # make's own flags and jobserver details (a recipe's MAKEFLAGS) change no build.
    monkeypatch.setenv("MAKEFLAGS", "ks -j2 --jobserver-auth=fifo:/tmp/GMfifo123")
    assert flow.build_environment_key() == plain
    monkeypatch.setenv("MAKEFLAGS", "s -j2 -- OPT_FAST=-O0")
    assert flow.build_environment_key() != plain
    monkeypatch.setenv("MAKEFLAGS", "OPT_FAST=-O0")
    assert flow.build_environment_key() != plain
    # The compiler's version is that of the compiler make runs (CXX= in MAKEFLAGS).
    monkeypatch.setenv("MAKEFLAGS", "CXX=true")
    assert flow.build_environment_key()[-1] != plain[-1]
    monkeypatch.setenv("MAKEFLAGS", "OPT_FAST=-O0")
    key = device._source_key({"lanes": 1})
    monkeypatch.setenv("MAKEFLAGS", "OPT_FAST=-O1")
    assert device._source_key({"lanes": 1}) != key
    # The harnesses' key: their parameters and every file given (the C++ harness, its
    # header, sim/harness.py, sim/chain.py) are in it.
    extra = tmp_path / "harness.cpp"
    extra.write_text("int main() { return 0; }")
    base = device.source_key({"max_width": 64}, [extra], ["-CFLAGS", "-O2"])
    assert device.source_key({"max_width": 128}, [extra], ["-CFLAGS", "-O2"]) != base
    assert device.source_key({"max_width": 64}, [extra], ["-CFLAGS", "-O1"]) != base
    extra.write_text("int main() { return 1; }")
    assert device.source_key({"max_width": 64}, [extra], ["-CFLAGS", "-O2"]) != base
    import dlbooster.hw.idct
    import dlbooster.hw.t81

    sources = {p.resolve() for p in device._gateware_sources()}
    assert {Path(dlbooster.hw.t81.__file__).resolve(), Path(dlbooster.hw.idct.__file__).resolve()} <= sources
    assert {p.parent for p in sources} == {Path(dlbooster.hw.idct.__file__).resolve().parent}
    # Every key holds every file of sim/netlist/, which flattens and rewrites the
    # Verilog: a change to any of them changes it.
    from dlbooster.sim import netlist

    assert {Path(module.__file__).resolve() for module in (netlist, netlist.evaluation, netlist.fallback,
                                                           netlist.flatten, netlist.replicate, netlist.sink)} == {
        p.resolve() for p in netlist.SOURCES}
    copies = []
    for path in netlist.SOURCES:
        copies.append(tmp_path / "netlist" / path.name)
        copies[-1].parent.mkdir(exist_ok=True)
        copies[-1].write_bytes(path.read_bytes())
    key = device.source_key({"max_width": 64}, [extra], ["-CFLAGS", "-O2"])
    monkeypatch.setattr(netlist, "SOURCES", tuple(copies))
    assert device.source_key({"max_width": 64}, [extra], ["-CFLAGS", "-O2"]) == key
    for copy in copies:
        text = copy.read_bytes()
        copy.write_bytes(text + b"\n")
        assert device.source_key({"max_width": 64}, [extra], ["-CFLAGS", "-O2"]) != key, copy.name
        copy.write_bytes(text)
    # The device library's key holds its harness, its training run and sim/device.py,
    # which chooses how the device is elaborated and rewritten.
    given = []
    monkeypatch.setattr(device, "source_key", lambda params, files, flags: given.append(files) or "key")
    device._source_key({"lanes": 1})
    assert {Path(device.__file__).resolve(), device._CPP.resolve(), device._PGO.resolve()} <= {
        Path(f).resolve() for f in given[0]}


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

    # A finished build (with its record) where builds go: the index holds its path
    # relative to the cache, which may be moved whole.
    product = tmp_path / "cache" / "device" / "built" / "libdlbdevice.so"
    product.parent.mkdir(parents=True)
    product.write_bytes(b"library")
    product.with_name("libdlbdevice.so.sha256").write_text(hashlib.sha256(b"library").hexdigest())
    monkeypatch.setenv("DLBOOSTER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(simdev, "export_flat_verilog", lambda device, top: "")
    builds = []
    monkeypatch.setattr(simdev, "build_verilated", lambda *a, **kw: builds.append(kw) or product)
    monkeypatch.setattr(simdev, "profile_guided_available", lambda: True)
    with caplog.at_level(logging.INFO, logger="dlbooster.sim.device"):
        assert simdev.build_device_library(lanes=2, max_width=64) == product
    assert len(builds) == 1 and callable(builds[0]["train"])
    assert simdev._PGO.read_text() in builds[0]["sources"]        # the training run is in the cache key
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "building the simulated decoder device (2 lane(s), 64-pixel line buffers)" in warning.getMessage()
    assert str(tmp_path / "cache" / "device") in warning.getMessage()
    caplog.clear()
    assert simdev.build_device_library(lanes=2, max_width=64) == product     # the index finds it
    assert len(builds) == 1 and not caplog.records
    (index,) = (tmp_path / "cache" / "device").glob("index-*")
    assert index.read_text() == "built/libdlbdevice.so"
    product.write_bytes(b"librar")                        # damaged: not taken from the index
    monkeypatch.setattr(simdev, "profile_guided_available", lambda: False)
    simdev.build_device_library(lanes=2, max_width=64)
    assert len(builds) == 2 and builds[1]["train"] is None


#: The device tests' build (tests/sim/test_device_sim.py): the fallback's test shares its
#: normal build with them.
_WIDTH = 256


def _decode_all(transport, files: dict[str, bytes]) -> tuple[list, int, dict[str, int]]:
    """``files`` decoded through the host driver on ``transport`` (reset first) under
    memory gaps and latency with the gate check on: the outcomes, the clocks the batch
    took, and the counters after it."""
    frames = [jpeg.parse(data).frame for data in files.values()]
    device = DecoderDevice(transport)
    device.reset()
    transport.set_port(simdev.PortBehaviour(ready_percent=70, latency=9, seed=3))
    transport.check_gates()
    before = transport.counters()
    try:
        outcomes = device.decode_batch([(data, 3 * frame.width * frame.height)
                                        for data, frame in zip(files.values(), frames)])
    finally:
        transport.check_gates(False)
        transport.set_port(simdev.PortBehaviour())
    after = transport.counters()
    return outcomes, after["clocks"] - before["clocks"], {k: after[k] - before[k] for k in after}


@pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
def test_a_device_one_evaluation_per_clock_does_not_know_builds_clocked_the_ordinary_way(monkeypatch, caplog):
    """Where one_evaluation_per_clock does not know the device's Verilog (forced here),
    the build does not fail: one warning, and a library, cached apart from the normal
    build, that simulates the flattened Verilog as it is, two edges per clock. It decodes
    as the normal build does, completion for completion and clock for clock (the design
    is the same), and as Pillow does."""
    photo = gen(64, 48, subsampling=2, quality=90)
    scan = jpeg.parse(photo).scans[0]
    middle = (scan.data_start + scan.data_end) // 2
    files = {"420": photo, "444": gen(48, 32, subsampling=0, quality=85),
             "gray": gen(40, 24, subsampling="gray", quality=80),
             "restarts": gen(64, 48, subsampling=2, quality=75, restart_blocks=2),
             # Stuffed FF bytes: a run of 1 bits, which no Huffman code is.
             "corrupt": photo[:middle] + b"\xff\x00" * 4 + photo[middle + 8:]}
    assert sum(files["restarts"].count(bytes([0xFF, 0xD0 + n])) for n in range(8)) == 5
    assert expectation(files["corrupt"], _WIDTH)[:2] == ("fault", "bad-huffman-code")

    normal = simdev.build_device_library(lanes=1, max_width=_WIDTH)

    def refuse(verilog, clock):
        raise UnknownForm("one_evaluation_per_clock", "a form it was not written for")

    monkeypatch.setattr(simdev, "one_evaluation_per_clock", refuse)
    # The index is keyed by the sources, which this test leaves as they are: it would
    # find the normal build again.
    monkeypatch.setattr(simdev, "indexed_build", lambda root, key, build: build())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dlbooster"):
        fallback = simdev.build_device_library(lanes=1, max_width=_WIDTH)
    announced, warned = (r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert announced.startswith("building the simulated decoder device (1 lane(s), 256-pixel line buffers)")
    assert warned == ("one_evaluation_per_clock: a form it was not written for; the simulation builds without one "
                      "evaluation per clock: slower (two evaluations per clock, the same behaviour)")
    assert fallback.parent != normal.parent
    log = (fallback.parent / "build.log").read_text()
    assert "-DDLB_GATES=0" in log and "-DDLB_ONE_EVALUATION=0" in log
    assert "-DDLB_ONE_EVALUATION=1" in (normal.parent / "build.log").read_text()
    assert "gate_open" not in (fallback.parent / "dlbooster_decoder.v").read_text()

    runs = []
    for library in (normal, fallback):
        with simdev.SimTransport(library=library) as transport:
            runs.append((transport.one_evaluation, *_decode_all(transport, files)))
    (one_a, outcomes_a, clocks_a, counts_a), (one_b, outcomes_b, clocks_b, counts_b) = runs
    assert (one_a, one_b) == (True, False)
    assert clocks_a == clocks_b > 0
    assert counts_a == counts_b
    assert counts_b["violations"] == counts_b["early_reads"] == counts_b["unfinished"] == 0
    for name, a, b in zip(files, outcomes_a, outcomes_b):
        ca, cb = a.completion, b.completion
        assert (ca.status, ca.width, ca.height, ca.bytes_written, ca.symbols, ca.clocks) == \
            (cb.status, cb.width, cb.height, cb.bytes_written, cb.symbols, cb.clocks), name
        if name == "corrupt":
            assert cb.status != 0 and b.image is None and a.image is None
        else:
            reference, _ = pillow_rgb(files[name])
            assert cb.status == 0 and b.image.shape == reference.shape and (b.image == reference).all(), name
            assert (a.image == b.image).all(), name
