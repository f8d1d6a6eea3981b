"""``dlbooster.Loader`` on inputs that fail and arguments that are wrong.

An input is an error exactly where Pillow raises on it. Covers: each sample's outcome
(``error`` with reason ``unreadable`` or ``undecodable``, ``fallback`` with the
pre-screen's reason), the pre-screen keeping inputs outside the hardware profile off
the device, files of 4 GiB or more, declared frames of 65535 x 65535, special files
(FIFOs, /dev/zero); the ``on_error`` policies ``skip``, ``raise`` (DecodeError naming
the sample) and ``replace``; ValueError and TypeError for arguments at construction,
before any backend is made; and the epoch's report, stats (images/s, host cores, lane
busy fractions), progress bar and skip log.
"""

from __future__ import annotations

import logging
import os
import pickle
import resource
import time

import numpy as np
import pytest
from PIL import Image

from dlbooster.errors import DecodeError

from jpegtools import gen
from loader_helpers import bad_inputs, drain, make_loader, patch_sof, pillow_file, tiny_files, write


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory):
    return bad_inputs(tmp_path_factory.mktemp("bad"))


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    return tiny_files(tmp_path_factory.mktemp("tiny"))


# ---------------------------------------------------------------------------------
# Bad inputs: outcomes, the pre-screen's verdicts, huge, large and special files


def test_the_pre_screen_keeps_inputs_outside_the_profile_off_the_device(bad_dir, tmp_path):
    """Inputs whose headers put them outside the hardware profile (not a JPEG, CMYK,
    progressive, 12-bit, wider than the device) cost no device job: they go to the CPU
    path with the header classification's reason, and only inputs whose headers are in
    the profile become jobs."""
    from dlbooster.device.instant import InstantBackend, InstantTransport

    wide = write(tmp_path / "wide.jpg", gen(72, 8, subsampling=0))
    paths = {**bad_dir, "wide": wide}
    transport = InstantTransport(lanes=2, job_depth=4, max_width=64)
    for name in ("good", "good_odd"):
        transport.learn(paths[name].read_bytes(), pillow_file(str(paths[name]))[0])
    source = [(str(path), n) for n, path in enumerate(paths.values())]
    with make_loader(source, 3, backend=InstantBackend(transport), slot_pixels=80 * 64, on_error="skip") as loader:
        batches = drain(loader)
        outcomes = {o.path: o for b in batches for o in b.outcomes}
        assert loader.report.accounted == len(source)
        for name, reason in {"png": "not-jpeg", "gif": "not-jpeg", "cmyk": "components",
                             "progressive": "progressive", "wide": "width"}.items():
            outcome = outcomes[str(paths[name])]
            assert (outcome.status, outcome.reason, outcome.detail) == ("fallback", reason, "host pre-screen"), name
        # 12-bit and 65535 x 65535: kept off the device too; Pillow fails on both, so the
        # outcome is Pillow's error.
        for name in ("precision12", "huge"):
            assert outcomes[str(paths[name])].status == "error", name
        for name in ("good", "good_odd"):
            assert str(paths[name]) not in outcomes, name
        assert loader.service.stats.jobs == len(
            {"good", "good_odd", "truncated", "truncated_entropy_eoi", "corrupt_entropy"})


def test_a_kept_verdict_follows_pillows_pixel_limit(tmp_path, monkeypatch):
    """The pre-screen's verdict is kept per file across epochs, but a file Pillow's pixel
    limit refuses (``too-large``) must fail where Pillow fails: lowering
    ``Image.MAX_IMAGE_PIXELS`` between epochs sends it to the CPU path, which raises
    Pillow's error, instead of the device decoding it by the verdict of the old limit."""
    from dlbooster.device.instant import InstantBackend, InstantTransport

    path = write(tmp_path / "a.jpg", gen(64, 64, subsampling=2))
    transport = InstantTransport(lanes=1, job_depth=2)
    transport.learn(path.read_bytes(), pillow_file(str(path))[0])
    with make_loader([(str(path), 0)], 1, backend=InstantBackend(transport), slot_pixels=64 * 64,
                     on_error="skip") as loader:
        assert [b.indices.tolist() for b in loader] == [[0]] and loader.stats().outcomes == {"ok": 1}
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)        # errors above 2,000 pixels
        assert [b.indices.tolist() for b in loader] == [[]]
        [skipped] = loader.report.skipped
        assert (skipped.status, skipped.reason) == ("error", "undecodable")
        assert "DecompressionBombError" in skipped.detail
        assert loader.service.stats.jobs == 1
        monkeypatch.undo()
        assert [b.indices.tolist() for b in loader] == [[0]] and loader.stats().outcomes == {"ok": 1}


