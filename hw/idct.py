"""ISLOW inverse DCT building blocks (SPEC.md 3.1, libjpeg-turbo ``jidctint.c``).

:class:`IdctPass` is one 1-D 8-point pass of the integer "ISLOW" IDCT, pipelined so that
every multiplier and every adder level has a register after it: eight inputs in, eight
outputs out, one vector per clock, six clocks of latency. The two-pass 8x8 core :class:`Idct`
(block assembly, dequantisation, columns, DESCALE 11, transpose, rows, DESCALE 18, range
limit) is built from two of them and a :class:`TransposeBuffer`.
"""

from amaranth import Array, Cat, Const, Module, Mux, Shape, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .t81 import ZIGZAG
from .entropy import CoefBeat

__all__ = ["BlockRow", "Idct", "IdctPass", "LATENCY", "QuantWrite", "TransposeBuffer",
           "block_beats", "block_rows", "quant_writes"]

#: Clocks from an accepted input vector to its output vector.
LATENCY = 6

# round(x * 8192) constants of jidctint.c (CONST_BITS = 13).
_FIX = {
    "0_298631336": 2446, "0_390180644": 3196, "0_541196100": 4433, "0_765366865": 6270,
    "0_899976223": 7373, "1_175875602": 9633, "1_501321110": 12299, "1_847759065": 15137,
    "1_961570560": 16069, "2_053119869": 16819, "2_562915447": 20995, "3_072711026": 25172,
}


def _span(width: int) -> tuple[int, int]:
    return -(1 << (width - 1)), (1 << (width - 1)) - 1


#: Bits of a :class:`IdctPass` value held modulo ``2**MODULAR_BITS`` (``modular``): wide
#: enough for every value of a pass of 16-bit inputs (34 bits; of inputs up to 29 bits),
#: narrow enough that a sum (49 bits) or a product by a 15-bit constant (63) fits a
#: 64-bit word.
MODULAR_BITS = 48


class _Ranged:
    """A value (an Amaranth expression, or None when only the range is wanted) and the
    interval ``[lo, hi]`` it lies in, carried through sums, differences and constant
    products to size each pipeline register. With ``mod``, the expression holds the value
    modulo ``2**mod`` (unsigned), and each operation's result is cut back to ``mod`` bits."""

    def __init__(self, expr, lo: int, hi: int, mod: int | None = None):
        self.expr, self.lo, self.hi, self.mod = expr, lo, hi, mod

    def _with(self, other, op, lo: int, hi: int) -> "_Ranged":
        expr = None if self.expr is None else op(self.expr, other)
        if expr is not None and self.mod:
            expr = expr[:self.mod]
        return _Ranged(expr, lo, hi, self.mod)

    def __add__(self, other: "_Ranged") -> "_Ranged":
        return self._with(other.expr, lambda a, b: a + b, self.lo + other.lo, self.hi + other.hi)

    def __sub__(self, other: "_Ranged") -> "_Ranged":
        return self._with(other.expr, lambda a, b: a - b, self.lo - other.hi, self.hi - other.lo)

    def __mul__(self, c: int) -> "_Ranged":
        lo, hi = sorted((self.lo * c, self.hi * c))
        if self.mod and c < 0:
            # The product by -c, negated: by c modulo 2**mod, without a 2**mod-sized constant.
            return self._with(-c, lambda a, b: -(a * b), lo, hi)
        return self._with(c, lambda a, b: a * b, lo, hi)

    def __lshift__(self, n: int) -> "_Ranged":
        return self._with(n, lambda a, b: a << b, self.lo << n, self.hi << n)

    @property
    def bits(self) -> int:
        """Signed bits that hold every value of the interval."""
        return max((v if v >= 0 else -v - 1).bit_length() for v in (self.lo, self.hi)) + 1


