"""The decoder device top (``dlbooster.hw.device.Device``, 2 lanes, 256-pixel line buffers)
on its AXI4-Lite and AXI4 ports: cocotb (``sim/device_tb.py``, which states every check)
on Verilator, with cocotbext-axi's AXI4-Lite master as the host and AXI RAM as memory.

- random ready/valid gaps on every channel while 2 lanes decode six generated files
  (every sampling, odd sizes, restart intervals): completions matched by id, RGB equal to
  Pillow, no byte written outside the outputs, AXI rules on every clock;
- ``ap_rst_n`` pulsed low mid-job: registers back to reset values, the next jobs correct;
- an output buffer one byte too small: OUTPUT_TOO_SMALL (0x41) and memory untouched.
"""

from __future__ import annotations

import json

import pytest

from dlbooster.hw.regs import DeviceStatus
from dlbooster.sim.flow import run_cocotb, simulator_available
from dlbooster.sim.netlist import export_flat_verilog

from jpegtools import gen

pytestmark = pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")

TOP = "dlbooster_decoder"


@pytest.fixture(scope="module")
def verilog():
    """The top as the Yosys-flattened netlist the C++ harnesses also simulate (same
    ports; Verilator builds it in about half the time of the hierarchical export)."""
    from dlbooster.hw.device import Device

    return export_flat_verilog(Device(lanes=2, max_width=256), TOP)


@pytest.fixture(scope="module")
def job_file(tmp_path_factory):
    """The JPEGs of every cocotb test and the ``DLB_JOB`` file naming them."""
    folder = tmp_path_factory.mktemp("device_jobs")
    files = {
        "backpressure": [
            gen(40, 24, subsampling=2, quality=85),                       # long: completes last
            gen(16, 16, subsampling=0, quality=90),
            gen(17, 9, subsampling=1, quality=50),                        # 459 bytes: partial last word
            gen(23, 19, subsampling="gray", quality=60),
            gen(24, 16, subsampling="440", quality=80),
            gen(32, 16, subsampling=2, quality=70, restart_blocks=1),
        ],
        "reset": [gen(40, 24, subsampling=0, quality=95), gen(16, 16, subsampling=2, quality=75)],
        "too_small": [gen(24, 16, subsampling=1, quality=80)],
    }
    spec: dict = {"seed": 11}
    for test, datas in files.items():
        spec[test] = []
        for i, data in enumerate(datas):
            path = folder / f"{test}{i}.jpg"
            path.write_bytes(data)
            spec[test].append(str(path))
    path = folder / "jobs.json"
    path.write_text(json.dumps(spec))
    return path


def _run(verilog, job_file, tmp_path, testcase: str) -> list[dict]:
    """Run one cocotb test; returns the completions it reported."""
    out = tmp_path / "report.json"
    tests, failed, test_dir = run_cocotb(TOP, verilog, "dlbooster.sim.device_tb", simulator="verilator",
                                         testcase=testcase,
                                         extra_env={"DLB_JOB": str(job_file), "DLB_OUT": str(out)})
    assert (tests, failed) == (1, 0), f"cocotb test {testcase} failed; log in {test_dir / 'sim.log'}"
    return json.loads(out.read_text())[testcase]


def test_device_backpressure_out_of_order(verilog, job_file, tmp_path):
    done = _run(verilog, job_file, tmp_path, "backpressure_out_of_order")
    assert len(done) == 6 and all(c["status"] == 0 for c in done)
    assert {c["lane"] for c in done} == {0, 1}
    assert sorted((c["width"], c["height"]) for c in done) == sorted(
        [(40, 24), (16, 16), (17, 9), (23, 19), (24, 16), (32, 16)])


def test_device_reset_mid_job(verilog, job_file, tmp_path):
    done = _run(verilog, job_file, tmp_path, "reset_mid_job")
    assert sorted((c["job_id"], c["status"], c["bytes_written"]) for c in done) == [
        (0x100, 0, 40 * 24 * 3), (0x101, 0, 16 * 16 * 3)]


def test_device_output_too_small(verilog, job_file, tmp_path):
    short, exact = _run(verilog, job_file, tmp_path, "output_too_small")
    assert (short["status"], short["width"], short["height"], short["bytes_written"]) == (
        DeviceStatus.OUTPUT_TOO_SMALL, 24, 16, 0)
    assert (exact["status"], exact["bytes_written"]) == (0, 24 * 16 * 3)
