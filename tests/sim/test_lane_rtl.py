"""The whole decoder lane on the generated Verilog.

- cocotb (``sim/lane_tb.py``) on Verilator: generated files covering every feature
  (every sampling, odd sizes, quality 1..100, restart intervals, optimised and 16-bit
  tables), files the lane must stop on (progressive, too wide, truncated entropy data,
  no EOI) and a small corpus pick, fed with random input gaps and output back-pressure;
  RGB byte for byte equal to Pillow, every stage equal to the reference model, statuses
  as the host expects. Icarus runs a smaller set. A failing file is rerun with a
  waveform dump, named in the failure message.
- The C++ Verilator harness (8192-pixel line buffers) on a feature-covering corpus pick
  and one corpus file per classify() reason; ``pytest -m corpus`` runs every corpus file
  (``dlbooster bench lane --all ../shared/corpus`` is the same check with a report).
- :func:`dlbooster.sim.verify.stage_differences` names the first stage that differs.
"""

from __future__ import annotations

import numpy as np
import pytest

from dlbooster import jpeg

from dlbooster.jpeg import model
from dlbooster.hw.entropy import CoefBeat
from dlbooster.hw.idct import block_beats, block_rows
from dlbooster.hw.color import ycbcr_pixels
from dlbooster.sim.flow import simulator_available
from dlbooster.sim.harness import pack
from dlbooster.sim.verify import stage_differences, verify_lane

from jpegtools import CORPUS_DIR, corpus_rows, feature_files, feature_subset, gen, hardware_candidates

needs_verilator = pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
needs_icarus = pytest.mark.skipif(not simulator_available("icarus"), reason="iverilog not installed")

#: Line buffers of the cocotb build (a small build; wider files must stop with "width").
COCOTB_WIDTH = 256


def _corpus_small(count: int) -> list:
    """Small corpus files: a feature-covering pick of decodable ones, plus stops."""
    rows = [r for r in corpus_rows() if r["width"].isdigit() and int(r["size"]) <= 12000]
    picked = feature_subset([r for r in hardware_candidates(rows)
                             if int(r["width"]) * int(r["height"]) <= 64 * 64], cap=count)
    stops = {}
    for r in rows:
        stops.setdefault(r["sof"], r)
    return [CORPUS_DIR / r["path"] for r in picked + list(stops.values())[:3]]


def _write(tmp_path, files: dict[str, bytes]) -> list:
    paths = []
    for name, data in files.items():
        path = tmp_path / f"{name}.jpg"
        path.write_bytes(data)
        paths.append(path)
    return paths


def _run(paths, simulator, **options):
    from dlbooster.sim.lane_debug import debug_lane

    run, reruns = debug_lane(paths, simulator=simulator, max_width=COCOTB_WIDTH, **options)
    assert len(run.report) == len(paths)
    message = []
    for r in run.failed:
        waves = reruns[r["path"]].waves if r["path"] in reruns else []
        message.append(f"{r['path']}: {r['verdict']['detail']} stages={r['stages']} waves={waves}")
    assert not run.failed, "\n".join(message)
    return {r["path"]: r for r in run.report}


def test_verify_lane_fails_every_kind_of_wrong_result():
    """The judge of every lane test (sim/verify.py), on hand-made results: a right one
    passes; a changed pixel, a missing row, a stop on a good file, a hang, an unknown
    status, too many clocks, the wrong fault for a damaged file and an entropy stop for a
    file the header rejects are each a failure that says what went wrong."""
    from dlbooster.hw.lane import STATUS_ENTROPY
    from dlbooster.hw.entropy import Status
    from dlbooster.hw.headers import HeaderStatus
    from dlbooster.sim.harness import TIMEOUT, LaneResult
    from dlbooster.sim.verify import cycle_bound, padded_blocks
    from jpegtools import pillow_rgb, truncated_entropy

    data = gen(21, 13, subsampling=2, quality=80)
    rgb, _ = pillow_rgb(data)
    bound = cycle_bound(len(data), padded_blocks(jpeg.parse(data)))

    def judge(status=0, cycles=1000, pixels=rgb, source=data):
        return verify_lane(LaneResult(status, cycles, 21, 13, pixels), source, 8192)

    good = judge()
    assert (good.ok, good.expect, good.equals_pillow, good.detail) == (True, "decode", True, "")
    assert judge(cycles=bound).ok
    changed = rgb.copy()
    changed[12, 20, 2] ^= 1
    cases = {
        "1 pixels differ from Pillow, first at (y, x) = (12, 20)": judge(pixels=changed),
        "shape (12, 21, 3), Pillow (13, 21, 3)": judge(pixels=rgb[:12]),
        f"stopped with {STATUS_ENTROPY | Status.TRUNCATED:#x} (truncated) on a file Pillow decodes":
            judge(status=STATUS_ENTROPY | Status.TRUNCATED, pixels=rgb.reshape(-1, 3)[:10]),
        "no done: the lane hung": judge(status=TIMEOUT),
        "unknown status 0x2f": judge(status=0x2F),
        f"{bound + 1} clocks, over the bound {bound}": judge(cycles=bound + 1),
    }
    for detail, verdict in cases.items():
        assert not verdict.ok and verdict.detail == detail, (detail, verdict)
    assert cases["1 pixels differ from Pillow, first at (y, x) = (12, 20)"].equals_pillow is False
    # A file the model finds truncated: the lane must report that fault, not another.
    cut = truncated_entropy(data)
    assert judge(status=STATUS_ENTROPY | Status.TRUNCATED, pixels=rgb.reshape(-1, 3)[:10], source=cut).ok
    wrong = judge(status=STATUS_ENTROPY | Status.BAD_CODE, pixels=rgb.reshape(-1, 3)[:10], source=cut)
    assert not wrong.ok
    assert wrong.detail == f"status {STATUS_ENTROPY | Status.BAD_CODE:#x} (bad-huffman-code), the model says truncated"
    # A progressive file stops in the header, with a header status.
    progressive = gen(21, 13, subsampling=2, progressive=True)
    empty = np.zeros((0, 3), np.uint8)
    assert judge(status=HeaderStatus.PROGRESSIVE, pixels=empty, source=progressive).ok
    late = judge(status=STATUS_ENTROPY | Status.BAD_CODE, pixels=empty, source=progressive)
    assert not late.ok and late.detail.endswith("for a file classify rejects as progressive")


