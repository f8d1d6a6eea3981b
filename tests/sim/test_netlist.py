"""sim/netlist/: the flattening and the rewritings for simulation speed (the
replications of one bit, one evaluation per clock, logic moved under the enables that
read it), checked on the text and by simulating the design before and after side by side
in Icarus; and what each does with Verilog of a form it does not know."""

import logging
import re
import subprocess

import pytest

from dlbooster.sim.flow import simulator_available
from dlbooster.sim.netlist import (UnknownForm, export_flat_verilog, one_evaluation_per_clock, replicate_bit_runs,
                                   rewrite_or_keep, sink_into_enables)

_OUTPUTS = {"a": 18, "b": 18, "c": 16, "d": 16, "e": 8, "f": 8, "g": 16}


def _sinkable():
    """Registers and a memory port behind enables that read shared logic, and logic
    that must stay where it is."""
    from amaranth import Module, Signal
    from amaranth.lib import wiring
    from amaranth.lib.memory import Memory
    from amaranth.lib.wiring import In, Out

    class Sinkable(wiring.Component):
        def __init__(self):
            super().__init__({"x": In(16), "y": In(16), "en": In(1), "en2": In(1),
                              **{name: Out(width) for name, width in _OUTPUTS.items()}})

        def elaborate(self, platform):
            m = Module()
            s = Signal(17)          # read by two registers and a memory write port, under en
            p = Signal(18)          # reads s; its one reader is under en
            t = Signal(16)          # an output, and read under en2
            v = Signal(17)          # read under en and under en2
            u = Signal()            # an enable
            m.d.comb += [s.eq(self.x + self.y), p.eq(s - self.y), t.eq(self.x ^ self.y), v.eq(self.x - self.y),
                         u.eq((self.x[:4] == self.y[:4]) & self.en2)]
            m.submodules.mem = mem = Memory(shape=8, depth=16, init=[])
            write, read = mem.write_port(), mem.read_port(domain="comb")
            with m.If(self.en):
                m.d.sync += [self.a.eq(s + self.x), self.b.eq(p[1:] + s + v)]
            with m.If(self.en2):
                m.d.sync += self.c.eq(t + v)
            with m.If(u):
                m.d.sync += self.e.eq(self.e + 1)
            m.d.comb += [self.d.eq(t), write.en.eq(self.en), write.addr.eq(s[:4]), write.data.eq(s[4:12] ^ s[8:16]),
                         read.addr.eq(self.y[:4]), self.f.eq(read.data)]
            m.d.sync += self.g.eq(self.g + t[:8])
            return m

    return Sinkable()


def _flat():
    return one_evaluation_per_clock(export_flat_verilog(_sinkable(), "top"), "clk")[0]