@pytest.mark.parametrize("backend", ["cpu", "model"])
def test_files_of_4_gib_or_more_are_decoded_from_the_file(backend, tmp_path):
    """Sparse files of LARGE_FILE bytes (a 60 GB one was read whole, and failed with a
    MemoryError): never read into memory; Pillow decodes them from the file, so a JPEG
    followed by zeros is Pillow's image and zeros alone are Pillow's error."""
    from dlbooster.backends import LARGE_FILE

    head = gen(40, 24, subsampling=2, quality=80)
    big, zeros = write(tmp_path / "big.jpg", head), write(tmp_path / "zeros.jpg", b"")
    os.truncate(big, LARGE_FILE + 5)
    os.truncate(zeros, LARGE_FILE)
    good = write(tmp_path / "good.jpg", gen(16, 16, subsampling=0))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss        # KiB on Linux
    with make_loader([(str(big), 0), (str(zeros), 1), (str(good), 2)], 3, backend=backend,
                     on_error="skip") as loader:
        (batch,) = drain(loader)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 256 * 1024
    assert batch.indices.tolist() == [0, 2] and batch.labels.tolist() == [0, 2]
    assert tuple(batch.sizes[0].tolist()) == (24, 40)
    assert np.array_equal(batch.images[0, :, :24, :40].permute(1, 2, 0).numpy(), pillow_file(big)[0])
    (skipped,) = loader.report.skipped
    assert (skipped.index, skipped.status, skipped.reason) == (1, "error", "undecodable")
    assert "cannot identify image file" in skipped.detail
    unusual = [(o.index, o.status, o.reason, o.backend) for o in batch.outcomes]
    assert unusual == ([] if backend == "cpu" else [(0, "fallback", "input-size", "cpu")]) + [
        (1, "error", "undecodable", None)]


@pytest.mark.timeout(120)       # a hang guard: three headers are rejected at once
def test_huge_declared_frame_is_an_error_without_a_huge_buffer(tmp_path):
    data = patch_sof(gen(16, 16, subsampling=0, quality=80), width=65535, height=65535)
    path = write(tmp_path / "huge.jpg", data)
    _, pillow_exc = pillow_file(path)
    assert type(pillow_exc).__name__ == "DecompressionBombError"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss        # KiB on Linux
    with make_loader([(str(path), 0)] * 3, 2, backend="cpu", slot_pixels=64 * 64) as loader:
        batches = drain(loader)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
    assert grown < 256 * 1024, f"peak RSS grew by {grown} KiB"
    assert [len(b.indices) for b in batches] == [0, 0]
    assert tuple(batches[0].images.shape) == (0, 3, 0, 0)
    outcomes = [o for b in batches for o in b.outcomes]
    assert [(o.status, o.reason) for o in outcomes] == [("error", "undecodable")] * 3
    assert all("DecompressionBombError" in o.detail and o.path == str(path) for o in outcomes)
    assert loader.report.accounted == loader.report.positions == 3


@pytest.mark.timeout(120)       # a hang guard: a FIFO blocks a plain open() for ever
def test_special_files_are_unreadable_not_read(tmp_path):
    good = write(tmp_path / "c" / "good.jpg", gen(16, 16))
    (tmp_path / "c" / "zero.jpg").symlink_to("/dev/zero")
    fifo = tmp_path / "c" / "fifo.jpg"
    __import__("os").mkfifo(fifo)
    with make_loader(str(tmp_path), 4, backend="cpu") as loader:
        (batch,) = drain(loader)
        assert [loader.samples[i].path for i in batch.indices.tolist()] == [str(good)]
        assert sorted((o.path.rsplit("/", 1)[1], o.reason, o.detail) for o in loader.report.skipped) == [
            ("fifo.jpg", "unreadable", "not a regular file"), ("zero.jpg", "unreadable", "not a regular file")]


# ---------------------------------------------------------------------------------
# Policies: on_error='raise' and 'replace'


