"""``dlbooster.Loader`` epochs and iterations: sharding, resume, iterations that end early.

Sharding is checked against ``DistributedSampler`` + ``DataLoader``, index for index,
over world sizes 2 and 3, with and without shuffle and drop_last. Also: a sampler's
state saved mid-epoch resumes at the next batch; an iteration left by ``break``, ended
by a newer one, raced by other threads or cut by ``close()`` gives every pool buffer
back (RuntimeError where it cannot go on); a loader iterated before a fork works in
the child (a device loader raises there, naming the fork); a loader refuses pickling;
and the next batch is submitted before a batch is yielded.
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from loader_helpers import N_SHARD, check_batches, drain, make_loader, pillow_file, tiny_files


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    return tiny_files(tmp_path_factory.mktemp("tiny"))


# ---------------------------------------------------------------------------------
# Sharding: DistributedSampler + DataLoader, index for index


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world_size", [2, 3])
def test_shards_equal_distributed_sampler(tiny_source, world_size, shuffle, drop_last):
    from torch.utils.data import DataLoader, DistributedSampler

    batch_size, seed = 2, 7
    loaders = [make_loader(tiny_source, batch_size, backend="cpu", shuffle=shuffle, seed=seed,
                           drop_last=drop_last, rank=r, world_size=world_size, slot_pixels=32 * 32)
               for r in range(world_size)]
    try:
        for epoch in (0, 1):
            covered = set()
            for rank, loader in enumerate(loaders):
                sampler = DistributedSampler(range(N_SHARD), num_replicas=world_size, rank=rank,
                                             shuffle=shuffle, seed=seed, drop_last=drop_last)
                sampler.set_epoch(epoch)
                reference = DataLoader(range(N_SHARD), batch_size=batch_size, sampler=sampler, drop_last=drop_last)
                expect = list(sampler)
                if drop_last:
                    expect = expect[: len(expect) // batch_size * batch_size]
                loader.set_epoch(epoch)
                assert len(loader) == len(reference)
                batches = drain(loader)
                got = [i for b in batches for i in b.indices.tolist()]
                assert got == expect, (rank, epoch)
                assert [b.indices.tolist() for b in batches] == [b.tolist() for b in reference]
                assert all(b.labels.tolist() == [100 + i for i in b.indices.tolist()] for b in batches)
                assert loader.report.positions == len(expect) == loader.report.accounted
                covered.update(got)
            if not drop_last:
                assert covered == set(range(N_SHARD))
    finally:
        for loader in loaders:
            loader.close()


# ---------------------------------------------------------------------------------
# Abandoned and resumed epochs


@pytest.mark.timeout(120)       # a hang guard: leaving the epoch must not wait for it
def test_break_out_of_an_epoch_then_a_full_one(tiny_source):
    with make_loader(tiny_source, 2, backend="cpu", prefetch=2, slot_pixels=32 * 32) as loader:
        assert loader.pool.depth == 3
        for batch in loader:
            assert batch.indices.tolist() == [0, 1]
            break
        assert loader.pool.free == loader.pool.depth
        assert loader.stats().images == 2
        assert loader.report.accounted < loader.report.positions
        # A generator left suspended, then dropped, gives its buffers back too.
        it = iter(loader)
        next(it)
        next(it)
        del it
        assert loader.pool.free == loader.pool.depth
        loader.set_epoch(1)
        batches = drain(loader)
        assert check_batches(loader, batches) == list(range(N_SHARD))
        assert loader.report.accounted == loader.report.positions == N_SHARD
        assert loader.pool.free == loader.pool.depth


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_sampler_state_saved_mid_epoch_resumes_at_the_next_batch(tiny_source, drop_last):
    """The sampler's state counts the samples of the batches yielded, not of those
    decoded ahead (it was always at the epoch's end, and a resume from it read nothing
    more); after a full epoch it is at the end, as a DataLoader's."""
    kw = dict(backend="cpu", shuffle=True, seed=2, drop_last=drop_last, prefetch=2, slot_pixels=32 * 32)
    with make_loader(tiny_source, 2, **kw) as loader:
        loader.set_epoch(1)
        epoch = [b.indices.tolist() for b in loader]
        assert len(epoch) == (5 if drop_last else 6)
        assert loader.sampler.state_dict()["start"] == N_SHARD
        it = iter(loader)
        assert [next(it).indices.tolist() for _ in range(2)] == epoch[:2]
        state = loader.sampler.state_dict()
        assert state["start"] == 4 and state["epoch"] == 1
    with make_loader(tiny_source, 2, **kw) as resumed:
        resumed.sampler.load_state_dict(state)
        resumed.set_epoch(1)
        batches = drain(resumed)
        assert [b.indices.tolist() for b in batches] == epoch[2:]
        assert sorted(check_batches(resumed, batches)) == sorted(i for b in epoch[2:] for i in b)