def test_sinking_moves_what_one_enable_reads_and_keeps_conditions_outputs_and_shared_logic():
    flat = _flat()
    text, moved = sink_into_enables(flat)
    assert re.search(r"^  assign s = x \+ y;$", flat, re.M) and re.search(r"^  assign p = s - y;$", flat, re.M)
    assert "assign s =" not in text and "assign p =" not in text
    # s: computed under en, in the one process of everything that reads it.
    process = re.search(r"  always @\(posedge clk or negedge clk\) begin\n    if \(en\) begin\n"
                        r"      s = x \+ y ;\n    end\n(?s:(.*?))\n  end\n", text)
    assert process, text
    body = process.group(1)
    assert re.search(r"if \(en\) begin\n      mem\[s\[3:0\]\] <= ", body)
    assert re.search(r"if \(rst\) begin\n      b <= 18'h00000 +;\n      a <= 18'h00000 +;\n    end\n"
                     r"    else if \(en\) begin\n      b <= .*\n      a <= \$unsigned\(18'\(s \+ x\)\) +;\n    end", body)
    # p, and the sums that read it once, are substituted into b's expression.
    assert "$unsigned(18'(s - y)) >> 1" in body
    assert "  reg [16:0] s;\n" in text and "  wire [16:0] s;\n" in flat
    # What stays: an output (d), logic two enables read (v), an enable (u).
    for kept in (r"assign d = x \^ y;", r"assign v = x - y;", r"assign u = "):
        assert re.search(kept, text), kept
    assert moved == len(re.findall(r"^  assign ", flat, re.M)) - len(re.findall(r"^  assign ", text, re.M))
    assert moved == 6            # s, p, the memory port's data and the three sums after them
    # A reader of another form (here an assignment to a concatenation) keeps s, and
    # what reads s, where they are.
    other = flat.replace("  assign s = x + y;\n", "  assign s = x + y;\n  assign { \\k1 , \\k2  } = s[1:0];\n")
    assert other != flat and "assign s = x + y;" in sink_into_enables(other)[0]
    # A wire declared with its value (Yosys writes some that way) moves too.
    declared = flat.replace("  wire [17:0] \\$2 ;\n", "").replace("  assign \\$2  = s + x;", "  wire [17:0] \\$2  = s + x;")
    assert declared != flat
    moved_declared, count = sink_into_enables(declared)
    assert count == moved and "  reg [17:0] \\$2 ;" in moved_declared and "wire [17:0] \\$2" not in moved_declared
    assert "a <= $unsigned(18'(s + x))" in moved_declared
    # A wire read under a variable index is assigned, not substituted (a cast cannot be
    # indexed).
    indexed, _ = sink_into_enables(flat.replace("else if (en) a <= \\$2 ;", "else if (en) a <= \\$2 [x[3:0] +: 2];"))
    assert "      \\$2  = s + x ;" in indexed and "a <= \\$2 [x[3:0] +: 2]" in indexed
    # Nothing else to move the second time; the width bound keeps s where it was.
    assert sink_into_enables(text)[1] == 0
    assert sink_into_enables(flat, max_width=16) == (flat, 0)


@pytest.mark.skipif(not simulator_available("icarus"), reason="iverilog not installed")
def test_the_sunk_design_behaves_as_the_flattened_one_clock_for_clock(tmp_path):
    flat = _flat()
    text, moved = sink_into_enables(flat)
    assert moved == 6            # s, p, the memory port's data and the three sums after them
    inputs = {"x": 16, "y": 16, "en": 1, "en2": 1, "rst": 1}
    assert _side_by_side(flat, text, inputs, _OUTPUTS, tmp_path, clocks=3000) == 0
    # The bench sees a difference: s computed under the other enable.
    wrong = text.replace("    if (en) begin\n      s = x + y ;", "    if (en2) begin\n      s = x + y ;", 1)
    assert wrong != text
    assert _side_by_side(flat, wrong, inputs, _OUTPUTS, tmp_path, clocks=3000) > 100


def _module(body: str, outputs: dict[str, int]) -> str:
    """A module ``top`` in the form Yosys writes: clk, en, 16-bit x and y, the outputs
    given (registers, reset to 0), and ``body``."""
    ports = ", ".join(["clk", "en", "x", "y", *outputs])
    head = "".join(f"  input {p};\n  wire {p};\n" for p in ("clk", "en"))
    head += "".join(f"  input [15:0] {p};\n  wire [15:0] {p};\n" for p in ("x", "y"))
    head += "".join(f"  output [{w - 1}:0] {n};\n  reg [{w - 1}:0] {n} = {w}'h0;\n" for n, w in outputs.items())
    return f"module top({ports});\n{head}{body}endmodule\n"