def _datapath(x: list, reg_at) -> tuple[dict, "_Ranged", list]:
    """The ISLOW pass from eight :class:`_Ranged` inputs (``jidctint.c``'s even and odd
    parts): ``reg_at(n)`` gives the register function of stage ``n`` (``reg(name,
    value) -> value``). Returns stage 1b's values, ``z3 + z4``, and the eight outputs
    before the last register."""
    # Stage 1: the inputs as they are, so that whatever selects them (the transpose
    # buffer's read multiplexer, the block store's written-mask) has a clock of its
    # own before any adder.
    reg = reg_at(0)
    x = [reg(f"x{n}", v) for n, v in enumerate(x)]
    # Stage 1b: the sums the multipliers need, and z5's operand z3 + z4 (two adder
    # levels of narrow operands).
    reg = reg_at(1)
    s1b = {
        "z1e": reg("z1e", x[2] + x[6]),
        "t0e": reg("t0e", x[0] + x[4]),
        "t1e": reg("t1e", x[0] - x[4]),
        "d2": reg("d2", x[2]), "d6": reg("d6", x[6]),
        "a0": reg("a0", x[7]), "a1": reg("a1", x[5]),
        "a2": reg("a2", x[3]), "a3": reg("a3", x[1]),
        "z1": reg("z1", x[7] + x[1]), "z2": reg("z2", x[5] + x[3]),
        "z3": reg("z3", x[7] + x[3]), "z4": reg("z4", x[5] + x[1]),
    }
    z34 = reg("z34", (x[7] + x[3]) + (x[5] + x[1]))
    # Stage 2: products (and << 13 of the DC terms).
    f = _FIX
    reg = reg_at(2)
    s2 = {
        "z1e": reg("m_z1e", s1b["z1e"] * f["0_541196100"]),
        "t2p": reg("m_d6", s1b["d6"] * f["1_847759065"]),
        "t3p": reg("m_d2", s1b["d2"] * f["0_765366865"]),
        "t0": reg("m_t0", s1b["t0e"] << 13),
        "t1": reg("m_t1", s1b["t1e"] << 13),
        "z5": reg("m_z5", z34 * f["1_175875602"]),
        "a0": reg("m_a0", s1b["a0"] * f["0_298631336"]),
        "a1": reg("m_a1", s1b["a1"] * f["2_053119869"]),
        "a2": reg("m_a2", s1b["a2"] * f["3_072711026"]),
        "a3": reg("m_a3", s1b["a3"] * f["1_501321110"]),
        "z1": reg("m_z1", s1b["z1"] * -f["0_899976223"]),
        "z2": reg("m_z2", s1b["z2"] * -f["2_562915447"]),
        "z3": reg("m_z3", s1b["z3"] * -f["1_961570560"]),
        "z4": reg("m_z4", s1b["z4"] * -f["0_390180644"]),
    }
    # Stage 3: first adder level.
    reg = reg_at(3)
    t2 = reg("t2", s2["z1e"] - s2["t2p"])
    t3 = reg("t3", s2["z1e"] + s2["t3p"])
    z3 = reg("z3s", s2["z3"] + s2["z5"])
    z4 = reg("z4s", s2["z4"] + s2["z5"])
    keep = {k: reg(f"{k}_c", s2[k]) for k in ("t0", "t1", "a0", "a1", "a2", "a3", "z1", "z2")}
    # Stage 4: even outputs and odd sums.
    reg = reg_at(4)
    e10 = reg("e10", keep["t0"] + t3)
    e13 = reg("e13", keep["t0"] - t3)
    e11 = reg("e11", keep["t1"] + t2)
    e12 = reg("e12", keep["t1"] - t2)
    a0 = reg("a0s", keep["a0"] + keep["z1"] + z3)
    a1 = reg("a1s", keep["a1"] + keep["z2"] + z4)
    a2 = reg("a2s", keep["a2"] + keep["z2"] + z3)
    a3 = reg("a3s", keep["a3"] + keep["z1"] + z4)
    # Stage 5 (the caller's output register): butterflies.
    outputs = [e10 + a3, e11 + a2, e12 + a1, e13 + a0, e13 - a0, e12 - a1, e11 - a2, e10 - a3]
    return s1b, z34, outputs


