"""The IDCT core's generated Verilog against the model: IEEE 1180, full-range random
blocks, and every block of generated and corpus JPEGs.

Verilator runs the core through the C++ harness (``sim/cpp/idct_main.cpp``, millions
of clocks per second) for the large sets, and through cocotb (``sim/idct_tb.py``) on
Verilator and Icarus for the protocol with random valid/ready gaps.
"""

from __future__ import annotations

import numpy as np
import pytest

from dlbooster.jpeg import ieee1180, model

from dlbooster import jpeg
from dlbooster.hw.idct import Idct
from dlbooster.sim.flow import export_verilog, run_cocotb, simulator_available

from jpegtools import CORPUS_DIR, corpus_rows, feature_subset, gen, hardware_candidates

needs_verilator = pytest.mark.skipif(not simulator_available("verilator"),
                                     reason="verilator not installed")


@pytest.fixture(scope="module", params=[1, 4], ids=["lanes1", "lanes4"])
def harness(request):
    from dlbooster.sim.harness import IdctHarness

    with IdctHarness(request.param) as h:
        yield h


def _model(blocks, quant, comps):
    samples = np.empty((len(blocks), 8, 8), dtype=np.uint8)
    in_range = np.empty(len(blocks), dtype=bool)
    for c, table in enumerate(quant):
        sel = comps == c
        samples[sel], in_range[sel] = model.idct_islow(blocks[sel], np.asarray(table))
    return samples, in_range


def _assert_equal_to_model(result, blocks, quant, comps):
    """Every block's range fault is the model's, and every in-range block's samples are
    (an out-of-range block's are unspecified: the lane declines its image)."""
    expect, in_range = _model(blocks, quant, comps)
    differ = np.flatnonzero(((result.samples != expect).any(axis=(1, 2))) & in_range)
    assert not len(differ), (f"{len(differ)} blocks differ, first {differ[0]}: "
                             f"{blocks[differ[0]].tolist()}")
    assert (result.range_fault == ~in_range).all()
    assert (result.tags[:, 0] == comps).all()
    assert (result.tags[:, 2] + (result.tags[:, 1] << 16) == np.arange(len(blocks))).all()


def _print_ieee(results, who):
    print(f"\nIEEE 1180-1990, {who}:")
    print(f"{'range':>12} {'sign':>4} {'peak':>4} {'pmse':>7} {'omse':>7} {'pme':>7} {'ome':>8}")
    for r in results:
        print(f"{-r.low:>5}..{r.high:<5} {r.sign:>4} {r.peak:>4} {r.pmse:>7.4f} {r.omse:>7.4f} "
              f"{r.pme:>7.4f} {r.ome:>8.5f}")
    lim = ieee1180.LIMITS
    print(f"{'limits':>17} {lim['peak']:>4} {lim['pmse']:>7.4f} {lim['omse']:>7.4f} "
          f"{lim['pme']:>7.4f} {lim['ome']:>8.5f}")


def test_ieee1180_model():
    idct = lambda coef: model.idct_islow(coef, np.ones(64, dtype=np.int64))[0]  # noqa: E731
    results = ieee1180.run(idct)
    _print_ieee(results, "reference model")
    assert len(results) == 6 and all(r.passed for r in results), [r.to_json() for r in results]
    assert ieee1180.zero_input_gives_zero(idct)


def test_ieee1180_offsets_recover_the_signed_output():
    """The DC-offset trick equals the exact signed ISLOW output, clipped."""
    from reference_impl import spec_idct_values

    coef, _ = ieee1180.reference(ieee1180.input_blocks(300, 300, 300))
    exact = spec_idct_values(coef.astype(np.int64), np.ones(64, dtype=np.int64))
    idct = lambda c: model.idct_islow(c, np.ones(64, dtype=np.int64))[0]  # noqa: E731
    got = ieee1180.signed_output(idct, coef)
    assert (got == np.clip(exact.reshape(got.shape), -256, 255)).all()
    assert (got < -128).any() and (got > 127).any()