def _side_by_side(flat: str, sunk: str, inputs: dict[str, int], outputs: dict[str, int], tmp_path,
                  clocks: int = 2000) -> int:
    """Mismatching clocks between the outputs of ``flat`` and ``sunk`` (each a module
    ``top`` with a ``clk`` and the ports given, name to width), driven by the same random
    inputs in Icarus; an ``rst`` input is held for two clocks and then pulsed now and
    then, and every 16th clock ``y``'s low bits equal ``x``'s (an equality to hit)."""
    connect = lambda tag: ", ".join([".clk(clk)", *(f".{n}({n})" for n in inputs),            # noqa: E731
                                     *(f".{n}({n}_{tag})" for n in outputs)])
    both = lambda tag: "{" + ", ".join(f"{n}_{tag}" for n in outputs) + "}"                       # noqa: E731
    regs = "".join(f"  reg [{w - 1}:0] {n} = 0;\n" for n, w in inputs.items())
    wires = "".join(f"  wire [{w - 1}:0] {n}_o, {n}_s;\n" for n, w in outputs.items())
    drive = "".join(f"      {n} = $random(seed);\n" for n in inputs if n != "rst")
    if "rst" in inputs:
        drive += "      rst = i < 2 || $random(seed) % 211 == 0;\n"
    bench = f"""
module bench;
  reg clk = 0;
{regs}{wires}  orig o({connect("o")});
  sunk s({connect("s")});
  integer i, bad = 0, seed = 7;
  initial begin
    for (i = 0; i < {clocks}; i = i + 1) begin
{drive}      if (i % 16 == 0) y[3:0] = x[3:0];
      #1 clk = ~clk;
      #1 if ({both("o")} !== {both("s")}) bad = bad + 1;
    end
    $display("MISMATCHES %0d", bad);
    $finish;
  end
endmodule
"""
    source = tmp_path / "side.v"
    source.write_text(flat.replace("module top(", "module orig(", 1) + sunk.replace("module top(", "module sunk(", 1)
                      + bench)
    subprocess.run(["iverilog", "-g2012", "-o", str(tmp_path / "side.vvp"), str(source)], check=True,
                   capture_output=True, text=True)
    run = subprocess.run(["vvp", "-n", str(tmp_path / "side.vvp")], check=True, capture_output=True, text=True)
    return int(re.search(r"MISMATCHES (\d+)", run.stdout).group(1))


_INPUTS = {"en": 1, "x": 16, "y": 16}       # the inputs of :func:`_module`


_CLOCKED = "  always @(posedge clk or negedge clk)\n"
#: Netlists a review found the rewriting got wrong: each must come out valid and alike.
_HARD = {
    # A shared wire read by an assignment that stays (to a concatenation), directly ...
    "concatenation reader": (
        "  wire [7:0] v;\n  wire [7:0] w;\n  wire k;\n  assign v = x[7:0] ^ y[7:0];\n"
        "  assign { k, w } = v + y[7:0];\n" + _CLOCKED + "    if (en) a <= w;\n" + _CLOCKED
        + "    if (en) b <= { k, v };\n", {"a": 8, "b": 9}),
    # ... and through a wire whose other bits such an assignment drives.
    "partly concatenated": (
        "  wire [7:0] v;\n  wire [7:0] w;\n  wire [3:0] k;\n  assign v = x[7:0] - y[7:0];\n"
        "  assign w[3:0] = v[3:0] ^ v[7:4];\n  assign { k, w[7:4] } = x[7:0] + y[7:0];\n" + _CLOCKED
        + "    if (en) a <= w;\n" + _CLOCKED + "    if (en) b <= { k, k };\n", {"a": 8, "b": 8}),
    # A one-reader wire under a variable index, its name also inside an escaped name ...
    "name inside an escaped name": (
        "  reg [16:0] \\sub.s  = 17'h00000;\n  wire [16:0] t;\n  wire [16:0] s;\n  wire [1:0] w;\n"
        "  wire [16:0] u;\n  assign t = x + y;\n  assign s = t ^ x;\n  assign w = s[x[3:0] +: 2];\n"
        "  assign u = t + \\sub.s ;\n" + _CLOCKED + "    if (en) a <= w;\n" + _CLOCKED + "    if (en) b <= u;\n"
        + _CLOCKED + "    \\sub.s  <= y;\n", {"a": 2, "b": 17}),
    # ... or inside a literal.
    "name inside a literal": (
        "  wire [16:0] t;\n  wire [16:0] hd0;\n  wire [1:0] w;\n  wire [16:0] u;\n  assign t = x + y;\n"
        "  assign hd0 = t ^ x;\n  assign w = hd0[x[3:0] +: 2];\n  assign u = t + 8'hd0;\n" + _CLOCKED
        + "    if (en) a <= w;\n" + _CLOCKED + "    if (en) b <= u;\n", {"a": 2, "b": 17}),
    # A wire whose bits do not start at 0 stays.
    "offset range": (
        "  wire [16:0] t;\n  wire [10:3] w;\n  assign t = x + y;\n  assign w = t[10:3] ^ x[7:0];\n" + _CLOCKED
        + "    if (en) a <= w[5:4];\n" + _CLOCKED + "    if (en) b <= t;\n", {"a": 2, "b": 17}),
}


