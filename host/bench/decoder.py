"""Benchmarks behind ``dlbooster bench``.

Each benchmark prints a table and, with ``--json FILE``, writes the same figures as JSON.
Inputs default to the ImageNet sample photos of the shared corpus
(``../shared/corpus/imagenet-sample-images``, or ``$DLBOOSTER_CORPUS``).

- ``bench parse``: microseconds per file for :func:`dlbooster.jpeg.parse` +
  :func:`dlbooster.jpeg.classify` (the runtime's per-image pre-screen).
- ``bench decode``: images/s, microseconds per image and Mpixel/s of Pillow, the CPU
  backend and the reference model, one core, same files, same run.
- ``bench entropy``: the entropy decoder core in cycle-accurate simulation (Verilator,
  C++ harness): symbols, clocks, symbols/clock and coded bytes/clock per file and in
  total, every coefficient and status checked against the reference model.
- ``bench idct``: the IDCT core in cycle-accurate simulation (Verilator) for each
  ``--lanes`` value: the IEEE 1180-1990 test on the RTL, latency and clocks per block
  (dense and DC-only blocks), and, on photos, the entropy decoder feeding the IDCT
  against the entropy decoder alone (does the IDCT ever hold it up?), every block's
  samples checked against the reference model.
- ``bench lane``: the whole decoder lane (header parser to RGB) in cycle-accurate
  simulation (Verilator): clocks per output pixel per file and by subsampling, every
  image checked byte for byte against Pillow. ``--all`` also runs the files the
  hardware profile excludes and judges each outcome (:mod:`dlbooster.sim.verify`:
  the expected stop, a clock bound from the file size, no pixels past W x H).
- ``bench device``: the simulated decoder device (:mod:`dlbooster.sim.device`) through
  the host driver, for each ``--lanes`` value: simulated device clocks per second of
  wall time (one core), images/s of simulated decode, device clocks per image and the
  images/s the same clocks give at 250 MHz; every image checked against Pillow.
  ``--no-clock-gating`` runs the boards' design without the simulation build's clock gates.
- ``bench host`` and ``bench loader``: the runtime (:mod:`dlbooster.bench.runtime`).
- ``bench backward``: training iteration time with autograd and with the split backward
  schedule (:mod:`dlbooster.bench.train`); needs no input files.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter

import numpy as np

from dlbooster import jpeg
from dlbooster.backends import CpuBackend, ModelBackend, decode_pillow
from dlbooster.bench.common import Refused, by_subsampling, machine
from dlbooster.errors import DlboosterError, Malformed
from dlbooster.jpeg import classify, ieee1180, model, parse

__all__ = ["bench_parse", "bench_decode", "bench_entropy", "bench_idct", "bench_lane", "bench_device"]


def bench_parse(files: list[tuple[str, bytes]], repeat: int) -> dict:
    """Best-of-``repeat`` microseconds per file for two uses of the parser: the full
    structure parse (every marker, the entropy-coded segments scanned for RSTn and
    their end) and the runtime's pre-screen (``headers_only``: up to the first SOS)."""
    def best_us(data: bytes, headers_only: bool) -> float:
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter_ns()
            classify(parse(data, headers_only=headers_only))
            best = min(best, time.perf_counter_ns() - t0)
        return best / 1000

    reasons: dict[str, int] = {}
    for _, data in files:
        reason = str(classify(parse(data)))
        reasons[reason] = reasons.get(reason, 0) + 1
    result = {"benchmark": "parse+classify", "files": len(files),
              "bytes_mean": statistics.fmean(len(d) for _, d in files), "classification": reasons}
    for mode, headers_only in (("full", False), ("prescreen", True)):
        per_file = sorted(best_us(data, headers_only) for _, data in files)
        result[mode] = {
            "us_mean": statistics.fmean(per_file),
            "us_median": statistics.median(per_file),
            "us_p95": per_file[-(-95 * len(per_file) // 100) - 1],       # nearest rank
            "us_max": per_file[-1],
        }
    return {**result, **machine()}


def bench_decode(files: list[tuple[str, bytes]], backends: list[str]) -> dict:
    decoders = {"pillow": decode_pillow, "cpu": CpuBackend().decode, "model": ModelBackend().decode}
    timed: dict[str, dict[int, tuple[float, int]]] = {}
    shared = set(range(len(files)))
    for name in backends:
        decode = decoders[name]
        for _, data in files[:2]:  # warm-up (numba compiles on first use)
            try:
                decode(data)
            except DlboosterError:
                pass
        timed[name] = {}
        for i, (_, data) in enumerate(files):
            t0 = time.perf_counter()
            try:
                image = decode(data)
            except DlboosterError:
                continue
            timed[name][i] = (time.perf_counter() - t0, image.shape[0] * image.shape[1])
        # Rates over the images every backend decodes, so that the rows compare the same
        # work; refused as soon as no image is left, before the other backends run.
        shared &= set(timed[name])
        if not shared:
            raise Refused(f"dlbooster bench decode: no input of the {len(files)} decodes with every one of "
                          f"{', '.join(backends[:len(timed)])}")
    rows = []
    for name, times in timed.items():
        elapsed = sum(times[i][0] for i in shared)
        pixels = sum(times[i][1] for i in shared)
        rows.append({
            "backend": name, "images": len(shared), "decoded": len(times), "declined": len(files) - len(times),
            "seconds": elapsed, "us_per_image": 1e6 * elapsed / len(shared),
            "images_per_s": len(shared) / elapsed if elapsed else 0.0,
            "mpixel_per_s": pixels / elapsed / 1e6 if elapsed else 0.0,
        })
    return {"benchmark": "decode, one core", "files": len(files), "results": rows, **machine()}


def bench_entropy(files: list[tuple[str, bytes]], ready_percent: int) -> dict:
    from dlbooster.sim.harness import EntropyHarness, blocks_from_beats

    rows = []
    usable = [(path, data, info) for path, data in files
              if jpeg.classify(info := jpeg.parse(data)) is None]
    if not usable:
        raise Refused(f"dlbooster bench entropy: none of the {len(files)} inputs is in the hardware profile "
                      f"(baseline or extended sequential JPEG, SPEC.md section 2)")
    t0 = time.perf_counter()
    sim_s = 0.0                   # the harness's decodes alone, not the model's checks
    with EntropyHarness() as harness:
        for path, data, info in usable:
            start = time.perf_counter()
            result = harness.decode(data, info, ready_percent=ready_percent)
            sim_s += time.perf_counter() - start
            try:
                blocks, symbols = model.entropy_decode(data, info)
                expect = 0
            except Malformed as exc:
                blocks, symbols, expect = None, None, model.REASON_STATUS[exc.reason]
            same = result.status == expect
            if same and blocks is not None:
                try:
                    grids, tags = blocks_from_beats(result.beats, [b.shape[:2] for b in blocks])
                except ValueError:
                    same = False
                else:
                    same = (result.symbols == symbols
                            and np.array_equal(tags, model.block_order(info))
                            and all((g == b).all() for g, b in zip(grids, blocks)))
            scan = info.scans[0]
            rows.append({
                "path": path, "subsampling": info.subsampling, "status": result.status,
                "matches_model": bool(same), "symbols": result.symbols, "cycles": result.cycles,
                "bytes": scan.data_end - scan.data_start,
                "symbols_per_clock": result.symbols / max(result.cycles, 1),
                "bytes_per_clock": (scan.data_end - scan.data_start) / max(result.cycles, 1),
            })
    wall = time.perf_counter() - t0
    clean = [r for r in rows if r["status"] == 0]
    groups = by_subsampling(clean)

    def total(rs):
        symbols, cycles = sum(r["symbols"] for r in rs), sum(r["cycles"] for r in rs)
        return {"files": len(rs), "symbols": symbols, "cycles": cycles,
                "symbols_per_clock": symbols / max(cycles, 1),
                "bytes_per_clock": sum(r["bytes"] for r in rs) / max(cycles, 1)}

    return {
        "benchmark": "entropy decoder core, Verilator", "ready_percent": ready_percent,
        "files": len(rows), "faulty_streams": len(rows) - len(clean),
        "model_mismatches": sum(not r["matches_model"] for r in rows),
        "simulated_clocks_per_s": sum(r["cycles"] for r in rows) / max(sim_s, 1e-9),
        "wall_s": wall, "simulation_s": sim_s,
        "totals": {k: total(v) for k, v in groups.items()}, "per_file": rows, **machine(),
    }


def bench_idct(files: list[tuple[str, bytes]], lanes_list: list[int], ieee_blocks: int) -> dict:
    from dlbooster.sim.harness import ChainHarness, EntropyHarness, IdctHarness

    hw_files = []
    for path, data in files:
        info = jpeg.parse(data)
        if jpeg.classify(info) is not None:
            continue
        try:
            out = model.decode(data)
        except Exception:  # the lane hands corrupt entropy data to the CPU
            continue
        hw_files.append((path, data, info, out))
    if not hw_files:
        raise Refused(f"dlbooster bench idct: none of the {len(files)} inputs is in the hardware profile and "
                      f"decodes (SPEC.md section 2)")
    entropy_cycles = {}
    with EntropyHarness() as harness:
        for path, data, info, _ in hw_files:
            entropy_cycles[path] = harness.decode(data, info).cycles
    configs = []
    for lanes in lanes_list:
        t0 = time.perf_counter()
        config = {"lanes": lanes, "samples_per_clock": 8 * lanes}
        with IdctHarness(lanes) as harness:
            if ieee_blocks:
                one = np.ones(64, dtype=np.int64)
                results = ieee1180.run(lambda c: harness.transform(c, one).samples, ieee_blocks)
                config["ieee1180"] = {"blocks_per_run": ieee_blocks,
                                      "passed": all(r.passed for r in results)
                                      and ieee1180.zero_input_gives_zero(
                                          lambda c: harness.transform(c, one).samples),
                                      "runs": [r.to_json() for r in results]}
            rng = np.random.default_rng(0)
            dense = rng.integers(-64, 64, (2000, 64)).astype(np.int16)
            dc_only = np.zeros((2000, 64), dtype=np.int16)
            dc_only[:, 0] = rng.integers(-100, 100, 2000)
            for name, blocks in (("dense_64_beats", dense), ("dc_only_2_beats", dc_only)):
                r = harness.transform(blocks, np.ones(64, dtype=np.int64))
                config[name] = {"blocks": len(blocks), "cycles": r.cycles,
                                "clocks_per_block": r.cycles / len(blocks), "latency": r.latency}
        rows = []
        with ChainHarness(0, lanes) as chain:
            for path, data, info, out in hw_files:
                r = chain.decode(data, info)
                order = model.block_order(info)
                same = r.status == 0 and np.array_equal(r.tags, order)
                if same:
                    for c, grid in enumerate(out.coefficients):
                        sel = order[:, 0] == c
                        expect = model.idct_islow(grid[order[sel, 1], order[sel, 2]],
                                                  info.scans[0].qtables[info.frame.components[c].tq])[0]
                        same = same and bool((r.samples[sel] == expect).all())
                rows.append({"path": path, "subsampling": info.subsampling, "blocks": len(order),
                             "symbols": r.symbols, "entropy_alone": entropy_cycles[path],
                             "entropy_done": r.done_cycles, "cycles": r.cycles,
                             "stall_ratio": r.done_cycles / max(entropy_cycles[path], 1),
                             "matches_model": bool(same)})
        groups = by_subsampling(rows)
        config["photos"] = {k: {
            "files": len(v), "blocks": sum(x["blocks"] for x in v),
            "symbols_per_block": sum(x["symbols"] for x in v) / max(sum(x["blocks"] for x in v), 1),
            "entropy_alone": sum(x["entropy_alone"] for x in v),
            "entropy_done": sum(x["entropy_done"] for x in v),
            "with_idct": sum(x["cycles"] for x in v),
            "slowdown": sum(x["entropy_done"] for x in v) / max(sum(x["entropy_alone"] for x in v), 1),
            "worst_file_slowdown": max(x["stall_ratio"] for x in v),
            "files_held_up": sum(x["entropy_done"] > x["entropy_alone"] for x in v),
        } for k, v in groups.items()}
        config["model_mismatches"] = sum(not x["matches_model"] for x in rows)
        config["per_file"] = rows
        config["wall_s"] = time.perf_counter() - t0
        configs.append(config)
    return {"benchmark": "IDCT core, Verilator", "files": len(hw_files), "configs": configs,
            **machine()}


def bench_lane(files: list[tuple[str, bytes]], max_width: int, every_file: bool = False) -> dict:
    from dlbooster.sim.harness import LaneHarness
    from dlbooster.sim.verify import verify_lane

    if not any(data for _, data in files):
        raise Refused(f"dlbooster bench lane: none of the {len(files)} inputs has any bytes")
    if not every_file and not any(data and jpeg.classify(jpeg.parse(data), max_width=max_width) is None
                                  for _, data in files):
        raise Refused(f"dlbooster bench lane: none of the {len(files)} inputs is in the hardware profile at "
                      f"--max-width {max_width} (SPEC.md section 2; --all runs them anyway)")
    rows = []
    t0 = time.perf_counter()
    sim_s = 0.0
    empty = 0
    with LaneHarness(max_width) as lane:
        for path, data in files:
            if not data:     # a lane takes no file without bytes (the device rejects them)
                empty += 1
                continue
            info = jpeg.parse(data)
            if not every_file and jpeg.classify(info, max_width=max_width) is not None:
                continue
            t1 = time.perf_counter()
            result = lane.decode(data)
            sim_s += time.perf_counter() - t1
            verdict = verify_lane(result, data, max_width)
            pixels = result.width * result.height
            rows.append({"path": path, "subsampling": info.subsampling, "bytes": len(data),
                         "status": result.status, "status_reason": verdict.status_reason,
                         "expect": verdict.expect, "reason": verdict.reason, "passed": verdict.ok,
                         "detail": verdict.detail, "pixels": pixels, "cycles": result.cycles,
                         "clocks_per_pixel": result.cycles / max(pixels, 1),
                         "equals_pillow": verdict.equals_pillow})
    wall = time.perf_counter() - t0
    groups = by_subsampling([r for r in rows if r["expect"] == "decode" and r["status"] == 0])
    totals = {k: {"files": len(v), "pixels": sum(r["pixels"] for r in v),
                  "cycles": sum(r["cycles"] for r in v),
                  "clocks_per_pixel": sum(r["cycles"] for r in v) / max(sum(r["pixels"] for r in v), 1),
                  "mean_file_clocks_per_pixel": statistics.fmean(r["clocks_per_pixel"] for r in v) if v else 0.0}
              for k, v in groups.items()}
    outcomes = {}
    for r in rows:
        o = outcomes.setdefault(r["expect"], {"files": 0, "passed": 0, "statuses": {}})
        o["files"] += 1
        o["passed"] += r["passed"]
        key = f"{r['reason'] or 'ok'} -> {r['status_reason'] or ('ok' if r['status'] == 0 else hex(r['status']))}"
        o["statuses"][key] = o["statuses"].get(key, 0) + 1
    return {"benchmark": "decoder lane, Verilator", "max_width": max_width, "files": len(rows),
            "every_file": every_file, "empty_files_skipped": empty,
            "failed": sum(not r["passed"] for r in rows),
            "stopped": sum(r["status"] != 0 for r in rows),
            "differ_from_pillow": sum(r["equals_pillow"] is False for r in rows),
            "simulated_clocks_per_s": sum(r["cycles"] for r in rows) / max(sim_s, 1e-9),
            "wall_s": wall, "simulation_s": sim_s, "outcomes": outcomes, "totals": totals, "per_file": rows, **machine()}


def bench_device(files: list[tuple[str, bytes]], lanes_list: list[int], max_width: int,
                 clock_gating: bool = True) -> dict:
    """The hardware-decodable files (pre-screen and classify pass) through the simulated
    device, all queued at once, per lane count; ``clock_gating`` False builds the device
    without the simulation's clock gates (:class:`dlbooster.sim.device.SimTransport`)."""
    from dlbooster.device.driver import DecoderDevice
    from dlbooster.sim.device import SimTransport

    items, names = [], []
    for path, data in files:
        info = jpeg.parse(data)
        if data and jpeg.classify(info, max_width=max_width) is None:
            items.append((data, info.frame.width * info.frame.height * 3))
            names.append(path)
    if not items:
        raise Refused(f"dlbooster bench device: none of the {len(files)} inputs is in the hardware profile at "
                      f"--max-width {max_width} (SPEC.md section 2)")
    configs = []
    for lanes in lanes_list:
        with SimTransport(lanes=lanes, max_width=max_width, clock_gating=clock_gating) as sim:
            device = DecoderDevice(sim)
            device.start()
            before = sim.counters()
            t0 = time.perf_counter()
            outcomes = device.decode_batch(items)
            wall = time.perf_counter() - t0
            clocks = sim.counters()["clocks"] - before["clocks"]
        differ = sum(o.image is None or not (o.image == decode_pillow(data)).all()
                     for o, (data, _) in zip(outcomes, items))
        job_clocks = [o.completion.clocks for o in outcomes]
        pixels = sum(cap // 3 for _, cap in items)
        configs.append({"lanes": lanes, "images": len(items), "pixels": pixels, "device_clocks": clocks,
                        "wall_s": wall, "simulated_clocks_per_s": clocks / wall, "images_per_s": len(items) / wall,
                        "mean_job_clocks": statistics.fmean(job_clocks) if job_clocks else 0.0,
                        "device_clocks_per_image": clocks / max(len(items), 1),
                        "images_per_s_at_250mhz": 250e6 * len(items) / max(clocks, 1),
                        "statuses": {str(k): v for k, v in sorted(
                            Counter(o.completion.status for o in outcomes).items())},
                        "differ_from_pillow": differ,
                        "lanes_used": len({o.completion.lane for o in outcomes})})
    return {"benchmark": "simulated decoder device (Verilator, C++ memory model)", "max_width": max_width,
            "clock_gating": clock_gating, "files": names, "configs": configs, **machine()}