@needs_verilator
def test_ieee1180_rtl(harness):
    """The standard's six runs of 10,000 blocks through the one-lane RTL; 2,000 per run
    for four lanes (same arithmetic units, slower to simulate; the full test is
    ``dlbooster bench idct``)."""
    idct = lambda coef: harness.transform(coef, np.ones(64, dtype=np.int64)).samples  # noqa: E731
    results = ieee1180.run(idct, 10000 if harness.lanes == 1 else 2000)
    _print_ieee(results, "RTL (Verilator)")
    assert len(results) == 6 and all(r.passed for r in results), [r.to_json() for r in results]
    assert ieee1180.zero_input_gives_zero(idct)


def _random_job(rng, n):
    """Blocks across the whole int16 range (values only corrupt files produce included,
    which must raise the range fault), realistic sparse blocks,
    DC-only and all-zero blocks; 8-bit, 16-bit and extreme quantisation tables."""
    blocks = rng.integers(-32768, 32768, (n, 64)).astype(np.int16)
    kind = rng.integers(0, 5, n)
    small = rng.integers(-64, 64, (n, 64)).astype(np.int16)
    sparse = np.where(rng.random((n, 64)) < 0.15, small, 0).astype(np.int16)
    blocks = np.where((kind == 1)[:, None], small, blocks)
    blocks = np.where((kind == 2)[:, None], sparse, blocks)
    blocks[kind == 3, 1:] = 0
    blocks[kind == 4] = 0
    blocks[::97] = np.int16(-32768)
    quant = [rng.integers(1, 256, 64), rng.integers(1, 32768, 64), np.full(64, 32767)]
    quant[0][0] = 1
    comps = rng.integers(0, 3, n)
    return blocks, quant, comps


@needs_verilator
@pytest.mark.parametrize("valid_percent,ready_percent", [(100, 100), (55, 100), (100, 35), (70, 60)])
def test_random_blocks_bit_exact(harness, valid_percent, ready_percent):
    rng = np.random.default_rng(valid_percent * 1000 + ready_percent)
    blocks, quant, comps = _random_job(rng, 3000)
    result = harness.transform(blocks, quant, comps, valid_percent=valid_percent,
                               ready_percent=ready_percent, seed=ready_percent)
    _assert_equal_to_model(result, blocks, quant, comps)
    assert result.range_fault.any() and not result.range_fault.all()