@pytest.mark.skipif(not simulator_available("icarus"), reason="iverilog not installed")
@pytest.mark.parametrize("case", sorted(_HARD))
def test_netlists_that_once_broke_the_rewriting_come_out_valid_and_alike(case, tmp_path):
    body, outputs = _HARD[case]
    flat = _module(body, outputs)
    sunk, moved = sink_into_enables(flat)
    assert _side_by_side(flat, sunk, _INPUTS, outputs, tmp_path) == 0, sunk
    if case in ("concatenation reader", "partly concatenated", "offset range"):
        # v's (w's) reader is an assignment that stays, or w's bits start at 3: nothing moves.
        assert moved == 0 and sunk == flat
    else:
        # t (two readers) moves, and with it what reads it; s (hd0) is assigned, not
        # substituted into the variable index, and the other name is left alone.
        assert moved == 4 and re.search(r"^      (s|hd0) = t \^ x ;$", sunk, re.M), sunk


def test_writes_to_one_memory_keep_their_order_in_a_merged_process():
    # Another memory written under the second condition comes first: grouping the
    # writes by condition would put mem's second write before its first.
    body = ("  wire [15:0] t1;\n  wire [15:0] t2;\n  reg [7:0] m0 [15:0];\n  reg [7:0] mem [15:0];\n"
            "  assign t1 = x + y;\n  assign t2 = x ^ y;\n"
            + _CLOCKED.replace("\n", " begin\n") + "    if (y[0])\n      m0[t2[3:0]] <= x[7:0];\n  end\n"
            + _CLOCKED.replace("\n", " begin\n") + "    if (en)\n      mem[y[3:0]] <= t1[7:0];\n  end\n"
            + _CLOCKED.replace("\n", " begin\n") + "    if (y[0])\n      mem[y[3:0]] <= t2[7:0];\n  end\n"
            + _CLOCKED + "    if (en) a <= t1;\n    else if (y[0]) a <= t2;\n")
    sunk, moved = sink_into_enables(_module(body, {"a": 16}))
    assert moved == 2
    writes = re.findall(r"mem\[y\[3:0\]\] <= (\S+)", sunk)
    assert writes == ["t1[7:0]", "t2[7:0]"], sunk


def test_the_huffman_comparators_are_computed_only_when_a_long_code_is_registered():
    """The entropy decoder's sixteen code-limit compares, the one-hot length and the
    symbol index serve only codes longer than 8 bits (hw/entropy.py): after the
    rewriting they are blocking assignments inside the process of the register that
    takes a long code, not logic evaluated in every clock; ``fast``, needed in every
    clock, has a compare of its own and stays. Fails if Yosys's output regroups them
    into pieces the rewriting cannot move."""
    from dlbooster.hw.entropy import EntropyDecoder

    flat = one_evaluation_per_clock(export_flat_verilog(EntropyDecoder(), "top"), "clk")[0]
    text, _ = sink_into_enables(flat)
    names = ["huff.ge", "huff.first", "huff.length", "huff.valid", "huff.index"]
    for name in names:
        (declared,) = re.findall(rf"^  (reg|wire)\b[^;\n]*\\{re.escape(name)} ;$", text, re.M)
        assert declared == "reg", name
        assert not re.search(rf"^  assign \\{re.escape(name)}\b", text, re.M), name
    # Computed in one process, the one that loads the long-code register (``valid``,
    # read once, substituted into that load).
    (process,) = [p for p in re.split(r"\n  always ", text) if "\\huff.ge [15] =" in p]
    assert all(f"\\{name} " in process for name in names if name != "huff.valid") and "<=" in process
    assert re.search(r"^  assign fast = \\buf \[63:56\] < ", text, re.M)


