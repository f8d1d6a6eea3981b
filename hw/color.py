"""YCbCr to RGB colour conversion core (SPEC.md 3.3, libjpeg-turbo ``jdcolor.c``).

:class:`ColorConverter` turns ``pixels`` YCbCr samples per clock into RGB with the exact
fixed-point arithmetic of libjpeg-turbo (SCALEBITS = 16, ONE_HALF = 32768):

- R = clamp(Y + ((91881 * xr + 32768) >> 16))
- G = clamp(Y + ((-22554 * xb + 32768 - 46802 * xr) >> 16))
- B = clamp(Y + ((116130 * xb + 32768) >> 16))

with xb = Cb - 128, xr = Cr - 128, arithmetic shifts, clamp to 0..255. Gray images need
no mode: Cb = Cr = 128 gives R = G = B = Y, which is what ``.convert("RGB")`` does.

``unsigned`` computes the same in offset binary, every value non-negative: the products
of Cb and Cr themselves plus ``2**24`` and the offsets' constant parts (R: 91881 * Cr +
5049216, B: 116130 * Cb + 1945344, G: 25687552 - 22554 * Cb - 46802 * Cr, all within
25 bits), so that each ``>> 16`` is 256 more than the signed one, and
``q = Y + (... >> 16)`` is the channel plus 256: below 256 clamps to 0, from 512 to 255,
else its low byte. A simulator then evaluates no sign extensions.
"""

from amaranth import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ColorConverter", "LATENCY", "rgb_pixels", "ycbcr_pixels"]

#: Pipeline stages between an accepted input beat and its output beat.
LATENCY = 3


def ycbcr_pixels(pixels: int) -> data.StructLayout:
    """Input beat: ``pixels`` samples of each plane, left to right (uint8 each); ``n``
    (valid pixels), ``row_end`` and ``last`` are passed through untouched."""
    plane = data.ArrayLayout(8, pixels)
    return data.StructLayout({"y": plane, "cb": plane, "cr": plane, "n": range(pixels + 1),
                              "row_end": 1, "last": 1})


def rgb_pixels(pixels: int) -> data.StructLayout:
    """Output beat: ``pixels`` RGB pixels, left to right; ``n``, ``row_end`` and ``last``
    of the input beat."""
    return data.StructLayout({"rgb": data.ArrayLayout(data.ArrayLayout(8, 3), pixels),
                              "n": range(pixels + 1), "row_end": 1, "last": 1})


class ColorConverter(wiring.Component):
    """YCbCr to RGB, ``pixels`` per clock, bit-exact with :func:`dlbooster.jpeg.model.ycbcr_to_rgb`.

    Pipeline: products (registered), rounding shifts (registered), Y added and clamped
    (registered output); :data:`LATENCY` clocks; the whole pipeline holds while the output
    is not taken (full back-pressure, one beat per clock when it is).

    Args:
        pixels: pixels per beat (1 or more).
        unsigned: the offset-binary form (module docstring), for simulation builds:
            Verilator evaluates it without sign extensions (docs/benchmarks.md). FPGA
            builds keep the signed form: the ECP5 mapping of Yosys 0.70 (the synthesis
            flow's) fails an assertion on the unsigned one.

    Ports:
        i: stream of :func:`ycbcr_pixels` ``(pixels)``.
        o: stream of :func:`rgb_pixels` ``(pixels)``.
        idle: high in clocks with no beat in the pipeline or at its input: no register
            changes then but data registers without a beat; for
            :class:`dlbooster.hw.gating.ClockGate`.
    """

    def __init__(self, pixels: int = 8, unsigned: bool = False):
        self.pixels = pixels
        self.unsigned = unsigned
        super().__init__({
            "i": In(stream.Signature(ycbcr_pixels(pixels))),
            "o": Out(stream.Signature(rgb_pixels(pixels))),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.pixels
        en = Signal()
        side = Cat(self.i.payload.n, self.i.payload.row_end, self.i.payload.last)
        valid = [Signal(name=f"valid{k}") for k in range(LATENCY)]
        sides = [Signal(len(side), name=f"side{k}") for k in range(LATENCY)]
        m.d.comb += [en.eq(~valid[-1] | self.o.ready), self.i.ready.eq(en),
                     self.o.valid.eq(valid[-1]), self.idle.eq(~(self.i.valid | Cat(*valid).any())),
                     Cat(self.o.payload.n, self.o.payload.row_end, self.o.payload.last).eq(sides[-1])]
        with m.If(en):
            m.d.sync += [valid[0].eq(self.i.valid), sides[0].eq(side)]
            m.d.sync += [valid[k].eq(valid[k - 1]) for k in range(1, LATENCY)]
            m.d.sync += [sides[k].eq(sides[k - 1]) for k in range(1, LATENCY)]
        for p in range(n):
            y, cb, cr = self.i.payload.y[p], self.i.payload.cb[p], self.i.payload.cr[p]
            shape1, shape2, products, clamp = (self._unsigned_form(cb, cr) if self.unsigned else
                                               self._signed_form(m, p, cb, cr))
            # Stage 1: the products (|product| < 2**24), Y kept alongside.
            y1 = Signal(8, name=f"y1_{p}")
            stage1 = [Signal(shape1, name=f"{c}1_{p}") for c in "rgb"]
            # Stage 2: rounding shifts to the offsets added to Y.
            y2 = Signal(8, name=f"y2_{p}")
            stage2 = [Signal(shape2, name=f"{c}2_{p}") for c in "rgb"]
            # Stages 2 and 3 load only with a beat (a bubble leaves them as they were): free
            # on the FPGA, and the simulator skips their arithmetic. Stage 1 loads on every
            # enabled clock: gating its registered products trips an assertion in Yosys
            # 0.70's ECP5 ABC9 mapping.
            with m.If(en):
                m.d.sync += [y1.eq(y), *(r1.eq(value) for r1, value in zip(stage1, products))]
            with m.If(en & valid[0]):
                m.d.sync += [y2.eq(y1), *(r2.eq(r1 >> 16) for r1, r2 in zip(stage1, stage2))]
            with m.If(en & valid[1]):
                for c, offset in enumerate(stage2):
                    m.d.sync += self.o.payload.rgb[p][c].eq(clamp(y2 + offset))
        return m

    @staticmethod
    def _signed_form(m, p, cb, cr):
        """The stage-1 and stage-2 register shapes, the R, G and B products, and the clamp
        of Y plus an offset, as libjpeg-turbo computes them."""
        xb = Signal(signed(9), name=f"xb{p}")
        xr = Signal(signed(9), name=f"xr{p}")
        m.d.comb += [xb.eq(cb - 128), xr.eq(cr - 128)]
        products = [91881 * xr + 32768, -22554 * xb + 32768 - 46802 * xr, 116130 * xb + 32768]
        return signed(26), signed(10), products, lambda s: Mux(s < 0, 0, Mux(s > 255, 255, s))

    @staticmethod
    def _unsigned_form(cb, cr):
        """The same in offset binary (module docstring): every value non-negative, each
        shifted sum 256 more than the signed one, the clamp read off the sum's top bits."""
        products = [91881 * cr + 5049216, (25687552 - (22554 * cb + 46802 * cr))[:25], 116130 * cb + 1945344]
        return 25, 9, products, lambda q: Mux(q[8:] == 0, 0, Mux(q[9], 255, q[:8]))
