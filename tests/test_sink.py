"""sim/sink.py: logic moved under the enables that read it, checked on the text and
by simulating the design before and after side by side in Icarus."""

import re
import subprocess

import pytest

from dlbooster.sim.flow import export_flat_verilog, one_evaluation_per_clock, simulator_available
from dlbooster.sim.sink import sink_into_enables

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
    assert moved >= 5
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


def _bench(modules: dict[str, str], tmp_path, clocks: int = 3000) -> int:
    """Mismatching clocks between the outputs of the modules ``orig`` and ``sunk``
    (renamed copies of the design), driven by the same random inputs."""
    ports = ", ".join(f".{n}({n})" for n in ("x", "y", "en", "en2", "rst", "clk"))
    wires = "".join(f"  wire [{w - 1}:0] {n}_o, {n}_s;\n" for n, w in _OUTPUTS.items())
    outs = lambda tag: ", ".join(f".{n}({n}_{tag})" for n in _OUTPUTS)          # noqa: E731
    both = lambda tag: ", ".join(f"{n}_{tag}" for n in _OUTPUTS)                # noqa: E731
    bench = f"""
module bench;
  reg clk = 0, rst = 1, en = 0, en2 = 0;
  reg [15:0] x = 0, y = 0;
{wires}  orig o({ports}, {outs("o")});
  sunk s({ports}, {outs("s")});
  integer i, bad = 0, seed = 7;
  initial begin
    for (i = 0; i < {clocks}; i = i + 1) begin
      x = $random(seed); y = $random(seed); en = $random(seed); en2 = $random(seed);
      if (i % 16 == 0) y[3:0] = x[3:0];
      rst = i < 2 || $random(seed) % 211 == 0;
      #1 clk = ~clk;
      #1 if ({{{both("o")}}} !== {{{both("s")}}}) bad = bad + 1;
    end
    $display("MISMATCHES %0d", bad);
    $finish;
  end
endmodule
"""
    source = tmp_path / "bench.v"
    source.write_text("".join(text.replace("module top(", f"module {name}(", 1) for name, text in modules.items())
                      + bench)
    subprocess.run(["iverilog", "-g2012", "-o", str(tmp_path / "bench.vvp"), str(source)], check=True,
                   capture_output=True, text=True)
    run = subprocess.run(["vvp", "-n", str(tmp_path / "bench.vvp")], check=True, capture_output=True, text=True)
    return int(re.search(r"MISMATCHES (\d+)", run.stdout).group(1))


@pytest.mark.skipif(not simulator_available("icarus"), reason="iverilog not installed")
def test_the_sunk_design_behaves_as_the_flattened_one_clock_for_clock(tmp_path):
    flat = _flat()
    text, moved = sink_into_enables(flat)
    assert moved >= 5
    assert _bench({"orig": flat, "sunk": text}, tmp_path) == 0
    # The bench sees a difference: s computed under the other enable.
    wrong = text.replace("    if (en) begin\n      s = x + y ;", "    if (en2) begin\n      s = x + y ;", 1)
    assert wrong != text
    assert _bench({"orig": flat, "sunk": wrong}, tmp_path) > 100