def test_copies_of_one_bit_in_a_concatenation_become_a_replication():
    text = ("  assign p = { \\a.b [15], \\a.b [15], \\a.b [15], \\a.b [15:0] };\n"
            "  assign q = { x [3], x [3], y [1], y [1], y [1], y [1], x [3:2], x [3:2], x [3:2] };\n")
    out, runs = replicate_bit_runs(text)
    assert runs == 2
    assert out == ("  assign p = { {3{\\a.b [15] }}, \\a.b [15:0] };\n"
                   "  assign q = { x [3], x [3], {4{y [1] }}, x [3:2], x [3:2], x [3:2] };\n")
    assert replicate_bit_runs(out) == (out, 0)
    # Names with a comma or a brace in them, and strings, are left alone.
    for kept in ("  assign { \\$2 [8], \\v,k[1],k[1],k[1] } = a;\n", "  wire \\s{q[1],q[1],q[1]} ;\n",
                 '    $write("{a [1], a [1], a [1]}");\n'):
        assert replicate_bit_runs(kept) == (kept, 0)


def _extending():
    """A signed input sign-extended into a register under an enable, and read elsewhere."""
    from amaranth import Module, signed
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    class Extend(wiring.Component):
        x: In(signed(16))
        y: In(16)
        en: In(1)
        a: Out(48)
        b: Out(40)

        def elaborate(self, platform):
            m = Module()
            with m.If(self.en):
                m.d.sync += self.a.eq(self.x)
            m.d.sync += self.b.eq(self.x.as_signed() + self.y)
            return m

    return Extend()


def test_a_sign_extension_comes_out_of_the_flattening_as_a_replication():
    text = export_flat_verilog(_extending(), "top")
    assert re.search(r"\{3[12]\{", text), text
    assert replicate_bit_runs(text)[1] == 0, text


@pytest.mark.skipif(not simulator_available("icarus"), reason="iverilog not installed")
def test_replications_behave_as_the_copies_they_replace(tmp_path):
    body = (_CLOCKED + "    if (en) a <= { x [15], x [15], x [15], x [15], x [15:0] };\n" + _CLOCKED
            + "    b <= { y [2], y [2], y [2], x [0], x [0], x [0], y [7:0] };\n")
    outputs = {"a": 20, "b": 14}
    flat = _module(body, outputs)
    replicated, runs = replicate_bit_runs(flat)
    assert runs == 3
    assert _side_by_side(flat, replicated, _INPUTS, outputs, tmp_path) == 0
    wrong = replicated.replace("{3{x [0] }}", "{3{x [1] }}")
    assert wrong != replicated and _side_by_side(flat, wrong, _INPUTS, outputs, tmp_path) > 100


@pytest.mark.skipif(not simulator_available("icarus"), reason="iverilog not installed")
def test_replications_behave_the_same_through_the_simulation_rewritings(tmp_path, monkeypatch):
    """:func:`_extending` flattened with and without the replications, each through
    one_evaluation_per_clock, the replicated one also through sink_into_enables: the same
    outputs in every clock."""
    from dlbooster.sim.netlist import flatten

    replicated = one_evaluation_per_clock(export_flat_verilog(_extending(), "top"), "clk")[0]
    monkeypatch.setattr(flatten, "replicate_bit_runs", lambda verilog, shortest=3: (verilog, 0))
    plain = one_evaluation_per_clock(export_flat_verilog(_extending(), "top"), "clk")[0]
    assert re.search(r"\{3[12]\{", replicated) and not re.search(r"\{3[12]\{", plain)
    sunk, _ = sink_into_enables(replicated)
    inputs, outputs = {"x": 16, "y": 16, "en": 1, "rst": 1}, {"a": 48, "b": 40}
    assert _side_by_side(plain, sunk, inputs, outputs, tmp_path) == 0