# ---------------------------------------------------------------------------------
# Iterations that overlap, close during an epoch


def test_a_new_iteration_ends_a_suspended_one(tiny_source):
    with make_loader(tiny_source, 2, backend="cpu", slot_pixels=32 * 32) as loader:
        first = iter(loader)
        next(first)                      # peeked at, kept alive: holds the pool's buffers
        batches = drain(loader)          # must not wait for the first iteration's buffers
        assert len(batches) == len(loader)
        assert sorted(check_batches(loader, batches)) == list(range(len(tiny_source)))
        with pytest.raises(RuntimeError, match="ended by a newer one"):
            next(first)
        assert loader.pool.free == loader.pool.depth


@pytest.mark.timeout(120)       # a hang guard: a lost buffer made a later epoch wait forever
def test_iterations_on_several_threads_at_once_lose_no_buffer(tiny_source):
    """Threads iterating one loader at once end each other's iterations (RuntimeError),
    but none loses a pool buffer: an older iteration's cleanup on another thread once
    ran between a buffer's take and its submission, and that buffer never came back."""
    import threading

    with make_loader(tiny_source, 1, backend="cpu", prefetch=1, slot_pixels=32 * 32) as loader:
        ended, others = [], []

        def work():
            for _ in range(50):
                try:
                    for _ in loader:
                        pass
                except RuntimeError as exc:
                    (ended if "ended by a newer one" in str(exc) else others).append(exc)

        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not others
        assert ended, "no iteration was ended by another: the threads never overlapped"
        assert loader.pool.free == loader.pool.depth
        batches = drain(loader)
        assert check_batches(loader, batches) == list(range(N_SHARD))
        assert loader.report.accounted == loader.report.positions == N_SHARD
        assert loader.pool.free == loader.pool.depth


def test_closed_loader_raises(tiny_source):
    """close() inside the loop: the next step raises, with no batch from the freed pool
    (batches already decoded wait in it: prefetch 2)."""
    loader = make_loader(tiny_source, 2, backend="cpu", slot_pixels=32 * 32, prefetch=2)
    it = iter(loader)
    next(it)
    time.sleep(0.2)                           # the next batches are ready
    loader.close()
    with pytest.raises(RuntimeError, match="the loader was closed during the epoch"):
        next(it)
    with pytest.raises(RuntimeError, match="loader is closed"):
        list(loader)


def test_close_from_another_thread_waits_for_the_batch_being_assembled(tiny_source):
    """A batch is assembled from the pool's memory, which close() frees: close() from
    another thread waits until the batch is done, and the iteration then ends."""
    import threading

    closer = None

    def transform(views):
        nonlocal closer
        if closer is None:
            closer = threading.Thread(target=loader.close)
            closer.start()
            closer.join(0.3)
            # Still assembling: close() has not begun (it would set _closed first).
            assert closer.is_alive() and not loader._closed
            return [int(v.sum()) for v in views]   # the slots' pixels, read before close()
        return views

    loader = make_loader(tiny_source, 2, backend="cpu", slot_pixels=32 * 32, transform=transform)
    it = iter(loader)
    images, _ = next(it)
    closer.join()
    expected = [int(np.asarray(Image.open(path).convert("RGB"), np.int64).sum()) for path, _ in tiny_source[:2]]
    assert images == expected and loader._closed
    with pytest.raises(RuntimeError, match="the loader was closed during the epoch"):
        next(it)