@needs_verilator
@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_sustains_lanes_rows_per_clock(lanes):
    """DC-only blocks arrive in two beats; the core must take one every 8 / lanes clocks
    (8 * lanes samples per clock), so with 4 lanes it keeps pace with the two beats."""
    from dlbooster.sim.harness import IdctHarness

    n = 400
    blocks = np.zeros((n, 64), dtype=np.int16)
    blocks[:, 0] = np.arange(n) % 200 - 100
    with IdctHarness(lanes) as harness:
        result = harness.transform(blocks, np.arange(1, 65))
    _assert_equal_to_model(result, blocks, [np.arange(1, 65)], np.zeros(n, dtype=np.int64))
    per_block = max(8 // lanes, 2)
    assert per_block * n <= result.cycles <= per_block * n + result.latency + 8
    assert result.latency <= 32


@needs_verilator
def test_two_rows_per_clock_bit_exact_with_exact_and_modular_passes():
    """The device's IDCT (two rows per clock) as the boards have it (each value in its
    range's width) and as the simulated device has it (passes modulo 2**48) on full-range
    random blocks under random gaps: both equal to the model, with the same range faults,
    and the same clocks."""
    from dlbooster.sim.harness import IdctHarness

    rng = np.random.default_rng(48)
    blocks, quant, comps = _random_job(rng, 1500)
    results = []
    for modular in (False, True):
        with IdctHarness(2, modular) as harness:
            results.append(harness.transform(blocks, quant, comps, valid_percent=70, ready_percent=60, seed=3))
        _assert_equal_to_model(results[-1], blocks, quant, comps)
    exact, modular = results
    assert modular.range_fault.any() and not modular.range_fault.all()
    assert (modular.range_fault == exact.range_fault).all() and modular.cycles == exact.cycles


def file_blocks(data: bytes):
    """Every block of a hardware-decodable JPEG: (blocks, quant, comps, model output)."""
    out = model.decode(data)
    info = out.info
    scan = info.scans[0]
    quant = [scan.qtables[c.tq] for c in info.frame.components]
    blocks = np.concatenate([g.reshape(-1, 64) for g in out.coefficients])
    comps = np.concatenate([np.full(g.shape[0] * g.shape[1], c) for c, g in enumerate(out.coefficients)])
    return blocks, quant, comps, out


def _check_file(harness, data: bytes, **kw):
    blocks, quant, comps, out = file_blocks(data)
    result = harness.transform(blocks, quant, comps, **kw)
    _assert_equal_to_model(result, blocks, quant, comps)
    assert not result.range_fault.any()
    start = 0
    for c, grid in enumerate(out.coefficients):
        bh, bw = grid.shape[:2]
        plane = result.samples[start:start + bh * bw].reshape(bh, bw, 8, 8)
        plane = plane.transpose(0, 2, 1, 3).reshape(bh * 8, bw * 8)
        rows, cols = out.samples[c].shape
        assert (plane[:rows, :cols] == out.samples[c]).all(), f"component {c} plane differs"
        start += bh * bw
    return result


GENERATED = [
    (40, 24, {"subsampling": 0, "quality": 100}),
    (33, 17, {"subsampling": 2, "quality": 1}),
    (48, 32, {"subsampling": 1, "quality": 75, "restart_blocks": 2}),
    (35, 27, {"subsampling": "440", "quality": 90}),
    (29, 31, {"subsampling": "gray", "quality": 50, "optimize": True}),
    (24, 24, {"subsampling": 2, "qtables": [[200 + 37 * i for i in range(64)]] * 2}),
    (64, 64, {"subsampling": 0, "qtables": [[1] * 64] * 2}),
]


@needs_verilator
@pytest.mark.parametrize("w,h,options", GENERATED, ids=[str(i) for i in range(len(GENERATED))])
def test_generated_file_blocks(harness, w, h, options):
    """Every block of Pillow-encoded photos (every sampling, quality 1..100, 16-bit DQT,
    all-ones tables) equals the model, whose samples equal Pillow's decode."""
    _check_file(harness, gen(w, h, **options), valid_percent=80, ready_percent=80)


def _corpus_files(rows):
    for r in rows:
        data = (CORPUS_DIR / r["path"]).read_bytes()
        info = jpeg.parse(data)
        if jpeg.classify(info) is not None:
            continue
        try:
            model.decode(data)
        except Exception:  # corrupt entropy data: the lane hands these to the CPU
            continue
        yield r["path"], data


@needs_verilator
def test_corpus_subset_blocks(harness):
    rows = feature_subset(hardware_candidates(corpus_rows()), cap=25 if harness.lanes == 1 else 8)
    if not rows:
        pytest.skip(f"corpus not present at {CORPUS_DIR}")
    checked = [path for path, data in _corpus_files(rows) if _check_file(harness, data)]
    assert len(checked) >= (10 if harness.lanes == 1 else 4)


@pytest.mark.corpus
@needs_verilator
def test_corpus_all_blocks(harness):
    rows = hardware_candidates(corpus_rows())
    if not rows:
        pytest.skip(f"corpus not present at {CORPUS_DIR}")
    checked = [path for path, data in _corpus_files(rows) if _check_file(harness, data)]
    assert len(checked) >= 500


def _cocotb_job(tmp_path, rng, *, ieee_count, random_count, valid_percent, ready_percent):
    coef = np.concatenate([ieee1180.offset_inputs(ieee1180.reference(
        ieee1180.input_blocks(low, high, ieee_count))[0]) for low, high in ieee1180.RANGES])
    blocks, quant, comps = _random_job(rng, random_count)
    blocks = np.concatenate([coef, blocks])
    comps = np.concatenate([np.zeros(len(coef), dtype=np.int64), comps])
    quant = np.stack([np.ones(64, dtype=np.int64), quant[1], quant[2]])
    job = tmp_path / "job.npz"
    np.savez(job, blocks=blocks, comps=comps, quant=quant, valid_percent=valid_percent,
             ready_percent=ready_percent, seed=7)
    return job, len(coef), blocks, quant, comps


def _run_cocotb(tmp_path, simulator, **kw):
    job, n_ieee, blocks, quant, comps = _cocotb_job(tmp_path, np.random.default_rng(4), **kw)
    out = tmp_path / f"out-{simulator}.npz"
    tests, failed, test_dir = run_cocotb(
        "idct", export_verilog(Idct(), "idct"), "dlbooster.sim.idct_tb", simulator=simulator,
        extra_env={"DLB_JOB": str(job), "DLB_OUT": str(out)})
    assert (tests, failed) == (1, 0), f"cocotb failures, see {test_dir / 'sim.log'}"
    got = np.load(out)
    expect, in_range = _model(blocks, quant, comps)
    assert (got["samples"][in_range] == expect[in_range]).all() and (got["range_fault"] == ~in_range).all()
    signed = ieee1180.combine(got["samples"][:n_ieee])
    assert signed.min() < -128 and signed.max() > 127


@pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
def test_idct_cocotb_verilator(tmp_path):
    _run_cocotb(tmp_path, "verilator", ieee_count=30, random_count=120, valid_percent=70,
                ready_percent=65)


@pytest.mark.skipif(not simulator_available("icarus"), reason="iverilog not installed")
def test_idct_cocotb_icarus(tmp_path):
    _run_cocotb(tmp_path, "icarus", ieee_count=8, random_count=40, valid_percent=80,
                ready_percent=70)


@pytest.mark.skipif(not simulator_available("icarus"), reason="iverilog not installed")
def test_a_cocotb_build_that_did_not_finish_is_made_again(tmp_path, monkeypatch):
    """A build killed while writing its product leaves a file newer than its sources,
    which make takes as up to date: without the finished mark, the folder is built anew
    (before, every later run failed with "cocotb wrote no results")."""
    monkeypatch.setenv("DLBOOSTER_CACHE", str(tmp_path / "cache"))   # a build no other run uses
    _run_cocotb(tmp_path, "icarus", ieee_count=2, random_count=4, valid_percent=80, ready_percent=70)
    [build] = [p.parent for p in (tmp_path / "cache" / "cocotb").glob("idct-icarus-*/build.done")]
    (build / "sim.vvp").write_bytes(b"#! /usr/")     # a partial product, newer than idct.v
    (build / "build.done").unlink()
    _run_cocotb(tmp_path, "icarus", ieee_count=2, random_count=4, valid_percent=80, ready_percent=70)
    assert (build / "build.done").exists() and (build / "sim.vvp").stat().st_size > 1000


@needs_verilator
@pytest.mark.parametrize("w,h,options", [(96, 64, {"subsampling": 2, "quality": 20}),
                                         (64, 48, {"subsampling": 0, "quality": 90}),
                                         (48, 40, {"subsampling": "gray", "quality": 5})])
def test_four_lanes_never_hold_up_the_entropy_decoder(w, h, options):
    """Entropy decoder -> IDCT (4 lanes): the entropy decoder finishes on the same clock
    as alone, even on low-quality files with few symbols per block, and every block's
    samples equal the model's."""
    from dlbooster.sim.harness import ChainHarness, EntropyHarness

    data = gen(w, h, **options)
    info = jpeg.parse(data)
    blocks, quant, comps, out = file_blocks(data)
    with EntropyHarness() as entropy, ChainHarness(0, 4) as chain:
        alone = entropy.decode(data, info)
        both = chain.decode(data, info)
    assert both.status == alone.status == 0
    assert both.done_cycles == alone.cycles
    assert alone.symbols < 8 * len(blocks) or options["quality"] >= 90
    order = model.block_order(info)
    assert (both.tags == order).all()
    expect, _ = _model(blocks, quant, comps)
    flat = {tuple(t): n for n, t in enumerate(zip(comps, *np.concatenate(
        [np.indices(g.shape[:2]).reshape(2, -1) for g in out.coefficients], axis=1)))}
    assert (both.samples == expect[[flat[tuple(t)] for t in order]]).all()