def _gated_counters():
    """A component with a counter on ``sync`` and one behind a :class:`ClockGate` opened by
    ``go``."""
    from amaranth import Module, ResetSignal
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    from dlbooster.hw.gating import ClockGate

    class Counters(wiring.Component):
        def __init__(self):
            super().__init__({"go": In(1), "every": Out(8), "gated": Out(8)})

        def elaborate(self, platform):
            m = Module()
            gate = ClockGate("blk", True)
            inner = Module()
            inner.d.sync += self.gated.eq(self.gated + 1)
            m.submodules.blk = gate.wrap(inner)
            gate.add(m, self.go, ResetSignal("sync"))
            m.d.sync += self.every.eq(self.every + 1)
            return m

    return Counters()


def test_one_evaluation_per_clock_makes_each_gate_a_port_pair_and_every_register_take_both_edges():
    flat = export_flat_verilog(_gated_counters(), "top")
    (enable, expr), = re.findall(r"always @\(negedge clk\)\n    (\S+ ?) <= (.+);", flat)   # the gate's enable
    gated_clock, = re.findall(rf"assign (\S+ ?) = clk & {re.escape(enable)};", flat)
    text, gates = one_evaluation_per_clock(flat, "clk")
    assert gates == 1
    header = re.search(r"module top\((.*?)\);", text, re.S).group(1)
    assert {"gate_clk", "gate_open", "clk", "go"} <= {p.strip() for p in header.split(",")}
    assert "  input [0:0] gate_clk;\n  output [0:0] gate_open;\n" in text
    # The enable register's input drives gate_open; the gated clock is the port, and it
    # clocks the gated counter.
    assert f"  assign gate_open[0] = {expr};\n" in text
    assert f"  assign {gated_clock} = gate_clk[0];\n" in text
    assert re.search(rf"always @\(posedge {re.escape(gated_clock)} or negedge {re.escape(gated_clock)}\)\n"
                     r"    if \(rst\) gated <= ", text)
    assert enable not in text and "clk &" not in text
    processes = re.findall(r"always @\((.*?)\)", text)
    assert len(processes) >= 2
    for sensitivity in processes:
        clock = re.fullmatch(r"posedge (\S+ ?) or negedge (\S+ ?)", sensitivity)
        assert clock and clock.group(1) == clock.group(2), sensitivity
    assert text.count("negedge") == len(processes)
    # Without gates: only the registers change, and no port is added.
    from amaranth import Module
    from amaranth.lib import wiring
    from amaranth.lib.wiring import Out

    class Plain(wiring.Component):
        def __init__(self):
            super().__init__({"count": Out(4)})

        def elaborate(self, platform):
            m = Module()
            m.d.sync += self.count.eq(self.count + 1)
            return m

    plain, none = one_evaluation_per_clock(export_flat_verilog(Plain(), "top"), "clk")
    assert none == 0 and "gate_" not in plain and "always @(posedge clk or negedge clk)" in plain