@needs_verilator
def test_lane_cocotb_verilator(tmp_path):
    files = feature_files(COCOTB_WIDTH)
    paths = _write(tmp_path, files) + _corpus_small(10)
    report = _run(paths, "verilator", valid_percent=75, ready_percent=70)
    by_name = {p.stem: report[str(p.resolve())] for p in paths[:len(files)]}
    assert all(by_name[k]["verdict"]["expect"] == "decode" and by_name[k]["status"] == 0
               for k in list(files)[:10])
    assert by_name["progressive"]["verdict"]["status_reason"] == "progressive"
    assert by_name["too_wide"]["verdict"]["status_reason"] == "width"
    assert by_name["truncated"]["verdict"]["status_reason"] == "truncated"
    assert by_name["no_eoi"]["verdict"]["status_reason"] == "after-scan"
    assert sum(r["pixels"] for r in report.values()) > 5000


@needs_icarus
def test_lane_cocotb_icarus(tmp_path):
    from dlbooster.sim.lane_debug import run_lane_testbench

    files = {k: v for k, v in feature_files(COCOTB_WIDTH).items() if k in ("422_q1_odd", "gray_q60_odd", "progressive", "no_eoi")}
    report = _run(_write(tmp_path, files), "icarus", valid_percent=80, ready_percent=80)
    assert [r["status"] for r in report.values()][:2] == [0, 0]
    # What a failing file gets: a waveform of its run.
    run = run_lane_testbench([tmp_path / "422_q1_odd.jpg"], simulator="icarus", max_width=COCOTB_WIDTH,
                             waves=True)
    assert run.report[0]["ok"] and [w.suffix for w in run.waves] == [".fst"]
    assert run.waves[0].stat().st_size > 1000


# --------------------------------------------------------------------------------------
# The C++ harness on the corpus


@pytest.fixture(scope="module")
def lane():
    from dlbooster.sim.harness import LaneHarness

    with LaneHarness(8192) as harness:
        yield harness


def _check_corpus(lane, rows) -> dict[str, int]:
    counts: dict[str, int] = {}
    failures = []
    for r in rows:
        data = (CORPUS_DIR / r["path"]).read_bytes()
        if not data:
            continue
        verdict = verify_lane(lane.decode(data), data, 8192)
        counts[verdict.expect] = counts.get(verdict.expect, 0) + 1
        if not verdict.ok:
            failures.append(f"{r['path']}: {verdict.detail}")
    assert not failures, "\n".join(failures)
    return counts


@needs_verilator
def test_lane_harness_generated(lane):
    """The benchmark's C++ harness: every generated file judged as in the cocotb test
    (here with 8192-pixel line buffers, so the wide file decodes)."""
    verdicts = {}
    for name, data in feature_files(COCOTB_WIDTH).items():
        verdicts[name] = verify_lane(lane.decode(data), data, 8192)
    assert all(v.ok for v in verdicts.values()), {k: v.detail for k, v in verdicts.items() if not v.ok}
    assert verdicts["too_wide"].expect == "decode" and verdicts["too_wide"].status == 0
    assert [verdicts[k].status_reason for k in ("progressive", "truncated", "no_eoi")] == [
        "progressive", "truncated", "after-scan"]


