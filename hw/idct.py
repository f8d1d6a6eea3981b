"""ISLOW inverse DCT building blocks (SPEC.md 3.1, libjpeg-turbo ``jidctint.c``).

:class:`IdctPass` is one 1-D 8-point pass of the integer "ISLOW" IDCT, pipelined so that
every multiplier and every adder level has a register after it: eight inputs in, eight
outputs out, one vector per clock, six clocks of latency. The two-pass 8x8 core (columns,
DESCALE 11, transpose, rows, DESCALE 18, range limit) is built from it.
"""

from amaranth import Array, Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["IdctPass", "LATENCY", "TransposeBuffer"]

#: Clocks from an accepted input vector to its output vector.
LATENCY = 6

# round(x * 8192) constants of jidctint.c (CONST_BITS = 13).
_FIX = {
    "0_298631336": 2446, "0_390180644": 3196, "0_541196100": 4433, "0_765366865": 6270,
    "0_899976223": 7373, "1_175875602": 9633, "1_501321110": 12299, "1_847759065": 15137,
    "1_961570560": 16069, "2_053119869": 16819, "2_562915447": 20995, "3_072711026": 25172,
}


class IdctPass(wiring.Component):
    """One pipelined 1-D ISLOW pass (SPEC.md 3.1, even and odd parts, ``jidctint.c``).

    Args:
        width: bits of each signed input (32 covers both passes of 8-bit JPEG).

    Ports:
        i: 8 signed inputs ``d0..d7`` (``width`` bits), valid with ``i_valid``.
        o: 8 signed outputs ``o0..o7`` before descaling, exact (no truncation), valid
            with ``o_valid`` :data:`LATENCY` enabled clocks after the input.
        en: advance the pipeline this clock (back-pressure holds every stage).
    """

    def __init__(self, width: int = 32):
        self.width = width
        out_width = width + 19  # |sum of products| < 2**(width + 18)
        super().__init__({
            "i": In(signed(width)).array(8),
            "i_valid": In(1),
            "o": Out(signed(out_width)).array(8),
            "o_valid": Out(1),
            "en": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        w = self.width
        d = self.i
        valid = [Signal(name=f"valid{n}") for n in range(LATENCY)]

        def reg(name, expr, stage_width):
            r = Signal(signed(stage_width), name=name)
            with m.If(self.en):
                m.d.sync += r.eq(expr)
            return r

        # Stage 1: the sums the multipliers need.
        s1 = {
            "z1e": reg("z1e", d[2] + d[6], w + 1),
            "t0e": reg("t0e", d[0] + d[4], w + 1),
            "t1e": reg("t1e", d[0] - d[4], w + 1),
            "d2": reg("d2", d[2], w), "d6": reg("d6", d[6], w),
            "a0": reg("a0", d[7], w), "a1": reg("a1", d[5], w),
            "a2": reg("a2", d[3], w), "a3": reg("a3", d[1], w),
            "z1": reg("z1", d[7] + d[1], w + 1), "z2": reg("z2", d[5] + d[3], w + 1),
            "z3": reg("z3", d[7] + d[3], w + 1), "z4": reg("z4", d[5] + d[1], w + 1),
        }
        z34 = reg("z34", s1["z3"] + s1["z4"], w + 2)  # an extra stage for z5's operand
        s1b = {k: reg(f"{k}_b", v, len(v)) for k, v in s1.items()}
        pw = w + 18
        # Stage 2: products (and << 13 of the DC terms).
        f = _FIX
        s2 = {
            "z1e": reg("m_z1e", s1b["z1e"] * f["0_541196100"], pw),
            "t2p": reg("m_d6", s1b["d6"] * f["1_847759065"], pw),
            "t3p": reg("m_d2", s1b["d2"] * f["0_765366865"], pw),
            "t0": reg("m_t0", s1b["t0e"] << 13, pw),
            "t1": reg("m_t1", s1b["t1e"] << 13, pw),
            "z5": reg("m_z5", z34 * f["1_175875602"], pw),
            "a0": reg("m_a0", s1b["a0"] * f["0_298631336"], pw),
            "a1": reg("m_a1", s1b["a1"] * f["2_053119869"], pw),
            "a2": reg("m_a2", s1b["a2"] * f["3_072711026"], pw),
            "a3": reg("m_a3", s1b["a3"] * f["1_501321110"], pw),
            "z1": reg("m_z1", s1b["z1"] * -f["0_899976223"], pw),
            "z2": reg("m_z2", s1b["z2"] * -f["2_562915447"], pw),
            "z3": reg("m_z3", s1b["z3"] * -f["1_961570560"], pw),
            "z4": reg("m_z4", s1b["z4"] * -f["0_390180644"], pw),
        }
        # Stage 3: first adder level.
        t2 = reg("t2", s2["z1e"] - s2["t2p"], pw)
        t3 = reg("t3", s2["z1e"] + s2["t3p"], pw)
        z3 = reg("z3s", s2["z3"] + s2["z5"], pw)
        z4 = reg("z4s", s2["z4"] + s2["z5"], pw)
        keep = {k: reg(f"{k}_c", s2[k], pw) for k in ("t0", "t1", "a0", "a1", "a2", "a3", "z1", "z2")}
        # Stage 4: even outputs and odd sums.
        e10 = reg("e10", keep["t0"] + t3, pw)
        e13 = reg("e13", keep["t0"] - t3, pw)
        e11 = reg("e11", keep["t1"] + t2, pw)
        e12 = reg("e12", keep["t1"] - t2, pw)
        a0 = reg("a0s", keep["a0"] + keep["z1"] + z3, pw)
        a1 = reg("a1s", keep["a1"] + keep["z2"] + z4, pw)
        a2 = reg("a2s", keep["a2"] + keep["z2"] + z3, pw)
        a3 = reg("a3s", keep["a3"] + keep["z1"] + z4, pw)
        # Stage 5: butterflies.
        outputs = [e10 + a3, e11 + a2, e12 + a1, e13 + a0, e13 - a0, e12 - a1, e11 - a2, e10 - a3]
        for n, expr in enumerate(outputs):
            with m.If(self.en):
                m.d.sync += self.o[n].eq(expr)
        with m.If(self.en):
            m.d.sync += valid[0].eq(self.i_valid)
            for n in range(1, LATENCY):
                m.d.sync += valid[n].eq(valid[n - 1])
        m.d.comb += self.o_valid.eq(valid[LATENCY - 1])
        return m


class TransposeBuffer(wiring.Component):
    """Double-buffered 8x8 transpose between the column and the row pass.

    Takes the 8 columns of a block (one 8-element vector per beat, column 0 first) and
    gives its 8 rows (row 0 first). While one bank is read out the other is written, so
    blocks stream through at one vector per clock; full back-pressure on both sides.

    Args:
        width: bits of each signed element.
    """

    def __init__(self, width: int = 32):
        vector = data.ArrayLayout(signed(width), 8)
        self.width = width
        super().__init__({
            "i": In(stream.Signature(vector)),
            "o": Out(stream.Signature(vector)),
        })

    def elaborate(self, platform):
        m = Module()
        w = self.width
        # bank[b][r][c]: element (row r, column c) of the block held in bank b.
        bank = Array([Array([Array([Signal(signed(w), name=f"b{b}r{r}c{c}") for c in range(8)])
                             for r in range(8)]) for b in range(2)])
        full = Array([Signal(name=f"full{b}") for b in range(2)])
        wb = Signal()      # bank being written
        wc = Signal(3)     # next column to write
        rb = Signal()      # bank being read
        rr = Signal(3)     # next row to read

        m.d.comb += self.i.ready.eq(~full[wb])
        with m.If(self.i.valid & self.i.ready):
            for r in range(8):
                m.d.sync += bank[wb][r][wc].eq(self.i.payload[r])
            m.d.sync += wc.eq(wc + 1)
            with m.If(wc == 7):
                m.d.sync += [full[wb].eq(1), wb.eq(~wb)]

        m.d.comb += self.o.valid.eq(full[rb])
        for c in range(8):
            m.d.comb += self.o.payload[c].eq(bank[rb][rr][c])
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += rr.eq(rr + 1)
            with m.If(rr == 7):
                m.d.sync += [full[rb].eq(0), rb.eq(~rb)]
        return m