def test_one_evaluation_per_clock_refuses_what_it_cannot_rewrite():
    from amaranth import ClockDomain, ClockSignal, Module
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    class FallingEdgeData(wiring.Component):
        def __init__(self):
            super().__init__({"d": In(4), "q": Out(4)})

        def elaborate(self, platform):
            m = Module()
            m.domains.fall = ClockDomain(clk_edge="neg", local=True)
            m.d.comb += ClockSignal("fall").eq(ClockSignal("sync"))
            m.d.fall += self.q.eq(self.d)
            return m

    with pytest.raises(UnknownForm, match=r"falling-edge register q of clk is not a clock gate's enable \(one"):
        one_evaluation_per_clock(export_flat_verilog(FallingEdgeData(), "top"), "clk")
    flat = export_flat_verilog(_gated_counters(), "top")
    one_evaluation_per_clock(flat, "clk")
    latch = re.search(r"  always @\(negedge clk\)\n    (\S+ ?) <= (.+);\n", flat)
    with pytest.raises(UnknownForm, match="a falling-edge process on clk that is not"):
        one_evaluation_per_clock(flat.replace(latch.group(0), latch.group(0).replace(
            "negedge clk)\n", "negedge clk) begin\n") + "  end\n"), "clk")
    gated_clock = re.search(r"  assign (\S+ ?) = clk & (\S+ ?);\n", flat)
    twice = flat.replace(gated_clock.group(0), gated_clock.group(0) + gated_clock.group(0).replace(
        gated_clock.group(1), "\\other_clk ", 1))
    with pytest.raises(UnknownForm, match="is not a clock gate's enable"):
        one_evaluation_per_clock(twice, "clk")
    with pytest.raises(UnknownForm, match="rising edge"):
        one_evaluation_per_clock(flat.replace("always @(posedge clk)", "always @(posedge clk or posedge go)", 1),
                                 "clk")
    # A clock of another kind (a divided clock, say) would run at twice its rate.
    with pytest.raises(UnknownForm, match=r"processes on \['go'\], neither clk nor"):
        one_evaluation_per_clock(flat.replace("always @(posedge clk)", "always @(posedge go)", 1), "clk")
    # The clock's level changes once per cycle after the rewriting: no logic may read it.
    counter = re.search(r"  assign (\S+ ?) = every \+ 1'h1;", flat).group(0)
    with pytest.raises(UnknownForm, match="clk is used other than as a clock"):
        one_evaluation_per_clock(flat.replace(counter, counter.replace("1'h1", "clk")), "clk")
    with pytest.raises(UnknownForm, match="used other than as a clock"):
        one_evaluation_per_clock(flat.replace(counter, counter.replace("1'h1", gated_clock.group(1))), "clk")
    # The gates' ports go after the clock's: a declaration of another form is a use.
    with pytest.raises(UnknownForm, match="^one_evaluation_per_clock: clk is used other than as a clock$"):
        one_evaluation_per_clock(flat.replace("  input clk;\n", "  input wire clk;\n"), "clk")


#: A shared sum that two registers read under ``en`` (sink_into_enables moves it), on
#: the rising edge of ``clk`` as Yosys writes it.
_SHARED = ("  wire [15:0] t;\n  assign t = x + y;\n  always @(posedge clk)\n    if (en) a <= t;\n"
           "  always @(posedge clk)\n    if (en) b <= t ^ x;\n")
#: Verilog that sink_into_enables cannot cut into its items (each valid Verilog), and
#: the reason it gives.
_UNCUT = {
    "endfunction with a comment": (
        "  function [15:0] inc;\n    input [15:0] v;\n    inc = v + 16'h1;\n  endfunction // inc\n",
        "line 20 opens a function that no line endfunction closes"),
    "begin in a comment": (
        "  always @(posedge clk) begin\n    a <= x; // begin\n  end\n",
        "line 20 opens a block (it ends in begin) that no line end closes"),
}


