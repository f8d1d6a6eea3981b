"""cocotb tests of the entropy decoder core on the generated Verilog (Verilator, Icarus).

Each vector is decoded by the core and compared with the reference model's coefficient
stage (``sim/entropy_tb.py`` states the checks). Vectors: generated JPEGs covering every
sampling, quality extremes, restart intervals, optimised tables, 16-bit quantisation
tables, tiny and odd sizes; corrupt mutations of them (bit flips, truncation, inserted
markers, wrong RSTn, random bytes); and a small feature-covering subset of the shared
corpus when present. ``pytest -m corpus`` runs every hardware-decodable corpus file.
"""

from __future__ import annotations

import json
import random

import pytest

from dlbooster import jpeg
from dlbooster.hw.entropy import EntropyDecoder
from dlbooster.sim.flow import export_verilog, run_cocotb, simulator_available

from jpegtools import CORPUS_DIR, EncoderRefused, corpus_available, make_jpeg, one_code_tables_jpeg

GENERATED = [
    # (width, height, options)
    (1, 1, {"subsampling": 2, "quality": 75}),
    (8, 8, {"subsampling": 0, "quality": 100}),
    (7, 9, {"subsampling": 1, "quality": 1}),
    (17, 33, {"subsampling": 2, "quality": 95}),
    (33, 17, {"subsampling": "440", "quality": 80}),
    (23, 19, {"subsampling": "gray", "quality": 60}),
    (40, 24, {"subsampling": 2, "quality": 85, "restart_blocks": 1}),
    (48, 32, {"subsampling": 0, "quality": 70, "restart_rows": 1}),
    (35, 27, {"subsampling": 1, "quality": 90, "restart_blocks": 3}),
    (64, 48, {"subsampling": 2, "quality": 50, "optimize": True}),
    (31, 15, {"subsampling": "gray", "quality": 95, "restart_blocks": 2}),
    (24, 24, {"subsampling": 0, "qtables": [[300 + (i % 7) for i in range(64)]] * 2}),
]


def _mutations(data: bytes, rng: random.Random) -> list[bytes]:
    info = jpeg.parse(data)
    scan = info.scans[0]
    start, end = scan.data_start, scan.data_end
    out = []
    for _ in range(3):  # bit flips inside the entropy-coded data
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(start, end)
            buf[pos] ^= 1 << rng.randrange(8)
        out.append(bytes(buf))
    cut = start + (end - start) // 2
    out.append(data[:cut] + data[end:])                                  # truncated, EOI kept
    out.append(data[:cut] + b"\xff\xd3" + data[cut:])                    # marker mid-scan
    out.append(data[:start] + bytes(rng.randrange(256) for _ in range(end - start)) + data[end:])
    rst = data.find(b"\xff\xd0", start, end)
    if rst >= 0:
        out.append(data[:rst + 1] + b"\xd5" + data[rst + 2:])            # wrong RSTn
    return [m for m in out if jpeg.classify(jpeg.parse(m)) is None]


