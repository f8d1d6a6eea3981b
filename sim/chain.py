"""Entropy decoder followed by the IDCT core, for cycle-accurate throughput measurement.

A measuring top, not the product's lane (``hw/`` holds the cores): it connects
:class:`dlbooster.hw.entropy.EntropyDecoder`'s coefficient stream to
:class:`dlbooster.hw.idct.Idct`, optionally through a FIFO, and exposes both cores'
other ports, so ``dlbooster bench idct`` can compare the clocks of entropy decoding
alone with those of entropy decoding plus IDCT on the same photos.
"""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from dlbooster.hw.entropy import CoefBeat, EntropyDecoder, InputBeat, ScanConfig, TableWrite
from dlbooster.hw.idct import Idct, QuantWrite, block_rows

__all__ = ["EntropyIdctChain"]


class EntropyIdctChain(wiring.Component):
    """Ports: those of :class:`EntropyDecoder` except ``coef``, plus :class:`Idct`'s
    ``quant`` and ``o``.

    Args:
        fifo_depth: coefficient beats buffered between the cores (0: direct).
        lanes: the IDCT's rows per clock (:class:`Idct` ``lanes``).
    """

    def __init__(self, fifo_depth: int = 0, lanes: int = 1):
        self.fifo_depth = fifo_depth
        self.lanes = lanes
        super().__init__({
            "scan": In(ScanConfig),
            "start": In(1),
            "busy": Out(1),
            "done": Out(1),
            "status": Out(3),
            "symbols": Out(32),
            "tables": In(stream.Signature(TableWrite)),
            "input": In(stream.Signature(InputBeat)),
            "quant": In(stream.Signature(QuantWrite)),
            "o": Out(stream.Signature(block_rows(lanes))),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.entropy = ent = EntropyDecoder()
        m.submodules.idct = idct = Idct(self.lanes)
        m.d.comb += [ent.scan.eq(self.scan), ent.start.eq(self.start), self.busy.eq(ent.busy),
                     self.done.eq(ent.done), self.status.eq(ent.status),
                     self.symbols.eq(ent.symbols)]
        wiring.connect(m, wiring.flipped(self.tables), ent.tables)
        wiring.connect(m, wiring.flipped(self.input), ent.input)
        wiring.connect(m, wiring.flipped(self.quant), idct.quant)
        wiring.connect(m, idct.o, wiring.flipped(self.o))
        if self.fifo_depth:
            m.submodules.fifo = buf = fifo.SyncFIFOBuffered(width=CoefBeat.size, depth=self.fifo_depth)
            m.d.comb += [buf.w_data.eq(ent.coef.payload), buf.w_en.eq(ent.coef.valid),
                         ent.coef.ready.eq(buf.w_rdy), idct.coef.payload.eq(buf.r_data),
                         idct.coef.valid.eq(buf.r_rdy), buf.r_en.eq(idct.coef.ready)]
        else:
            wiring.connect(m, ent.coef, idct.coef)
        return m