@pytest.mark.parametrize("case", sorted(_UNCUT))
def test_a_form_the_sinking_does_not_know_keeps_the_verilog_with_one_warning(case, caplog):
    body, reason = _UNCUT[case]
    plain = _module(_SHARED, {"a": 16, "b": 16})
    assert sink_into_enables(plain)[1] == 1
    text = _module(_SHARED + body, {"a": 16, "b": 16})
    with pytest.raises(UnknownForm, match=f"^sink_into_enables: {re.escape(reason)}$") as raised:
        sink_into_enables(text)
    assert (raised.value.pass_name, raised.value.reason) == ("sink_into_enables", reason)
    with caplog.at_level(logging.WARNING, logger="dlbooster.sim.netlist"):
        assert rewrite_or_keep(sink_into_enables, text) == (text, 0)
    (warning,) = caplog.records
    assert warning.levelno == logging.WARNING
    assert warning.getMessage() == (f"sink_into_enables: {reason}; the Verilog is kept without this rewriting "
                                    "(the same behaviour, slower to simulate)")
    # A form it knows: rewritten, and nothing said.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dlbooster.sim.netlist"):
        assert rewrite_or_keep(sink_into_enables, plain) == sink_into_enables(plain)
    assert not caplog.records


def test_a_form_one_evaluation_per_clock_does_not_know_is_kept_with_one_warning(caplog):
    """Kept, by :func:`rewrite_or_keep`, as it is: here a falling-edge register that is
    no clock gate's enable."""
    text = _module("  always @(negedge clk)\n    a <= x;\n", {"a": 16})
    with caplog.at_level(logging.WARNING, logger="dlbooster.sim.netlist"):
        assert rewrite_or_keep(one_evaluation_per_clock, text, "clk") == (text, 0)
    (warning,) = caplog.records
    assert warning.getMessage().startswith("one_evaluation_per_clock: falling-edge register a of clk is not a "
                                           "clock gate's enable (one register, used once, as clk & enable); ")


def test_the_device_build_keeps_its_verilog_unsunk_where_the_sinking_does_not_know_its_form(monkeypatch, caplog):
    """The simulated device's Verilog (:func:`dlbooster.sim.device.device_verilog`) where
    sink_into_enables does not apply: one evaluation per clock, not sunk, one warning."""
    from dlbooster.sim import device

    flat = _module(_SHARED + _UNCUT["begin in a comment"][0], {"a": 16, "b": 16}).replace("clk", "ap_clk")
    monkeypatch.setattr(device, "export_flat_verilog", lambda component, top: flat)
    once, gates = one_evaluation_per_clock(flat, "ap_clk")
    assert "always @(posedge ap_clk or negedge ap_clk)" in once and gates == 0
    with caplog.at_level(logging.WARNING, logger="dlbooster.sim"):
        assert device.device_verilog({"lanes": 1, "max_width": 64}) == (once, 0, True)
    (warning,) = caplog.records
    assert warning.getMessage().startswith(
        "sink_into_enables: line 20 opens a block (it ends in begin) that no line end closes; ")


def test_the_device_build_keeps_its_flattened_verilog_where_one_evaluation_per_clock_does_not_know_its_form(
        monkeypatch, caplog):
    """Where one_evaluation_per_clock does not know the device's Verilog (here a
    falling-edge register that is no gate's enable): the flattened Verilog as it is, not
    sunk either (sink_into_enables would move ``t`` here), no gates, and the ordinary
    clocking; one warning names the pass, the reason and the cost. The device tests
    (tests/sim/test_device_build.py) build and run such a device."""
    from dlbooster.sim import device

    outputs = {"a": 16, "b": 16, "c": 16}
    falling = _module(_SHARED + "  always @(negedge clk)\n    c <= x;\n", outputs).replace("clk", "ap_clk")
    assert sink_into_enables(falling)[1] == 1
    monkeypatch.setattr(device, "export_flat_verilog", lambda component, top: falling)
    with caplog.at_level(logging.WARNING, logger="dlbooster.sim"):
        assert device.device_verilog({"lanes": 1, "max_width": 64}) == (falling, 0, False)
    (warning,) = caplog.records
    assert (warning.name, warning.levelno) == ("dlbooster.sim.device", logging.WARNING)
    assert warning.getMessage() == (
        "one_evaluation_per_clock: falling-edge register c of ap_clk is not a clock gate's enable (one register, "
        "used once, as ap_clk & enable); the simulation builds without one evaluation per clock: slower (two "
        "evaluations per clock, the same behaviour)")