def test_policy_raise_names_the_path(bad_dir):
    source = [(str(bad_dir[name]), i) for i, name in enumerate(("good", "png", "empty", "good_odd", "huge"))]
    with make_loader(source, 2, backend="cpu", on_error="raise") as loader:
        it = iter(loader)
        first = next(it)
        assert first.indices.tolist() == [0, 1] and first.outcomes == []
        with pytest.raises(DecodeError) as err:
            next(it)
        assert str(bad_dir["empty"]) in str(err.value)
        assert err.value.source == str(bad_dir["empty"]) and err.value.reason == "undecodable"
        assert err.value.index == 2 and str(err.value).startswith(f"sample 2: {bad_dir['empty']}: undecodable")
        copy = pickle.loads(pickle.dumps(err.value))
        assert (copy.index, copy.source, copy.reason, str(copy)) == (2, err.value.source, "undecodable",
                                                                     str(err.value))
        # The abandoned epoch gave every buffer back; the next epoch stops at the same input.
        assert loader.pool.free == loader.pool.depth
        with pytest.raises(DecodeError, match="empty"):
            drain(loader)
        assert loader.pool.free == loader.pool.depth


def test_policy_replace(bad_dir):
    names = ("missing", "good", "truncated", "cmyk", "huge")
    source = [(str(bad_dir[name]), 10 + i) for i, name in enumerate(names)]
    calls = []

    def replace(index, outcome):
        calls.append((index, outcome.path, outcome.status))
        return np.full((5, 7, 3), index, np.uint8)

    with make_loader(source, 2, backend="cpu", on_error="replace", replace=replace) as loader:
        batches = drain(loader)
    assert sorted(calls) == [(0, source[0][0], "error"), (2, source[2][0], "error"), (4, source[4][0], "error")]
    assert [b.indices.tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    for batch in batches:
        assert batch.labels.tolist() == [10 + i for i in batch.indices.tolist()]
        for i, index in enumerate(batch.indices.tolist()):
            h, w = batch.sizes[i].tolist()
            got = batch.images[i][:, :h, :w].permute(1, 2, 0).numpy()
            if index in (0, 2, 4):
                assert (h, w) == (5, 7) and (got == index).all()
            else:
                assert np.array_equal(got, pillow_file(source[index][0])[0])
    assert [o.path for b in batches for o in b.outcomes] == [source[0][0], source[2][0], source[4][0]]
    report = loader.report
    assert (report.replaced, report.delivered, report.skipped) == (3, 2, [])
    assert report.accounted == report.positions == 5


def test_replace_returning_junk_names_the_input_and_counts_nothing(bad_dir):
    source = [(str(p), 0) for p in sorted(bad_dir.values())] if isinstance(bad_dir, dict) else bad_dir
    for junk in (np.full((4, 4, 3), 300.7), None, np.zeros((0, 0, 3), np.uint8)):
        with make_loader(source, 64, backend="cpu", on_error="replace",
                         replace=lambda index, outcome, junk=junk: junk) as loader:
            with pytest.raises((ValueError, TypeError)) as err:
                drain(loader)
            if isinstance(err.value, ValueError):
                assert "replace() for " in str(err.value)
            # The failed batch was not delivered: nothing of it is counted.
            assert loader.report.delivered == loader.report.replaced == 0
            assert loader.pool.free == loader.pool.depth


# ---------------------------------------------------------------------------------
# Arguments checked at construction


def test_bad_policy_arguments():
    with pytest.raises(ValueError):
        make_loader([("x.jpg", 0)], 1, on_error="ignore")
    with pytest.raises(ValueError):
        make_loader([("x.jpg", 0)], 1, on_error="replace")
    with pytest.raises(ValueError):
        make_loader([("x.jpg", 0)], 0)
    for size in (2.5, True, "2", None):
        with pytest.raises(TypeError, match="batch_size must be an integer"):
            make_loader([("x.jpg", 0)], size)
    with pytest.raises(ValueError, match="does not fit in int64"):   # found at once, not mid-epoch
        make_loader([("x.jpg", 2**63)], 1)
    for workers in (0, -1):                     # 0 was read as "every core"
        with pytest.raises(ValueError, match=f"cpu_workers must be at least 1 .*not {workers}"):
            make_loader([("x.jpg", 0)], 1, cpu_workers=workers)
    for workers in (1.5, True):                 # 1.5 ran two threads
        with pytest.raises(TypeError, match=f"cpu_workers must be an integer, not {workers!r}"):
            make_loader([("x.jpg", 0)], 1, cpu_workers=workers)
    from dlbooster.runtime.service import DecodeService

    for depth, error in ((0, ValueError), (-2, ValueError), (2.0, TypeError)):   # 0 or less: no bound
        with pytest.raises(error, match="device_queue must be"):
            DecodeService("cpu", device_queue=depth)


@pytest.mark.parametrize("kw, error, match", [
    (dict(prefetch=-1), ValueError, "prefetch must be at least 0, not -1"),
    (dict(prefetch=1.0), TypeError, "prefetch must be an integer, not 1.0"),
    (dict(slot_pixels=0), ValueError, "slot_pixels must be at least 1, not 0"),
    (dict(slot_pixels=True), TypeError, "slot_pixels must be an integer, not True"),
    (dict(seed=1.5), TypeError, "seed must be an integer, not 1.5"),
    (dict(seed=2**64), ValueError, r"seed must be in \[-2\*\*63, 2\*\*64\) .*not 18446744073709551616"),
    (dict(rank=1.0, world_size=2), TypeError, "rank must be an integer, not 1.0"),
    (dict(rank=True, world_size=2), TypeError, "rank must be an integer, not True"),
    (dict(world_size=2.0), TypeError, "world_size must be an integer, not 2.0"),
    (dict(transform=42), TypeError, "transform must be callable or None, not 42"),
    (dict(on_error="replace", replace="zeros"), TypeError, "replace must be callable or None, not 'zeros'"),
    (dict(on_error="skip", replace=lambda index, outcome: None), ValueError,
     "replace= is used only with on_error='replace', not on_error='skip'"),
])
def test_cheap_argument_errors_name_the_argument_before_the_backend_is_made(monkeypatch, kw, error, match):
    """Each found before the backend is made (a sim build takes minutes), naming the
    argument: ``seed=1.5`` said only "'float' object cannot be interpreted as an
    integer", ``rank=True`` passed as 1, ``transform=42`` failed at the first batch and
    ``replace`` with another policy was ignored."""
    def no_backend(*args, **kwargs):
        raise AssertionError("the backend was made before the arguments were checked")

    monkeypatch.setattr("dlbooster.runtime.service.get_backend", no_backend)
    with pytest.raises(error, match=match):
        make_loader([("x.jpg", 0)], 1, backend="cpu", **kw)


@pytest.mark.parametrize("env, kw, match", [
    ({"WORLD_SIZE": "2"}, dict(rank=3), r"rank must be in \[0, 1\], got 3 \(world_size from environment "
                                        r"variable WORLD_SIZE='2'\)"),
    ({"WORLD_SIZE": "0"}, dict(rank=0), r"world_size must be >= 1, got 0 \(world_size from environment variable "
                                        r"WORLD_SIZE='0'\)"),
    ({"RANK": "4"}, dict(world_size=2), r"rank must be in \[0, 1\], got 4 \(rank from environment variable "
                                        r"RANK='4'\)"),
    ({"RANK": "5", "WORLD_SIZE": "2"}, {}, r"environment variable RANK=5 is outside \[0, WORLD_SIZE=2\)"),
])
def test_a_rank_or_world_size_out_of_range_from_the_environment_names_the_variable(monkeypatch, env, kw, match):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=match):
        make_loader([("x.jpg", 0)], 1, backend="cpu", **{"rank": None, "world_size": None, **kw})


