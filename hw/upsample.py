"""Fancy chroma upsampling of one row (SPEC.md 3.2, libjpeg-turbo ``jdsample.c``).

:class:`RowUpsampler` is the arithmetic of libjpeg-turbo's "fancy" upsamplers on a
stream of row pieces; the lane's line buffers feed it a chroma row and, for vertical
upsampling, its neighbour row (the row above for output row 2r, below for 2r + 1, the
row itself at the plane's top and bottom edges). Per beat:

- vertical (``v2``): column sums ``c = 3 * p + q`` (p: the row, q: its neighbour);
  otherwise ``c = p``.
- horizontal (``h2``): ``out[2i] = (3c[i] + c[i-1] + ke) >> s``,
  ``out[2i+1] = (3c[i] + c[i+1] + ko) >> s`` with ``(s, ke, ko) = (4, 8, 7)`` for h2v2 and
  ``(2, 1, 2)`` for h2v1; at the row's ends the missing neighbour is the edge sample
  itself, which gives ``out[0] = p[0]``, ``out[2n-1] = p[n-1]`` (h2v1) and
  ``(4c + 8) >> 4``, ``(4c + 7) >> 4`` (h2v2) exactly as ``jdsample.c``.
- vertical only (h1v2): ``out[i] = (c[i] + 1) >> 2`` for output row 2r, ``+ 2`` for 2r + 1.
- ``narrow`` (a chroma plane at most 2 samples wide with ``h2``): plain replication,
  ``out[2i] = out[2i+1] = p[i]``, no vertical smoothing (``h2v1_upsample`` /
  ``h2v2_upsample``).
"""

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["RowUpsampler", "row_in", "row_out"]


def row_in(pixels: int) -> data.StructLayout:
    """Input beat: ``pixels`` samples of the row (``p``) and of its neighbour (``q``), ``n``
    of them valid (all but in a row's last beat), ``first``/``last`` beat of the row, and
    the mode (``h2``, ``v2``, ``odd``: output row 2r + 1, ``narrow``), constant in a row."""
    plane = data.ArrayLayout(8, pixels)
    return data.StructLayout({"p": plane, "q": plane, "n": range(pixels + 1), "first": 1,
                              "last": 1, "h2": 1, "v2": 1, "odd": 1, "narrow": 1})


def row_out(pixels: int) -> data.StructLayout:
    """Output beat: up to ``2 * pixels`` upsampled samples, ``n`` valid, left to right."""
    return data.StructLayout({"samples": data.ArrayLayout(8, 2 * pixels),
                              "n": range(2 * pixels + 1), "first": 1, "last": 1})


class RowUpsampler(wiring.Component):
    """Fancy upsampling of row pieces, ``pixels`` input samples per clock, bit-exact with
    :func:`dlbooster.jpeg.model.upsample` row by row.

    A beat is held until the next beat of its row arrives (its right neighbour); a row's
    last beat goes out without waiting. One beat per clock in steady state, full
    back-pressure; the output is registered.

    Args:
        pixels: input samples per beat (output: twice as many with ``h2``).

    Ports:
        i: stream of :func:`row_in` ``(pixels)``.
        o: stream of :func:`row_out` ``(pixels)``.
        idle: high in clocks in which none of its registers changes (for
            :class:`dlbooster.hw.gating.ClockGate`).
    """

    def __init__(self, pixels: int = 8):
        self.pixels = pixels
        super().__init__({
            "i": In(stream.Signature(row_in(pixels))),
            "o": Out(stream.Signature(row_out(pixels))),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        n_px = self.pixels
        beat = self.i.payload
        held = Signal(row_in(n_px))
        held_valid = Signal()
        left = Signal(11)            # c of the sample before the held beat

        def times3(x):
            # Shift-add: synthesis maps a constant product to a DSP, a slow path on ECP5.
            return (x << 1) + x

        def sums(b):
            return [Mux(b.v2, times3(b.p[k]) + b.q[k], b.p[k]) for k in range(n_px)]

        out = Signal(row_out(n_px))
        out_valid = Signal()
        out_free = ~out_valid | self.o.ready
        # The held beat can go once its right neighbour is known.
        emit = held_valid & out_free & (held.last | self.i.valid)
        m.d.comb += [self.i.ready.eq(~held_valid | emit), self.o.valid.eq(out_valid),
                     self.o.payload.eq(out),
                     self.idle.eq(~(self.i.valid | emit | (out_valid & self.o.ready)))]
        with m.If(self.o.ready):
            m.d.sync += out_valid.eq(0)
        # The held beat's column sums are registered with it, so the output's arithmetic
        # starts from registers; only the last sample's right neighbour (the next beat's
        # first column sum) still comes from the input.
        c_in = sums(beat)
        assert all(len(c) == 11 for c in c_in)   # the layout of held_c, for the Cat below
        held_c = Signal(data.ArrayLayout(11, n_px))
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [held.eq(beat), held_valid.eq(1), held_c.eq(Cat(*c_in))]
        with m.Elif(emit):
            m.d.sync += held_valid.eq(0)

        c = [held_c[k] for k in range(n_px)]
        count = held.n
        lefts = [Mux(held.first, c[0], left)] + c[:-1]
        rights = []
        for k in range(n_px):
            after = c_in[0] if k == n_px - 1 else c[k + 1]
            rights.append(Mux(held.last & (k + 1 >= count), c[k], after))
        k_even = Mux(held.v2, 8, 1)
        k_odd = Mux(held.v2, 7, 2)
        with m.If(emit):
            m.d.sync += [out_valid.eq(1), out.first.eq(held.first), out.last.eq(held.last),
                         out.n.eq(Mux(held.h2, 2 * count, count)), left.eq(c[-1])]
            for k in range(n_px):
                even_sum = times3(c[k]) + lefts[k] + k_even
                odd_sum = times3(c[k]) + rights[k] + k_odd
                # Two fixed shifts and a select, not a barrel shifter.
                even = Mux(held.v2, even_sum[4:12], even_sum[2:10])
                odd = Mux(held.v2, odd_sum[4:12], odd_sum[2:10])
                vertical = (c[k] + Mux(held.odd, 2, 1)) >> 2
                with m.If(held.h2 & held.narrow):
                    m.d.sync += [out.samples[2 * k].eq(held.p[k]), out.samples[2 * k + 1].eq(held.p[k])]
                with m.Elif(held.h2):
                    m.d.sync += [out.samples[2 * k].eq(even), out.samples[2 * k + 1].eq(odd)]
                with m.Elif(held.v2):
                    m.d.sync += out.samples[k].eq(vertical)
                with m.Else():
                    m.d.sync += out.samples[k].eq(held.p[k])
        return m
