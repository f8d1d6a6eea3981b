"""The design flattened and optimised into one Verilog module by the Yosys that Amaranth
bundles (:func:`export_flat_verilog`), for every C++ Verilator harness."""

from .replicate import replicate_bit_runs

__all__ = ["export_flat_verilog"]


def export_flat_verilog(component, name: str) -> str:
    """Verilog of ``component`` as one flattened, optimised module ``name``, for the C++
    Verilator harnesses: Amaranth's RTLIL through the Yosys that Amaranth bundles
    (``proc; flatten; opt -full; pmux2shiftx; opt -full; opt_clean; memory_collect``),
    with runs of copies of one bit written as replications (:func:`replicate_bit_runs`).
    Verilator then simulates the lane about 2.3 times faster than from
    :func:`dlbooster.sim.flow.export_verilog` (same outputs and clock counts; docs/benchmarks.md) and builds
    it in half the time. No ``wreduce``: the bits it narrows away are driven from the same
    wire's other bits, and Verilator schedules such a wire with a change trigger of its
    own (2 % more instructions per clock with it). The top-level ports keep their names."""
    from amaranth._toolchain.yosys import find_yosys
    from amaranth.back import rtlil

    text = rtlil.convert(component, name=name, emit_src=False)
    # The version bound is the one amaranth.back.verilog asks for.
    yosys = find_yosys(lambda version: version >= (0, 40))
    script = [f"read_rtlil <<rtlil\n{text}\nrtlil", "proc", "flatten", "opt -full", "pmux2shiftx",
              "opt -full", "opt_clean -purge", "memory_collect", "opt_clean",
              "write_verilog -norename -noattr"]
    verilog, _ = replicate_bit_runs(yosys.run(["-q", "-"], "\n".join(script), ignore_warnings=True))
    return verilog