def test_a_constructor_failing_after_the_backend_was_made_closes_the_service(tiny_source, monkeypatch):
    """The service's dispatcher thread (and a simulated device) outlived the failure."""
    import threading

    from dlbooster.device.instant import InstantBackend, InstantTransport

    def no_memory(*args, **kwargs):
        raise MemoryError("no room for the pool")

    monkeypatch.setattr("dlbooster.runtime.loader.BatchPool", no_memory)
    before = set(threading.enumerate())
    with pytest.raises(MemoryError, match="no room for the pool"):
        make_loader(tiny_source, 2, backend=InstantBackend(InstantTransport(lanes=1, job_depth=2)))
    assert [t.name for t in set(threading.enumerate()) - before] == []


# ---------------------------------------------------------------------------------
# The epoch's figures and log


def test_epoch_figures_progress_bar_and_skip_log(bad_dir, tiny_source, capsys, caplog):
    """The epoch's figures are what they say (images/s is images over the epoch's wall
    seconds, host cores its process CPU time over them); the progress bar shows on rank
    0 only, one step per batch; a skipped sample is logged with its path."""
    source = tiny_source[:5]
    for rank, shows in ((0, True), (1, False)):
        with make_loader(source, 2, backend="cpu", slot_pixels=32 * 32, progress=True, rank=rank,
                         world_size=2) as loader:
            loader.set_epoch(3)
            start_cpu = time.process_time()
            batches = drain(loader)
            cpu = time.process_time() - start_cpu
            stats = loader.stats()
            assert stats.images == sum(len(b.indices) for b in batches) == 3
            assert 0 < stats.seconds and stats.images_per_s == pytest.approx(stats.images / stats.seconds)
            # The epoch's CPU time is part of this test's, which is measured around it.
            assert 0 < stats.host_cores * stats.seconds <= cpu + 1e-3
            assert set(stats.queue_peak) <= set(loader.service.queue_depths())
            assert stats.outcomes == {"ok": 3} and stats.lane_busy == {}
        bar = capsys.readouterr().err
        assert ("epoch 3" in bar and "2/2" in bar) == shows, bar
    with caplog.at_level(logging.WARNING, logger="dlbooster"):
        with make_loader([(str(bad_dir["empty"]), 0)], 1, backend="cpu", on_error="skip") as loader:
            assert [len(b.indices) for b in drain(loader)] == [0]
            [skipped] = loader.report.skipped
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping ")] == [
        f"skipping {skipped}"]
    assert str(skipped).startswith(f"{bad_dir['empty']}: error (undecodable: ")