def _one_per_reason(rows, max_bytes: int = 200_000) -> list[dict]:
    picked: dict[str, dict] = {}
    for r in sorted(rows, key=lambda r: int(r["size"])):
        if not 0 < int(r["size"]) <= max_bytes:     # the lane takes no empty file
            continue
        data = (CORPUS_DIR / r["path"]).read_bytes()
        reason = jpeg.classify(jpeg.parse(data))
        if reason is not None:
            picked.setdefault(reason, r)
    return list(picked.values())


@needs_verilator
def test_lane_harness_corpus_subset(lane):
    rows = corpus_rows()
    if not rows:
        pytest.skip(f"corpus not present at {CORPUS_DIR}")
    decodable = feature_subset([r for r in hardware_candidates(rows)
                                if int(r["width"]) * int(r["height"]) <= 400_000], cap=25)
    counts = _check_corpus(lane, decodable + _one_per_reason(rows))
    assert counts.get("decode", 0) >= 15 and counts.get("stop", 0) >= 10, counts


@pytest.mark.corpus
@needs_verilator
def test_lane_harness_corpus_all(lane):
    rows = corpus_rows()
    if not rows:
        pytest.skip(f"corpus not present at {CORPUS_DIR}")
    counts = _check_corpus(lane, rows)
    assert counts.get("decode", 0) > 800, counts


# --------------------------------------------------------------------------------------
# The stage comparison


def _model_beats(data: bytes, lanes: int = 4):
    """The probe beats a correct lane gives for ``data``, built from the model."""
    out = model.decode(data)
    info = out.info
    coef, rows = [], []
    layout = block_rows(lanes)
    for c, by, bx in model.block_order(info):
        block = out.coefficients[c][by, bx]
        coef += [pack(CoefBeat, b) for b in block_beats(block, int(c), int(bx), int(by))]
        quant = info.scans[0].qtables[info.frame.components[c].tq]
        samples = model.idct_islow(block[None], quant)[0][0]
        for r in range(0, 8, lanes):
            rows.append(pack(layout, {"comp": int(c), "bx": int(bx), "by": int(by), "row": r,
                                      "last": r + lanes == 8, "range_fault": 0,
                                      "samples": [int(v) for v in samples[r:r + lanes].reshape(-1)]}))
    planes = out.upsampled if len(out.upsampled) == 3 else [out.upsampled[0], None, None]
    h, w = info.frame.height, info.frame.width
    planes = [np.full((h, w), 128) if p is None else p for p in planes]
    ycc = []
    layout = ycbcr_pixels(8)
    for y in range(h):
        for x in range(0, w, 8):
            n = min(8, w - x)
            pad = [0] * (8 - n)
            ycc.append(pack(layout, {"y": [int(v) for v in planes[0][y, x:x + n]] + pad,
                                     "cb": [int(v) for v in planes[1][y, x:x + n]] + pad,
                                     "cr": [int(v) for v in planes[2][y, x:x + n]] + pad,
                                     "n": n, "row_end": x + n == w, "last": 0}))
    return coef, rows, ycc


@pytest.mark.parametrize("subsampling", [2, "gray"])
def test_stage_differences_names_the_first_stage(subsampling):
    data = gen(24, 16, subsampling=subsampling, quality=80)
    coef, rows, ycc = _model_beats(data)
    assert stage_differences(data, coef, rows, ycc) == []

    bad = list(coef)
    beat = CoefBeat.from_bits(bad[5])
    bad[5] = pack(CoefBeat, {"comp": beat.comp, "bx": beat.bx, "by": beat.by, "index": beat.index,
                             "value": beat.value + 1, "coef": beat.coef, "first": beat.first,
                             "last": beat.last, "count": beat.count})
    lines = stage_differences(data, bad, rows, ycc)
    assert len(lines) == 1 and lines[0].startswith("entropy: 1 blocks of component 0")

    lines = stage_differences(data, coef, rows[:-1], ycc)
    assert len(lines) == 1 and lines[0].startswith("idct: 1 blocks")
    lines = stage_differences(data, coef, rows + rows[-1:], ycc)     # a block given twice
    assert len(lines) == 1 and lines[0].startswith("idct: 1 blocks")

    bad = list(ycc)
    bad[3] ^= 1    # the lowest bit of the first Y sample of the fourth beat
    lines = stage_differences(data, coef, rows, bad)
    assert lines == [lines[0]] and lines[0].startswith("upsample: 1 y samples differ; first at (y=")


@needs_verilator
def test_debug_lane_command(tmp_path, capsys):
    from dlbooster.cli import main

    paths = _write(tmp_path, {k: v for k, v in feature_files(COCOTB_WIDTH).items() if k in ("gray_q60_odd", "no_eoi")})
    assert main(["debug-lane", "--max-width", str(COCOTB_WIDTH), "--valid", "90", *map(str, paths)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ok")]
    assert len(lines) == 2
    assert "expect decode, status 0x0" in lines[0]
    assert "expect stop (after-scan), status 0x26 (after-scan)" in lines[1]