@pytest.fixture(scope="module")
def vectors(tmp_path_factory):
    folder = tmp_path_factory.mktemp("entropy_vectors")
    rng = random.Random(3)
    files = []
    for i, (w, h, options) in enumerate(GENERATED):
        try:
            data = make_jpeg(w, h, **options)
        except EncoderRefused:
            continue
        assert jpeg.classify(jpeg.parse(data)) is None, (w, h, options)
        files.append((f"gen{i}", data))
        if i % 3 == 0:
            files += [(f"gen{i}_bad{j}", m) for j, m in enumerate(_mutations(data, rng))]
    one_code = one_code_tables_jpeg()
    assert jpeg.classify(jpeg.parse(one_code)) is None
    files.insert(len(files) // 2, ("one_code_tables", one_code))
    if corpus_available():
        files += [(p.name, p.read_bytes()) for p in _corpus_subset()]
    paths = []
    for name, data in files:
        path = folder / f"{name}.jpg"
        path.write_bytes(data)
        paths.append(path)
    return paths


def _corpus_subset(max_bytes: int = 6000, per_kind: int = 1) -> list:
    """Small hardware-decodable corpus files: a few per (subsampling, restart, source)."""
    seen: dict[tuple, int] = {}
    picked = []
    for path in sorted(p for p in CORPUS_DIR.rglob("*") if p.is_file()):
        if path.suffix in (".tsv", ".md", ".json") or path.stat().st_size > max_bytes:
            continue
        data = path.read_bytes()
        info = jpeg.parse(data)
        if jpeg.classify(info) is not None:
            continue
        key = (info.subsampling, info.scans[0].restart_interval > 0, path.parts[len(CORPUS_DIR.parts)])
        if seen.get(key, 0) < per_kind:
            seen[key] = seen.get(key, 0) + 1
            picked.append(path)
    return picked


@pytest.fixture(scope="module")
def verilog():
    return export_verilog(EntropyDecoder(), "entropy_decoder")


def _run(verilog, paths, tmp_path, simulator, backpressure_every=2):
    manifest = tmp_path / f"vectors-{simulator}.json"
    manifest.write_text(json.dumps([{"path": str(p), "backpressure": i % backpressure_every == 1}
                                    for i, p in enumerate(paths)]))
    report = tmp_path / f"report-{simulator}.json"
    tests, failed, test_dir = run_cocotb(
        "entropy_decoder", verilog, "dlbooster.sim.entropy_tb", simulator=simulator,
        extra_env={"DLB_VECTORS": str(manifest), "DLB_REPORT": str(report)})
    assert (tests, failed) == (1, 0), f"cocotb failures, see {test_dir / 'sim.log'}"
    return json.loads(report.read_text())


@pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
def test_entropy_core_verilator(verilog, vectors, tmp_path):
    results = _run(verilog, vectors, tmp_path, "verilator")
    assert len(results) == len(vectors)
    statuses = {r["status"] for r in results}
    assert 0 in statuses and statuses - {0}, "vectors must include clean and faulty streams"
    assert all(r["blocks"] > 0 and r["symbols"] >= r["blocks"] for r in results if r["status"] == 0)


@pytest.mark.skipif(not simulator_available("icarus"), reason="iverilog not installed")
def test_entropy_core_icarus(verilog, vectors, tmp_path):
    generated = [p for p in vectors if p.name.startswith("gen")][:14]
    results = _run(verilog, generated, tmp_path, "icarus")
    assert [r["path"] for r in results] == [str(p) for p in generated]


def _harness_check(paths, ready_percent: int) -> list[dict]:
    """Decode through the C++ harness; every result must equal the model's."""
    from dlbooster.bench.decoder import bench_entropy

    result = bench_entropy([(str(p), p.read_bytes()) for p in paths], ready_percent)
    assert result["model_mismatches"] == 0, [r["path"] for r in result["per_file"]
                                              if not r["matches_model"]]
    # The simulation speed counts the harness's decodes only, not the model's checks.
    assert 0 < result["simulation_s"] < result["wall_s"]
    assert result["simulated_clocks_per_s"] == pytest.approx(
        sum(r["cycles"] for r in result["per_file"]) / result["simulation_s"])
    return result["per_file"]


@pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
def test_entropy_core_harness_with_backpressure(vectors):
    rows = _harness_check(vectors, ready_percent=60)
    assert len(rows) == len(vectors)
    assert {r["status"] for r in rows} - {0}, "faulty vectors must report a fault"


@pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
def test_a_built_harness_is_found_without_elaborating(monkeypatch):
    """The harness index finds a finished build from the gateware's sources alone: no
    elaboration and Yosys flattening (tens of seconds for a lane) before each run."""
    from dlbooster.sim import harness

    built = harness.build_entropy_harness()

    def no_export(*args, **kwargs):
        raise AssertionError("the design was elaborated again")
    monkeypatch.setattr(harness, "export_flat_verilog", no_export)
    assert harness.build_entropy_harness() == built


@pytest.mark.corpus
@pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
def test_entropy_core_full_corpus():
    if not corpus_available():
        pytest.skip(f"corpus not present at {CORPUS_DIR}")
    paths = [p for p in sorted(CORPUS_DIR.rglob("*")) if p.is_file()
             and p.suffix not in (".tsv", ".md", ".json")
             and jpeg.classify(jpeg.parse(p.read_bytes())) is None]
    rows = _harness_check(paths, ready_percent=100)
    assert len(rows) == len(paths)