# ---------------------------------------------------------------------------------
# Forks and pickling


def _in_forked_child(work, timeout: float = 60):
    """``work()``'s result in a child forked from this process (given one PyTorch thread,
    as a ``DataLoader`` worker is), or ``repr`` of what it raised; fails if the child
    sends nothing within ``timeout`` seconds (a hang)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)

    def child():
        # As in DataLoader's workers: PyTorch's intra-op threads do not survive a fork.
        torch.set_num_threads(1)
        try:
            sender.send(work())
        except BaseException as exc:
            sender.send(f"raised {exc!r}")

    process = ctx.Process(target=child)
    process.start()
    try:
        assert receiver.poll(timeout), "the forked child sent nothing: hung"
        return receiver.recv()
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()


@pytest.mark.timeout(180)       # a hang guard: the parent's threads do not exist in the child
def test_a_loader_iterated_before_a_fork_works_in_the_child(tiny_source):
    """As in a ``DataLoader(num_workers > 0)`` worker: the child gets its own decode
    threads and the whole pool, even with an iteration of the parent's in flight; the
    parent's iteration goes on unharmed."""
    with make_loader(tiny_source, 2, backend="cpu", slot_pixels=32 * 32) as loader:
        assert check_batches(loader, drain(loader)) == list(range(N_SHARD))
        parents = iter(loader)
        first = next(parents)               # the parent's batches in flight at the fork

        def child():
            order = check_batches(loader, drain(loader))
            return order, loader.pool.free, loader.pool.depth

        order, free, depth = _in_forked_child(child)
        assert order == list(range(N_SHARD)) and free == depth
        assert check_batches(loader, [first, *parents]) == list(range(N_SHARD))
        assert loader.pool.free == loader.pool.depth


@pytest.mark.timeout(180)
def test_a_device_loader_in_a_forked_child_says_so(tiny_source):
    """A device backend's device and dispatcher threads are the parent's: iterating in
    the child raises at once, naming the fork, instead of waiting forever."""
    from dlbooster.device.instant import InstantBackend, InstantTransport

    transport = InstantTransport(lanes=2, job_depth=4)
    for path, _ in tiny_source:
        transport.learn(Path(path).read_bytes(), pillow_file(path)[0])
    with make_loader(tiny_source, 4, backend=InstantBackend(transport), slot_pixels=32 * 32) as loader:
        assert check_batches(loader, drain(loader)) == list(range(N_SHARD))

        def child():
            try:
                drain(loader)
            except RuntimeError as exc:
                loader.close()              # leaves the parent's device alone
                return str(exc), loader._closed
            return "no error"

        message, closed = _in_forked_child(child)
        assert "cannot be used in process" in message and "forked from it" in message and closed
        assert check_batches(loader, drain(loader)) == list(range(N_SHARD))   # the parent's still works


def test_a_loader_cannot_be_pickled_and_says_what_to_send(tiny_source):
    with make_loader(tiny_source, 2, backend="cpu", slot_pixels=32 * 32) as loader:
        with pytest.raises(TypeError, match="Loader cannot be pickled .*send its source and arguments"):
            pickle.dumps(loader)


# ---------------------------------------------------------------------------------
# Decoding ahead


def test_the_next_batch_is_submitted_before_a_batch_is_yielded(tiny_source):
    """The iterating thread submits batch n + 1 into the buffer batch n freed before it
    yields batch n, so decoding overlaps the consumer's step (one pool buffer here)."""
    with make_loader(tiny_source, 2, backend="cpu", prefetch=0, slot_pixels=32 * 32) as loader:
        assert loader.pool.depth == 1
        it = iter(loader)
        assert next(it).indices.tolist() == [0, 1]
        loader.service.drain()
        assert sum(loader.service.stats.outcomes.values()) == 4      # batches 0 and 1, no more
        assert loader.pool.free == 0
        rest = list(it)
        assert [b.indices.tolist() for b in rest] == [list(range(i, min(i + 2, N_SHARD))) for i in range(2, N_SHARD, 2)]
        assert loader.pool.free == 1