class IdctPass(wiring.Component):
    """One pipelined 1-D ISLOW pass (SPEC.md 3.1, even and odd parts, ``jidctint.c``).

    Args:
        width: bits of each signed input (:class:`Idct` uses 16: in-range blocks fit).
        out_width: bits of each output. The default, the outputs' range carried from
            the inputs' through every stage (34 bits for 16-bit inputs, 50 for 32), is
            exact for any input; a smaller value gives the outputs modulo
            ``2**out_width`` (two's complement wraps consistently through sums and
            products), which is all the next step needs when it keeps only low bits.
        tag_width: bits of a tag carried from ``t_i`` to ``t_o`` alongside each vector.
        modular: hold every value modulo ``2**MODULAR_BITS`` (:data:`MODULAR_BITS`) in
            unsigned registers of that width instead of each in its range's signed width
            (inputs of at most 29 bits, whose values all lie within ``+-2**47``); the
            outputs are then the exact outputs modulo ``2**MODULAR_BITS``, unsigned. For
            simulation builds: Verilator evaluates each operation as one 64-bit operation
            and a mask, where a sum of narrower signed values first sign-extends both
            (docs/benchmarks.md). FPGA builds keep the exact widths, which take fewer
            flip-flops and narrower adders.

    Raises:
        ValueError: ``modular`` with inputs wider than 29 bits.

    Ports:
        i: 8 signed inputs ``d0..d7`` (``width`` bits), valid with ``i_valid``; ``t_i``
            the vector's tag.
        o: 8 signed outputs ``o0..o7`` before descaling (``out_width`` bits; with
            ``modular``, unsigned ``MODULAR_BITS`` bits), valid
            with ``o_valid`` :data:`LATENCY` enabled clocks after the input; ``t_o`` its
            tag; ``o_fit``: the sums a 16-bit SIMD IDCT forms from its input (``d0 +- d4``,
            ``d2 + d6``, ``d7 + d1``, ``d5 + d3``, ``d7 + d3``, ``d5 + d1``,
            ``d7 + d3 + d5 + d1``) all fit 16 bits: the sum part of the model's
            ``_simd_safe``.
        en: advance the pipeline this clock (back-pressure holds every stage).

    A stage's registers load only when a vector moves into it: a bubble leaves them as
    they were, so ``o``, ``t_o`` and ``o_fit`` mean something only with ``o_valid``.
    """

    def __init__(self, width: int = 32, out_width: int | None = None, tag_width: int = 1,
                 modular: bool = False):
        self.width = width
        # The outputs' range, from the inputs' through every stage: exact in that many bits.
        inputs = [_Ranged(None, *_span(width)) for _ in range(8)]
        exact = max(v.bits for v in _datapath(inputs, lambda n: lambda name, v: v)[2])
        if modular and exact >= MODULAR_BITS:
            raise ValueError(f"modular needs every value within +-2**{MODULAR_BITS - 1}: inputs of at most "
                             f"{width - (exact - MODULAR_BITS) - 1} bits, not {width}")
        self.mod = MODULAR_BITS if modular else None
        self.out_width = out_width = MODULAR_BITS if modular else min(out_width or exact, exact)
        super().__init__({
            "i": In(signed(width)).array(8),
            "i_valid": In(1),
            "t_i": In(tag_width),
            "o": Out(unsigned(out_width) if modular else signed(out_width)).array(8),
            "o_valid": Out(1),
            "t_o": Out(tag_width),
            "o_fit": Out(1),
            "en": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        w = self.width
        d = self.i
        valid = [Signal(name=f"valid{n}") for n in range(LATENCY)]

        # Loading a stage only with a vector is free on the FPGA (clock enables) and
        # spares the simulator the arithmetic of empty stages. Each register is as wide
        # as its value's range (at most the output width): a register whose top bits
        # only repeat its sign is narrowed by Yosys, which then drives those bits from
        # the register's own sign bit, and Verilator evaluates such a variable on every
        # change instead of once per clock.
        def stage(load):
            def reg(name, value):
                # Modular: the first stage's signed inputs are sign-extended as they load.
                shape = self.mod or signed(min(value.bits, self.out_width))
                r = Signal(shape, name=name)
                with m.If(load):
                    m.d.sync += r.eq(value.expr)
                return _Ranged(r, value.lo, value.hi, self.mod)
            return reg

        x = [_Ranged(d[n], *_span(w)) for n in range(8)]
        regs = [stage(self.en & v) for v in [self.i_valid] + valid]
        s1b, z34, outputs = _datapath(x, lambda n: regs[n])
        fit = Cat(*(_fits16(s1b[k].expr, self.mod) for k in ("t0e", "t1e", "z1e", "z1", "z2", "z3", "z4")),
                  _fits16(z34.expr, self.mod)).all()
        for n, value in enumerate(outputs):
            with m.If(self.en & valid[4]):
                m.d.sync += self.o[n].eq(value.expr)
        # The tag moves with the vector; the fit bit joins it in stage 3.
        tag = self.t_i
        for n in range(LATENCY):
            side = Cat(tag, fit) if n == 2 else tag
            r = Signal(len(side), name=f"tag{n}")
            with m.If(self.en & ([self.i_valid] + valid)[n]):
                m.d.sync += r.eq(side)
            tag = r
        m.d.comb += [self.t_o.eq(tag[:len(self.t_o)]), self.o_fit.eq(tag[-1])]
        with m.If(self.en):
            m.d.sync += valid[0].eq(self.i_valid)
            for n in range(1, LATENCY):
                m.d.sync += valid[n].eq(valid[n - 1])
        m.d.comb += self.o_valid.eq(valid[LATENCY - 1])
        return m


class TransposeBuffer(wiring.Component):
    """Double-buffered 8x8 transpose between the column and the row pass.

    Takes the 8 columns of a block, ``lanes`` per beat (column 0 first), and gives its
    8 rows, ``lanes`` per beat (row 0 first). While one bank is read out the other is
    written, so blocks stream through at ``lanes`` vectors per clock; full back-pressure
    on both sides.

    Args:
        width: bits of each signed element.
        tag: layout of a per-block tag carried alongside; the tag of a block's last
            input beat comes out with every one of its output beats.
        lanes: vectors per beat (1, 2 or 4).

    Ports:
        i: stream of ``{data: lanes x 8 x signed(width), tag}``: ``data[p]`` is column
            ``lanes * beat + p``.
        o: stream of ``{data: lanes x 8 x signed(width), tag}``: ``data[q]`` is row
            ``lanes * beat + q``.
    """

    def __init__(self, width: int = 32, tag=1, lanes: int = 1):
        if lanes not in (1, 2, 4):
            raise ValueError(f"lanes must be 1, 2 or 4, not {lanes}")
        self.width = width
        self.tag = tag
        self.lanes = lanes
        vectors = data.ArrayLayout(data.ArrayLayout(signed(width), 8), lanes)
        layout = data.StructLayout({"data": vectors, "tag": tag})
        super().__init__({
            "i": In(stream.Signature(layout)),
            "o": Out(stream.Signature(layout)),
        })

    def elaborate(self, platform):
        m = Module()
        w, lanes = self.width, self.lanes
        beats = 8 // lanes
        # bank[b][r][c]: element (row r, column c) of the block held in bank b.
        bank = [[[Signal(signed(w), name=f"b{b}r{r}c{c}") for c in range(8)] for r in range(8)]
                for b in range(2)]
        tags = Array([Signal(self.tag, name=f"tag{b}") for b in range(2)])
        full = Array([Signal(name=f"full{b}") for b in range(2)])
        wb = Signal()                       # bank being written
        wj = Signal(range(beats))           # next column group to write
        rb = Signal()                       # bank being read
        ri = Signal(range(beats))           # next row group to read

        m.d.comb += self.i.ready.eq(~full[wb])
        with m.If(self.i.valid & self.i.ready):
            # The beat's columns enter each row of the bank at the right while the row
            # shifts left by ``lanes``: after ``beats`` beats column c sits at c. One enable
            # per bank and no write decode per register (cheaper on the FPGA, and one
            # condition instead of 64 for a simulator).
            for b in range(2):
                with m.If(wb == b):
                    for r in range(8):
                        row = bank[b][r]
                        m.d.sync += [row[c].eq(row[c + lanes]) for c in range(8 - lanes)]
                        m.d.sync += [row[8 - lanes + p].eq(self.i.payload.data[p][r]) for p in range(lanes)]
            m.d.sync += [wj.eq(wj + 1 if beats > 1 else 0), tags[wb].eq(self.i.payload.tag)]
            with m.If(wj == beats - 1):
                m.d.sync += [full[wb].eq(1), wb.eq(~wb)]

        m.d.comb += [self.o.valid.eq(full[rb]), self.o.payload.tag.eq(tags[rb])]
        for q in range(lanes):
            m.d.comb += self.o.payload.data[q].as_value().eq(
                Array([Cat(*bank[b][i * lanes + q]) for b in range(2) for i in range(beats)])[
                    Cat(ri, rb) if beats > 1 else rb])
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += ri.eq(ri + 1 if beats > 1 else 0)
            with m.If(ri == beats - 1):
                m.d.sync += [full[rb].eq(0), rb.eq(~rb)]
        return m


#: One quantisation-table entry for a scan component (``comp`` 0..2, in scan order),
#: ``index`` in natural (row-major) order, ``value`` 1..32767 (DQT, T.81 B.2.4.1).
QuantWrite = data.StructLayout({"comp": 2, "index": 6, "value": 16})

def block_rows(lanes: int = 1) -> data.StructLayout:
    """Layout of an output beat of :class:`Idct` with ``lanes`` rows per beat.

    Rows ``row .. row + lanes - 1`` of the block at ``bx``/``by`` of component ``comp``;
    ``samples[8 * q + c]`` is column c of row ``row + q``. ``last`` marks the block's
    final beat. ``range_fault`` on that beat is set when some intermediate value of the
    block left the range where libjpeg-turbo's C and x86 SIMD IDCTs agree (see
    :func:`dlbooster.jpeg.model.idct_islow`; the block's samples are then unspecified): the
    lane must hand the image to the CPU.
    """
    return data.StructLayout({
        "comp": 2,
        "bx": 16,
        "by": 16,
        "row": 3,
        "last": 1,
        "range_fault": 1,
        "samples": data.ArrayLayout(unsigned(8), 8 * lanes),
    })


#: Output beat of the one-row-per-clock core (``Idct(lanes=1)``).
BlockRow = block_rows(1)

_Tag = data.StructLayout({"comp": 2, "bx": 16, "by": 16, "ok": 1})


def _within(x, low: int, high: int, mod: int | None = None):
    """``low <= x <= high`` for a signed ``x``, or for one held modulo ``2**mod`` (its
    value within ``+-2**(mod - 1)``): then one unsigned compare of ``x - low``."""
    if mod:
        return (x - low)[:mod] <= high - low
    return (x >= low) & (x <= high)


def _fits16(x, mod: int | None = None):
    return _within(x, -32768, 32767, mod)


def _descaled_within(x, shift: int, low: int, high: int, mod: int | None = None):
    """``low <= DESCALE(x, shift) <= high`` (``(x + 2**(shift - 1)) >> shift``), as
    compares on ``x`` itself, so the check does not wait for the rounding adder."""
    half = 1 << (shift - 1)
    return _within(x, (low << shift) - half, ((high + 1) << shift) - half - 1, mod)


class Idct(wiring.Component):
    """Dequantiser and 8x8 ISLOW IDCT: coefficient beats in, rows of samples out.

    Raises ``range_fault`` exactly where :func:`dlbooster.jpeg.model.idct_islow` (SPEC.md
    3.1, libjpeg-turbo ``jidctint.c``) finds the block out of range (``in_range``
    False: some value leaves the range where libjpeg-turbo's C and SIMD IDCTs agree),
    and is bit-exact with it on every other block. An out-of-range block's samples are
    unspecified: the lane hands such an image to the CPU (status ``idct-range``), so the
    datapath carries only what an in-range block needs.

    Structure: a block store of ``banks`` blocks (row memories, a written-mask so
    uncoded coefficients read as zero, dequantisation ``coef * q`` on the way in, each
    entry kept as 16 bits and one flag per block: whether all fitted), the column pass (``lanes``
    :class:`IdctPass` of 16-bit inputs, exact; then DESCALE 11 kept as 16 bits), a
    :class:`TransposeBuffer` of 16-bit elements, the row pass (16-bit inputs, exact),
    DESCALE 18 and the range limit ``T[v & 1023] = clamp(sext10(v) + 128, 0, 255)``.
    Every narrowing is covered by a range check: an in-range block's inputs and column
    outputs fit 16 bits, so each product is one 18x18 multiplier.

    Throughput: ``lanes`` columns, then rows, per clock: a block every ``8 / lanes``
    clocks (``8 * lanes`` samples per clock) with no stalls. The entropy decoder gives a
    block in as few as 2 clocks (DC and end-of-block beats), so ``lanes = 4`` can never
    hold it up; ``lanes = 1`` (8 samples per clock) is the smallest. Latency: see
    ``dlbooster bench idct``.

    Args:
        lanes: columns/rows per clock (1, 2 or 4); each costs two :class:`IdctPass`.
        banks: blocks the store holds, a power of two (default 2 for ``lanes = 1``, else
            4: a full block's store handshake takes 3 clocks, longer than the 2 clocks
            that ``lanes = 4`` spends reading it).
        modular: the passes' values held modulo ``2**48`` (:class:`IdctPass`), for
            simulation builds; the same outputs and checks, clock for clock.

    Ports:
        quant: :data:`QuantWrite` stream (always ready); load before the scan's blocks.
        coef: :data:`CoefBeat` stream from :class:`dlbooster.hw.entropy.EntropyDecoder`;
            a ``first`` beat starts a fresh block (a block cut short by a faulty scan is
            dropped), the ``last`` beat completes it; a block gives each coefficient index
            at most once (its ``fit`` flag is that of all its values written).
        o: :func:`block_rows` ``(lanes)`` stream, ``8 / lanes`` beats per block, blocks
            in input order.
    """

    def __init__(self, lanes: int = 1, banks: int | None = None, modular: bool = False):
        if lanes not in (1, 2, 4):
            raise ValueError(f"lanes must be 1, 2 or 4, not {lanes}")
        if banks is None:
            banks = 2 if lanes == 1 else 4
        if banks < 2 or banks & (banks - 1):
            raise ValueError(f"banks must be a power of two, at least 2, not {banks}")
        self.lanes = lanes
        self.banks = banks
        self.modular = modular
        self.row_layout = block_rows(lanes)
        super().__init__({
            "quant": In(stream.Signature(QuantWrite)),
            "coef": In(stream.Signature(CoefBeat)),
            "o": Out(stream.Signature(self.row_layout)),
        })

    def elaborate(self, platform):
        m = Module()
        lanes, nbanks = self.lanes, self.banks
        beats = 8 // lanes
        lb = lanes.bit_length() - 1           # log2(lanes)
        # A block's checks so far live in one bit a stage (the bank tag's ``ok`` after the
        # block store, d1's tag after the columns, e1_ok after the rows), so each check
        # expression has one register to load and a simulator evaluates it only when
        # that register loads.
        # Read asynchronously from LUT RAM and registered in s1 beside the beat: the
        # dequantiser's multiplier then starts from flip-flops, not from a block RAM's
        # clock-to-out, at the same latency. ``ram_style`` keeps Yosys from folding that
        # register back into a block RAM's read port.
        m.submodules.qmem = qmem = Memory(shape=16, depth=256, init=[],
                                          attrs={"ram_style": "distributed"})
        qw = qmem.write_port()
        qr = qmem.read_port(domain="comb")
        m.d.comb += [
            self.quant.ready.eq(1),
            qw.en.eq(self.quant.valid),
            qw.addr.eq(Cat(self.quant.payload.index, self.quant.payload.comp)),
            qw.data.eq(self.quant.payload.value),
        ]

        # Block store: memory (r, p) holds the columns c = lanes * j + p of row r of every
        # bank, at address (bank, j), so one read gives ``lanes`` whole columns. An entry
        # keeps the dequantised value's low 16 bits; the bank's tag keeps whether every
        # value written into it fitted 16 bits: a block with a value that does not is out
        # of range (the model's ``_simd_safe``), and an in-range block needs no more bits
        # anywhere before the row pass's products. One bit per block, set as the values
        # are written, instead of one per entry checked against the written-mask as the
        # columns are read (16 terms a vector for a simulator).
        mem_w, mem_r = {}, {}
        for r in range(8):
            for p in range(lanes):
                mem = Memory(shape=signed(16), depth=nbanks * beats, init=[])
                m.submodules[f"row{r}_{p}"] = mem
                mem_w[r, p] = mem.write_port()
                mem_r[r, p] = mem.read_port(transparent_for=())
        mask = Array([Signal(64, name=f"mask{b}") for b in range(nbanks)])
        full = Array([Signal(name=f"full{b}") for b in range(nbanks)])
        btag = Array([Signal(_Tag, name=f"btag{b}") for b in range(nbanks)])
        wb = Signal(range(nbanks))   # bank the incoming beats fill

        # Write pipeline: accept (quantiser read) -> multiply -> store.
        beat = self.coef.payload
        fire = self.coef.valid & self.coef.ready
        m.d.comb += [self.coef.ready.eq(~full[wb]), qr.addr.eq(Cat(beat.index, beat.comp))]
        bank_shape = range(nbanks)
        s1 = Signal(data.StructLayout({"valid": 1, "bank": bank_shape, "beat": CoefBeat, "q": 16}))
        s2 = Signal(data.StructLayout({"valid": 1, "bank": bank_shape, "beat": CoefBeat,
                                       "value": signed(32)}))
        m.d.sync += [s1.valid.eq(fire), s2.valid.eq(s1.valid)]
        # Data registers load with a beat only (see IdctPass).
        with m.If(fire):
            m.d.sync += [s1.bank.eq(wb), s1.beat.eq(beat), s1.q.eq(qr.data)]
        with m.If(s1.valid):
            m.d.sync += [s2.bank.eq(s1.bank), s2.beat.eq(s1.beat), s2.value.eq(s1.beat.value * s1.q)]
        with m.If(fire & beat.last):
            m.d.sync += wb.eq(wb + 1)
        b2 = s2.beat
        col, row = b2.index[0:3], b2.index[3:6]
        bit = Mux(b2.coef, Const(1, 64) << b2.index, 0)
        for (r, p), port in mem_w.items():
            lane_hit = (col[0:lb] == p) if lb else 1
            m.d.comb += [port.en.eq(s2.valid & b2.coef & (row == r) & lane_hit),
                         port.addr.eq(Cat(col[lb:3], s2.bank)),
                         port.data.eq(s2.value[:16])]
        fits = ~b2.coef | _fits16(s2.value)
        with m.If(s2.valid):
            m.d.sync += [mask[s2.bank].eq(Mux(b2.first, bit, mask[s2.bank] | bit)),
                         btag[s2.bank].ok.eq(Mux(b2.first, fits, btag[s2.bank].ok & fits))]
            with m.If(b2.first):
                m.d.sync += [btag[s2.bank].comp.eq(b2.comp), btag[s2.bank].bx.eq(b2.bx),
                             btag[s2.bank].by.eq(b2.by)]
            with m.If(b2.last):
                m.d.sync += full[s2.bank].eq(1)

        # Column pass. Every stage from the store read to the transpose buffer input
        # moves together on en1 (held while the transpose buffer cannot take a beat).
        # Unit 0 of each pass carries the vector's side data: group, block tag, checks.
        side_width = Shape.cast(range(beats)).width + _Tag.size + 1
        pass1 = [IdctPass(width=16, tag_width=side_width if p == 0 else 1, modular=self.modular)
                 for p in range(lanes)]
        for p, unit in enumerate(pass1):
            m.submodules[f"pass1_{p}"] = unit
        m.submodules.tb = tb = TransposeBuffer(width=16, tag=_Tag, lanes=lanes)
        d1 = Signal(data.StructLayout({
            "valid": 1, "tag": _Tag,
            "w": data.ArrayLayout(data.ArrayLayout(signed(16), 8), lanes)}))
        en1 = Signal()
        m.d.comb += en1.eq(~d1.valid | tb.i.ready)
        rb = Signal(range(nbanks))
        rj = Signal(range(beats))
        issue = full[rb] & en1
        r1 = Signal(data.StructLayout({"valid": 1, "group": range(beats), "mask": 8 * lanes,
                                       "tag": _Tag}))
        # As in IdctPass, data registers and read ports load only with a vector.
        for port in mem_r.values():
            m.d.comb += [port.en.eq(issue), port.addr.eq(Cat(rj, rb))]
        with m.If(en1):
            m.d.sync += r1.valid.eq(issue)
        with m.If(issue):
            m.d.sync += [r1.group.eq(rj), r1.tag.eq(btag[rb]),
                         # One shift brings the beat's columns to bits 0..lanes-1 of each
                         # row's byte, then constant bits: not a variable select per bit.
                         r1.mask.eq(Cat(*((mask[rb] >> (rj * lanes))[r * 8 + p]
                                          for p in range(lanes) for r in range(8)))),
                         rj.eq(rj + 1 if beats > 1 else 0)]
            with m.If(rj == beats - 1):
                m.d.sync += [full[rb].eq(0), rb.eq(rb + 1)]
        for p, unit in enumerate(pass1):
            x = [Mux(r1.mask[8 * p + r], mem_r[r, p].data, 0) for r in range(8)]
            m.d.comb += [unit.en.eq(en1), unit.i_valid.eq(r1.valid)]
            m.d.comb += [unit.i[r].eq(x[r]) for r in range(8)]
        m.d.comb += pass1[0].t_i.eq(Cat(r1.group, r1.tag.as_value(), r1.tag.ok))
        p1 = pass1[0].t_o
        gw = len(r1.group)
        p1_group, p1_tag, p1_ok = p1[0:gw], _Tag(p1[gw:gw + _Tag.size]), p1[-1]
        checks = [p1_ok, *(unit.o_fit for unit in pass1)]
        for p, unit in enumerate(pass1):
            w = [(unit.o[r] + (1 << 10)) >> 11 for r in range(8)]
            # The model's two checks of a column output: |o| <= 2**31 - 2**18 (where the C
            # and SIMD code agree) and DESCALE(o, 11) fitting 16 bits; the second implies
            # the first.
            checks += [_descaled_within(unit.o[r], 11, -32768, 32767, unit.mod) for r in range(8)]
            with m.If(en1 & unit.o_valid):
                m.d.sync += [d1.w[p][r].eq(w[r]) for r in range(8)]
        group_ok = Cat(*checks).all() & ((p1_group == 0) | d1.tag.ok)
        with m.If(en1):
            m.d.sync += d1.valid.eq(pass1[0].o_valid)
        with m.If(en1 & pass1[0].o_valid):
            m.d.sync += [d1.tag.eq(p1_tag), d1.tag.ok.eq(group_ok)]
        m.d.comb += [tb.i.valid.eq(d1.valid), tb.i.payload.tag.eq(d1.tag),
                     tb.i.payload.data.eq(d1.w)]

        # Row pass, moving on en2 (held while the output beat is not taken).
        pass2 = [IdctPass(width=16, tag_width=side_width if q == 0 else 1, modular=self.modular)
                 for q in range(lanes)]
        for q, unit in enumerate(pass2):
            m.submodules[f"pass2_{q}"] = unit
        e1 = Signal(data.StructLayout({"valid": 1, "group": range(beats), "tag": _Tag,
                                       "v": data.ArrayLayout(signed(10), 8 * lanes)}))
        e2 = Signal(self.row_layout)
        e2_valid = Signal()
        e2_ok = Signal()             # the beat's checks before the last stage
        en2 = Signal()
        m.d.comb += en2.eq(~e2_valid | self.o.ready)
        group = Signal(range(beats))
        m.d.comb += tb.o.ready.eq(en2)
        for q, unit in enumerate(pass2):
            m.d.comb += [unit.en.eq(en2), unit.i_valid.eq(tb.o.valid)]
            m.d.comb += [unit.i[c].eq(tb.o.payload.data[q][c]) for c in range(8)]
        with m.If(tb.o.valid & en2):
            m.d.sync += group.eq(group + 1 if beats > 1 else 0)
        m.d.comb += pass2[0].t_i.eq(Cat(group, tb.o.payload.tag.as_value(), Const(1, 1)))
        p2 = pass2[0].t_o
        p2_group, p2_tag, p2_ok = p2[0:gw], _Tag(p2[gw:gw + _Tag.size]), p2[-1]
        checks = [p2_ok, p2_tag.ok, *(unit.o_fit for unit in pass2)]
        for q, unit in enumerate(pass2):
            # |o| <= 2**31 - 2**18 and -512 <= DESCALE(o, 18) <= 511; again the second
            # implies the first.
            checks += [_descaled_within(unit.o[c], 18, -512, 511, unit.mod) for c in range(8)]
            with m.If(en2 & unit.o_valid):
                m.d.sync += [e1.v[8 * q + c].eq((unit.o[c] + (1 << 17)) >> 18) for c in range(8)]
        # The block's row checks so far in a register of their own, not in e1's tag: a
        # wide register whose next value reads one of its own bits is updated through a
        # shadow copy in Verilator (about 70 instructions per device clock).
        e1_ok = Signal()
        rows_ok = Cat(*checks).all() & ((p2_group == 0) | e1_ok)
        with m.If(en2):
            m.d.sync += e1.valid.eq(pass2[0].o_valid)
        with m.If(en2 & pass2[0].o_valid):
            m.d.sync += [e1.group.eq(p2_group), e1.tag.eq(p2_tag), e1_ok.eq(rows_ok)]
        with m.If(en2):
            m.d.sync += e2_valid.eq(e1.valid)
        with m.If(en2 & e1.valid):
            m.d.sync += [e2.comp.eq(e1.tag.comp), e2.bx.eq(e1.tag.bx),
                         e2.by.eq(e1.tag.by), e2.row.eq(e1.group * lanes),
                         e2.last.eq(e1.group == beats - 1), e2_ok.eq(e1_ok)]
            for n in range(8 * lanes):
                # clamp(v + 128, 0, 255) for the 10-bit v (v & 1023 sign-extended; in
                # range: v itself) from its bits: below -128 when negative and bits 9..7
                # are not all set, above 127 when positive and bit 8 or 7 is set, else
                # v + 128, which is v's low byte with bit 7 flipped. The same function as
                # an adder and two compares, without the adder: a simulator evaluates
                # a few bit operations instead of sign extensions and an 11-bit sum.
                v = e1.v[n]
                high = v[7:10]
                below = v[9] & (high != 0b111)
                above = ~v[9] & (high != 0)
                m.d.sync += e2.samples[n].eq(Mux(below, 0, Mux(above, 255, v[:8] ^ 0x80)))
        m.d.comb += [self.o.valid.eq(e2_valid), self.o.payload.eq(e2),
                     self.o.payload.range_fault.eq(~e2_ok)]
        return m


def quant_writes(comp: int, quant) -> list[dict]:
    """The :data:`QuantWrite` beats that load one component's table.

    Args:
        comp: scan component 0..2.
        quant: 64 quantisation values in natural order (DQT values, 1..32767).
    """
    return [{"comp": comp, "index": i, "value": int(q)} for i, q in enumerate(quant)]


def block_beats(block, comp: int = 0, bx: int = 0, by: int = 0) -> list[dict]:
    """The :data:`CoefBeat` beats the entropy decoder gives for one block.

    Args:
        block: 64 quantised coefficients (int16 range) in natural order.
        comp, bx, by: the block's tags.

    Returns:
        The DC beat, a beat per non-zero AC coefficient in zigzag order, and an
        end-of-block beat unless the last coefficient (zigzag 63) is non-zero.
    """
    tag = {"comp": comp, "bx": bx, "by": by}
    beats = [{**tag, "index": 0, "value": int(block[0]), "coef": 1, "first": 1, "last": 0,
              "count": 1}]
    for k in range(1, 64):
        value = int(block[ZIGZAG[k]])
        if value:
            beats.append({**tag, "index": int(ZIGZAG[k]), "value": value, "coef": 1, "first": 0,
                          "last": int(k == 63), "count": len(beats) + 1})
    if not beats[-1]["last"]:
        beats.append({**tag, "index": 0, "value": 0, "coef": 0, "first": 0, "last": 1,
                      "count": len(beats)})
    return beats
