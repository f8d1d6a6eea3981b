"""Clock gating of idle blocks, for the simulated device.

A cycle-based simulator such as Verilator evaluates every register of a clock domain,
and the logic in front of it, on every edge of that domain's clock, whether or not
anything changes; a register's enable saves only the work inside its enable branch.
A block behind a gated clock is not evaluated at all in the clocks its gate is closed.
:class:`ClockGate` gives a block such a domain, opened by the block's own "busy"
condition: a block declares (an ``idle`` output) the clocks in which none of its
registers changes, except data registers that hold nothing without a valid beat (a
pipeline stage's data loaded in a bubble, a read port's data), and the gate closes in
exactly those clocks. The gated design then makes the same handshakes with the same
valid data, clock for clock, as the design without the gate: the simulated device gives
the same pixels, statuses and clock counts (checked over the whole corpus,
docs/benchmarks.md, and against the ungated build in the tests).

The gate is the usual integrated clock gate: the enable is sampled on the clock's
falling edge (the latch of an ICG cell) and ANDed with the clock, so the gated clock
has no glitch and its rising edges are the rising edges of ``sync`` in which the enable
was high. A register behind it behaves as the same register with that enable as its
clock enable (Amaranth's ``EnableInserter``). The gate is for simulation builds
(:mod:`dlbooster.sim.device`); the boards' builds are elaborated without it (``gated``
False), as FPGA fabric clocks want clock enables, not gated clocks, and the blocks then
run in ``sync`` unchanged.

In Verilog (Verilator, Icarus) the gated clock rises with ``sync``. The simulated
device's build replaces each gate by a port pair whose clock its harness toggles
(:func:`dlbooster.sim.netlist.one_evaluation_per_clock`), which is the same gate when the
enable depends on registers only. In Amaranth's own
simulator it rises one delta cycle later, so a gated register that reads a ``sync``
register directly sees that register's new value; a combinational assignment between
the two (as every port connection of the lane has) hides the difference.
"""

from amaranth import ClockDomain, ClockSignal, Module, ResetSignal, Signal
from amaranth.hdl import DomainRenamer

__all__ = ["ClockGate"]


class ClockGate:
    """A clock domain ``name``: ``sync``'s clock gated, or ``sync`` itself.

    Args:
        name: the domain's name (local to the module that adds it).
        gated: False gives the block ``sync`` itself (:meth:`wrap` returns it unchanged and
            :meth:`add` adds nothing).
    """

    def __init__(self, name: str, gated: bool):
        self.name, self.gated = name, gated

    def wrap(self, elaboratable):
        """The block, in this gate's domain (its ``sync`` renamed) when gated."""
        return DomainRenamer({"sync": self.name})(elaboratable) if self.gated else elaboratable

    def add(self, m: Module, open_, reset) -> None:
        """Add the domain to ``m`` when gated.

        Args:
            open_: the gate's enable, 1 bit: high in every clock in which a register of the
                block may change (the clock's rising edge then reaches the block). A
                function of the design's registers only, never of a top-level input: the
                simulated device's build (:func:`dlbooster.sim.netlist.one_evaluation_per_clock`)
                turns the enable into an output that its harness reads before it applies a
                clock's inputs.
            reset: the domain's synchronous reset, 1 bit; the gate is open while it is high.
        """
        if not self.gated:
            return
        latch = f"{self.name}_latch"
        m.domains += [ClockDomain(self.name, local=True),
                      ClockDomain(latch, clk_edge="neg", local=True, reset_less=True)]
        enable = Signal(init=1, name=f"{self.name}_enable")
        m.d.comb += ClockSignal(latch).eq(ClockSignal("sync"))
        m.d[latch] += enable.eq(open_ | reset)
        m.d.comb += [ClockSignal(self.name).eq(ClockSignal("sync") & enable), ResetSignal(self.name).eq(reset)]