def test_lane_busy_is_the_epochs(tiny_source):
    """``stats().lane_busy`` is each lane's clocks over its device's, both counted over
    the last epoch (it was the service's lifetime figure). The clock counters are set
    by hand here, as a simulated device's dispatcher sets them."""
    with make_loader(tiny_source, 4, backend="cpu", slot_pixels=32 * 32) as loader:
        stats = loader.service.stats
        stats.lane_clocks[0, 0], stats.device_clocks[0] = 400, 1000      # before the epoch
        for number, _ in enumerate(loader):
            if number == 0:
                stats.lane_clocks[0, 0], stats.lane_clocks[0, 1], stats.device_clocks[0] = 700, 100, 3000
        first = loader.stats()
        assert first.lane_busy == {"device0.lane0": 300 / 2000, "device0.lane1": 100 / 2000}
        assert loader.service.lane_busy() == {"device0.lane0": 700 / 3000, "device0.lane1": 100 / 3000}
        drain(loader)
        assert loader.stats().lane_busy == {}                            # the device ran no clock
        assert first.lane_busy == {"device0.lane0": 300 / 2000, "device0.lane1": 100 / 2000}


def test_lane_busy_of_a_device_that_counts_no_clocks_uses_its_fabric_clock(tmp_path):
    """A board counts no device clocks, only each job's (at its fabric clock,
    ``clock_hz``): its lanes' busy fraction is their job clocks over the fabric clock
    times the wall time, measured over the epoch (a window at least as long as the
    epoch's ``seconds``). The instant instrument, with no ``clock_hz``, has no figures."""
    from dlbooster.device.instant import InstantBackend, InstantTransport

    paths = [write(tmp_path / f"{i}.jpg", gen(16 + i, 16, subsampling=2)) for i in range(6)]
    for clock_hz in (None, 1e6):
        transport = InstantTransport(lanes=2, job_depth=4)
        if clock_hz:
            transport.clock_hz = clock_hz
        for path in paths:
            transport.learn(path.read_bytes(), pillow_file(str(path))[0])
        with make_loader([(str(p), 0) for p in paths], 3, backend=InstantBackend(transport),
                         slot_pixels=32 * 32) as loader:
            for _ in range(2):
                drain(loader)
                stats = loader.stats()
                assert stats.outcomes == {"ok": 6}
                if clock_hz is None:
                    assert stats.lane_busy == {}
                    continue
                # The instrument reports 1 clock per job; the lanes take turns.
                assert set(stats.lane_busy) == {"device0.lane0", "device0.lane1"}
                for fraction in stats.lane_busy.values():
                    # 3 jobs of 1 clock per lane, over a window a little longer than the epoch.
                    assert 3 / (clock_hz * (stats.seconds + 0.5)) <= fraction <= 3 / (clock_hz * stats.seconds)
