"""One Verilator evaluation per clock for the simulated device's harness
(:func:`one_evaluation_per_clock`): every register on both edges of the clock, and each
clock gate a pair of ports."""

import re

from .fallback import UnknownForm

__all__ = ["one_evaluation_per_clock"]

_PASS = "one_evaluation_per_clock"

_NAME = r"\\\S+ |[A-Za-z_]\w*"       # a Verilog identifier as Yosys writes it (escaped ones end in a space)
_LATCH = r"  always @\(negedge {clock}\)\n    (" + _NAME + r") <= (.+);\n"
_POSEDGE = re.compile(r"always @\(posedge (" + _NAME + r")\)")
_SENSITIVITY = re.compile(r"always @\(posedge (" + _NAME + r") or negedge \1\)")
_HEADER = re.compile(r"^module \w+\((?s:.*?)\);", re.M)


def _uses(name: str, text: str) -> int:
    """Occurrences of the identifier ``name`` in ``text``."""
    if name.startswith("\\"):
        return text.count(name)
    return len(re.findall(rf"(?<![\w$.\\]){re.escape(name)}(?![\w$])", text))


def one_evaluation_per_clock(verilog: str, clock: str) -> tuple[str, int]:
    """:func:`~dlbooster.sim.netlist.flatten.export_flat_verilog`'s output rewritten so that a C++ harness simulates one
    clock with one Verilator evaluation instead of two (about 7 % fewer instructions
    per device clock, docs/benchmarks.md).

    - Every register and memory port takes both edges of its clock
      (``always @(posedge c or negedge c)``): the harness toggles ``clock`` once per
      clock cycle.
    - Each clock gate (:class:`dlbooster.hw.gating.ClockGate`: an enable register on the
      falling edge of ``clock`` and a gated clock ``clock & enable``) becomes a pair of
      ports: ``gate_open[i]``, the gate's enable expression, and ``gate_clk[i]``, the
      gated clock, which the harness toggles together with ``clock`` in the cycles whose
      ``gate_open[i]`` it read high before applying the cycle's inputs. That is the
      gate's own behaviour as long as the enable depends on registers only, as
      ``ClockGate`` asks (the harness counts the cycles where it did not with
      ``dlb_check_gates``).

    Returns the Verilog and the number of gates (``gate_clk``/``gate_open`` are that
    wide; there are no such ports without gates).

    Raises:
        UnknownForm: the Verilog has a falling-edge register that is not a gate's enable
            (one register, used once, as ``clock & enable``), a process that is not a
            register or memory port on ``clock`` or on a gate's clock, or a use of
            ``clock`` or a gated clock other than as a clock (whose level the rewriting
            changes; their declarations ``module NAME(...);``, ``input CLOCK;`` and
            ``wire NAME;`` aside).
    """
    gates = []

    def cut_latch(match):
        gates.append((match.group(1), match.group(2)))
        return ""

    text = re.sub(_LATCH.format(clock=re.escape(clock)), cut_latch, verilog)
    if f"negedge {clock}" in text:
        raise UnknownForm(_PASS, f"a falling-edge process on {clock} that is not a clock gate's enable register")
    gate_clocks = []
    for i, (enable, expr) in enumerate(gates):
        text, declared = re.subn(rf"  reg {re.escape(enable)}( = [^;]+)?;\n", "", text)
        both = rf"(?:{re.escape(clock)} & {re.escape(enable)}|{re.escape(enable)} & {re.escape(clock)})"

        def port(match, i=i, expr=expr):
            gate_clocks.append(match.group(1))
            return f"  assign {match.group(1)} = gate_clk[{i}];\n  assign gate_open[{i}] = {expr};\n"

        text, used = re.subn(rf"  assign ({_NAME}) = {both};\n", port, text)
        if declared != 1 or used != 1 or _uses(enable, text):
            raise UnknownForm(_PASS, f"falling-edge register {enable.strip()} of {clock} is not a clock gate's "
                                     f"enable (one register, used once, as {clock} & enable)")
    text, processes = _POSEDGE.subn(lambda m: f"always @(posedge {m.group(1)} or negedge {m.group(1)})", text)
    if text.count("always @(") != processes:
        raise UnknownForm(_PASS, "a process that is not a register or memory port on one clock's rising edge")
    # Each clock now changes level once per cycle: it may clock processes, nothing else.
    rest = _SENSITIVITY.sub("always @()", text)
    clocked = set(_SENSITIVITY.findall(text))
    if not clocked <= {clock, *gate_clocks}:
        raise UnknownForm(_PASS, f"processes on {sorted(c.strip() for c in clocked - {clock, *gate_clocks})}, "
                                 f"neither {clock} nor a clock gate's clock")
    names = "|".join(re.escape(name) for name in (clock, *gate_clocks))
    rest = re.sub(rf"^  (?:input|wire) (?:{names});\n|^  assign (?:{_NAME}) *= gate_clk\[\d+\];\n", "",
                  _HEADER.sub("", rest, count=1), flags=re.M)
    for name in (clock, *gate_clocks):
        if _uses(name, rest):
            raise UnknownForm(_PASS, f"{name.strip()} is used other than as a clock")
    if gates:
        n = len(gates)
        header = _HEADER.search(text)
        text = (text[:header.end() - 2] + ", gate_clk, gate_open" + text[header.end() - 2:])
        text = text.replace(f"  input {clock};\n",
                            f"  input {clock};\n  input [{n - 1}:0] gate_clk;\n  output [{n - 1}:0] gate_open;\n", 1)
    return text, len(gates)
