"""cocotb testbench of the entropy decoder core (``dlbooster.hw.entropy``).

Run through :func:`dlbooster.sim.flow.run_cocotb` (the pytest tests and
``dlbooster bench entropy`` do). Parameters come from the environment:

- ``DLB_VECTORS``: a JSON file, a list of ``{"path": ..., "backpressure": bool}``; every
  file is decoded by the core and compared with the reference model's coefficient stage.
- ``DLB_SEED``: seed of the random ready/valid gaps.
- ``DLB_REPORT``: where to write per-file results (symbols, cycles, status) as JSON.

Per file the core must: end with the model's status (0, or the model's fault code);
on success emit exactly the model's coefficients, block by block in MCU order, each
block starting with its DC beat and ending with a ``last`` beat whose ``count`` is the
number of coefficient beats; never emit more than 64 coefficients per block or more
blocks than the frame holds; and finish within ``16 * bytes + 4096`` clocks.
"""

from __future__ import annotations

import json
import os
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from dlbooster import jpeg

from dlbooster.jpeg import model
from dlbooster.errors import Malformed
from dlbooster.hw.entropy import CoefBeat, InputBeat, ScanConfig, TableWrite, scan_program



def _pack(layout, value: dict) -> int:
    return layout.const(value).as_value().value


_FIELDS = [(name, field.offset, (1 << field.width) - 1) for name, field in CoefBeat]


def _unpack(raw: int) -> dict:
    """CoefBeat fields as unsigned ints (plain bit operations: this runs every clock)."""
    return {name: (raw >> offset) & mask for name, offset, mask in _FIELDS}


def expected(data: bytes):
    """The model's view: (status, blocks or None, symbols or None, block order)."""
    info = jpeg.parse(data)
    order = [tuple(int(x) for x in row) for row in model.block_order(info)]
    try:
        blocks, symbols = model.entropy_decode(data, info)
    except Malformed as exc:
        return model.REASON_STATUS[exc.reason], None, None, order, info
    return 0, blocks, symbols, order, info


async def decode_file(dut, data: bytes, rng: random.Random, backpressure: bool) -> dict:
    status, blocks, symbols, order, info = expected(data)
    config, writes, start, end = scan_program(info)
    for w in writes:
        dut.tables__payload.value = _pack(TableWrite, w)
        dut.tables__valid.value = 1
        await ReadOnly()
        while not int(dut.tables__ready.value):  # the lookahead fill holds the writes
            await RisingEdge(dut.clk)
            await ReadOnly()
        await RisingEdge(dut.clk)
    dut.tables__valid.value = 0
    dut.scan.value = _pack(ScanConfig, config)
    dut.start.value = 1
    await RisingEdge(dut.clk)
    dut.start.value = 0

    stream = data[start:end]
    beats = [stream[i:i + 4] for i in range(0, len(stream), 4)]
    packed = [_pack(InputBeat, {"data": int.from_bytes(chunk, "little"), "n": len(chunk),
                                "last": i == len(beats) - 1}) for i, chunk in enumerate(beats)]
    bound = 16 * len(stream) + 4096
    got = [np.zeros_like(b) for b in blocks] if blocks is not None else None
    seen_blocks: list[tuple[int, int, int]] = []
    in_block = False
    coefs_in_block = 0
    cycles = 0
    bi = 0
    offer = True
    while True:
        if bi < len(beats):
            if not backpressure or rng.random() < 0.7:
                dut.input__payload.value = packed[bi]
                dut.input__valid.value = 1
            else:
                dut.input__valid.value = 0
        else:
            dut.input__valid.value = 0
        ready = 1 if not backpressure else int(rng.random() < 0.7)
        dut.coef__ready.value = ready
        await ReadOnly()
        offer = int(dut.input__valid.value) and int(dut.input__ready.value)
        if int(dut.coef__valid.value) and ready:
            raw = dut.coef__payload.value
            assert raw.is_resolvable, f"coefficient beat with X/Z bits: {raw}"
            beat = _unpack(int(raw))
            tag = (beat["comp"], beat["by"], beat["bx"])
            if beat["first"]:
                assert not in_block, f"block {tag} started inside another block"
                assert beat["coef"] and beat["index"] == 0, "a block must start with its DC beat"
                in_block = True
                coefs_in_block = 0
                seen_blocks.append(tag)
                assert len(seen_blocks) <= len(order), "more blocks than the frame holds"
            assert in_block and tag == seen_blocks[-1], f"beat {tag} outside its block"
            if beat["coef"]:
                coefs_in_block += 1
                assert coefs_in_block <= 64, "more than 64 coefficients in a block"
                if got is not None:
                    value = beat["value"] - (beat["value"] >> 15 << 16)
                    got[tag[0]][tag[1], tag[2], beat["index"]] = value
            if beat["last"]:
                assert beat["count"] == coefs_in_block, "count differs from the beats sent"
                in_block = False
        done = int(dut.done.value)
        await RisingEdge(dut.clk)
        cycles += 1
        if offer:
            bi += 1
        if done:
            break
        assert cycles <= bound, f"no completion within {bound} clocks"
    got_status = int(dut.status.value)
    got_symbols = int(dut.symbols.value)
    assert bi == len(beats), "the core stopped before draining its input"
    assert got_status == status, f"status {got_status}, model {status}"
    if status == 0:
        assert seen_blocks == order, "blocks out of MCU order"
        assert not in_block
        for c, (a, b) in enumerate(zip(got, blocks)):
            if not np.array_equal(a, b):
                where = np.argwhere(a != b)[0]
                raise AssertionError(f"component {c} block {tuple(where[:2])} coefficient "
                                     f"{where[2]}: core {a[tuple(where)]}, model {b[tuple(where)]}")
        assert got_symbols == symbols, f"symbols {got_symbols}, model {symbols}"
    return {"status": got_status, "symbols": got_symbols, "cycles": cycles,
            "bytes": len(stream), "blocks": len(seen_blocks)}


@cocotb.test()
async def decode_vectors(dut):
    """Decode every vector of ``DLB_VECTORS`` and compare with the model."""
    with open(os.environ["DLB_VECTORS"]) as f:
        vectors = json.load(f)
    rng = random.Random(int(os.environ.get("DLB_SEED", "1")))
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    dut.start.value = 0
    dut.tables__valid.value = 0
    dut.input__valid.value = 0
    dut.coef__ready.value = 1
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    await RisingEdge(dut.clk)
    report = []
    for vector in vectors:
        with open(vector["path"], "rb") as f:
            data = f.read()
        try:
            result = await decode_file(dut, data, rng, vector.get("backpressure", False))
        except AssertionError as exc:
            raise AssertionError(f"{vector['path']}: {exc}") from None
        report.append({"path": vector["path"], **result})
    if os.environ.get("DLB_REPORT"):
        with open(os.environ["DLB_REPORT"], "w") as f:
            json.dump(report, f)
